#!/usr/bin/env python3
"""What the hook's history costs a GPT-2 training step in all (issue "Right on real training
jobs": at most 1 %), measured inside one process: short blocks of steps alternate between
the hook as `vramtop run` sets it up (PyTorch's event ring on, the hook's thread
checkpointing it and reading it whole off the GIL; with --viewer also a state made every
second, as for a viewer at 1 s) and the ring off (no recording, no checkpoints, no states).
The hook's idle thread (its socket poll and the allocation series) runs in both, so the
difference is what the history and the states add, not the hook's import.

Each 'on' block is compared with the mean of the 'off' blocks either side: the figure is
`on_minus_off_pct`, the mean difference of the blocks' mean steps in % of the mean 'off'
step (a user's job takes the mean step's time); by medians, trimmed means and ratios too. The hook checkpoints at the
job's own pace in 'on' time however short the blocks (Switch carries the allocations over
'off' blocks).

--viewer attaches a real viewer (viewer.py, a subprocess on the hook's socket) for the
whole run; its states are made in 'on' blocks only (the hook's own thread makes them, as
for any viewer) and refused in 'off' blocks, so 'on' against 'off' is the history and a
viewer against the hook idle. Half its asks fall in 'off' blocks, so it asks every 0.5 s
(--viewer-interval) for about one state an 'on' second, a viewer at 1 s (states_per_on_s
says how many came).

Noise. The step is bound by the job thread's CPU (launching kernels), its time moves
between levels (26 to 33 ms on the H100) that last seconds, and 1 to 3 % of steps take 50
to 111 ms with or without vramtop (step_outliers.py). Pairs of 20-step blocks spread 4.6
to 7.1 % (pinned; 40-step ones 4.4 to 4.8 % unpinned), of 4-step blocks 13 %: one run's
interval is about +-1 % either way, and runs in different processes differ by more than
that. The job's thread is pinned alone to one core by default, and every other thread
(PyTorch's, the hook's, `vramtop run`'s, the viewer's) to the rest (`--no-pin` leaves the
scheduler alone); it did not narrow the intervals.

Experiments, each a part of the history taken away (for finding where the cost is, never a
setting a user runs):
  --no-checkpoints  the ring records at the hook's size but is never checkpointed (the
                    recording alone, the hook's thread idle)
  --no-state-read   a checkpoint keeps the ring's own read (it holds the segments too) as
                    its state, instead of reading the segments again after clearing
  --no-events-read, --annotations-elsewhere, --clear-after-read: see their help

Run under the hook, with no viewer attached:
  vramtop run --quiet -- python3 hook_step_cost.py [--blocks 300] [--block-steps 20] [--viewer]
Prints one JSON line.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

from hook_read_cost import on_minus_off, on_vs_off, spread, warmed_gpt2_under_the_hook
from train_gpt2 import train_step


class Switch:
    """Turns the hook's ring (and with it its checkpoints) off and on between blocks.

    The allocations of 'on' blocks since the last checkpoint are carried over the 'off'
    blocks between them, so a checkpoint is due after as many 'on' allocations as in a job
    that ran 'on' throughout. Short blocks still take fewer: a due checkpoint waits for the
    hook's next look, and 'off' forgets a look's timing (on the H100, 2.0 a second with
    4-step blocks against 3.6 with 20-step ones; checkpoints_per_on_s says). And the ring
    starts empty in each 'on' block (turning PyTorch's ring off clears it), so a checkpoint
    reads the entries of its own block only: with short blocks, fewer than a job's
    checkpoint reads. So short blocks understate the checkpoints' share.
    'off' waits for a checkpoint under way to end, its ring read included, so none of its
    work falls in an 'off' block."""

    def __init__(self, alloc):
        self.alloc = alloc
        self.entries = alloc.ring_entries
        self.checkpoints = 0
        self.checkpointing = False
        self.carried = 0  # 'on' allocations since the last checkpoint, over 'off' blocks
        restart = alloc.restart_ring

        def counted(stacks):
            self.checkpointing = True
            try:
                taken = restart(stacks)
            finally:
                self.checkpointing = False
            if taken:
                self.checkpoints += 1
            return taken

        alloc.restart_ring = counted

    def off(self):
        alloc = self.alloc
        alloc.ring_entries = 0  # the hook's thread starts no checkpoint from here
        time.sleep(0.001)
        while self.checkpointing or alloc.restarting:  # one under way ends first
            time.sleep(0.001)
        count = alloc.allocation_count()
        known = count is not None and alloc.ring_start_count is not None
        self.carried = max(0, count - alloc.ring_start_count) if known else 0
        alloc._record(enabled=None)

    def on(self):
        alloc = self.alloc
        alloc.record_ring(self.entries)
        alloc.ring_fill = 0
        count = alloc.allocation_count()
        alloc.ring_start_count = None if count is None else count - self.carried
        alloc.ring_entries = self.entries


class States:
    """The hook's states, counted, and refused while `paused` (the viewer then gets none)."""

    def __init__(self, hook):
        self.count = 0
        self.paused = False
        made = hook.state_frame

        def counted():
            if self.paused:
                return None
            self.count += 1
            return made()

        hook.state_frame = counted


def skip_events_read(alloc):
    """Each checkpoint's first read (the ring, before it is cleared) answers None: what the
    step costs without the history's ring reads, the state read and clearing kept."""
    read, clear, cleared = alloc.read_pickled, alloc.clear_ring, [False]

    def read_state_only():
        return read() if cleared[0] else None

    def clear_then_mark(*a, **k):
        cleared[0] = True
        return clear(*a, **k)

    restart = alloc.restart_ring

    def checkpoint(*a, **k):
        cleared[0] = False
        return restart(*a, **k)

    alloc.read_pickled, alloc.clear_ring, alloc.restart_ring = read_state_only, clear_then_mark, checkpoint


def clear_after_read(alloc):
    """Hook 1.7's order: the ring read whole first, then cleared, then the state read, all
    on the hook's thread (no helper thread; the events of the whole read are in no piece).
    For comparing hook 1.8's overlapped read with it in one machine's runs."""
    def read_then_clear(entries, stacks, estimate):
        events = alloc.read_pickled()
        if alloc.user_history or not alloc.ring_entries:
            return None
        count = alloc.allocation_count()
        alloc.clear_ring(entries, stacks)
        return events, count, alloc.read_pickled()

    alloc.read_then_clear = read_then_clear


def no_checkpoints(alloc):
    """The ring keeps recording (it wraps at its size) and no checkpoint is ever taken."""
    alloc.restart_ring = lambda stacks: False


def state_from_events_read(alloc):
    """A checkpoint's state is its events read (a snapshot of the segments and the ring,
    taken together) instead of a second read after the clearing. Where the events were not
    read whole (the first checkpoint, say) the state is read as the hook does."""
    read, clear, kept = alloc.read_pickled, alloc.clear_ring, {"events": None, "cleared": False}

    def read_or_reuse():
        if kept["cleared"]:
            kept["cleared"] = False
            events, kept["events"] = kept["events"], None
            return events if events is not None else read()
        kept["events"] = read()
        return kept["events"]

    def clear_then_mark(*a, **k):
        kept["cleared"] = True
        return clear(*a, **k)

    alloc.read_pickled, alloc.clear_ring = read_or_reuse, clear_then_mark


def siblings(core):
    """The cores sharing `core`'s physical core (SMT), itself included; {core} if unknown."""
    try:
        with open("/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list" % core) as f:
            text = f.read().strip()
    except OSError:
        return {core}
    cores = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cores.update(range(int(lo), int(hi or lo) + 1))
    return cores | {core}


def pin(spare_pids=()):
    """The job's thread alone on one core (the last this process may use: interrupts favour
    the first), its SMT siblings left idle (a thread there shares the core's units: the
    hook's ring read beside the job would slow it for that core's sake, which an idle
    machine's scheduler avoids), every other thread of this process, of its parent
    (`vramtop run`) and of `spare_pids` on the rest. Threads are pinned one by one: on
    Linux an affinity is each thread's own. Returns (job core, the rest, its siblings), or
    None with too few cores."""
    cores = sorted(os.sched_getaffinity(0))
    job = cores[-1]
    idle = siblings(job) - {job}
    rest = set(cores) - idle - {job}
    if not rest:
        return None
    me = threading.get_native_id()
    for pid in (os.getpid(), os.getppid()) + tuple(spare_pids):
        try:
            tids = [int(t) for t in os.listdir("/proc/%d/task" % pid)]
        except OSError:
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(tid, {job} if tid == me else rest)
            except OSError:
                pass  # a thread that ended meanwhile, or one not ours to move
    return job, rest, sorted(idle)


def trimmed_mean(times, cut=0.1):
    ordered = sorted(times)
    k = int(len(ordered) * cut)
    kept = ordered[k:len(ordered) - k] or ordered
    return sum(kept) / len(kept)


def record_from_a_helper_thread(alloc):
    """record_ring, called from a short-lived thread with global_record_annotations=False:
    PyTorch registers its annotation callback (a RecordFunction callback) local to that
    thread, not global. The first 'off' removes the global one the hook began with."""
    def record_elsewhere(entries, stacks=False, clear=False):
        extra = {"clear_history": True} if clear else {}
        if alloc.skips_requests:
            extra["skip_actions"] = ["free_requested"]
        failed = []

        def call():
            try:
                alloc._record(enabled="all", context="state" if stacks else None, stacks="python",
                              max_entries=entries, **extra)
            except Exception as err:  # noqa: BLE001 - reported below, on the caller's thread
                failed.append(err)

        helper = threading.Thread(target=call)
        helper.start()
        helper.join()
        if failed:
            raise failed[0]

    alloc.record_ring = record_elsewhere


def attach_viewer(hook, interval, cores=None):
    """viewer.py on the hook's socket, once the hook has it as a viewer (None if not); on
    `cores` when given (off the job's core)."""
    here = os.path.dirname(os.path.abspath(__file__))
    viewer = subprocess.Popen(
        [sys.executable, os.path.join(here, "viewer.py"), "--socket", hook.path, "--interval", str(interval),
         "--timeout", "3600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    if cores:  # after the start, not in preexec_fn (unsafe in a process with threads)
        try:
            os.sched_setaffinity(viewer.pid, cores)
        except OSError:
            pass
    deadline = time.monotonic() + 20
    while not hook.viewers and time.monotonic() < deadline:
        time.sleep(0.05)
    return viewer if hook.viewers else None


def launch_share(model, optimizer, ids, steps=20):
    """What bounds the step: the median time the job's thread takes to launch a step's work
    (until optimizer.zero_grad returns, before the synchronize) against the median step, in
    %. Near 100, the step is the thread's (what the thread adds shows in full); well under,
    the GPU's, and the thread's extra time hides behind kernels still running."""
    launches = []
    steps_s = [train_step(model, optimizer, ids, launches)[1] for _ in range(steps)]
    return round(100 * statistics.median(launches) / statistics.median(steps_s), 1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=300)
    parser.add_argument("--block-steps", type=int, default=20)
    parser.add_argument("--no-pin", action="store_true", help="leave threads where the scheduler puts them")
    parser.add_argument("--no-checkpoints", action="store_true",
                        help="experiment: the ring records at the hook's size, never checkpointed")
    parser.add_argument("--no-state-read", action="store_true",
                        help="experiment: a checkpoint's state is its events read, not a second read")
    parser.add_argument("--viewer", action="store_true", help="a real viewer, its states in 'on' blocks")
    parser.add_argument("--viewer-interval", type=float, default=0.5,
                        help="its interval: 0.5 s gives about one state an 'on' second")
    parser.add_argument("--no-events-read", action="store_true",
                        help="experiment: checkpoints skip reading the ring before clearing it (no history kept)")
    parser.add_argument("--clear-after-read", action="store_true",
                        help="experiment: hook 1.7's order (read the ring whole, then clear it, then read the state)")
    parser.add_argument("--annotations-elsewhere", action="store_true",
                        help="experiment: the ring turned on from a helper thread with PyTorch's annotation "
                             "callback local to it, so the job's own ops never meet it")
    parser.add_argument("--batch", type=int, default=8,
                        help="sequences a step: 8 x 384 leaves the H200 waiting on the job's thread "
                             "(the step is its CPU's); 32 x 1024 makes the GPU the bound")
    parser.add_argument("--length", type=int, default=384, help="tokens a sequence")
    args = parser.parse_args()
    hook, model, optimizer, ids = warmed_gpt2_under_the_hook(args.batch, args.length)
    alloc = hook.alloc
    if args.no_events_read:
        skip_events_read(alloc)
    if args.annotations_elsewhere:
        record_from_a_helper_thread(alloc)
    if args.no_checkpoints:
        no_checkpoints(alloc)
    if args.clear_after_read:
        clear_after_read(alloc)
    if args.no_state_read:
        state_from_events_read(alloc)
    if not alloc.ring_entries or alloc.pickled is None:
        print(json.dumps({"error": "no ring or no ring reader: %s" % (alloc.missing + [alloc.pickled_missing],)}))
        sys.exit(2)
    if hook.viewers:
        print(json.dumps({"error": "a viewer is attached before ours: its states would count as 'off'"}))
        sys.exit(2)
    pinned = None if args.no_pin else pin()
    switch = Switch(alloc)
    states = States(hook)
    viewer = attach_viewer(hook, args.viewer_interval, pinned[1] if pinned else None) if args.viewer else None
    if args.viewer and viewer is None:
        print(json.dumps({"error": "the viewer never attached"}))
        sys.exit(2)
    blocks = []  # (mode, median step s, checkpoints, states, wall s, trimmed mean, mean, steps)
    for block in range(args.blocks + 1):  # the first, off, is a warm-up
        mode = "on" if block % 2 else "off"
        if mode == "on":
            switch.on()
            states.paused = False
        else:
            states.paused = True
            switch.off()
        checkpoints, made = switch.checkpoints, states.count
        began = time.perf_counter()
        times = [train_step(model, optimizer, ids)[1] for _ in range(args.block_steps)]
        wall = time.perf_counter() - began
        if block:
            blocks.append((mode, statistics.median(times), switch.checkpoints - checkpoints, states.count - made, wall,
                           trimmed_mean(times), sum(times) / len(times), times))
    if viewer is not None:
        viewer.terminate()
    states.paused = False
    switch.off()
    launch_pct = launch_share(model, optimizer, ids)
    switch.on()
    pairs = on_vs_off(blocks)
    trimmed_pairs = on_vs_off([(b[0], b[5]) for b in blocks])
    mean_pairs = on_vs_off([(b[0], b[6]) for b in blocks])
    on = [b for b in blocks if b[0] == "on"]
    off = [b for b in blocks if b[0] == "off"]
    print(json.dumps({
        "viewer": args.viewer, "viewer_interval_s": args.viewer_interval if args.viewer else None, "ring": switch.entries, "events_read": not args.no_events_read,
        "annotations_elsewhere": args.annotations_elsewhere, "checkpoints": not args.no_checkpoints,
        "state_read": not args.no_state_read, "clear_after_read": args.clear_after_read, "pinned_core": pinned[0] if pinned else None,
        "idle_siblings": pinned[2] if pinned else None,
        "blocks": len(blocks), "block_steps": args.block_steps, "batch": args.batch, "length": args.length,
        "launch_pct_of_step": launch_pct,
        "off_step_ms": round(1000 * statistics.mean(b[1] for b in off), 3),
        "on_step_ms": round(1000 * statistics.mean(b[1] for b in on), 3),
        "on_minus_off_pct": on_minus_off([(b[0], b[6]) for b in blocks]),
        "on_minus_off_by_medians_pct": on_minus_off(blocks),
        "on_vs_off_pct": spread(pairs),
        "on_vs_off_trimmed_pct": spread(trimmed_pairs),
        "on_vs_off_mean_pct": spread(mean_pairs),
        "on_vs_off_median_of_pairs_pct": round(statistics.median(pairs), 4),
        "skips_free_requested": bool(getattr(alloc, "skips_requests", False)),
        "checkpoints_on": sum(b[2] for b in on), "checkpoints_off": sum(b[2] for b in off),
        "checkpoints_per_on_s": round(sum(b[2] for b in on) / sum(b[4] for b in on), 2),
        "states_per_on_s": round(sum(b[3] for b in on) / sum(b[4] for b in on), 2),
        "states_off": sum(b[3] for b in off),
        "history_pieces": len(alloc.history.pieces), "history_bytes": alloc.history.bytes,
        "vm_hwm_kb": int(re.search(r"VmHWM:\s+(\d+) kB", open("/proc/self/status").read()).group(1)),
        "block_medians_ms": [[b[0], round(1000 * b[1], 3), round(1000 * b[5], 3), b[2]] for b in blocks],
        "block_steps_ms": [[round(1000 * t, 2) for t in b[7]] for b in blocks],
    }), flush=True)


if __name__ == "__main__":
    main()
