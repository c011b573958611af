#!/usr/bin/env python3
"""Where a hook checkpoint's time goes, in a GPT-2 loop under the hook: each part of
`restart_ring` timed by wrappers (the ring read off the GIL, the ring turned off and on,
the state read holding the GIL, its unpickling, the history's compression), per checkpoint.

  VRAMTOP_RING=16384 vramtop run --quiet -- python3 checkpoint_profile.py [--steps 600]
Prints one JSON line: per part, the calls and the mean and total milliseconds.
"""
import argparse
import json
import pickle
import time

from hook_read_cost import warmed_gpt2_under_the_hook
from train_gpt2 import train_step


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=600)
    args = parser.parse_args()
    hook, model, optimizer, ids = warmed_gpt2_under_the_hook()
    alloc = hook.alloc
    parts = {}

    def timed(name, fn):
        def wrapper(*a, **k):
            began = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                n, total = parts.get(name, (0, 0.0))
                parts[name] = (n + 1, total + time.perf_counter() - began)
        return wrapper

    read = alloc.read_pickled
    sizes = {"events": [], "state": []}

    def read_split(hold_gil=False):
        name = "state read (GIL held)" if hold_gil else "events read (off the GIL)"
        data = timed(name, read)(hold_gil)
        sizes["state" if hold_gil else "events"].append(len(data or b""))
        return data

    alloc.read_pickled = read_split
    alloc._record = timed("ring off/on (_record)", alloc._record)
    alloc.restart_ring = timed("checkpoint in all", alloc.restart_ring)
    alloc.history.pack = timed("history pack (zlib)", alloc.history.pack)
    pickle.loads = timed("state unpickled", pickle.loads)
    began = time.perf_counter()
    steps = [train_step(model, optimizer, ids)[1] for _ in range(args.steps)]
    wall = time.perf_counter() - began
    print(json.dumps({
        "steps": args.steps, "wall_s": round(wall, 2), "step_ms": round(1000 * sum(steps) / len(steps), 3),
        "ring_entries": alloc.ring_entries,
        "parts": {k: {"calls": n, "mean_ms": round(1000 * t / n, 3), "total_ms": round(1000 * t, 1)}
                  for k, (n, t) in parts.items()},
        "events_bytes_mean": sum(sizes["events"]) // max(1, len(sizes["events"])),
        "state_bytes_mean": sum(sizes["state"]) // max(1, len(sizes["state"])),
    }), flush=True)


if __name__ == "__main__":
    main()
