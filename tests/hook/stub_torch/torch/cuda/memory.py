"""The stub allocator. Each allocation gets its own segment, rounded up to 2 MiB, split
into the active block and an inactive remainder: enough to give segments, blocks, states
and the stats the hook reads. Everything is in host memory; nothing here touches a GPU."""

import os
import sys
import threading

_LACKS = set(filter(None, os.environ.get("STUB_TORCH_LACKS", "").split(",")))
_lock = threading.RLock()
_initialized = False
_forked_child = False
_segments = {}  # name -> segment dict
_next_address = 0x7F0000000000
_observers = []
_counters = {"num_ooms": 0, "num_alloc_retries": 0, "num_device_alloc": 0, "num_device_free": 0, "allocations": 0}
_peaks = {"allocated": 0, "reserved": 0}
history_calls = []
_history_on = False  # stacks kept on live blocks (context "state", "alloc" or "all")
# PyTorch's trace ring (c10 RingBuffer): max_entries long with enabled="all", 1 entry
# otherwise; cleared only when history is turned off. Resized in place, never trimmed: a
# ring shrunk below what it holds writes past its end, which kills the job (SIGSEGV on
# the H100): the stub exits 139 there too.
_ring = []
_ring_max = 0
_ring_next = 0
_ring_skips = set()  # skip_actions: actions the ring does not record
LIMIT_BYTES = 8 * 1024 ** 3
# PYTORCH_CUDA_ALLOC_CONF's backend:cudaMallocAsync, as the real allocator reads it: it
# refuses snapshots, history and the OOM observer with these words, and keeps its totals.
# STUB_TORCH_BACKEND=pluggable: a CUDAPluggableAllocator, which refuses the stats too.
ASYNC = "backend:cudaMallocAsync" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
BACKEND = "cudaMallocAsync" if ASYNC else os.environ.get("STUB_TORCH_BACKEND", "native")


def _refused_by_async(what):
    if BACKEND != "native":
        name = "cudaMallocAsync" if ASYNC else "CUDAPluggableAllocator"
        raise RuntimeError("%s does not yet support %s. If you need it, please file an issue "
                           "describing your use case." % (name, what))


def _after_fork():
    # As torch does: a forked child cannot use its parent's CUDA context.
    global _forked_child, _initialized, _queued_calls
    _forked_child = True
    _initialized = False
    _queued_calls = []


os.register_at_fork(after_in_child=_after_fork)


_queued_calls = []
_initializing = threading.local()


def _lazy_init():
    """As torch.cuda._lazy_init: init, then run the queued calls, then say initialised."""
    global _initialized
    if _initialized or getattr(_initializing, "on", False):
        return
    if _forked_child and os.environ.get("STUB_TORCH_CHILD_CUDA") != "1":
        raise RuntimeError("Cannot re-initialize CUDA in forked subprocess (stub)")
    _initializing.on = True
    try:
        for call in _queued_calls:
            call()
    finally:
        _initializing.on = False
    _initialized = True


def _lazy_call(callable):
    if _initialized:
        callable()
    else:
        _queued_calls.append(callable)


def is_initialized():
    return _initialized


def _frames():
    frames = []
    frame = sys._getframe(1)  # from stub_alloc: a torch-internal frame first
    while frame is not None:
        code = frame.f_code
        frames.append({"filename": code.co_filename, "line": frame.f_lineno, "name": code.co_name})
        frame = frame.f_back
    return frames


def _trace(action, address, size):
    global _ring_next
    if _ring_max <= 0 or action in _ring_skips:
        return
    entry = {"action": action, "addr": address, "size": size, "stream": 0, "time_us": 0, "frames": []}
    if len(_ring) < _ring_max:
        _ring.append(entry)
        return
    if _ring_next >= len(_ring):
        sys.stderr.write("stub torch: the trace ring was shrunk while full: PyTorch writes past its end (SIGSEGV)\n")
        sys.stderr.flush()
        os._exit(139)
    _ring[_ring_next] = entry
    _ring_next += 1
    if _ring_next == _ring_max:
        _ring_next = 0


def stub_alloc(name, size):
    """Allocate `size` bytes as block `name` (the job keeps the name, as it would a tensor)."""
    global _next_address
    with _lock:
        total = max(2 * 1024 * 1024, -(-size // (2 * 1024 * 1024)) * 2 * 1024 * 1024)
        address = _next_address
        _next_address += total + 2 * 1024 * 1024
        active = {"address": address, "size": size, "requested_size": size, "state": "active_allocated"}
        if _history_on:
            active["frames"] = _frames()
        blocks = [active]
        if total > size:
            blocks.append({"address": address + size, "size": total - size, "requested_size": 0, "state": "inactive"})
        _segments[name] = {
            "device": 0, "address": address, "total_size": total, "stream": 0,
            "segment_type": "large" if size > 1024 * 1024 else "small",
            "segment_pool_id": (0, 0), "is_expandable": False, "blocks": blocks,
        }
        _counters["num_device_alloc"] += 1
        _counters["allocations"] += 1
        _trace("segment_alloc", address, total)
        _trace("alloc", address, size)
        _update_peaks()


def stub_free(name):
    with _lock:
        segment = _segments.get(name)
        if segment:
            segment["blocks"][0]["state"] = "inactive"
            segment["blocks"][0].pop("frames", None)
            _trace("free_requested", segment["address"], segment["blocks"][0]["size"])
            _trace("free_completed", segment["address"], segment["blocks"][0]["size"])


def stub_oom(size):
    """What the real allocator does when every retry failed: count, call the observers
    (after releasing its lock), then raise PyTorch's OutOfMemoryError."""
    from .. import OutOfMemoryError

    with _lock:
        _counters["num_ooms"] += 1
        stats = memory_stats(0)
        _trace("oom", 0, size)
        observers = list(_observers)
    allocated = stats["allocated_bytes.all.current"]
    reserved = stats["reserved_bytes.all.current"]
    free = LIMIT_BYTES - reserved
    for observer in observers:
        # An observer that raises turns the OOM into another error, as in C++.
        observer(0, size, LIMIT_BYTES, free)
    if ASYNC:
        # cudaMallocAsync's own words (CUDAMallocAsyncAllocator.cpp), its limit the stub's.
        def printed(n):
            return "%.2f MiB" % (n / 1048576.0) if n <= 1 << 30 else "%.2f GiB" % (n / 1073741824.0)

        raise OutOfMemoryError(
            "Allocation on device 0 would exceed allowed memory. (out of memory)\n"
            "Currently allocated     : %s\nRequested               : %s\n"
            "Device limit            : %s\nFree (according to CUDA): %s\n"
            "PyTorch limit (set by user-supplied memory fraction)\n                        : %s"
            % (printed(allocated), printed(size), printed(LIMIT_BYTES), printed(free), printed(LIMIT_BYTES)))
    raise OutOfMemoryError(
        "CUDA out of memory. Tried to allocate %d bytes. Of the allocated memory %d bytes is "
        "allocated by PyTorch, and %d bytes is reserved by PyTorch but unallocated." % (size, allocated, reserved - allocated)
    )


def _totals():
    allocated = reserved = inactive_split = requested = 0
    for segment in _segments.values():
        reserved += segment["total_size"]
        for block in segment["blocks"]:
            if block["state"] == "active_allocated":
                allocated += block["size"]
                requested += block["requested_size"]
            elif len(segment["blocks"]) > 1:
                inactive_split += block["size"]
    return allocated, reserved, inactive_split, requested


def _update_peaks():
    allocated, reserved, _, _ = _totals()
    _peaks["allocated"] = max(_peaks["allocated"], allocated)
    _peaks["reserved"] = max(_peaks["reserved"], reserved)


def memory_stats(device=None):
    if BACKEND == "pluggable":
        _refused_by_async("getDeviceStats")
    if not _initialized:
        return {}
    with _lock:
        allocated, reserved, inactive_split, requested = _totals()
        stats = {
            "allocated_bytes.all.current": allocated,
            "reserved_bytes.all.current": reserved,
            "active_bytes.all.current": allocated,
            "inactive_split_bytes.all.current": inactive_split,
            "requested_bytes.all.current": requested,
            "allocated_bytes.all.peak": _peaks["allocated"],
            "reserved_bytes.all.peak": _peaks["reserved"],
        }
        stats.update({k: v for k, v in _counters.items() if k != "allocations"})
        stats["allocation.all.allocated"] = _counters["allocations"]
        return stats


def _snapshot(device=None):
    import copy

    if BACKEND == "pluggable":
        _refused_by_async("snapshot")
    if ASYNC:
        raise RuntimeError("Calling snapshot with backend:cudaMallocAsync is not meaningful.")
    with _lock:
        result = {"segments": copy.deepcopy(list(_segments.values())), "device_traces": [copy.deepcopy(_ring[_ring_next:] + _ring[:_ring_next])]}
        if "allocator_settings" not in _LACKS:
            result["allocator_settings"] = {
                "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                "max_split_size": -1,
                "garbage_collection_threshold": 0.0,
                "expandable_segments": "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                "roundup_power2_divisions": {"1": 0, "2": 0},
            }
        return result


def memory_snapshot():
    return _snapshot()["segments"]


def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize, device=None,
                           clear_history=False, compile_context=False, global_record_annotations=False,
                           skip_actions=None):
    global _history_on, _ring_max, _ring_next, _ring_skips
    _lazy_init()  # as the real binding does
    _refused_by_async("recordHistory")
    call = {"enabled": enabled, "context": context, "stacks": stacks, "max_entries": max_entries}
    if clear_history:
        call["clear_history"] = True
    if skip_actions:
        call["skip_actions"] = list(skip_actions)
    history_calls.append(call)
    # As recordHistory (2.11): each call sets the skipped actions anew.
    _ring_skips = set(skip_actions or ())
    _history_on = enabled is not None and context in ("state", "alloc", "all")
    # As recordHistory: the ring is max_entries long only with enabled="all", else 1 entry;
    # turning history off, or clear_history, clears it.
    if enabled is None or clear_history:
        _ring.clear()
        _ring_next = 0
    _ring_max = 0 if enabled is None else max(1, max_entries if enabled == "all" else 1)


if "skip_actions" in _LACKS:  # PyTorch before skip_actions: every action is recorded
    _with_skips = _record_memory_history

    def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize, device=None,
                               clear_history=False, compile_context=False, global_record_annotations=False):
        return _with_skips(enabled, context, stacks, max_entries, device, clear_history, compile_context,
                           global_record_annotations)


if "clear_history" in _LACKS and "skip_actions" in _LACKS:  # neither: off and on clears the ring
    _with_clear = _record_memory_history

    def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize, device=None,
                               compile_context=False, global_record_annotations=False):
        return _with_clear(enabled, context, stacks, max_entries, device, False, compile_context,
                           global_record_annotations)
elif "clear_history" in _LACKS:  # skip_actions without clear_history (no PyTorch known; a hook must cope)
    _with_clear = _record_memory_history

    def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize, device=None,
                               compile_context=False, global_record_annotations=False, skip_actions=None):
        return _with_clear(enabled, context, stacks, max_entries, device, False, compile_context,
                           global_record_annotations, skip_actions)


if "memory_snapshot" in _LACKS:
    del _snapshot, memory_snapshot
if "record_memory_history" in _LACKS:
    del _record_memory_history
