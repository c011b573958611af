#!/usr/bin/env python3
"""What the hook's history costs a GPT-2 training step in all (issue "Right on real training
jobs": at most 1 %), measured inside one process: short blocks of steps alternate between
the hook as `vramtop run` sets it up (PyTorch's event ring on, the hook's thread
checkpointing it and reading it whole off the GIL; with --viewer also a state made every
second, as for a viewer at 1 s) and the ring off (no recording, no checkpoints, no states).
The hook's idle thread (its socket poll and the allocation series) runs in both, so the
difference is what the history and the states add, not the hook's import.

Each block's median step is compared with the mean of the medians of the blocks either side
(the step time drifts a few % over minutes; the median drops the odd slow step). A block
must be long enough to reach the hook's checkpoints at the job's own pace: each 'on' block
starts the ring afresh, and 8 steps of GPT-2 (23,000 entries) never half-filled hook 1.5's
ring of 65,536, so such blocks measured the recording alone (seen on the H100: 0
checkpoints); a ring of 2,000,000 does the same for blocks of 40.

--viewer attaches a real viewer (viewer.py, a subprocess on the hook's socket, states at
1 s) for the whole run; its states are made in 'on' blocks only (the hook's own thread
makes them, as for any viewer) and refused in 'off' blocks, so 'on' against 'off' is the
history and a viewer at 1 s against the hook idle.

Run under the hook, with no viewer attached:
  vramtop run --quiet -- python3 hook_step_cost.py [--blocks 120] [--block-steps 40] [--viewer]
Prints one JSON line.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

from hook_read_cost import on_vs_off, spread, warmed_gpt2_under_the_hook
from train_gpt2 import train_step


class Switch:
    """Turns the hook's ring (and with it its checkpoints) off and on between blocks."""

    def __init__(self, alloc):
        self.alloc = alloc
        self.entries = alloc.ring_entries
        self.checkpoints = 0
        restart = alloc.restart_ring

        def counted(stacks):
            taken = restart(stacks)
            if taken:
                self.checkpoints += 1
            return taken

        alloc.restart_ring = counted

    def off(self):
        alloc = self.alloc
        alloc.ring_entries = 0  # the hook's thread starts no checkpoint from here
        time.sleep(0.02)
        while alloc.restarting:  # one under way turns the ring back on as it ends
            time.sleep(0.005)
        alloc._record(enabled=None)

    def on(self):
        alloc = self.alloc
        alloc.record_ring(self.entries)
        alloc.ring_fill = 0
        alloc.ring_start_count = alloc.allocation_count()
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


def record_from_a_helper_thread(alloc):
    """record_ring, called from a short-lived thread with global_record_annotations=False:
    PyTorch registers its annotation callback (a RecordFunction callback) local to that
    thread, not global. The first 'off' removes the global one the hook began with."""
    import threading

    def record_elsewhere(entries, stacks=False, clear=False):
        extra = {"clear_history": True} if clear else {}
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


def attach_viewer(hook, interval):
    """viewer.py on the hook's socket, once the hook has it as a viewer (None if not)."""
    here = os.path.dirname(os.path.abspath(__file__))
    viewer = subprocess.Popen(
        [sys.executable, os.path.join(here, "viewer.py"), "--socket", hook.path, "--interval", str(interval),
         "--timeout", "3600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not hook.viewers and time.monotonic() < deadline:
        time.sleep(0.05)
    return viewer if hook.viewers else None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=120)
    parser.add_argument("--block-steps", type=int, default=40)
    parser.add_argument("--viewer", action="store_true", help="a real viewer at 1 s, its states in 'on' blocks")
    parser.add_argument("--no-events-read", action="store_true",
                        help="experiment: checkpoints skip reading the ring before clearing it (no history kept)")
    parser.add_argument("--annotations-elsewhere", action="store_true",
                        help="experiment: the ring turned on from a helper thread with PyTorch's annotation "
                             "callback local to it, so the job's own ops never meet it")
    args = parser.parse_args()
    hook, model, optimizer, ids = warmed_gpt2_under_the_hook()
    alloc = hook.alloc
    if args.no_events_read:
        skip_events_read(alloc)
    if args.annotations_elsewhere:
        record_from_a_helper_thread(alloc)
    if not alloc.ring_entries or alloc.pickled is None:
        print(json.dumps({"error": "no ring or no ring reader: %s" % (alloc.missing + [alloc.pickled_missing],)}))
        sys.exit(2)
    if hook.viewers:
        print(json.dumps({"error": "a viewer is attached before ours: its states would count as 'off'"}))
        sys.exit(2)
    switch = Switch(alloc)
    states = States(hook)
    viewer = attach_viewer(hook, 1.0) if args.viewer else None
    if args.viewer and viewer is None:
        print(json.dumps({"error": "the viewer never attached"}))
        sys.exit(2)
    blocks = []  # (mode, median step seconds, checkpoints, states, wall seconds)
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
            blocks.append((mode, statistics.median(times), switch.checkpoints - checkpoints, states.count - made, wall))
    if viewer is not None:
        viewer.terminate()
    states.paused = False
    switch.on()
    pairs = on_vs_off(blocks)
    on = [b for b in blocks if b[0] == "on"]
    off = [b for b in blocks if b[0] == "off"]
    print(json.dumps({
        "viewer_at_1s": args.viewer, "ring": switch.entries, "events_read": not args.no_events_read,
        "annotations_elsewhere": args.annotations_elsewhere,
        "blocks": len(blocks), "block_steps": args.block_steps,
        "off_step_ms": round(1000 * statistics.mean(b[1] for b in off), 3),
        "on_step_ms": round(1000 * statistics.mean(b[1] for b in on), 3),
        "on_vs_off_pct": spread(pairs),
        "checkpoints_on": sum(b[2] for b in on), "checkpoints_off": sum(b[2] for b in off),
        "checkpoints_per_on_s": round(sum(b[2] for b in on) / sum(b[4] for b in on), 2),
        "states_per_on_s": round(sum(b[3] for b in on) / sum(b[4] for b in on), 2),
        "states_off": sum(b[3] for b in off),
        "history_pieces": len(alloc.history.pieces), "history_bytes": alloc.history.bytes,
        "vm_hwm_kb": int(re.search(r"VmHWM:\s+(\d+) kB", open("/proc/self/status").read()).group(1)),
        "block_medians_ms": [[b[0], round(1000 * b[1], 3)] for b in blocks],
    }), flush=True)


if __name__ == "__main__":
    main()
