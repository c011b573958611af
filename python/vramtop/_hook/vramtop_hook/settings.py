"""The hook's settings: fixed limits and the VRAMTOP_* environment knobs, read once
at import, and `say_once`, the one way the hook speaks on the job's stderr.

Stdlib only; nothing here raises into the job.
"""

import os
import sys


HOOK_VERSION = "1.18"
PROTOCOL_VERSION = 1
MAX_FRAME = 16 * 1024 * 1024
# Viewers only ever send `subscribe`; a bigger frame from one is garbage, not a request.
MAX_VIEWER_FRAME = 64 * 1024
MAX_VIEWERS = 32
INTERVAL_RANGE = (0.05, 3600.0)
POLL_S = 0.25  # how often to look for torch / CUDA before they are there
# A viewer that takes nothing for this long is dropped. Tests shorten it.
def env_float(name, default):
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


STALL_S = env_float("VRAMTOP_HOOK_STALL_S", 10.0)
# History's price is PyTorch's: every allocation it records gathers the job's Python stack.
# On the H100 a GPT-2 training step (transformers, 8 layers) makes 958 allocations in 28 ms,
# and recording them all cost it 4.3 to 8.8 % (1.2 to 2.6 us each; history_ab.py, in one
# process). To keep the job well within 5 %, the hook records allocations for a share of
# each HISTORY_PERIOD_S, chosen each period so that at most HISTORY_RATE allocations per
# second are recorded (5,000: 19 % of that job's second, 1 to 2 % of its time). A job that
# allocates less (where a leak is easiest to miss in the noise) is recorded whole.
HISTORY_PERIOD_S = 1.0
HISTORY_RATE = env_float("VRAMTOP_HISTORY_RATE", 5000.0)
HISTORY_MIN_SHARE = 0.02
# A state read that costs ten times the one before is not paced on, once per this many
# seconds (Hook.state_frame says why): at most one such read per 10 minutes is spent
# beyond the 1 % budget.
FORGIVE_S = 600.0


def env_entries(name, default):
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
# - Before the ring can fill, the hook takes a checkpoint: the ring cleared in place
#   (nothing converted), and a snapshot that now converts only the entries made since (a
#   handful). That snapshot's segments, kept in memory, plus every event of
#   the ring since, is the job's history from then on: an OOM's file carries both
#   (`vramtop_oom.checkpoint`), and a replay starts from the checkpoint's segments.
# - Whether it may fill is told without reading it: the allocations since the checkpoint
#   (the raw stats, 15 us, every RING_CHECK_S, or sooner where the job allocates fast:
#   `ring_look_period`), counted as 2 entries each (alloc, free_completed; 3 with
#   free_requested, where PyTorch cannot skip it: SKIPPED_ACTIONS)
#   and checkpointed from a quarter of the ring (RING_CHECKPOINT_SHARE). A look comes
#   before another quarter can fill at the pace seen, or at RING_FLOOR_RATE where the job
#   has been slower: the ring is read whole only below 0.8 of it (restart_ring), so a burst
#   at the job's start (a model built, its first steps) no longer costs the history its
#   beginning.
# 32,768 entries checkpointed from a quarter full (hook 1.6; 65,536 from half before):
# every entry is read once whatever the size, but PyTorch's C++ read needs about 2.3 KB an
# entry while it runs, so reads of half a 65,536-entry ring broke the 64 MiB bound on the
# hook's memory (+124.9 MiB peak; +54.9 MiB reading about 8,000 entries at a time;
# hook_memory.py on an H100). Reads that small mean about six checkpoints a second at a
# GPT-2 pace, which cost the GIL 2.3 ms each until the state read moved off it (0.3 ms
# now). A quarter of a bigger ring, rather than half of a smaller one, leaves more room for
# a burst between looks: up to 0.8 of the ring, under which restart_ring reads it whole.
RING_ENTRIES = env_entries("VRAMTOP_RING", 32768)
RING_CHECKPOINT_SHARE = 0.25
# The pace assumed, at the least, when timing the next look (entries a second): above
# GPT-2's (8 layers: 99,000 entries a second with free_requested, 66,000 without).
RING_FLOOR_RATE = 100000.0
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
# Hook 1.7: the ring skips `free_requested` where PyTorch takes `skip_actions` (2.11 does):
# 2 entries an allocation instead of 3. Nothing vramtop replays needs it: a block is freed
# by its `free_completed` (the same moment, unless another stream still used the block),
# and the replay only counted the requests. A third fewer entries is a third less for
# PyTorch to record on the job's thread, to read at each checkpoint and to keep.
SKIPPED_ACTIONS = ("free_requested",)
ENTRIES_PER_ALLOCATION_SKIPPING = 2
# Hook 1.5: the ring is read whole before each checkpoint clears it, so that an OOM's file
# holds the job's history from its start (or, past HISTORY_MAX_MB, from an older
# checkpoint) rather than from the last checkpoint only. Read through PyTorch's C++
# `_memory_snapshot_pickled()` (PickledSnapshot), which ctypes calls without the GIL: on an
# H100 (2.11, GPT-2 8 layers, 108k ring entries a second, blocks alternating in one process)
# the step took -0.27 % longer (95 %: -0.93 to +0.39) reading the ring every 0.35 s so,
# against +6.9 % with _snapshot(), which turns each entry into a dict under the GIL. The
# bytes are kept as PyTorch pickled them, zlib-compressed (also without the GIL): nothing
# here unpickles them (that alone cost +5.4 %); vramtop reads them at the OOM.
# Hook 1.6: the checkpoint's own state is read the same way, off the GIL, and unpickled only
# when an OOM or a state needs it; the ring is cleared in place (clear_history) in one call.
# Before, a checkpoint held the GIL about 2.3 ms (the state read 1.4 to 1.6 ms, unpickling
# 0.4, the ring off and on 0.2 to 0.65; checkpoint_profile.py on an H100), which a ring small
# enough for the 64 MiB bound pays several times a second.
HISTORY_MAX_MB = env_float("VRAMTOP_HISTORY_MB", 32.0)
# Hook 1.8: the ring is cleared while PyTorch is still pickling its copy of it, not after
# (TorchAllocator.read_then_clear): PyTorch copies the ring under the allocator's lock
# (3.5 ms for 65,536 entries: about 0.05 us an entry) and then pickles the copy off it
# (about 3 us an entry: 26 ms for 9,000 entries on an H200, 2.11). Cleared after the read,
# every event of those 26 ms was in no piece: hundreds a checkpoint at GPT-2's pace, and
# with them, at times, the job's own segment decisions. One that comes while the copy runs
# waits for the lock, and the events in no piece are those between the copy's end and the
# clear. (Hook 1.8 waited 0.3 ms and 0.03 us an entry of the wall: the gaps a state's own
# entries date measured 3.0 to 5.3 ms on an H200, against 26 to 92 ms cleared after the
# read on an H100.) Hook 1.9 waits for RING_COPY_CPU_S and RING_COPY_S_PER_ENTRY an entry
# the ring may hold of the reader's own CPU time (`wait_for_the_copy`), looking again every
# RING_COPY_POLL_S: a reader kept off the lock or off a core uses none, where the wall's
# wait let the clear overtake it. RING_COPY_CPU_S leaves room for what the reader runs
# before PyTorch takes the lock (the foreign call, PyTorch's clock converter). A clear that
# came before the copy all the same is told by the read's size
# (RING_READ_MIN_BYTES_PER_ENTRY): the history then begins again there.
RING_COPY_CPU_S = 0.0005
RING_COPY_S_PER_ENTRY = 3e-8
RING_COPY_POLL_S = 0.0005
# A pickled ring entry takes about 52 bytes (468,604 for 8,970 on an H200): a read that
# holds fewer than this many bytes an expected entry beyond the state read after it was
# made after the clearing, not before.
RING_READ_MIN_BYTES_PER_ENTRY = 16
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
