#!/usr/bin/env python3
"""What keeping the job's whole allocator history costs a GPT-2 training step (hook 1.5),
measured inside one process: blocks of steps alternate between the hook reading PyTorch's
ring off the GIL before each checkpoint (its `PickledSnapshot`, the default) and not
(checkpoints only, as hook 1.4), and each 'on' block is compared with the mean of the 'off'
blocks either side. No viewer is attached: the checkpoints run on the hook's own thread
whenever the ring may be half full, as in any job under `vramtop run`.

Run under the hook: vramtop run --quiet -- python3 ring_history_cost.py [--blocks 30]
Prints one JSON line: the step time per mode, the on-off difference with its 95 % interval,
the checkpoints and history kept per second, and the hook's history bytes at the end.
"""
import argparse
import json
import re
import sys
import time

from hook_read_cost import on_vs_off, spread, warmed_gpt2_under_the_hook
from train_gpt2 import train_step


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--block-steps", type=int, default=40)
    args = parser.parse_args()
    hook, model, optimizer, ids = warmed_gpt2_under_the_hook()
    alloc = hook.alloc
    reader = alloc.pickled
    if reader is None:
        print(json.dumps({"error": "no ring reader: %s" % alloc.pickled_missing}))
        sys.exit(2)
    blocks = []  # (mode, mean step seconds, checkpoints, history bytes, wall seconds)
    restarts = [0]
    restart = alloc.restart_ring

    def counted(stacks):
        restarts[0] += 1
        return restart(stacks)

    alloc.restart_ring = counted
    for block in range(args.blocks + 1):  # the first, off, is a warm-up
        mode = "on" if block % 2 else "off"
        alloc.pickled = reader if mode == "on" else None
        if mode == "off":
            alloc.history.clear()
        before = restarts[0]
        began = time.perf_counter()
        times = [train_step(model, optimizer, ids)[1] for _ in range(args.block_steps)]
        wall = time.perf_counter() - began
        if block:
            blocks.append((mode, sum(times) / len(times), restarts[0] - before, alloc.history.bytes, wall))
    alloc.pickled = reader
    pairs = on_vs_off(blocks)
    on = [b for b in blocks if b[0] == "on"]
    off = [b for b in blocks if b[0] == "off"]
    history = alloc.history
    print(json.dumps({
        "blocks": len(blocks), "block_steps": args.block_steps,
        "off_step_ms": round(1000 * sum(b[1] for b in off) / len(off), 3),
        "on_step_ms": round(1000 * sum(b[1] for b in on) / len(on), 3),
        "on_vs_off_pct": spread(pairs),
        "checkpoints_per_s": round(sum(b[2] for b in on) / sum(b[4] for b in on), 2),
        "history_bytes_per_s_on": round(max(b[3] for b in on) / max(b[4] for b in on)),
        "history_pieces": len(history.pieces), "history_bytes": history.bytes,
        "vm_hwm_kb": int(re.search(r"VmHWM:\s+(\d+) kB", open("/proc/self/status").read()).group(1)),
        "pairs_pct": [round(p, 3) for p in pairs],
    }), flush=True)


if __name__ == "__main__":
    main()
