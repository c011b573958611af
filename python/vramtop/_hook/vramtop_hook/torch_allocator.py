"""The torch adapter: PyTorch's CUDA caching allocator read as vramtop's protocol
wants it (stats, segments and blocks, the ring's checkpoints, the OOM observer).

Stdlib only; nothing here raises into the job.
"""

import collections
import contextlib
import functools
import os
import sys
import threading
import time

from .history import History, PickledSnapshot, cpu_clock_of_this_thread, wait_for_the_copy
from .roles import AllocatedSeries, PassMarks, RoleWatch
from .settings import (
    ENTRIES_PER_ALLOCATION, ENTRIES_PER_ALLOCATION_SKIPPING, HISTORY_MAX_MB, READ_RING_MAX, RING_CHECKPOINT_SHARE,
    RING_COPY_CPU_S, RING_COPY_S_PER_ENTRY, RING_READ_MIN_BYTES_PER_ENTRY, SKIPPED_ACTIONS, STEP_MARKS,
    say_once,
)


STAT_KEYS = (
    ("allocated_bytes", "allocated_bytes.all.current"),
    ("reserved_bytes", "reserved_bytes.all.current"),
    ("active_bytes", "active_bytes.all.current"),
    ("inactive_split_bytes", "inactive_split_bytes.all.current"),
    ("requested_bytes", "requested_bytes.all.current"),
    ("peak_allocated_bytes", "allocated_bytes.all.peak"),
    ("peak_reserved_bytes", "reserved_bytes.all.peak"),
    ("num_alloc_retries", "num_alloc_retries"),
    ("num_ooms", "num_ooms"),
    ("num_device_alloc", "num_device_alloc"),
    ("num_device_free", "num_device_free"),
)
MAX_BLOCKS = 200000
# PyTorch's backend:cudaMallocAsync keeps no blocks or segments of its own (CUDA's pool
# does), refuses snapshots, event history and the OOM observer, and ignores every setting
# of the native allocator: what the hook can read of it is the totals of memory_stats. A
# pluggable allocator (CUDAPluggableAllocator, "pluggable") refuses them alike.
NATIVE_BACKEND = "native"
UNTRACKED_MISSING = (
    "backend:%s: PyTorch keeps no blocks, segments, event history or OOM state for it, so "
    "vramtop shows its totals only and judges no remedy (expandable_segments, "
    "max_split_size_mb, garbage_collection_threshold and roundup_power2_divisions apply to "
    "the native allocator only)"
)
# The longest an OOM's reads wait for a checkpoint under way, and a checkpoint for an OOM's
# reads (seconds; tests shorten it).
OOM_WAIT_S = 2.0
BLOCK_STATES = ("active_allocated", "active_pending_free", "inactive")


def format_size(size):
    """c10's format_size, so our figures read exactly as PyTorch's OOM message."""
    if size <= 1024:
        return "%d bytes" % size
    if size <= 1048576:
        return "%.2f KiB" % (size / 1024.0)
    if size <= 1073741824:
        return "%.2f MiB" % (size / 1048576.0)
    return "%.2f GiB" % (size / 1073741824.0)


def parse_alloc_conf(raw):
    """PYTORCH_CUDA_ALLOC_CONF "k:v,k:v" into a dict; commas inside [..] stay in the value."""
    items, depth, current = [], 0, ""
    for ch in raw:
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth <= 0:
            items.append(current)
            current = ""
        else:
            current += ch
    items.append(current)
    conf = {}
    for item in items:
        key, _, value = item.partition(":")
        if key.strip():
            conf[key.strip()] = value.strip()
    return conf


# The OOM observer is process-wide in PyTorch: attached once, by whichever allocator first.
_oom_observer_attached = False


class TorchAllocator:
    """The CUDA caching allocator as this PyTorch exposes it, each API found by feature.

    Nothing here initialises CUDA: every call is made only after torch.cuda.is_initialized()
    said True (memory_stats returns {} before; the OOM observer's binding would init CUDA).
    """

    def __init__(self, torch):
        self.torch = torch
        cuda = getattr(torch, "cuda", None)
        memory = getattr(cuda, "memory", None)
        self._is_initialized = getattr(cuda, "is_initialized", None)
        # _snapshot() is the dict memory_snapshot() takes "segments" from; it also carries
        # "allocator_settings" on recent PyTorch, so one call gives both for one price.
        self._snapshot = getattr(memory, "_snapshot", None)
        self._memory_snapshot = getattr(cuda, "memory_snapshot", None)
        self._stats = getattr(cuda, "memory_stats", None)
        self._attach = getattr(getattr(torch, "_C", None), "_cuda_attach_out_of_memory_observer", None)
        self._record = getattr(memory, "_record_memory_history", None)
        # The settings string in force now, runtime changes included (recent PyTorch).
        self._settings_string = getattr(getattr(torch, "_C", None), "_accelerator_getAllocatorSettings", None)
        self.history_on = False
        self._record_on = self._record_off = None  # the form start_history found to work
        self._history_forms = None  # (on, off) without the ring, for when it retires
        # The event ring (RING_ENTRIES): its size while it lives (0: none), whether it began
        # before the job's first allocation, and its fullest device at the last read.
        self.ring_entries = 0
        self.ring_from_start = False
        self.ring_fill = 0
        self.ring_start_count = None  # allocation_count() when the ring (re)started
        # The allocator's segments when the ring last restarted (`checkpoint`), and how many
        # entries that snapshot already held per device (they are in its segments).
        self.checkpoint = None
        self.restarting = False  # restart_ring between clearing the ring and its checkpoint
        # Held by a checkpoint from clearing the ring to keeping its state, and by an OOM
        # while it reads the ring, the checkpoint and the history (`reading_at_oom`): an
        # OOM's file never pairs a ring with a checkpoint it does not follow on from.
        self.checkpoint_lock = threading.Lock()
        self._clear_in_place = True  # clear_ring: until this PyTorch refuses clear_history
        # Hook 1.7: the ring without free_requested (SKIPPED_ACTIONS), where this PyTorch's
        # _record_memory_history names `skip_actions` (start_ring decides).
        self.skips_requests = False
        self.entries_per_allocation = ENTRIES_PER_ALLOCATION
        # Hook 1.5: the ring read off the GIL before each checkpoint, and what it read.
        self.pickled = None
        self.history = History(int(HISTORY_MAX_MB * 1024 * 1024))
        self.generation = 0  # bumped as each checkpoint begins and again as it ends
        self._uuids = {}  # device -> its GPU's UUID (device_uuid)
        # When the job's optimizers stepped (time.time()), the last STEP_MARKS of them: a
        # replay empties the cache there to judge `empty_cache()` between steps.
        self.steps = collections.deque(maxlen=STEP_MARKS)
        self.optimizer_steps = 0  # counted, for `watch_skipped_steps`
        # Where no step is marked, where the job's passes through its first model began
        # (`PassMarks`): a replay takes them for its steps.
        self.passes = collections.deque(maxlen=STEP_MARKS)
        self.series = AllocatedSeries()
        self.roles = RoleWatch(torch, self.allocated_reserved)
        steps = self.steps
        self.roles.passes = PassMarks(torch, self.passes, lambda: bool(steps))
        # The same, sampled just after an optimizer step (at most one step a period): the
        # step's activations are gone then, so the samples are the job's floor itself.
        self.step_series = AllocatedSeries()
        self._raw_stats = getattr(getattr(torch, "_C", None), "_cuda_memoryStats", None)
        self._device_count = None
        # The job called _record_memory_history itself: its settings stand from then on
        # (see watch_user_history); the hook never switches recording again.
        self.user_history = False
        self.watch_user_history(memory)
        self.settings_from_torch = False
        self._last_raw_settings = None
        self.last_device = 0
        self.internal_prefixes = self._internal_prefixes()
        self._internal_cache = {}
        self.capabilities, self.missing = [], []
        # torch.cuda.get_allocator_backend() once CUDA is up (`read_backend`): "native",
        # "cudaMallocAsync", or None where this torch does not say.
        self.backend = None
        self._get_backend = getattr(cuda, "get_allocator_backend", None)
        self.watch_steps(torch)
        if self.roles.watch_models():
            self.capabilities.append("model_roles")
        self.roles.watch_averaged()
        if self._snapshot or self._memory_snapshot:
            self.capabilities.append("memory_snapshot")
        else:
            self.missing.append("no torch.cuda.memory_snapshot: no segments or blocks")
        if self._stats:
            self.capabilities.append("memory_stats")
        else:
            self.missing.append("no torch.cuda.memory_stats: no totals")
        if self._attach:
            self.capabilities.append("oom_observer")
        else:
            self.missing.append("no torch._C._cuda_attach_out_of_memory_observer: no OOM state")
        if self._record:
            self.capabilities.append("record_memory_history")
        if self._is_initialized is None:
            self.missing.append("no torch.cuda.is_initialized: cannot tell when CUDA is up")

    def watch_steps(self, torch):
        """Mark each optimizer step of the job (a global post-step hook of torch.optim:
        one append per step). Never raises into the job.

        The hook lives in the module torch.optim.optimizer, which torch/optim/__init__.py
        deletes from the package's names (`del optimizer`): it is found in sys.modules."""
        module = sys.modules.get("torch.optim.optimizer")
        if module is None and getattr(torch, "optim", None) is not None:
            try:
                import importlib

                module = importlib.import_module("torch.optim.optimizer")
            except Exception:
                module = None
        register = getattr(module, "register_optimizer_step_post_hook", None)
        if register is None:
            self.missing.append("no torch.optim.optimizer.register_optimizer_step_post_hook: no step marks")
            return
        steps = self.steps
        alloc = self

        def _vramtop_step_done(optimizer, args, kwargs):
            try:
                alloc.optimizer_steps += 1
                now = time.time()
                steps.append(now)
                if now >= alloc.step_series.next_due:
                    alloc.sample_at_step(optimizer, now)
                alloc.roles.after_step()
            except Exception:
                pass

        try:
            register(_vramtop_step_done)
            self.capabilities.append("step_marks")
            self.watch_skipped_steps(torch)
        except Exception:
            pass
        # Optimizers are known from their first step's start (their state comes in it).
        register_pre = getattr(module, "register_optimizer_step_pre_hook", None)
        optimizers = self.roles.optimizers

        def _vramtop_step_starts(optimizer, args, kwargs):
            try:
                optimizers.add(optimizer)
            except Exception:
                pass
            return None

        try:
            if register_pre is not None:
                register_pre(_vramtop_step_starts)
                self.capabilities.append("optimizer_roles")
        except Exception:
            pass

    def watch_skipped_steps(self, torch):
        """Mark a step that GradScaler skipped, where its step() returns. With inf or NaN
        gradients (fp16, a scale too high) it does not run the optimizer's step, so the
        post-step hook marks nothing, and the iteration would merge into the next in the
        history: a replay emptying the cache between steps would skip that point, where the
        job's own `empty_cache()` after `scaler.step()` runs. GradScaler.step is wrapped (on
        torch.amp.GradScaler, which torch.cuda.amp's subclasses from PyTorch 2.3; before,
        on torch.cuda.amp's); a step that ran the optimizer is marked once, by the post-step
        hook. Never raises into the job."""
        scaler = getattr(getattr(torch, "amp", None), "GradScaler", None)
        if scaler is None:
            # Before PyTorch 2.3 torch.cuda.amp's is a class of its own.
            cuda_amp = getattr(getattr(torch, "cuda", None), "amp", None)
            scaler = getattr(cuda_amp, "GradScaler", None)
        step = getattr(scaler, "step", None)
        if step is None:
            self.missing.append("no GradScaler.step: a step it skips is not marked")
            return
        # A forked child's torch already carries its parent's wrapper: wrap the original.
        original = getattr(step, "_vramtop_original", None) or step
        alloc = self

        def step_or_mark(scaler_self, optimizer, *args, **kwargs):
            before = alloc.optimizer_steps
            result = original(scaler_self, optimizer, *args, **kwargs)
            try:
                if alloc.optimizer_steps == before:
                    alloc.steps.append(time.time())
            except Exception:
                pass
            return result

        try:
            functools.update_wrapper(step_or_mark, original)
            step_or_mark._vramtop_original = original
            scaler.step = step_or_mark
            self.capabilities.append("skipped_step_marks")
        except Exception:
            pass

    def watch_user_history(self, memory):
        """Notice the job's own calls of torch.cuda.memory._record_memory_history (users
        turn it on to debug memory), so that turning our ring off, or HistoryDuty's
        switching, never turns theirs off. Our own calls go to the original (self._record)."""
        # A forked child's torch already carries its parent's wrapper: wrap the original.
        original = getattr(self._record, "_vramtop_original", None) or self._record
        self._record = original
        if original is None or memory is None:
            return
        alloc = self

        def _record_memory_history(*args, **kwargs):
            alloc.user_history = True
            # The job's thread: the one that may import what reading stacks needs.
            alloc.import_symbolizer()
            if alloc.ring_entries:
                # Ours goes first, cleared: their history starts as it would without us,
                # and a ring resized while wrapped would write past its end (retire_ring).
                alloc.ring_entries = 0
                try:
                    original(enabled=None)
                except Exception:
                    pass
            return original(*args, **kwargs)

        for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
            try:
                setattr(_record_memory_history, attr, getattr(original, attr))
            except Exception:
                pass
        _record_memory_history.__wrapped__ = original  # inspect.signature sees torch's
        _record_memory_history._vramtop_original = original
        try:
            memory._record_memory_history = _record_memory_history
        except Exception:
            pass

    def read_backend(self):
        """Which allocator PyTorch runs (PYTORCH_CUDA_ALLOC_CONF's `backend`, or a pluggable
        one); True where it is one that tracks no blocks (any but "native"), said once in
        `missing`."""
        if self.backend is None and self._get_backend is not None:
            try:
                self.backend = str(self._get_backend())
            except Exception:
                self.backend = None
            if self.blocks_untracked():
                self.missing.append(UNTRACKED_MISSING % self.backend)
                # Found, but this backend refuses each of them.
                refused = ("memory_snapshot", "oom_observer", "record_memory_history")
                self.capabilities = [c for c in self.capabilities if c not in refused]
        return self.blocks_untracked()

    def blocks_untracked(self):
        return self.backend is not None and self.backend != NATIVE_BACKEND

    def cuda_initialised(self):
        try:
            return bool(self._is_initialized and self._is_initialized())
        except Exception:
            return False

    def probe_settings(self):
        """Learn once whether PyTorch reports its allocator settings itself."""
        try:
            if self._settings_string is not None or (
                self._snapshot and isinstance((self.raw_snapshot() or {}).get("allocator_settings"), dict)
            ):
                self.settings_from_torch = True
                self.capabilities.append("allocator_settings")
                return
        except Exception:
            pass
        self.missing.append("allocator settings read from PYTORCH_CUDA_ALLOC_CONF only")

    def attach_oom_observer(self, observer):
        global _oom_observer_attached
        if self._attach is None or _oom_observer_attached:
            return  # observers cannot be detached; a forked child inherits the parent's
        try:
            self._attach(observer)
            _oom_observer_attached = True
        except Exception as err:
            self.missing.append("OOM observer refused: %r" % (err,))

    def record_ring(self, entries, stacks=False, clear=False):
        """Turn the ring of `entries` on (with stacks for live blocks when `stacks`); with
        `clear`, empty it too, in place (`clear_history`).

        Annotations are recorded by a callback PyTorch registers per thread unless asked for
        a global one; the ring starts in the job's thread (CUDA's init) and is restarted from
        ours, and a thread-local callback removed from another thread makes PyTorch warn
        "Requested callback is not found" on the job's stderr. Global, it is found."""
        call = {"enabled": "all", "context": "state" if stacks else None, "stacks": "python",
                "max_entries": entries, "global_record_annotations": True}
        if clear:
            call["clear_history"] = True
        if self.skips_requests:
            call["skip_actions"] = list(SKIPPED_ACTIONS)
        # The keywords a PyTorch may refuse (TypeError) are dropped one at a time:
        # global_record_annotations, then skip_actions. Refused with neither, it is another
        # (clear_history: clear_ring then turns the ring off and on instead), and the skip
        # stands; taken without skip_actions, this PyTorch names it but refuses it, and the
        # ring keeps free_requested from here.
        tries = [call, {k: v for k, v in call.items() if k != "global_record_annotations"}]
        if "skip_actions" in call:
            tries.append({k: v for k, v in tries[1].items() if k != "skip_actions"})
        for n, kwargs in enumerate(tries):
            try:
                self._record(**kwargs)
            except TypeError:
                if n + 1 == len(tries):
                    raise
                continue
            if self.skips_requests and "skip_actions" not in kwargs:
                self.skips_requests = False
                self.entries_per_allocation = ENTRIES_PER_ALLOCATION
            return

    def clear_ring(self, entries, stacks):
        """Empty the ring and keep recording, in one call where this PyTorch can.

        recordHistory (CUDACachingAllocator.cpp) empties the ring under its own lock when
        asked to clear it (`if (!enabled || clearHistory) alloc_buffer.clear()`), and with
        the same `entries` nothing is resized: safe, unlike shrinking one in place
        (restart_ring). One call instead of off and on (which also removes and adds
        PyTorch's annotation callback) is less time holding the GIL. A PyTorch without
        `clear_history` is turned off and on, as before."""
        if self._clear_in_place:
            try:
                self.record_ring(entries, stacks=stacks, clear=True)
                return
            except TypeError:
                self._clear_in_place = False
        self._record(enabled=None)
        self.record_ring(entries, stacks=stacks)

    def start_ring(self, entries):
        """Keep PyTorch's alloc/free events per device, without stacks (context=None: no
        Python stack is gathered for them). Started at CUDA's init, before the job's first
        allocation, it holds the job's whole history until its first checkpoint."""
        if self._record is None or entries <= 0 or self.user_history:
            return
        if self.history_already_on():
            # The job (a notebook, before we were there) records history itself.
            self.user_history = True
            return
        before = self.allocation_count()
        self.skips_requests = takes_keyword(self._record, "skip_actions")
        self.entries_per_allocation = ENTRIES_PER_ALLOCATION_SKIPPING if self.skips_requests else ENTRIES_PER_ALLOCATION
        try:
            self.record_ring(entries)
        except TypeError:
            self.missing.append("no event ring: this torch's _record_memory_history takes no max_entries")
            return
        except Exception as err:
            self.missing.append("event ring refused: %r" % (err,))
            return
        self.ring_entries = entries
        # An allocation made while we turned it on (from our thread, vramtop_hook.start())
        # may be missing from it: then the history needs a checkpoint to begin from.
        self.ring_from_start = before == 0 and self.allocation_count() == 0
        self.ring_start_count = before
        self.capabilities.append("event_ring")
        if self.skips_requests:
            self.capabilities.append("ring_without_free_requested")
        # Without it the history begins at the last checkpoint, as in hook 1.4: the
        # capability says which (nothing is said on the job's stderr either way).
        self.pickled, self.pickled_missing = PickledSnapshot.find(self.torch)
        if self.pickled is not None:
            self.capabilities.append("ring_history")
        # Otherwise the hook's thread takes a checkpoint at its next look (ring_may_be_full):
        # not here, where we may be inside torch's lazy init.

    def history_already_on(self):
        """Whether something records allocation history already: its trace holds entries,
        or its live blocks carry stacks. Only a job that has allocated can show either, so
        at CUDA's init (inside torch's lazy init, before any allocation) nothing is read."""
        if not self.allocation_count():
            return False
        # The one snapshot the hook's thread may take before torch._inductor is in: a hook
        # started by hand after the job allocated must learn whether the job records
        # history itself, and only if it does (stacks recorded) does reading import it.
        try:
            raw = self._snapshot() if self._snapshot is not None else (self.raw_snapshot() or {})
        except Exception:
            return False
        if any(raw.get("device_traces") or []):
            return True
        return any(b.get("frames") for seg in raw.get("segments") or [] for b in seg.get("blocks") or [])

    def ring_estimate(self):
        """How many entries the ring may hold now, from the allocations since it (re)started
        (None: cannot tell). Reading the ring itself is what costs."""
        if not self.ring_entries:
            return 0
        count = self.allocation_count()
        if count is None or self.ring_start_count is None:
            return None
        return self.entries_per_allocation * max(0, count - self.ring_start_count)

    def ring_may_be_full(self):
        """True when the ring may be a quarter full by now (RING_CHECKPOINT_SHARE): time for
        a checkpoint (RING_ENTRIES)."""
        if not self.ring_entries:
            return False
        if not self.ring_from_start and self.checkpoint is None:
            return True  # no start to replay from yet: the checkpoint is one
        estimate = self.ring_estimate()
        return estimate is None or estimate >= RING_CHECKPOINT_SHARE * self.ring_entries

    def ring_cheap_to_read(self):
        """Whether a snapshot now converts few enough ring entries (READ_RING_MAX)."""
        estimate = self.ring_estimate()
        return estimate is not None and estimate <= READ_RING_MAX

    def ring_of(self, raw, device):
        """What the ring holds for `device` in the snapshot `raw`: None without a ring, else
        {"max_entries", "entries", "complete", "checkpoint"}: complete when it holds every
        event since the job's first allocation, or since its checkpoint (`checkpoint` true),
        and has never been full (a full ring may have dropped its oldest)."""
        if not self.ring_entries:
            return None
        traces = (raw or {}).get("device_traces") or []
        entries = len(traces[device]) if 0 <= device < len(traces) else 0
        since_checkpoint = self.checkpoint is not None
        return {
            "max_entries": self.ring_entries,
            "entries": entries,
            # Once the job set history itself, the ring is its (it may have cleared it).
            "complete": bool(
                (self.ring_from_start or since_checkpoint)
                and entries < self.ring_entries
                and not self.user_history
                and not self.restarting
            ),
            "checkpoint": since_checkpoint,
        }

    def checkpoint_of(self, device):
        """The checkpoint as an OOM's file carries it (`vramtop_oom.checkpoint`): the segments
        of `device` then, in PyTorch's own form, and how many of the ring's first entries
        that snapshot had already seen (`skip`: they are in its segments)."""
        cp = self.checkpoint  # read once: the hook's thread may replace or drop it meanwhile
        raw = self.checkpoint_raw(cp)
        if raw is None:
            return None
        traces = raw.get("device_traces") or []
        return {
            "time_s": cp["time_s"],
            "skip": len(traces[device]) if 0 <= device < len(traces) else 0,
            "segments": [seg for seg in raw.get("segments") or [] if seg.get("device", device) == device],
        }

    def checkpoint_raw(self, cp=None):
        """The snapshot of the checkpoint `cp` (the last one by default) as _snapshot() gives
        it, or None. Kept as PyTorch pickled it and unpickled only when asked (at an OOM, or
        for a state that shows it): unpickling at every checkpoint held the GIL 0.4 ms each
        time, for nothing."""
        cp = self.checkpoint if cp is None else cp
        if cp is None:
            return None
        if cp.get("raw") is None:
            import pickle

            try:
                cp["raw"] = pickle.loads(cp["pickled"])
            except Exception as err:  # an OOM's file goes on without the checkpoint
                say_once("checkpoint", "cannot read the ring's checkpoint (%r): an OOM's history starts later" % (err,))
                return None
        return cp["raw"]

    @contextlib.contextmanager
    def reading_at_oom(self, timeout_s=None):
        """For an OOM's reads of the ring, the checkpoint and the history: a checkpoint under
        way ends first, and none begins meanwhile. The state read that ends a checkpoint
        runs off the GIL, so the job may run out of memory between the ring's clearing and
        its new checkpoint; and the hook's thread runs whenever the OOM's thread lets the
        GIL go. The job's thread does not hold the GIL while it waits. Bounded: past
        OOM_WAIT_S the OOM reads anyway (the generation check then tells)."""
        held = self.checkpoint_lock.acquire(timeout=OOM_WAIT_S if timeout_s is None else timeout_s)
        try:
            yield
        finally:
            if held:
                self.checkpoint_lock.release()

    def restart_ring(self, stacks):
        """Checkpoint: read the ring whole where that is cheap and safe (hook 1.5: off the
        GIL, kept in `history`), clear it, and keep the allocator's snapshot now (see
        RING_ENTRIES). Returns True when a checkpoint was taken (its snapshot is
        `checkpoint_raw()`), False when the ring is gone or an OOM's reads held it off.

        Never resized in place: shrinking a ring (enabled="state" sets 1 entry) leaves a
        wrapped ring writing past its end: on the H100 (2.11) that killed the job with
        SIGSEGV (`clear_ring` keeps its size). The snapshot is taken with the ring already
        recording again, so no event falls between the two: reading the segments writes a
        `snapshot` entry to the ring under the allocator's lock, and a replay starts from
        these segments and the events after that entry (`skip`). Events the job's other
        threads (autograd's) make meanwhile are on either side of that entry, as they
        happened.

        Only the clearing holds the GIL. Both reads run off it (hook 1.6): on the H100 the
        snapshot read held it 1.4 to 1.6 ms a checkpoint, its unpickling 0.4 ms, the ring
        off and on 0.2 to 0.65 ms. The ring is cleared while PyTorch still pickles its read
        (hook 1.8, `read_then_clear`). From the ring's read to the new checkpoint it holds
        `checkpoint_lock`, which an OOM's reads wait for (`reading_at_oom`)."""
        if self.user_history or not self.ring_entries:
            return False
        entries = self.ring_entries
        # The ring since the last checkpoint (or the job's start), read whole off the GIL
        # before it is cleared: with no stacks in it (symbolising them takes the GIL) and
        # none of it overwritten (a quarter full or a little more when checkpoints keep pace).
        first = self.checkpoint is None
        plain = not stacks and not self.frames_recorded()
        whole = (not first or self.ring_from_start) and plain
        # The estimate counts 2 or 3 entries an allocation (entries_per_allocation) and
        # nothing else (segment events, snapshot entries): a ring near full may have
        # dropped its oldest, so a margin.
        estimate = self.ring_estimate()
        whole = whole and estimate is not None and estimate < 0.8 * self.ring_entries
        whole = whole and self.ring_fill < self.ring_entries
        if not self.checkpoint_lock.acquire(timeout=OOM_WAIT_S):
            return False  # an OOM is reading: the next look checkpoints
        self.restarting = True
        # An OOM that read the generation before this point sees it change (on_oom): from
        # here the ring and the checkpoint it read no longer follow on from each other.
        self.generation += 1
        try:
            state, raw, events = None, None, None
            try:
                if whole and self.pickled is not None:  # else there is no read to overlap
                    read = self.read_then_clear(entries, stacks, estimate)
                    if read is None:
                        return False  # the job took the recording over: it is the job's now
                    events, count, state = read
                else:
                    count = self.allocation_count()
                    self.clear_ring(entries, stacks)
                    state = self.read_pickled() if self.pickled is not None and plain else None
                if events is not None and state is not None:
                    # A read no bigger than the state after it holds no ring from before the
                    # clearing: it came after it (RING_READ_MIN_BYTES_PER_ENTRY).
                    if len(events) - len(state) < RING_READ_MIN_BYTES_PER_ENTRY * (estimate or 0):
                        events = None
                if state is None:
                    raw = self.raw_snapshot() or {}
            except Exception as err:
                say_once("ring", "cannot restart the event ring (%r): no history from here" % (err,))
                # Off for good, off first (a ring left on would be read whole at every
                # state, and the history switches would resize it in place).
                self.restarting = False
                self.retire_ring(stacks)
                return False
            self.ring_start_count = count
            self.ring_fill = 0  # just cleared: a state that reads the ring says more
            self.checkpoint = {"time_s": time.time(), "pickled": state, "raw": raw}
            self.keep_history(events, state, from_start=first and self.ring_from_start)
            # And once more now that both are replaced (on_oom compares before and after).
            self.generation += 1
        finally:
            self.restarting = False
            self.checkpoint_lock.release()
        try:
            self.history.pack()
        except Exception as err:
            say_once("history", "cannot keep the allocator history (%r): from the last checkpoint only" % (err,))
            self.history.clear()
        return True

    def read_then_clear(self, entries, stacks, estimate):
        """The ring read whole (`read_pickled`) and cleared while PyTorch is still pickling
        its copy (RING_COPY_CPU_S says why), and the checkpoint's state read right after
        the clearing: (the events read, the allocation count at the clearing, the state), or
        None when the job took the recording over meanwhile (nothing cleared). The state is
        read at once, not after the ring's read: vramtop's stitch drops the ring's entries
        up to the state's own `snapshot` entry and puts in what the state says changed, so
        the state read late would make a gap of its own.

        The read runs on a helper thread (ctypes lets the GIL go for it); the clear follows
        its call by about the copy's time of the helper's own CPU (`wait_for_the_copy`), so
        the events in no piece are those of a fraction of a millisecond, not of the whole
        read, and a helper kept waiting for the allocator's lock or a core is waited for.
        A clear that comes while the copy runs waits for the allocator's lock. One that came
        before the copy all the same leaves the read holding only what followed the clear:
        restart_ring tells it by its size and begins the history again at this checkpoint,
        as for a ring that was not read whole."""
        read = {}

        def reader():
            clock = cpu_clock_of_this_thread()

            def at_call():
                # No clock, or one that cannot be read: the wait is for the reader's end.
                try:
                    read.setdefault("call", (clock, time.clock_gettime(clock)))
                except (OSError, TypeError):
                    read.setdefault("call", (None, 0.0))

            read["events"] = self.read_pickled(before_call=at_call)

        helper = threading.Thread(target=reader, name="vramtop-ring-read", daemon=True)
        helper.start()
        try:
            wait_for_the_copy(helper, lambda: read.get("call"),
                              RING_COPY_CPU_S + RING_COPY_S_PER_ENTRY * max(0, estimate or 0))
            if self.user_history or not self.ring_entries:
                return None
            count = self.allocation_count()
            self.clear_ring(entries, stacks)
            state = self.read_pickled()
        finally:
            helper.join()
        return read.get("events"), count, state

    def read_pickled(self, before_call=None):
        """The snapshot as PyTorch pickles it (PickledSnapshot), or None; a reader that
        fails once is not used again."""
        if self.pickled is None:
            return None
        try:
            return self.pickled.read(before_call)
        except Exception as err:
            say_once("pickled", "cannot read the event ring off the GIL (%r): history from the last checkpoint only" % (err,))
            self.pickled = None
            self.history.clear()
            return None

    def keep_history(self, events, state, from_start):
        """Adds a checkpoint to the history: after the ring read whole before it (the job's
        whole ring `from_start`, at the first checkpoint of a ring begun before the job's
        first allocation), or as the history's new beginning when the ring was not read
        whole (or the history is off)."""
        if self.pickled is None or state is None:
            self.history.clear()
            return
        try:
            continues = events is not None and (bool(self.history.pieces) or from_start)
            if continues:
                self.history.add(events, state)
            else:
                self.history.restart(state)
        except Exception as err:
            say_once("history", "cannot keep the allocator history (%r): from the last checkpoint only" % (err,))
            self.history.clear()

    def history_of(self):
        """The history pieces for an OOM's file (`History.of`), or None."""
        return self.history.of() if self.pickled is not None else None

    def retire_ring(self, recording_stacks):
        """Turn the ring off for good (history back to its own form): for a ring the hook
        cannot restart. Off first, always (restart_ring says why)."""
        self.ring_entries = 0
        self.ring_fill = 0
        self.checkpoint = None
        self.history.clear()
        if self.user_history:
            return  # the job's own settings stand
        try:
            self._record(enabled=None)
        except Exception as err:
            say_once("ring", "cannot turn the event ring off (%r)" % (err,))
            return
        if self._history_forms is not None:
            self._record_on, self._record_off = self._history_forms
            if recording_stacks:
                self.set_recording(True)

    def start_history(self):
        """Record each live block's allocation stack, with no trace ring to pay for.

        enabled="state" keeps a context on each live block only: _record_memory_history's
        C++ side then sets the trace ring to 1 entry (torch/csrc/cuda/memory_snapshot.cpp:
        `max_entries = enabled == "all" ? max_entries : 1`), while malloc still gathers the
        Python stack for every block (RecordContext::STATE). The 160 ms snapshots seen with
        an 86k-entry ring were the ring being symbolised, which this avoids.
        """
        if self._record is None:
            self.missing.append("no torch.cuda.memory._record_memory_history: no allocation sites")
            return
        record = self._record
        if self.ring_entries:
            # With the ring: stacks for live blocks on top of it, and "off" keeps the ring.
            ring_forms = (
                lambda: self.record_ring(self.ring_entries, stacks=True),
                lambda: self.record_ring(self.ring_entries, stacks=False),
            )
            self._history_forms = (
                lambda: record(enabled="state", context="state", stacks="python"),
                lambda: record(enabled=None),
            )
            try:
                ring_forms[0]()
            except Exception as err:
                self.missing.append("history refused: %r" % (err,))
                return
            self._record_on, self._record_off = ring_forms
            self.history_on = True
            return
        forms = (
            (lambda: record(enabled="state", context="state", stacks="python"), lambda: record(enabled=None)),
            # the boolean form of older releases
            (lambda: record(True, record_context=True, trace_alloc_max_entries=1), lambda: record(False)),
        )
        for turn_on, turn_off in forms:
            try:
                turn_on()
            except TypeError:
                continue
            except Exception as err:
                self.missing.append("history refused: %r" % (err,))
                return
            # Later switches (HistoryDuty) use the form that worked.
            self._record_on, self._record_off = turn_on, turn_off
            self.history_on = True
            return
        self.missing.append("history refused: no form of _record_memory_history was accepted")

    def set_recording(self, on):
        """Turn the recording of new allocations' stacks on or off. Blocks already live
        keep the stack they were recorded with; those allocated while it is off have none.
        Once the job set history itself, nothing is switched (its settings stand)."""
        if self.user_history:
            return True
        try:
            (self._record_on if on else self._record_off)()
            return True
        except Exception as err:
            say_once(
                "history-duty",
                "cannot switch history %s (%r): it stays %s from now on"
                % ("on" if on else "off", err, "off" if on else "on"),
            )
            return False

    def allocation_count(self):
        """How many allocations the job has made so far, on all its devices (None if
        unknown). The raw nested stats: memory_stats() would flatten ~100 keys per call."""
        raw = getattr(getattr(self.torch, "_C", None), "_cuda_memoryStats", None)
        try:
            total = 0
            for device in range(self.torch.cuda.device_count()):
                if raw is not None:
                    total += int(raw(device)["allocation"]["all"]["allocated"])
                else:
                    total += int(self._stats(device).get("allocation.all.allocated", 0))
            return total
        except Exception:
            return None

    def frames_recorded(self):
        """Whether PyTorch may be gathering Python stacks (ours with history, or the job's)."""
        return self.history_on or self.user_history

    @staticmethod
    def symbolizer_ready():
        """Whether a snapshot can turn recorded Python frames into text without importing.

        PyTorch symbolizes them (combined_traceback.cpp) behind `hasattr(torch, "_inductor")`,
        and torch's lazy __getattr__ imports torch._inductor then, with torch._dynamo: 3.6 s
        on the H100, the first time. From the hook's thread that import races the job's own
        imports of those modules, which import each other: a job whose optimizer imported
        torch._dynamo at that moment died of "cannot import name 'IndentedBuffer' from
        partially initialized module 'torch._inductor.utils'". So only the job's own thread
        imports it (`import_symbolizer`), and the hook's thread waits until it is there."""
        module = sys.modules.get("torch._inductor")
        spec = getattr(module, "__spec__", None)
        return module is not None and not getattr(spec, "_initializing", False)

    def import_symbolizer(self):
        """On the job's own thread (its CUDA init, its own history call, an OOM): import
        torch._inductor before Python stacks are recorded, so the hook's thread never does."""
        if self.symbolizer_ready():
            return
        try:
            import importlib

            importlib.import_module("torch._inductor")
        except Exception:
            pass

    def raw_snapshot(self, on_job_thread=False):
        """What torch.cuda.memory._snapshot() returns (segments only where it is missing).
        None from the hook's thread while recorded frames cannot be symbolized without an
        import (`symbolizer_ready`)."""
        if self.blocks_untracked():
            return None  # it refuses snapshots: the stats alone (collect)
        if self.frames_recorded() and not self.symbolizer_ready():
            if on_job_thread:
                self.import_symbolizer()
            else:
                say_once(
                    "symbolizer",
                    "the job records Python stacks but has not imported torch._inductor, which "
                    "PyTorch imports to read them: the map waits until it has (importing it from "
                    "the hook's thread could break the job's own imports)",
                )
                return None
        if self._snapshot is not None:
            return self._snapshot()
        if self._memory_snapshot is not None:
            return {"segments": self._memory_snapshot(), "device_traces": []}
        return None

    def collect(self, device=None, raw=None, segments=True):
        """The allocator's state for one device: stats, settings, segments with blocks.
        `raw` is a snapshot already taken (`raw_snapshot`), else one is taken here; without
        `segments` none is taken (`segments_omitted`: the viewer keeps its last ones)."""
        if not segments:
            device = self.last_device if device is None else device
            return {
                "device": device,
                "device_uuid": self.device_uuid(device),
                "stats": self.stats(device),
                "settings": self.settings(self._last_raw_settings),
                "segments": [],
                "segments_omitted": True,
                "truncated": False,
                "roles": self.roles.of(device),
            }
        if raw is None:
            raw = self.raw_snapshot()
            if raw is None and self.frames_recorded():
                # Not read (`raw_snapshot`): the viewer keeps its last map, says it waits.
                return self.collect(device=device, segments=False)
        raw_segments = (raw or {}).get("segments") or []
        raw_settings = (raw or {}).get("allocator_settings")
        self._last_raw_settings = raw_settings
        if self.ring_entries:
            self.ring_fill = max([len(t) for t in (raw or {}).get("device_traces") or []] or [0])
        if device is None:
            device = self.pick_device(raw_segments)
        self.last_device = device
        segments, truncated = self.convert_segments(raw_segments, device)
        return {
            "device": device,
            "device_uuid": self.device_uuid(device),
            "stats": self.stats(device),
            "settings": self.settings(raw_settings),
            "segments": segments,
            "truncated": truncated,
            "roles": self.roles.of(device),
        }

    def device_uuid(self, device):
        """The GPU's UUID as torch reports it: the same GPU in every process, whatever its
        CUDA_VISIBLE_DEVICES makes of the ordinal. None where torch does not say."""
        cache = self._uuids
        if device not in cache:
            uuid = None
            try:
                raw = getattr(self.torch.cuda.get_device_properties(device), "uuid", None)
                uuid = str(raw) if raw is not None else None
            except Exception:
                pass
            cache[device] = uuid
        return cache[device]

    def pick_device(self, raw_segments):
        """The job's device: the one it holds most memory on. (The current device is per
        thread, so ours says nothing about the job's; a job spread over several devices in
        one process shows its largest.)"""
        held = {}
        for segment in raw_segments:
            dev = segment.get("device", 0)
            held[dev] = held.get(dev, 0) + int(segment.get("total_size", 0) or 0)
        if not held and self.blocks_untracked():
            return self.device_most_reserved()
        if not held:
            return self.last_device
        return max(sorted(held), key=lambda d: held[d])

    def device_most_reserved(self):
        """With no segments to tell (a backend that tracks none), the device the job holds
        most memory on by PyTorch's totals: a rank on cuda:3 is not shown cuda:0's 0 B.
        Asking each device costs none a context: cudaMallocAsync's getDeviceStats answers
        zeros for a device it has not initialised (CUDAMallocAsyncAllocator.cpp)."""
        try:
            if self._device_count is None:
                self._device_count = int(self.torch.cuda.device_count())
            reserved = {d: self.current(d, ("reserved_bytes",))[0] or 0 for d in range(self._device_count)}
        except Exception:
            return self.last_device
        if not any(reserved.values()):
            return self.last_device
        return max(sorted(reserved), key=lambda d: reserved[d])

    def current(self, device, names):
        """PyTorch's current figures `names` ("allocated_bytes", ...) on `device`, each an
        int or None. The nested stats are read unflattened (memory_stats flattens ~150
        keys for the few figures wanted). A pluggable allocator refuses stats too: Nones."""
        try:
            if self._raw_stats is not None:
                raw = self._raw_stats(device) or {}
                values = [((raw.get(n) or {}).get("all") or {}).get("current") for n in names]
            else:
                flat = (self._stats(device) or {}) if self._stats else {}
                values = [flat.get("%s.all.current" % n) for n in names]
        except Exception:
            if not self.blocks_untracked():
                raise
            values = [None] * len(names)
        return [int(v) if isinstance(v, (int, float)) else None for v in values]

    def allocated_now(self, device):
        return self.current(device, ("allocated_bytes",))[0]

    def allocated_reserved(self, device):
        """(allocated, reserved) bytes on `device` now, or None."""
        now = self.current(device, ("allocated_bytes", "reserved_bytes"))
        return tuple(now) if None not in now else None

    def sample_allocated(self):
        """One row of the allocated series for each device the job has allocated on."""
        if self._device_count is None:
            self._device_count = int(self.torch.cuda.device_count())
        now = time.time()
        for device in range(self._device_count):
            allocated = self.allocated_now(device)
            if allocated or device in self.series.rows:
                self.series.add(device, now, allocated or 0)

    def sample_at_step(self, optimizer, now):
        """A row of the step series, on the device of the optimizer's first parameter.
        Runs on the job's thread: one stats read at most every period (tens of µs)."""
        self.step_series.next_due = now + self.step_series.period
        device = self.last_device
        try:
            index = optimizer.param_groups[0]["params"][0].device.index
            if index is not None:
                device = int(index)
        except Exception:
            pass
        allocated = self.allocated_now(device)
        if allocated is not None:
            self.step_series.add(device, now, allocated)

    def stats(self, device):
        raw = {}
        if self._stats is not None:
            try:
                raw = self._stats(device) or {}
            except Exception:
                # A pluggable allocator refuses memory_stats ("does not yet support
                # getDeviceStats"): its figures are unknown, the state still goes.
                if not self.blocks_untracked():
                    raise
        out = {}
        for name, key in STAT_KEYS:
            value = raw.get(key)
            out[name] = int(value) if isinstance(value, (int, float)) else None
        return out

    def settings(self, raw_settings):
        env = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF")
        if self._settings_string is not None:
            try:
                env = str(self._settings_string()) or env
            except Exception:
                pass
        if isinstance(raw_settings, dict):
            split = raw_settings.get("max_split_size")
            gc = raw_settings.get("garbage_collection_threshold")
            expandable = raw_settings.get("expandable_segments")
            return {
                "expandable_segments": expandable if isinstance(expandable, bool) else None,
                # -1 is SIZE_MAX seen through int64: no limit.
                "max_split_size": split if isinstance(split, int) and split >= 0 else None,
                "roundup_power2_divisions": raw_settings.get("roundup_power2_divisions"),
                "garbage_collection_threshold": float(gc) if isinstance(gc, (int, float)) else None,
                "raw": env or raw_settings.get("PYTORCH_CUDA_ALLOC_CONF") or None,
            }
        conf = parse_alloc_conf(env or "")
        expandable = conf.get("expandable_segments")
        split_mb = conf.get("max_split_size_mb", "")
        gc = conf.get("garbage_collection_threshold", "")
        return {
            "expandable_segments": (expandable.lower() == "true") if expandable else False,
            "max_split_size": int(split_mb) * 1048576 if split_mb.isdigit() else None,
            "roundup_power2_divisions": conf.get("roundup_power2_divisions"),
            "garbage_collection_threshold": _float_or_none(gc),
            "raw": env or None,
        }

    def convert_segments(self, raw_segments, device):
        """Protocol segments for `device`, at most MAX_BLOCKS blocks in all."""
        segments, count, truncated = [], 0, False
        for raw in raw_segments:
            if raw.get("device", device) != device:
                continue
            address = int(raw.get("address", 0))
            blocks = []
            for block in raw.get("blocks") or ():
                if count >= MAX_BLOCKS:
                    truncated = True
                    break
                size = int(block.get("size", 0))
                address = int(block.get("address", address))
                state = block.get("state")
                blocks.append(
                    {
                        "address": address,
                        "size": size,
                        "requested_size": int(block.get("requested_size", 0) or 0),
                        "state": state if state in BLOCK_STATES else "inactive",
                        "site": self.site(block.get("frames")) if self.history_on else None,
                    }
                )
                address += size
                count += 1
            segments.append(
                {
                    "address": int(raw.get("address", 0)),
                    "total_size": int(raw.get("total_size", 0)),
                    "stream": int(raw.get("stream", 0) or 0),
                    "segment_type": "small" if raw.get("segment_type") == "small" else "large",
                    "is_expandable": bool(raw.get("is_expandable", False)),
                    "blocks": blocks,
                }
            )
            if truncated:
                break
        return segments, truncated

    def site(self, frames):
        """The innermost frame of the user's code: not torch, site-packages or the stdlib."""
        for frame in frames or ():
            filename = frame.get("filename") or ""
            if not self.is_internal(filename):
                return "%s:%s %s" % (filename, frame.get("line", 0), frame.get("name", "?"))
        return None

    def is_internal(self, filename):
        known = self._internal_cache.get(filename)
        if known is None:
            known = (
                filename.startswith("<frozen")
                or "/site-packages/" in filename
                or "/dist-packages/" in filename
                or filename.startswith(self.internal_prefixes)
            )
            if len(self._internal_cache) < 8192:
                self._internal_cache[filename] = known
        return known

    def _internal_prefixes(self):
        import sysconfig

        dirs = [os.path.dirname(os.path.abspath(__file__))]
        torch_file = getattr(self.torch, "__file__", None)
        if torch_file:
            dirs.append(os.path.dirname(os.path.abspath(torch_file)))
        paths = sysconfig.get_paths()
        dirs += [paths.get("stdlib"), paths.get("platstdlib")]
        return tuple(os.path.join(d, "") for d in dirs if d)


def takes_keyword(function, name):
    """Whether `function`'s signature names the keyword `name` (False where it cannot be
    read: a keyword is passed only where it is known to be taken)."""
    import inspect

    try:
        return name in inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False


def _float_or_none(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None
