"""vramtop's hook inside a PyTorch job: serves the CUDA caching allocator's live state to
vramtop viewers over a Unix socket (protocol v1, crates/vramtop-attach/PROTOCOL.md).

Entered through sitecustomize.py (beside this file) when the job imports torch, or by hand:
`import vramtop_hook; vramtop_hook.start()` (a notebook). One daemon thread waits for torch
and for CUDA to be initialised by the job (it never initialises CUDA itself), listens on
`vramtop-<pid>.sock`, and sends each subscribed viewer a `state` at its interval.

Rules this file keeps: never raise into the job (every entry point is wrapped); never block
the job on a viewer (non-blocking sockets; a frame that cannot go out is dropped, only the
remainder of a frame already begun is kept); say once on stderr what it could not do.
Python 3.8+, stdlib only. Optional torch APIs are found by feature (hasattr), not version.
"""

import atexit
import collections
import json
import os
import selectors
import socket
import stat
import struct
import sys
import threading
import time
import weakref

HOOK_VERSION = "1.5.0"
PROTOCOL_VERSION = 1
MAX_FRAME = 16 * 1024 * 1024
# Viewers only ever send `subscribe`; a bigger frame from one is garbage, not a request.
MAX_VIEWER_FRAME = 64 * 1024
MAX_VIEWERS = 32
INTERVAL_RANGE = (0.05, 3600.0)
POLL_S = 0.25  # how often to look for torch / CUDA before they are there
# A viewer that takes nothing for this long is dropped. Tests shorten it.
def _env_float(name, default):
    """A positive, finite number from the environment; else the default, said once."""
    text = os.environ.get(name, "")
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not (0.0 < value < float("inf")):
        sys.stderr.write("vramtop hook: %s=%r is not a positive number; using %g\n" % (name, text, default))
        return default
    return value


STALL_S = _env_float("VRAMTOP_HOOK_STALL_S", 10.0)
# History's price is PyTorch's: every allocation it records gathers the job's Python stack.
# On the H100 a GPT-2 training step (transformers, 8 layers) makes 958 allocations in 28 ms,
# and recording them all cost it 4.3 to 8.8 % (1.2 to 2.6 us each; history_ab.py, in one
# process). To keep the job well within 5 %, the hook records allocations for a share of
# each HISTORY_PERIOD_S, chosen each period so that at most HISTORY_RATE allocations per
# second are recorded (5,000: 19 % of that job's second, 1 to 2 % of its time). A job that
# allocates less (where a leak is easiest to miss in the noise) is recorded whole.
HISTORY_PERIOD_S = 1.0
HISTORY_RATE = _env_float("VRAMTOP_HISTORY_RATE", 5000.0)
HISTORY_MIN_SHARE = 0.02
# A state read that costs ten times the one before is not paced on, once per this many
# seconds (Hook.state_frame says why): at most one such read per 10 minutes is spent
# beyond the 1 % budget.
FORGIVE_S = 600.0


def _env_entries(name, default):
    """A count of ring entries from the environment (0 turns the ring off)."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        sys.stderr.write("vramtop hook: %s=%r is not a count of entries; using %d\n" % (name, text, default))
        return default
    return value


# The event ring: PyTorch's own trace of alloc/free/segment events (no stacks), from which
# the job's history is replayed under each remedy at an OOM (`vramtop replay` does; so
# does the viewer, from the file kept at the OOM). Recording an event is a push under the
# allocator's lock: +0.04 % of a GPT-2 step with 8,192 entries, +0.47 % with 200,000 (95 %
# intervals -0.07 to +0.14 and -0.09 to +1.03; ring_cost.py on an H100). Reading is what
# costs: PyTorch turns every entry into a dict at each _snapshot(), 0.8 us an entry (3.7 ms
# at 4,096 entries, 69 ms at 65,536; 0.55 ms without), holding the GIL. So:
# - A state read never pays for a ring that may hold more than READ_RING_MAX entries: it
#   sends stats only, and the viewer keeps the block map of the last read that had one.
# - Before the ring can fill, the hook takes a checkpoint: history off (which clears the
#   ring: nothing converted), on again, and a snapshot that now converts only the entries
#   made since (a handful). That snapshot's segments, kept in memory, plus every event of
#   the ring since, is the job's history from then on: an OOM's file carries both
#   (`vramtop_oom.checkpoint`), and a replay starts from the checkpoint's segments.
# - Whether it may fill is told without reading it: the allocations since the checkpoint
#   (the raw stats, 15 us, every RING_CHECK_S, or sooner where the job allocates fast:
#   `ring_look_period`), counted as 3 entries each (alloc, free_requested, free_completed)
#   and checkpointed at half the ring, which leaves room for a quarter of the ring between
#   looks.
RING_ENTRIES = _env_entries("VRAMTOP_RING", 65536)
RING_CHECK_S = 0.25
# Optimizer steps remembered for a replay (a float each).
STEP_MARKS = 4096
READ_RING_MAX = 4096
# The job's allocated bytes, sampled from its start (one memory_stats call a device each
# SERIES_PERIOD_S, on the hook's thread): a leak shows as a floor that rises and never falls
# back. At SERIES_MAX samples pairs merge (keeping each pair's low and high) and the period
# doubles, so the series covers the whole job in bounded memory.
SERIES_PERIOD_S = 0.5
SERIES_MAX = 1024
ENTRIES_PER_ALLOCATION = 3
# Hook 1.5: the ring is read whole before each checkpoint clears it, so that an OOM's file
# holds the job's history from its start (or, past HISTORY_MAX_MB, from an older
# checkpoint) rather than from the last checkpoint only. Read through PyTorch's C++
# `_memory_snapshot_pickled()` (PickledSnapshot), which ctypes calls without the GIL: on an
# H100 (2.11, GPT-2 8 layers, 108k ring entries a second, blocks alternating in one process)
# the step took -0.27 % longer (95 %: -0.93 to +0.39) reading the ring every 0.35 s so,
# against +6.9 % with _snapshot(), which turns each entry into a dict under the GIL. The
# bytes are kept as PyTorch pickled them, zlib-compressed (also without the GIL): nothing
# here unpickles them (that alone cost +5.4 %); vramtop reads them at the OOM.
HISTORY_MAX_MB = _env_float("VRAMTOP_HISTORY_MB", 32.0)
PICKLED_SNAPSHOT_SYMBOL = "_ZN5torch4cuda24_memory_snapshot_pickledB5cxx11Ev"

_said = set()


def env_int(name):
    """A launcher's rank variable (torchrun, accelerate, deepspeed set RANK, LOCAL_RANK,
    WORLD_SIZE), or None when absent or not a whole number >= 0."""
    try:
        value = int(os.environ.get(name, ""))
    except ValueError:
        return None
    return value if value >= 0 else None


def say_once(key, text):
    """One line on stderr per kind of problem, for the life of the process."""
    if key in _said:
        return
    _said.add(key)
    try:
        sys.stderr.write("vramtop hook: %s\n" % text)
        sys.stderr.flush()
    except Exception:
        pass


def ring_look_period(count, last, now, entries):
    """Seconds to the next look at the ring: RING_CHECK_S, or sooner where at the pace since
    the last look (`last`: its time and allocation count) a quarter of the ring would fill
    before then, so that a look always comes before a ring checkpointed at half full can
    wrap (hook 1.5 reads it whole only then). 10 ms at the least: a look is one stats read."""
    if count is None or last is None or now <= last[0] or last[1] is None:
        return RING_CHECK_S
    rate = ENTRIES_PER_ALLOCATION * max(0, count - last[1]) / (now - last[0])
    if rate <= 0:
        return RING_CHECK_S
    return max(0.01, min(RING_CHECK_S, 0.25 * entries / rate))


class ProtocolError(Exception):
    """The peer broke framing; the connection is dropped."""


def encode(message):
    """One frame: 4-byte big-endian length, then compact UTF-8 JSON."""
    body = json.dumps(message, separators=(",", ":"), allow_nan=False).encode("utf-8")
    if len(body) > MAX_FRAME:
        raise ValueError("frame of %d bytes is over the 16 MiB limit" % len(body))
    return struct.pack(">I", len(body)) + body


class FrameReader:
    """Splits a byte stream into JSON objects; any framing fault raises ProtocolError."""

    def __init__(self, limit=MAX_FRAME):
        self.limit = limit
        self.buffer = bytearray()

    def feed(self, data):
        self.buffer += data
        messages = []
        while len(self.buffer) >= 4:
            (length,) = struct.unpack(">I", bytes(self.buffer[:4]))
            if length > self.limit:
                raise ProtocolError("frame of %d bytes is over the limit" % length)
            if len(self.buffer) < 4 + length:
                break
            body = bytes(self.buffer[4 : 4 + length])
            del self.buffer[: 4 + length]
            try:
                message = json.loads(body.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as err:
                raise ProtocolError("bad frame: %s" % err)
            if not isinstance(message, dict) or not isinstance(message.get("type"), str):
                raise ProtocolError("a frame is not an object with a string type")
            messages.append(message)
        return messages


def socket_dir():
    """Where sockets live (PROTOCOL.md "Where")."""
    explicit = os.environ.get("VRAMTOP_SOCKET_DIR")
    if explicit:
        return explicit
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "vramtop")
    return "/tmp/vramtop-%d" % os.getuid()


def private_dir(path):
    """Create `path` 0700 if needed; None (and one line) if it is not ours alone."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.lstat(path)
    except OSError as err:
        say_once("dir", "cannot use %s (%s); no live view for this job" % (path, err))
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        say_once("dir", "%s is not a directory owned by you; no live view" % path)
        return None
    if info.st_mode & 0o077:
        say_once(
            "dir",
            "%s can be read or written by others (mode %o); no live view. "
            "Run: chmod 700 %s" % (path, info.st_mode & 0o777, path),
        )
        return None
    return path


# What peer_uid returns where it cannot tell: refused (see viewer_allowed).
UNKNOWN_PEER = -1


def peer_uid(sock):
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED, Linux); None
    where the system has no SO_PEERCRED (macOS: then the socket's and its directory's
    modes are the only gate), UNKNOWN_PEER where it has one but it failed."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    try:
        # struct ucred: pid_t (signed), uid_t and gid_t (unsigned).
        size = struct.calcsize("iII")
        _pid, uid, _gid = struct.unpack("iII", sock.getsockopt(socket.SOL_SOCKET, option, size))
    except (OSError, struct.error):
        return UNKNOWN_PEER
    return uid


def viewer_allowed(uid):
    """A viewer may connect when it runs as the job's own user or as root (who can read
    any file anyway). Without SO_PEERCRED (None) the file modes decide; where the check
    failed (UNKNOWN_PEER) the viewer is refused."""
    return uid is None or uid == 0 or uid in (os.getuid(), os.geteuid())


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


class PickledSnapshot:
    """`torch::cuda::_memory_snapshot_pickled()`: the snapshot _snapshot() returns, pickled
    by PyTorch's C++ (protocol 2) instead of built as Python objects. Not bound to Python;
    libtorch_cuda.so exports it, and a ctypes call releases the GIL for its whole length,
    so the job's thread runs on while it converts the ring (the allocator's lock is held
    only while the ring is copied: 3.5 ms for 65,536 entries on the H100).

    It returns a std::string, which the x86-64 System V ABI returns through a hidden
    pointer passed first: `read` passes a buffer for it, copies the bytes out and frees
    them with libc's free (libstdc++'s operator delete). Used only where that is exactly
    so: Linux on x86-64, the cxx11 string ABI, the symbol under its mangled name (which
    fixes the signature: no arguments). VRAMTOP_RING_READ=0 turns it off."""

    def __init__(self, function, holding_gil, free):
        self._function = function
        self._holding_gil = holding_gil
        self._free = free

    @classmethod
    def find(cls, torch):
        """The reader, or (None, why not)."""
        if os.environ.get("VRAMTOP_RING_READ", "1") == "0":
            return None, "VRAMTOP_RING_READ=0"
        import platform

        if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"):
            return None, "reading the ring off the GIL needs Linux on x86-64"
        if getattr(getattr(torch, "_C", None), "_GLIBCXX_USE_CXX11_ABI", None) is not True:
            return None, "this torch is not built with the cxx11 string ABI"
        path = os.path.join(os.path.dirname(getattr(torch, "__file__", "") or ""), "lib", "libtorch_cuda.so")
        if not os.path.exists(path):
            return None, "no libtorch_cuda.so beside torch"
        try:
            import ctypes

            # Already loaded by torch: these only take handles on it. Through CDLL a call
            # releases the GIL; through PyDLL it keeps it.
            function = getattr(ctypes.CDLL(path), PICKLED_SNAPSHOT_SYMBOL)
            holding_gil = getattr(ctypes.PyDLL(path), PICKLED_SNAPSHOT_SYMBOL)
            free = ctypes.CDLL(None).free
        except (OSError, AttributeError):
            return None, "this torch does not export _memory_snapshot_pickled"
        for f in (function, holding_gil):
            f.argtypes = [ctypes.c_void_p]
            f.restype = ctypes.c_void_p
        free.argtypes = [ctypes.c_void_p]
        free.restype = None
        return cls(function, holding_gil, free), None

    def read(self, hold_gil=False):
        """The pickled snapshot, as bytes. `hold_gil`: the job's threads wait meanwhile
        (for a small read that must not let the job run on, as at a checkpoint)."""
        import ctypes

        # std::string (libstdc++, cxx11): data pointer, size, then 16 bytes of inline buffer.
        out = ctypes.create_string_buffer(32)
        base = ctypes.addressof(out)
        (self._holding_gil if hold_gil else self._function)(base)
        data, size = struct.unpack_from("=QQ", out.raw, 0)
        try:
            return ctypes.string_at(data, size)
        finally:
            if data != base + 16:
                self._free(data)


class History:
    """The job's allocator history in pieces (hook 1.5), for the file kept at an OOM: the
    ring as read just before each checkpoint cleared it (`events`), and the snapshot taken
    just after (`state`), each as PyTorch pickled it, zlib-compressed. In order: [events,
    state, events, state, ...] from the job's first allocation (`from_start`), else [state,
    events, state, ...] from an older checkpoint. The events between a ring's read and its
    clearing are in no piece: vramtop puts in what the next `state` says changed.

    Pieces are added as read (`add`, while a checkpoint holds the job back: an OOM then
    finds the checkpoint and the history before it in step) and compressed after (`pack`).
    Past `limit` bytes the oldest pieces go, an events piece with the state before it, so
    the history then begins at a later checkpoint."""

    def __init__(self, limit):
        self.limit = limit
        self.pieces = collections.deque()  # (kind, bytes, compressed)
        self.bytes = 0

    def restart(self, state):
        """The history begins anew at the checkpoint `state` (none before it is whole)."""
        self.clear()
        self._add("state", state)

    def clear(self):
        self.pieces.clear()
        self.bytes = 0

    def add(self, events, state):
        """The ring read before a checkpoint (`events`: every entry since the last one, or
        since the job's start when there were no pieces yet) and the checkpoint `state`."""
        self._add("events", events)
        self._add("state", state)

    def _add(self, kind, data):
        self.pieces.append((kind, data, False))
        self.bytes += len(data)

    def pack(self):
        """Compresses the pieces added since (zlib releases the GIL), then keeps to `limit`.
        Each piece is replaced whole, in one store: an OOM reading them meanwhile sees it
        as read or compressed, never half of each."""
        import zlib

        for i, (kind, data, packed) in enumerate(list(self.pieces)):
            if not packed:
                small = zlib.compress(data, 1)
                self.pieces[i] = (kind, small, True)
                self.bytes += len(small) - len(data)
        while self.bytes > self.limit and len(self.pieces) > 2:
            for _ in range(2 if self.pieces[0][0] == "state" else 1):
                self.bytes -= len(self.pieces.popleft()[1])

    def of(self):
        """What an OOM's file carries (`vramtop_oom.history`), or None without pieces."""
        pieces = list(self.pieces)
        if not pieces:
            return None
        return {
            "version": 1,
            "from_start": pieces[0][0] == "events",
            "pieces": [
                {"kind": kind, ("zlib" if packed else "pickle"): data} for kind, data, packed in pieces
            ],
        }


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
        # Hook 1.5: the ring read off the GIL before each checkpoint, and what it read.
        self.pickled = None
        self.history = History(int(HISTORY_MAX_MB * 1024 * 1024))
        self.generation = 0  # checkpoints taken so far
        self._uuids = {}  # device -> its GPU's UUID (device_uuid)
        # When the job's optimizers stepped (time.time()), the last STEP_MARKS of them: a
        # replay empties the cache there to judge `empty_cache()` between steps.
        self.steps = collections.deque(maxlen=STEP_MARKS)
        self.series = AllocatedSeries()
        self.roles = RoleWatch(torch, self.allocated_reserved)
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
        self.watch_steps(torch)
        if self.roles.watch_models():
            self.capabilities.append("model_roles")
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

    def record_ring(self, entries, stacks=False):
        """Turn the ring of `entries` on (with stacks for live blocks when `stacks`).

        Annotations are recorded by a callback PyTorch registers per thread unless asked for
        a global one; the ring starts in the job's thread (CUDA's init) and is restarted from
        ours, and a thread-local callback removed from another thread makes PyTorch warn
        "Requested callback is not found" on the job's stderr. Global, it is found."""
        context = "state" if stacks else None
        try:
            self._record(enabled="all", context=context, stacks="python", max_entries=entries, global_record_annotations=True)
        except TypeError:
            self._record(enabled="all", context=context, stacks="python", max_entries=entries)

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
        return ENTRIES_PER_ALLOCATION * max(0, count - self.ring_start_count)

    def ring_may_be_full(self):
        """True when the ring may be half full by now: time for a checkpoint (RING_ENTRIES)."""
        if not self.ring_entries:
            return False
        if not self.ring_from_start and self.checkpoint is None:
            return True  # no start to replay from yet: the checkpoint is one
        estimate = self.ring_estimate()
        return estimate is None or 2 * estimate >= self.ring_entries

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
        cp = self.checkpoint
        if cp is None:
            return None
        skips = cp["skip"]
        return {
            "time_s": cp["time_s"],
            "skip": skips[device] if 0 <= device < len(skips) else 0,
            "segments": [seg for seg in cp["segments"] if seg.get("device", device) == device],
        }

    def restart_ring(self, stacks):
        """Checkpoint: read the ring whole where that is cheap and safe (hook 1.5: off the
        GIL, kept in `history`), clear it, and keep the allocator's segments now (see
        RING_ENTRIES). Returns the snapshot taken, or None when the ring is gone.

        Off first, always: only turning history off clears PyTorch's ring, and shrinking
        one in place (enabled="state" sets 1 entry) leaves a wrapped ring writing past its
        end: on the H100 (2.11) that killed the job with SIGSEGV. The snapshot is taken with
        the ring already on again, so no event falls between the two. Reading the segments
        writes a `snapshot` entry to the ring under the allocator's lock: a replay starts
        from these segments and the events after that entry.

        An OOM in another thread while this runs finds `restarting` set: its file says the
        history is not complete (the ring is cleared before the new checkpoint is kept)."""
        if self.user_history or not self.ring_entries:
            return None
        entries = self.ring_entries
        # The ring since the last checkpoint (or the job's start), read whole off the GIL
        # before it is cleared: with no stacks in it (symbolising them takes the GIL) and
        # none of it overwritten (at most half full when checkpoints keep pace).
        first = self.checkpoint is None
        plain = not stacks and not self.frames_recorded()
        whole = (not first or self.ring_from_start) and plain
        # The estimate counts 3 entries an allocation and nothing else (segment events,
        # snapshot entries): a ring near full may have dropped its oldest, so a margin.
        estimate = self.ring_estimate()
        whole = whole and estimate is not None and estimate < 0.8 * self.ring_entries
        whole = whole and self.ring_fill < self.ring_entries
        events = self.read_pickled() if whole else None
        if self.user_history or not self.ring_entries:
            return None  # the job took the recording over while we read: it is the job's now
        count = self.allocation_count()
        self.restarting = True
        state = None
        try:
            self._record(enabled=None)
            self.record_ring(entries, stacks=stacks)
            # Holding the GIL: the job may not run out of memory between the ring's clearing
            # and the checkpoint that its next entries follow on from.
            state = self.read_pickled(hold_gil=True) if self.pickled is not None and plain else None
            if state is not None:
                import pickle

                raw = pickle.loads(state)
            else:
                raw = self.raw_snapshot() or {}
        except Exception as err:
            say_once("ring", "cannot restart the event ring (%r): no history from here" % (err,))
            # Off for good, off first (a ring left on would be read whole at every state,
            # and the history switches would resize it in place).
            self.restarting = False
            self.retire_ring(stacks)
            return None
        self.ring_start_count = count
        self.ring_fill = max([len(t) for t in raw.get("device_traces") or []] or [0])
        self.checkpoint = {
            "time_s": time.time(),
            "segments": raw.get("segments") or [],
            "skip": [len(t) for t in raw.get("device_traces") or []],
        }
        self.keep_history(events, state, from_start=first and self.ring_from_start)
        # An OOM that read the ring before this checkpoint must not take the checkpoint
        # and history after it (on_oom compares the generation before and after).
        self.generation += 1
        self.restarting = False
        try:
            self.history.pack()
        except Exception as err:
            say_once("history", "cannot keep the allocator history (%r): from the last checkpoint only" % (err,))
            self.history.clear()
        return raw

    def read_pickled(self, hold_gil=False):
        """The snapshot as PyTorch pickles it (PickledSnapshot), or None; a reader that
        fails once is not used again."""
        if self.pickled is None:
            return None
        try:
            return self.pickled.read(hold_gil)
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
        if not held:
            return self.last_device
        return max(sorted(held), key=lambda d: held[d])

    def current(self, device, names):
        """PyTorch's current figures `names` ("allocated_bytes", ...) on `device`, each an
        int or None. The nested stats are read unflattened (memory_stats flattens ~150
        keys for the few figures wanted)."""
        if self._raw_stats is not None:
            raw = self._raw_stats(device) or {}
            values = [((raw.get(n) or {}).get("all") or {}).get("current") for n in names]
        else:
            flat = (self._stats(device) or {}) if self._stats else {}
            values = [flat.get("%s.all.current" % n) for n in names]
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
            raw = self._stats(device) or {}
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


def _float_or_none(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


class Viewer:
    """One connected viewer: what it asked for and the frame still owed to it."""

    def __init__(self, sock, now):
        self.sock = sock
        self.reader = FrameReader(MAX_VIEWER_FRAME)
        self.interval = None  # None until it subscribes
        self.next_due = now
        self.pending = b""  # the rest of the one frame already begun
        self.owed = []  # (kind, frame): kept messages waiting behind `pending`, one per kind
        self.refused_since = None  # first refused write since it last took bytes
        self.events = selectors.EVENT_READ  # what the selector watches it for


class HistoryDuty:
    """Records allocation stacks for a share of each period (see HISTORY_RATE).

    At each period's start the job's allocation rate over the last period sets the share:
    HISTORY_RATE / rate, at least HISTORY_MIN_SHARE, at most all. The recorded window sits
    at a random place in each period: a job whose step divides the period would otherwise
    be recorded at the same point of its step every time, and a leak made elsewhere in the
    step would never get a site. A leak that allocates every step is still recorded in most
    periods when steps are short, and in every period when the job allocates slowly; what
    is not recorded shows as memory with no site.
    """

    def __init__(self, alloc, offset=None):
        self.alloc = alloc
        # offset(room) -> where in [0, room] this period's window starts. From a generator
        # of our own: drawing from `random`'s shared one would change the job's own random
        # numbers (a seeded training run would no longer repeat).
        import random  # here, not at the top: every Python process of the job imports us

        rng = random.Random()
        self.offset = offset or (lambda room: rng.uniform(0.0, room))
        self.share = 1.0
        self.recording = True
        now = time.monotonic()
        self.period_start = now
        self.window = (now, now + HISTORY_PERIOD_S)  # this period's recorded span
        self.next_switch = now + HISTORY_PERIOD_S
        self.last_count = alloc.allocation_count()
        self.broken = False

    def tick(self, now):
        if now < self.next_switch:  # also when broken: next_switch is then infinite
            return
        period_end = self.period_start + HISTORY_PERIOD_S
        if now < period_end:
            opens, closes = self.window
            if not self.recording and opens <= now < closes:
                self.next_switch = closes
                self.switch(True)
            else:
                self.next_switch = period_end
                if self.recording and now >= closes:
                    self.switch(False)  # the share of this period is over
            return
        count = self.alloc.allocation_count()
        elapsed = max(now - self.period_start, 1e-3)
        if count is not None and self.last_count is not None and count >= self.last_count:
            rate = (count - self.last_count) / elapsed
            self.share = 1.0 if rate <= HISTORY_RATE else max(HISTORY_RATE / rate, HISTORY_MIN_SHARE)
        self.last_count = count
        self.period_start = now
        span = HISTORY_PERIOD_S * self.share
        opens = now if self.share >= 1.0 else now + self.offset(HISTORY_PERIOD_S - span)
        self.window = (opens, opens + span)
        if opens <= now:
            self.next_switch = now + span
            if not self.recording:
                self.switch(True)
        else:
            self.next_switch = opens
            if self.recording:
                self.switch(False)

    def switch(self, on):
        if self.alloc.set_recording(on):
            self.recording = on
            return
        # Stop switching, with no further wake-ups (Hook.timeout reads next_switch), and
        # say truly what is recorded from now on: all if it could not be turned off,
        # nothing if it could not be turned back on.
        self.broken = True
        self.next_switch = float("inf")
        self.share = 0.0 if on else 1.0


class RoleWatch:
    """What the job's memory is for: parameters and buffers, gradients, optimizer state.

    Found without scanning the heap. Optimizers: a global optimizer step pre-hook (one set
    add a step). Models: global module forward hooks that note each root module (one whose
    forward runs inside no other) and remove themselves once a root comes round again (the
    job's second step: every model of a step is known) or after MODELS_WATCH_S. Counted on
    the tensors' own storages: each storage once (tied weights, DDP's gradient buckets),
    only those on the device asked about. What no role claims is left to the viewer as
    "other" (activations, temporaries, inputs).

    Where they are read: a gradient is written by the autograd engine's own thread, without
    the GIL, so reading `.grad` from the hook's thread raced it and crashed a GPT-2 job
    (a segfault, on the H100). So for a job with an optimizer the roles are read on the
    job's thread, just after an optimizer step (gradients alive, the step done), once each
    time a viewer's state asked for them (`wanted`), and at an OOM on the thread that hit
    it; a state carries the last reading, with its time. A job with models and no
    optimizer (inference) has no gradients to race: its parameters are read at the state."""

    MODELS_WATCH_S = 60.0

    def __init__(self, torch, totals=None):
        self.torch = torch
        # device -> (allocated, reserved) now: read with the roles, so that what no role
        # claims is told at the same moment.
        self.totals = totals
        self.models = weakref.WeakSet()
        self.optimizers = weakref.WeakSet()
        self.handles = []
        self.local = threading.local()
        self.watch_until = None
        self.wanted = False  # a state asked; the next step reads them
        self.at_step = None  # {device: figures} read just after the last step that read
        self.at_step_time = None

    def watch_models(self):
        module = sys.modules.get("torch.nn.modules.module")
        pre = getattr(module, "register_module_forward_pre_hook", None)
        post = getattr(module, "register_module_forward_hook", None)
        if pre is None or post is None:
            return False
        watch = self
        # Inside a torch.compile'd forward Dynamo traces global hooks; what ours call
        # (time.monotonic, a thread-local) it cannot, and it would warn and break the graph.
        # Traced, they do nothing: the compiled module's own call, outside, is the root.
        compiling = getattr(getattr(self.torch, "compiler", None), "is_compiling", None) or (lambda: False)

        def _vramtop_root_pre(module, args):
            if compiling():
                return None
            try:
                now = time.monotonic()
                if watch.watch_until is not None and now > watch.watch_until:
                    watch.stop_watching()  # whatever the depth: a raising forward leaves it up
                    return None
                depth = getattr(watch.local, "depth", 0)
                watch.local.depth = depth + 1
                if depth:
                    return None
                if watch.watch_until is None:
                    watch.watch_until = now + watch.MODELS_WATCH_S
                if module in watch.models:
                    watch.stop_watching()
                else:
                    watch.models.add(module)
            except Exception:
                pass
            return None

        def _vramtop_root_post(module, args, output):
            if compiling():
                return None
            try:
                watch.local.depth = max(getattr(watch.local, "depth", 1) - 1, 0)
            except Exception:
                pass
            return None

        try:
            first = pre(_vramtop_root_pre)
            try:
                # Run after a forward that raised too (torch 2.2+), or the depth stays up.
                second = post(_vramtop_root_post, always_call=True)
            except TypeError:
                second = post(_vramtop_root_post)
            self.handles = [first, second]
        except Exception:
            return False
        self.quiet_compile_warning()
        return True

    # torch.compile(module) warns at every call while any global module hook exists
    # (OptimizedModule.__call__, PyTorch 2.11): with ours in place a compiled job would print
    # it, and under -W error die of it. Ours alone cause it, so it is ignored while they
    # live, by a filter put first (before -W error's) and taken out with them.
    COMPILE_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks on modules"

    def quiet_compile_warning(self):
        try:
            import warnings

            warnings.filterwarnings("ignore", message=self.COMPILE_WARNING, category=UserWarning)
            self.warning_filter = warnings.filters[0]
        except Exception:
            self.warning_filter = None

    def stop_watching(self):
        handles, self.handles = self.handles, []
        for handle in handles:
            try:
                handle.remove()
            except Exception:
                pass
        entry, self.warning_filter = getattr(self, "warning_filter", None), None
        if entry is not None:
            try:
                import warnings

                warnings.filters.remove(entry)
                warnings._filters_mutated()
            except Exception:
                pass

    def after_step(self):
        """On the job's thread, just after an optimizer step: read the roles if a state
        asked for them since the last reading, or if none was ever read (a job may step a
        few times and then pause: its states must still have a reading). Never raises."""
        if not self.wanted and self.at_step is not None:
            return
        self.wanted = False
        try:
            self.at_step = self.read(list(self.models), list(self.optimizers), grads=True)
        except Exception:
            self.at_step = {}  # read again only when a state asks, not at every step
        self.at_step_time = time.time()

    def of(self, device):
        """For a state, on the hook's thread: {"parameters", "gradients", "optimizer_state"
        (bytes), "models", "optimizers", "time_s" (when read)} for `device`, or None when
        nothing is known yet (it is asked for: the job's next step reads them)."""
        models, optimizers = list(self.models), list(self.optimizers)
        if optimizers:
            self.wanted = True
            figures = (self.at_step or {}).get(device)
            if figures is None:
                return None
            return dict(figures, time_s=self.at_step_time)
        if not models:
            return None
        try:  # no optimizer: no gradients to race; parameters read now
            figures = self.read(models, [], grads=False).get(device)
        except Exception:
            return None
        return dict(figures, time_s=time.time()) if figures else None

    def at_oom(self, device):
        """On the thread that hit the OOM (the job's, or autograd's in a backward, which
        alone writes this device's gradients): the roles now. Never raises."""
        models, optimizers = list(self.models), list(self.optimizers)
        if not models and not optimizers:
            return None
        self.local.depth = 0  # a forward that ran out of memory never came back
        # The main thread, or a thread Python did not start (the autograd engine's, which
        # alone writes this device's gradients), may read them; another Python thread (a
        # prefetcher) may run beside a backward: it takes the last step's reading of them.
        current = threading.current_thread()
        own = current is threading.main_thread() or isinstance(current, getattr(threading, "_DummyThread", ()))
        try:
            figures = self.read(models, optimizers, grads=own, device=device).get(device)
        except Exception:
            return None
        if not figures:
            return None
        if not own:
            figures["gradients"] = ((self.at_step or {}).get(device) or {}).get("gradients", 0)
        return dict(figures, time_s=time.time())

    def read(self, models, optimizers, grads, device=None):
        """{device: figures} over every CUDA device the tensors are on (only `device`'s
        when given: another device's gradients may be written by its autograd thread right
        now). A tensor whose storage cannot be read (a DTensor's) is left out."""
        is_tensor = self.torch.is_tensor
        seen = set()
        out = {}

        def on_device(tensor):
            return is_tensor(tensor) and tensor.is_cuda and (device is None or tensor.device.index == device)

        def add(role, tensor):
            if not on_device(tensor):
                return
            try:
                storage = tensor.untyped_storage()
                ptr = storage.data_ptr()
            except Exception:
                return
            if ptr and ptr not in seen:
                seen.add(ptr)
                figures = out.get(tensor.device.index)
                if figures is None:
                    figures = out[tensor.device.index] = {
                        "parameters": 0, "gradients": 0, "optimizer_state": 0,
                        "models": len(models), "optimizers": len(optimizers),
                    }
                figures[role] += int(storage.nbytes())

        params = []
        for model in models:
            params.extend(model.parameters())
            for buffer in model.buffers():
                add("parameters", buffer)
        for optimizer in optimizers:
            for group in list(optimizer.param_groups):
                params.extend(group.get("params") or [])
        for p in params:
            add("parameters", p)
        if grads:
            for p in params:
                if not on_device(p):
                    continue  # never touch another device's .grad
                grad = p.grad
                if grad is not None:
                    add("gradients", grad)
        for optimizer in optimizers:
            for state in list(optimizer.state.values()):
                for value in list(state.values()) if isinstance(state, dict) else []:
                    add("optimizer_state", value)
        for device, figures in out.items():
            totals = self.totals(device) if self.totals is not None else None
            if totals is not None:
                figures["allocated"], figures["reserved"] = totals
        return out


class AllocatedSeries:
    """The allocated bytes of each device over the job's life: rows [time_s, low, high]
    (time.time(); the lowest and highest sample the row covers). Kept at an OOM so a leak
    can be told without the allocation history."""

    def __init__(self, period=SERIES_PERIOD_S, limit=SERIES_MAX):
        self.period = period
        self.limit = limit
        self.rows = {}  # device -> [[time_s, low, high], ...]
        self.spans = {}  # device -> the time a row covers now (doubles at each merge)
        self.next_due = 0.0

    def add(self, device, time_s, allocated):
        rows = self.rows.setdefault(device, [])
        rows.append([time_s, allocated, allocated])
        if len(rows) >= self.limit:
            merged = []
            for i in range(0, len(rows) - 1, 2):
                a, b = rows[i], rows[i + 1]
                merged.append([a[0], min(a[1], b[1]), max(a[2], b[2])])
            if len(rows) % 2:
                merged.append(rows[-1])
            self.rows[device] = merged
            self.spans[device] = 2 * self.spans.get(device, self.period)
            # Samples come at the slowest device's pace from then on (rows carry times).
            self.period = max(self.period, self.spans[device])

    def due(self, now):
        if now < self.next_due:
            return False
        self.next_due = now + self.period
        return True

    def of(self, device):
        return {"period_s": self.spans.get(device, self.period), "rows": [list(r) for r in self.rows.get(device, [])]}


# Mapped-library fragments that name a framework; the same list as the viewer's
# (crates/vramtop-alloc/src/framework.rs, MARKERS), which a test keeps in step.
FRAMEWORK_MARKERS = (
    ("JAX/XLA", ("/jaxlib/", "/jax_plugins/", "xla_cuda_plugin", "xla_extension")),
    ("TensorFlow", ("libtensorflow_framework", "_pywrap_tensorflow")),
    ("PyTorch", ("libtorch_cuda", "libc10_cuda")),
    ("CuPy", ("/cupy/", "/cupy_backends/")),
    ("ONNX Runtime", ("libonnxruntime_providers_cuda",)),
    ("TensorRT", ("libnvinfer.",)),
    ("PaddlePaddle", ("/paddle/base/libpaddle", "libpaddle_inference")),
)


def frameworks_of(pid):
    """The frameworks whose libraries process `pid` has mapped; None when its maps cannot
    be read (another user's process, or gone)."""
    paths = set()
    try:
        with open("/proc/%d/maps" % pid, "r", errors="replace") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    paths.add(parts[5].strip())
    except OSError:
        return None
    return [name for name, marks in FRAMEWORK_MARKERS if any(m in p for p in paths for m in marks)]


def process_facts(pid):
    """User, command line and frameworks of `pid` from /proc; None for what cannot be read."""
    facts = {"user": None, "command": None, "frameworks": frameworks_of(pid)}
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            parts = [p.decode("utf-8", "replace") for p in f.read().split(b"\0") if p]
        facts["command"] = " ".join(parts)[:512] or None
    except OSError:
        pass
    try:
        with open("/proc/%d/status" % pid) as f:
            uid = next((int(l.split()[1]) for l in f if l.startswith("Uid:")), None)
        if uid is not None:
            try:
                import pwd

                facts["user"] = pwd.getpwuid(uid).pw_name
            except (ImportError, KeyError):
                facts["user"] = str(uid)
    except (OSError, ValueError, IndexError):
        pass
    return facts


NVML_VALUE_NOT_AVAILABLE = (1 << 64) - 1


def gpu_processes(uuid, pci_bus_id=None):
    """Every process NVML lists on one GPU (compute and graphics), each with its bytes and
    what /proc says of it: {"processes": [...], "own_pid_listed": bool}, or None where NVML
    cannot say (no libnvidia-ml, an unknown GPU). Through ctypes, stdlib only; called at an
    OOM, off the job's hot path. When this process is not among the pids listed, NVML speaks
    of another PID namespace (a container): the pids are not ours to read."""
    import ctypes

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None

    class Info(ctypes.Structure):  # nvmlProcessInfo_t (v2 and v3 share it)
        _fields_ = [
            ("pid", ctypes.c_uint),
            ("usedGpuMemory", ctypes.c_ulonglong),
            ("gpuInstanceId", ctypes.c_uint),
            ("computeInstanceId", ctypes.c_uint),
        ]

    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        handle = ctypes.c_void_p()
        found = False
        if uuid:
            names = [uuid] if uuid.startswith(("GPU-", "MIG-")) else ["GPU-" + uuid, "MIG-" + uuid]
            for name in names:
                found = nvml.nvmlDeviceGetHandleByUUID(name.encode(), ctypes.byref(handle)) == 0
                if found:
                    break
        if not found and pci_bus_id and not (uuid or "").startswith("MIG-"):
            # By bus id a MIG instance would be its whole GPU, whose other instances'
            # processes share none of its memory: only for a UUID NVML did not know.
            found = nvml.nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id.encode(), ctypes.byref(handle)) == 0
        if not found:
            return None
        listed = {}
        answered = False
        for kind in ("Compute", "Graphics"):
            # v3 and v2 fill the same struct; drivers before R510 have only v2.
            call = None
            for version in ("_v3", "_v2"):
                try:
                    call = getattr(nvml, "nvmlDeviceGet%sRunningProcesses%s" % (kind, version))
                    break
                except AttributeError:
                    continue
            if call is None:
                continue
            size = 64
            while size <= 4096:
                infos = (Info * size)()
                count = ctypes.c_uint(size)
                rc = call(handle, ctypes.byref(count), infos)
                if rc == 7:  # NVML_ERROR_INSUFFICIENT_SIZE
                    size *= 4
                    continue
                if rc == 0:
                    answered = True
                    for info in infos[: count.value]:
                        used = info.usedGpuMemory
                        used = None if used == NVML_VALUE_NOT_AVAILABLE else int(used)
                        old = listed.get(info.pid)
                        listed[info.pid] = used if old is None else max(old, used or 0)
                break
    finally:
        nvml.nvmlShutdown()
    if not answered:
        return None  # NVML could not say: not "no processes"
    own = os.getpid()
    own_listed = own in listed
    processes = []
    for pid in sorted(listed):
        row = {"pid": pid, "bytes": listed[pid], "own": pid == own}
        if own_listed:
            row.update(process_facts(pid))
        processes.append(row)
    return {"processes": processes, "own_pid_listed": own_listed}


def who_holds_the_gpu(alloc, device):
    """At an OOM: the GPU's own total (not the per-process cap) and the processes on it.
    Never raises."""
    out = {"physical_total_bytes": None, "gpu_processes": None}
    try:
        props = alloc.torch.cuda.get_device_properties(device)
        out["physical_total_bytes"] = int(props.total_memory)
        bus = None
        if all(hasattr(props, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
            bus = "%08x:%02x:%02x.0" % (props.pci_domain_id, props.pci_bus_id, props.pci_device_id)
        out["gpu_processes"] = gpu_processes(alloc.device_uuid(device), bus)
    except Exception:
        pass
    return out


class Hook:
    """The server of one process. A forked child gets a fresh one (see _after_fork)."""

    def __init__(self, history, forked):
        self.pid = os.getpid()
        self.history_wanted = history
        self.forked = forked
        self.lock = threading.Lock()  # viewers and their write state
        self.viewers = []
        self.selector = None
        self.listener = None
        self.path = None
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.stopping = False
        self.thread = None
        self.torch = None
        self.alloc = None  # TorchAllocator once torch is imported
        self.cuda_ready = False
        self.seq = 0
        self.next_collect = 0.0
        self.last_cpu_cost = 0.0  # seconds of CPU the previous read took
        self.forgiven_until = 0.0  # no slow read is forgiven before this (monotonic)
        self.duty = None  # HistoryDuty once history is on
        self.kept = {}  # "oom"/"error" -> frame replayed to later viewers
        self.uncaught = False
        self.prepare_lock = threading.Lock()
        self.prepared = False
        self.next_ring_check = 0.0
        self.last_ring_look = None  # (time, allocation_count()) at the last look
        self.segments_wanted = False  # a viewer subscribed and has no map yet

    # ----- the thread -------------------------------------------------------------------

    def run(self):
        try:
            if self.alloc is None:  # started by hand: torch may not be imported yet
                if not self.wait_for_torch():
                    return
                self.meet_torch(self.torch)
            install_excepthooks()
            # A forked child (a DataLoader worker) serves only if it uses CUDA itself. Look
            # only after the other at-fork handlers (torch's marks CUDA unusable) have run.
            if self.forked:
                time.sleep(POLL_S)
                if not self.wait(self.alloc.cuda_initialised):
                    return
            if not self.listen():
                return
            self.serve()
        except Exception as err:  # the hook dies quietly; the job goes on
            say_once("crash", "stopped serving after an internal error: %r" % (err,))

    def wait(self, ready):
        while not self.stopping:
            if ready():
                return True
            time.sleep(POLL_S)
        return False

    def wait_for_torch(self):
        """True once torch is fully imported (a notebook may start us before it imports)."""
        while not self.stopping:
            module = sys.modules.get("torch")
            spec = getattr(module, "__spec__", None)
            if module is not None and not getattr(spec, "_initializing", False):
                if hasattr(module, "cuda"):
                    self.torch = module
                    return True
            time.sleep(POLL_S)
        return False

    def meet_torch(self, torch):
        self.torch = torch
        self.alloc = TorchAllocator(torch)
        self.arm_cuda_init()

    def listen(self):
        directory = private_dir(socket_dir())
        if directory is None:
            return False
        path = os.path.join(directory, "vramtop-%d.sock" % self.pid)
        if len(path.encode()) > 100:
            say_once("path", "socket path %s is too long for a Unix socket" % path)
            return False
        # Bound under a name viewers do not look for (shorter than `path`; vramtop clears
        # one a dead job left), and renamed once listening: a viewer that finds `path` can
        # connect (between bind and listen it would be refused).
        unready = os.path.join(directory, ".vt-%d.new" % self.pid)
        listener = None
        try:
            for stale in (path, unready):
                if os.path.lexists(stale):
                    os.unlink(stale)  # left by an earlier process with our pid
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(unready)
            os.chmod(unready, 0o600)
            listener.listen(8)
            listener.setblocking(False)
            os.rename(unready, path)
        except OSError as err:
            if listener is not None:
                listener.close()
                try:
                    os.unlink(unready)
                except OSError:
                    pass
            say_once("listen", "cannot listen on %s (%s)" % (path, err))
            return False
        self.listener, self.path = listener, path
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, "accept")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        atexit.register(self.at_exit)
        return True

    def serve(self):
        while not self.stopping:
            try:
                self.serve_once()
            except Exception as err:  # keep serving; never spin on a repeating fault
                say_once("serve", "internal error (serving on): %r" % (err,))
                time.sleep(POLL_S)

    def serve_once(self):
        now = time.monotonic()
        if not self.cuda_ready and self.alloc.cuda_initialised():
            self.on_cuda_ready()
        if self.duty is not None:
            self.duty.tick(now)
        self.watch_ring(now)
        self.sample_series(now)
        self.send_due_states(now)
        with self.lock:
            self.drop_stalled(now)
            self.watch_writes()
        timeout = self.timeout(time.monotonic())
        for key, mask in self.selector.select(timeout):
            self.on_event(key, mask)

    def watch_ring(self, now):
        """Checkpoint the event ring before it can fill, viewer or not (RING_ENTRIES)."""
        alloc = self.alloc
        if not self.cuda_ready or alloc is None or not alloc.ring_entries or now < self.next_ring_check:
            return
        count = alloc.allocation_count()
        self.next_ring_check = now + ring_look_period(count, self.last_ring_look, now, alloc.ring_entries)
        self.last_ring_look = (now, count)
        if alloc.ring_may_be_full():
            alloc.restart_ring(self.recording_stacks())

    def sample_series(self, now):
        alloc = self.alloc
        if self.cuda_ready and alloc is not None and alloc.series.due(now):
            alloc.sample_allocated()

    def recording_stacks(self):
        return self.duty.recording if self.duty is not None else bool(self.alloc and self.alloc.history_on)

    def timeout(self, now):
        if not self.cuda_ready:
            return POLL_S
        due = [v.next_due for v in self.viewers if v.interval is not None]
        limit = 1.0 if any(v.pending or v.owed for v in self.viewers) else 5.0
        if due:
            limit = min(limit, max(min(due), self.next_collect) - now)
        if self.duty is not None:
            limit = min(limit, self.duty.next_switch - now)
        if self.alloc is not None and self.alloc.ring_entries:
            limit = min(limit, self.next_ring_check - now)
        if self.alloc is not None:
            limit = min(limit, self.alloc.series.next_due - now)
        return max(0.0, limit)

    def on_event(self, key, mask):
        if key.data == "accept":
            self.accept()
        elif key.data == "wake":
            try:
                while os.read(self.wake_r, 512):
                    pass
            except OSError:
                pass
        else:
            viewer = key.data
            with self.lock:
                if mask & selectors.EVENT_WRITE:
                    self.flush(viewer)
                if mask & selectors.EVENT_READ and viewer in self.viewers:
                    self.read(viewer)

    def wake(self):
        try:
            os.write(self.wake_w, b"x")
        except OSError:
            pass

    # ----- viewers -----------------------------------------------------------------------

    def accept(self):
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        uid = peer_uid(sock)
        if not viewer_allowed(uid):
            # The socket (0600) and its directory (0700) already keep other users out;
            # this holds even where someone opened them up. Nothing is sent: no hello.
            try:
                sock.close()
            except OSError:
                pass
            who = "whose uid could not be read" if uid == UNKNOWN_PEER else "of uid %d" % uid
            say_once("peer", "refused a viewer %s (only uid %d and root may attach)" % (who, os.geteuid()))
            return
        if len(self.viewers) >= MAX_VIEWERS:
            sock.close()
            return
        sock.setblocking(False)
        viewer = Viewer(sock, time.monotonic())
        with self.lock:
            self.viewers.append(viewer)
            self.selector.register(sock, selectors.EVENT_READ, viewer)
            self.offer(viewer, encode(self.hello()))
            for kind in ("oom", "error"):
                if kind in self.kept:
                    self.offer(viewer, self.kept[kind], keep=kind)

    def read(self, viewer):
        try:
            data = viewer.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.drop(viewer)
            return
        try:
            messages = viewer.reader.feed(data)
        except ProtocolError:
            self.drop(viewer)
            return
        for message in messages:
            if message["type"] == "subscribe":
                interval = message.get("interval_s")
                if isinstance(interval, (int, float)) and not isinstance(interval, bool):
                    if interval == interval:  # NaN is not a pace
                        low, high = INTERVAL_RANGE
                        viewer.interval = min(max(float(interval), low), high)
                        viewer.next_due = time.monotonic()
                        # Its first state has segments, whatever the ring costs to read
                        # once (the pacing after it accounts for it): it has no map yet.
                        self.segments_wanted = True
            # other types are ignored (forward compatibility)

    def offer(self, viewer, frame, keep=None):
        """Write `frame` whole now, else drop it. A `keep` frame (a kind: "oom", "bye"...)
        waits instead, replacing an older one of its kind, so at most one per kind waits."""
        if viewer.pending:
            if keep:
                self.owe(viewer, keep, frame)
            else:
                self.refused(viewer)
            return
        sent = self.send_some(viewer, frame)
        if sent is None:
            return
        if sent == 0:
            if keep:
                self.owe(viewer, keep, frame)
            self.refused(viewer)
        elif sent < len(frame):
            viewer.pending = memoryview(frame)[sent:]

    def owe(self, viewer, kind, frame):
        viewer.owed = [(k, f) for k, f in viewer.owed if k != kind] + [(kind, frame)]

    def send_some(self, viewer, data):
        try:
            sent = viewer.sock.send(data)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError:
            self.drop(viewer)
            return None
        if sent:
            viewer.refused_since = None
        return sent

    def refused(self, viewer):
        if viewer.refused_since is None:
            viewer.refused_since = time.monotonic()

    def flush(self, viewer):
        """Finish the begun frame, then the kept ones, as far as the socket takes them."""
        while viewer in self.viewers:
            if not viewer.pending:
                if not viewer.owed:
                    return
                viewer.pending = memoryview(viewer.owed.pop(0)[1])
            sent = self.send_some(viewer, viewer.pending)
            if not sent:
                if sent == 0:
                    self.refused(viewer)
                return
            viewer.pending = viewer.pending[sent:]

    def drop_stalled(self, now):
        for viewer in list(self.viewers):
            if viewer.refused_since is not None and now - viewer.refused_since > STALL_S:
                self.drop(viewer)

    def watch_writes(self):
        """Ask to hear of writability only from viewers we owe bytes to."""
        for viewer in self.viewers:
            events = selectors.EVENT_READ
            if viewer.pending or viewer.owed:
                events |= selectors.EVENT_WRITE
            if events == viewer.events:
                continue
            try:
                self.selector.modify(viewer.sock, events, viewer)
                viewer.events = events
            except (KeyError, ValueError, OSError):
                pass

    def drop(self, viewer):
        if viewer in self.viewers:
            self.viewers.remove(viewer)
        try:
            self.selector.unregister(viewer.sock)
        except (KeyError, ValueError, OSError):
            pass
        try:
            viewer.sock.close()
        except OSError:
            pass

    def broadcast(self, frame, keep):
        with self.lock:
            for viewer in list(self.viewers):
                self.offer(viewer, frame, keep=keep)
        self.wake()

    # ----- messages ----------------------------------------------------------------------

    def hello(self):
        alloc = self.alloc
        return {
            "type": "hello",
            "protocol": PROTOCOL_VERSION,
            "pid": self.pid,
            "ppid": os.getppid(),
            "argv": [str(a)[:1024] for a in getattr(sys, "argv", [])[:64]],
            "hook_version": HOOK_VERSION,
            "torch_version": str(getattr(self.torch, "__version__", None) or "") or None,
            "cuda_ready": self.cuda_ready,
            "history": bool(alloc and alloc.history_on),
            "ring": alloc.ring_entries if alloc else 0,
            "capabilities": list(alloc.capabilities) if alloc else [],
            "missing": list(alloc.missing) if alloc else [],
            "rank": env_int("RANK"),
            "local_rank": env_int("LOCAL_RANK"),
            "world_size": env_int("WORLD_SIZE"),
        }

    def arm_cuda_init(self):
        """Ask torch to call us the moment the job initialises CUDA.

        torch.cuda._lazy_init runs the callables queued by torch.cuda._lazy_call right after
        torch._C._cuda_init(), in the job's thread, before the job's first CUDA call goes
        on. Without this, the OOM observer and history would start only at our next poll,
        and a job that fills memory at once could OOM unseen. A queued call that raises
        breaks the job's CUDA init (DeferredCudaCallError), so ours never raises.
        """
        lazy_call = getattr(getattr(self.torch, "cuda", None), "_lazy_call", None)
        if lazy_call is None:
            return
        try:
            lazy_call(self.on_cuda_init)
        except Exception:
            pass

    def on_cuda_init(self):
        try:
            self.prepare_allocator()
            self.wake()
        except Exception:
            pass

    def prepare_allocator(self):
        """Attach the OOM observer and start history, once, as soon as CUDA is up."""
        with self.prepare_lock:
            if self.prepared:
                return
            self.prepared = True
            self.alloc.attach_oom_observer(on_oom)
            self.alloc.start_ring(RING_ENTRIES)
            if self.history_wanted:
                # Stacks are read on our thread later: what reading them imports comes in
                # now, on the job's thread (its CUDA init), or history waits (see
                # TorchAllocator.symbolizer_ready).
                if threading.current_thread() is not self.thread:
                    self.alloc.import_symbolizer()
                if not self.alloc.symbolizer_ready():
                    say_once("history-symbolizer", "history is off: torch._inductor, which PyTorch imports to read recorded stacks, could not be imported on the job's thread")
                    return
                self.alloc.start_history()
                if self.alloc.history_on:
                    self.duty = HistoryDuty(self.alloc)

    def on_cuda_ready(self):
        self.cuda_ready = True
        self.prepare_allocator()
        self.alloc.probe_settings()
        if self.alloc.missing:
            say_once("missing", "; ".join(self.alloc.missing))
        # Viewers that came before CUDA learn it is ready from a fresh hello.
        self.broadcast(encode(self.hello()), keep="hello")

    def send_due_states(self, now):
        with self.lock:
            due = [
                v for v in self.viewers if v.interval is not None and now >= v.next_due
            ]
        if not due or not self.cuda_ready or now < self.next_collect:
            return
        frame = self.state_frame()
        with self.lock:
            for viewer in due:
                viewer.next_due = now + viewer.interval
                if viewer in self.viewers and frame is not None:
                    self.offer(viewer, frame)

    def state_frame(self):
        started = time.monotonic()
        cpu_started = time.thread_time()
        try:
            alloc = self.alloc
            raw, with_segments = None, True
            if alloc.ring_entries and not alloc.ring_cheap_to_read() and not self.segments_wanted:
                # Reading the ring now would cost more than the state is worth: a checkpoint
                # if it is due (its snapshot is cheap), else the stats alone.
                if alloc.ring_may_be_full():
                    raw = alloc.restart_ring(self.recording_stacks())
                with_segments = raw is not None or not alloc.ring_entries
            state = alloc.collect(raw=raw, segments=with_segments)
            if with_segments:
                self.segments_wanted = False
        except Exception as err:
            say_once("collect", "reading the allocator failed: %r" % (err,))
            state = None
        cost = time.monotonic() - started
        if self.alloc.ring_entries and self.alloc.ring_fill >= self.alloc.ring_entries:
            self.alloc.restart_ring(self.recording_stacks())
        frame = None
        if state is not None:
            self.seq += 1
            message = {"type": "state", "seq": self.seq, "time_s": time.time()}
            message.update(state)
            message["collect_ms"] = round(cost * 1000.0, 3)
            if self.duty is not None:
                message["history_share"] = round(self.duty.share, 3)
            frame = encode_fitting(message)
        # Pace ourselves so a state costs the job at most 1 % of its time whatever the
        # viewers ask, on our thread's CPU time for the whole state: reading the allocator
        # and encoding the frame (both hold the GIL; on the H100 the encoding added half
        # as much again as the read, so pacing on the read alone let the hook take 1.6 %
        # at 0.1 s). Waiting for the GIL costs the job nothing.
        # One slow read is forgiven, once per FORGIVE_S: with history, PyTorch's snapshot
        # once spent 4.9 s of CPU symbolising (on the H100, 2.11, GIL released; the reads
        # before and after took 0.4 ms), and pacing on it stopped all states for minutes.
        # Reads that are slow again and again are paced on what they cost.
        cpu_cost = time.thread_time() - cpu_started
        pace = cpu_cost
        if cpu_cost > 10 * self.last_cpu_cost and started >= self.forgiven_until:
            # Paced as the read before it (a first read: as a 5 ms one), which a viewer
            # that attaches late to a long job needs: its first read is the slow one.
            relief = max(self.last_cpu_cost, 0.005)
            if cpu_cost > relief:
                pace = relief
                self.forgiven_until = started + FORGIVE_S
        self.next_collect = started + pace / 0.01
        self.last_cpu_cost = cpu_cost
        return frame

    # ----- the end -----------------------------------------------------------------------

    def at_exit(self):
        if os.getpid() != self.pid:
            return  # a forked child exiting through atexit: the socket is the parent's
        self.stopping = True
        self.wake()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(1.0)
        code = 1 if self.uncaught else None
        bye = encode({"type": "bye", "time_s": time.time(), "exit_code": code})
        with self.lock:
            for viewer in list(self.viewers):
                self.offer(viewer, bye, keep="bye")
            self.drain(deadline=time.monotonic() + 0.5)
            for viewer in list(self.viewers):
                self.drop(viewer)
        self.close_listener(unlink=True)

    def drain(self, deadline):
        """At exit only: give slow viewers up to `deadline` to take what they are owed."""
        while time.monotonic() < deadline:
            waiting = [v for v in self.viewers if v.pending or v.owed]
            if not waiting:
                return
            for viewer in waiting:
                self.flush(viewer)
            time.sleep(0.01)

    def close_listener(self, unlink):
        if self.listener is not None:
            try:
                self.listener.close()
            except OSError:
                pass
        if unlink and self.path is not None:
            try:
                os.unlink(self.path)
            except OSError:
                pass

    def abandon(self):
        """In a forked child: let go of the parent's sockets without touching them."""
        self.stopping = True
        for viewer in list(self.viewers):
            try:
                viewer.sock.close()  # our copy only; never shutdown(): the parent's too
            except OSError:
                pass
        self.close_listener(unlink=False)
        for fd in (self.wake_r, self.wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.selector is not None:
            try:
                self.selector.close()
            except Exception:
                pass


def encode_fitting(message):
    """Encode, dropping trailing segments (and saying so) until the frame fits 16 MiB."""
    while True:
        try:
            return encode(message)
        except ValueError:
            segments = message.get("segments") or []
            if not segments:
                return None
            message["segments"] = segments[: len(segments) * 3 // 4]
            message["truncated"] = True


# ----- process-wide entry points --------------------------------------------------------

_hook = None
_start_lock = threading.Lock()
_oom_observer_attached = False
_excepthooks_installed = False


def start(history=None):
    """Start serving this process (idempotent). Safe to call from a notebook cell.

    history: record allocation sites (default: VRAMTOP_HISTORY=1). The hook waits on its
    own thread for torch and CUDA; calling this never imports torch or initialises CUDA.
    """
    global _hook
    try:
        with _start_lock:
            if _hook is not None and _hook.pid == os.getpid():
                return
            _hook = Hook(_history_wanted(history), forked=False)
            _launch(_hook)
    except Exception as err:
        say_once("start", "could not start: %r" % (err,))


def mark_step():
    """The end of one of the job's steps, as the job says it (`vramtop.step()`): marked as
    an optimizer step is. Never raises into the job."""
    try:
        hook = _hook
        if hook is not None and hook.alloc is not None:
            hook.alloc.steps.append(time.time())
    except Exception:
        pass


def torch_imported(torch):
    """The bootstrap's entry: called in the importing thread as `import torch` finishes, so
    the CUDA-init callback is queued before the job's next line can initialise CUDA."""
    global _hook
    try:
        with _start_lock:
            if _hook is not None and _hook.pid == os.getpid():
                return
            hook = Hook(_history_wanted(None), forked=False)
            hook.meet_torch(torch)
            _hook = hook
            _launch(hook)
    except Exception as err:
        say_once("start", "could not start: %r" % (err,))


def _history_wanted(history):
    if history is None:
        return os.environ.get("VRAMTOP_HISTORY", "").strip() == "1"
    return bool(history)


def _launch(hook):
    thread = threading.Thread(target=hook.run, name="vramtop-hook", daemon=True)
    hook.thread = thread
    thread.start()


def _after_fork_in_child():
    global _hook, _start_lock, _oom_keeper
    try:
        _start_lock = threading.Lock()  # the parent's may have been held at fork
        _oom_keeper = OomKeeper()  # the child's OOMs are its own: numbered from 1
        parent = _hook
        if parent is None:
            return
        parent.abandon()
        _hook = Hook(parent.history_wanted, forked=True)
        _launch(_hook)
    except Exception:
        _hook = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# Every OOM of a hooked job is kept on disk, viewer or not (`OomKeeper`).
OOM_FIRST_KEPT = 3
# Largest file kept, in MiB: history is what grows (a full ring is hundreds of MiB), and
# the default folder may be a small tmpfs ($XDG_RUNTIME_DIR). A file without history is
# tens of KiB (72 KiB for a capped checkerboard of 720 blocks, on an H100).
OOM_MAX_MB = _env_float("VRAMTOP_OOM_MAX_MB", 64.0)


class OomKeeper:
    """Keeps the allocator's state at an OOM as a PyTorch memory snapshot (the dict
    torch.cuda.memory._snapshot() returns, pickled), so PyTorch's own tools read it as well
    as `vramtop snapshot`. Bounded: the first OOM_FIRST_KEPT OOMs of a process, then the
    latest one in one file rewritten in place; a file over VRAMTOP_OOM_MAX_MB (default 64)
    loses the allocation history first (its `oom` entries stay), and is not written if
    still over.

    Where: VRAMTOP_OOM_DIR (`vramtop run` sets it beside its log), else the hook's socket
    directory. VRAMTOP_OOM_TAG (set by `vramtop run`) names the run in the file name, so it
    finds its job's files; VRAMTOP_OOM_QUIET=1 leaves the saying to `vramtop run`. Writing
    never raises into the job: a full disk or a read-only directory is one line on stderr.

    Added to PyTorch's dict: `vramtop_oom` (the request and the device's figures, which the
    snapshot alone lacks), and, when the allocation history holds no `oom` entry for this
    OOM (history off), one `oom` entry as PyTorch writes them, marked `vramtop_added`.
    """

    def __init__(self):
        self.count = 0
        self.said = set()
        # Two threads can run out of memory at once; each keeps its own file whole.
        self.lock = threading.Lock()

    def directory(self):
        return os.environ.get("VRAMTOP_OOM_DIR") or socket_dir()

    def path_for(self, n):
        tag = os.environ.get("VRAMTOP_OOM_TAG", "")
        which = str(n) if n <= OOM_FIRST_KEPT else "last"
        name = "vramtop-oom-%s%d-%s.pickle" % (tag + "-" if tag else "", os.getpid(), which)
        return os.path.join(self.directory(), name)

    def keep(self, raw, oom):
        """Write the snapshot `raw` with the OOM `oom` (the hook's message); the path or None.
        Never raises: whatever goes wrong is one line, said once."""
        try:
            with self.lock:
                return self._keep(raw, oom)
        except Exception as err:
            self.say_once("error", "could not keep the allocator state at an OOM: %r; the job goes on" % (err,))
            return None

    def _keep(self, raw, oom):
        import pickle

        self.count += 1
        n = self.count
        snapshot = self.annotated(raw, oom, n)
        limit = int(OOM_MAX_MB * 1024 * 1024)
        data = pickle.dumps(snapshot, protocol=4)
        history = snapshot["vramtop_oom"].get("history")
        if len(data) > limit and history:
            # The oldest history goes first, an events piece with the state before it;
            # counted by the pieces' own sizes and pickled once more, not at each cut.
            pieces = history["pieces"]
            over = len(data) - limit
            while over > 0 and len(pieces) > 1:
                cut = 2 if pieces[0]["kind"] == "state" and len(pieces) > 2 else 1
                over -= sum(len(p.get("zlib") or p.get("pickle") or b"") for p in pieces[:cut])
                del pieces[:cut]
            history["from_start"] = pieces[0]["kind"] == "events"
            if over > 0:
                snapshot["vramtop_oom"]["history"] = None
            data = pickle.dumps(snapshot, protocol=4)
        if len(data) > limit and snapshot.get("device_traces"):
            # The history is what grows: keep the state and the trace's own `oom` entries
            # (PyTorch's, or ours), say what was left out.
            snapshot["device_traces"] = [
                [e for e in t if isinstance(e, dict) and e.get("action") == "oom"] for t in snapshot["device_traces"]
            ]
            snapshot["vramtop_oom"]["history_left_out"] = True
            if snapshot["vramtop_oom"].get("ring"):
                snapshot["vramtop_oom"]["ring"] = dict(snapshot["vramtop_oom"]["ring"], complete=False)
            snapshot["vramtop_oom"]["checkpoint"] = None  # nothing to replay from it now
            snapshot["vramtop_oom"]["history"] = None
            data = pickle.dumps(snapshot, protocol=4)
        if len(data) > limit:
            self.say_once("cap", "OOM %d: the allocator state is %d MiB, over VRAMTOP_OOM_MAX_MB (%g); not kept" % (n, len(data) >> 20, OOM_MAX_MB))
            return None
        path = self.path_for(n)
        partial = "%s.%d.part" % (path, threading.get_ident())
        try:
            # Private, as the socket folder it may be: made here first, it must not be 0755.
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            with open(partial, "wb") as f:
                f.write(data)
            os.replace(partial, path)
        except OSError as err:
            try:
                os.unlink(partial)  # a full disk keeps no half-written file
            except OSError:
                pass
            self.say_once("write", "could not keep the allocator state at an OOM in %s: %s; the job goes on" % (self.directory(), err.strerror or err))
            return None
        if n <= OOM_FIRST_KEPT + 1 and os.environ.get("VRAMTOP_OOM_QUIET") != "1":
            later = "; later OOMs rewrite it" if n > OOM_FIRST_KEPT else ""
            self.say("OOM %d: allocator state kept in %s (%s)%s; open it with: vramtop snapshot %s" % (n, path, format_size(len(data)), later, path))
        return path

    @staticmethod
    def annotated(raw, oom, n):
        snapshot = dict(raw)
        device = oom["device"]
        snapshot["vramtop_oom"] = {
            "number": n,
            "pid": os.getpid(),
            "argv": list(sys.argv),
            "time_s": oom["time_s"],
            "device": device,
            "requested_bytes": oom["requested_bytes"],
            "device_free_bytes": oom["device_free_bytes"],
            "device_total_bytes": oom["device_total_bytes"],
            "stats": oom["stats"],
            "summary": oom["summary"],
            "history_left_out": False,
            "ring": oom.get("ring"),
            "checkpoint": oom.get("checkpoint"),
            # Hook 1.5: the history before the checkpoint, in pieces (History.of).
            "history": oom.get("history"),
            # When the job's optimizers stepped (time.time(); the trace's time_us is the same
            # clock in microseconds): `empty_cache()` between steps is replayed there.
            "steps": oom.get("steps") or [],
            # The job's allocated bytes from its start ([time_s, low, high] rows), the
            # GPU's own total, and every process NVML listed on it (hook 1.4).
            "series": oom.get("series"),
            "step_series": oom.get("step_series"),
            "physical_total_bytes": oom.get("physical_total_bytes"),
            "gpu_processes": oom.get("gpu_processes"),
            # What the live memory was for (parameters, gradients, optimizer state), as
            # the job's own tensors said at the OOM (hook 1.4).
            "roles": oom.get("roles"),
        }
        traces = [list(t) for t in (snapshot.get("device_traces") or [])]
        while len(traces) <= device:
            traces.append([])
        last = traces[device][-1] if traces[device] else None
        if not (isinstance(last, dict) and last.get("action") == "oom"):
            traces[device].append({
                "action": "oom",
                "addr": 0,
                "size": oom["requested_bytes"],
                "stream": 0,
                "device_free": oom["device_free_bytes"],
                "time_us": int(oom["time_s"] * 1e6),
                "frames": [],
                "vramtop_added": True,
            })
        snapshot["device_traces"] = traces
        return snapshot

    def say_once(self, key, text):
        if key not in self.said:
            self.said.add(key)
            self.say(text)

    @staticmethod
    def say(text):
        try:
            sys.stderr.write("vramtop: %s\n" % text)
            sys.stderr.flush()
        except Exception:
            pass


_oom_keeper = OomKeeper()


def on_oom(device, alloc_size, limit_bytes, device_free):
    """PyTorch's OOM observer: sends the allocator's state before the exception unwinds.

    What c10/cuda/CUDACachingAllocator.cpp (DeviceCachingAllocator::malloc) does: when every
    retry has failed it reads cudaMemGetInfo, counts the OOM, copies `oom_observers_`, and
    then `lock.unlock()` ("Make sure we do not have the device lock before calling our
    observers which might need hold the GIL") before calling each observer as
    (device, alloc_size, set_fraction ? allowed_memory_maximum : device_total, device_free),
    and only after them throws OutOfMemoryError. So calling memory_stats / memory_snapshot
    here does not deadlock (the allocator lock is free; it is recursive anyway), the third
    argument is the per-process cap when set_per_process_memory_fraction is in force, and
    alloc_size is the rounded size PyTorch's message says it "Tried to allocate". The Python
    binding (torch/csrc/cuda/Module.cpp) takes the GIL and turns an exception raised here
    into a C++ error that would replace the OOM: so nothing may escape this function.
    """
    try:
        hook = _hook
        if hook is None or hook.alloc is None or hook.pid != os.getpid():
            return
        generation = hook.alloc.generation
        raw = hook.alloc.raw_snapshot(on_job_thread=True)
        state = hook.alloc.collect(device=int(device), raw=raw)
        stats = state["stats"]
        message = {
            "type": "oom",
            "time_s": time.time(),
            "device": int(device),
            "device_uuid": state.get("device_uuid"),
            "requested_bytes": int(alloc_size),
            "device_free_bytes": int(device_free),
            "device_total_bytes": int(limit_bytes),
            "stats": stats,
            "settings": state["settings"],
            "segments": state["segments"],
            "truncated": state["truncated"],
            "summary": oom_summary(alloc_size, stats, device_free),
            "ring": hook.alloc.ring_of(raw, int(device)),
            "checkpoint": hook.alloc.checkpoint_of(int(device)),
            "history": hook.alloc.history_of(),
            "steps": list(hook.alloc.steps),
            "series": hook.alloc.series.of(int(device)),
            "step_series": hook.alloc.step_series.of(int(device)),
            "roles": hook.alloc.roles.at_oom(int(device)),
        }
        if hook.alloc.generation != generation:
            # A checkpoint came between the ring read above and its checkpoint and history:
            # they do not follow on from each other; the state at the OOM stands alone.
            if message["ring"]:
                message["ring"] = dict(message["ring"], complete=False)
            message["checkpoint"] = message["history"] = None
        # The processes sharing the GPU and its own total: who else held the memory.
        message.update(who_holds_the_gpu(hook.alloc, int(device)))
        # The file first: a job that dies of this OOM may be gone before a viewer reads.
        # A viewer replays the job's history from it when the ring holds all of it.
        if raw is not None:
            message["kept_path"] = _oom_keeper.keep(raw, message)
        # The checkpoint's segments are for the file (a replay starts from them), not the wire.
        message.pop("checkpoint", None)
        message.pop("history", None)
        message.pop("steps", None)
        frame = encode_fitting(message)
        if frame is None:
            return
        hook.kept["oom"] = frame  # kept even before we listen: the first viewer gets it
        if hook.listener is not None:
            hook.broadcast(frame, keep="oom")
    except Exception:
        pass


def oom_summary(alloc_size, stats, device_free):
    """PyTorch's own figures in PyTorch's own words, for jobs that catch the OOM."""
    allocated = stats.get("allocated_bytes") or 0
    reserved = stats.get("reserved_bytes") or 0
    return (
        "Tried to allocate %s; %s free on the device; %s is allocated by PyTorch, and %s "
        "is reserved by PyTorch but unallocated."
        % (
            format_size(int(alloc_size)),
            format_size(int(device_free)),
            format_size(allocated),
            format_size(max(reserved - allocated, 0)),
        )
    )


def install_excepthooks():
    """Chain sys.excepthook and threading.excepthook: report, then run the user's hook."""
    global _excepthooks_installed
    if _excepthooks_installed:
        return
    _excepthooks_installed = True
    previous_sys = sys.excepthook

    def vramtop_excepthook(kind, value, traceback):
        report_uncaught(kind, value)
        previous_sys(kind, value, traceback)

    sys.excepthook = vramtop_excepthook
    if hasattr(threading, "excepthook"):
        previous_thread = threading.excepthook

        def vramtop_thread_excepthook(args):
            report_uncaught(args.exc_type, args.exc_value)
            previous_thread(args)

        threading.excepthook = vramtop_thread_excepthook


def report_uncaught(kind, value):
    try:
        hook = _hook
        if hook is None or hook.pid != os.getpid():
            return
        if kind is None or issubclass(kind, (KeyboardInterrupt, SystemExit)):
            return  # Python exits 130 / the code given, not 1: leave exit_code unknown
        if threading.current_thread() is threading.main_thread():
            hook.uncaught = True
        message = {
            "type": "error",
            "time_s": time.time(),
            "kind": getattr(kind, "__name__", str(kind)),
            "message": str(value)[:65536],
        }
        frame = encode(message)
        hook.kept["error"] = frame
        if hook.listener is not None:
            hook.broadcast(frame, keep="error")
    except Exception:
        pass
