#!/usr/bin/env python3
"""Where a hook checkpoint's time goes, in a GPT-2 loop under the hook: each part of
`restart_ring` timed by wrappers (the ring read off the GIL, the ring cleared, the state
read off the GIL, the history's compression), per checkpoint. Since hook 1.6 only the
clearing and the bookkeeping between the parts hold the GIL: `gil_held_ms_mean` is a
checkpoint in all less its reads and its compression (which release it). An estimate: the
reads' own times include getting the GIL back, so it can read low (even below 0).

  VRAMTOP_RING=16384 vramtop run --quiet -- python3 checkpoint_profile.py [--steps 600]
Prints one JSON line: per part, the calls and the mean and total milliseconds, and the
signature of this PyTorch's _record_memory_history (whether it takes clear_history).
"""
import argparse
import inspect
import json
import time

from hook_read_cost import warmed_gpt2_under_the_hook
from train_gpt2 import train_step

OFF_THE_GIL = ("events read (off the GIL)", "state read (off the GIL)", "history pack (zlib)")


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

    # A read before the ring is cleared is the events piece; the one after, the state.
    cleared = [False]
    sizes = {"events": [], "state": []}
    read, clear, restart = alloc.read_pickled, timed("ring cleared (clear_ring)", alloc.clear_ring), timed("checkpoint in all", alloc.restart_ring)

    def read_split():
        kind = "state" if cleared[0] else "events"
        data = timed("%s read (off the GIL)" % kind, read)()
        sizes[kind].append(len(data or b""))
        return data

    def clear_then_mark(*a, **k):
        cleared[0] = True
        return clear(*a, **k)

    def checkpoint(*a, **k):
        cleared[0] = False
        return restart(*a, **k)

    alloc.read_pickled = read_split
    alloc.clear_ring = clear_then_mark
    alloc.restart_ring = checkpoint
    alloc.history.pack = timed("history pack (zlib)", alloc.history.pack)
    began = time.perf_counter()
    steps = [train_step(model, optimizer, ids)[1] for _ in range(args.steps)]
    wall = time.perf_counter() - began
    print(json.dumps({
        "steps": args.steps, "wall_s": round(wall, 2), "step_ms": round(1000 * sum(steps) / len(steps), 3),
        "ring_entries": alloc.ring_entries,
        "parts": {k: {"calls": n, "mean_ms": round(1000 * t / n, 3), "total_ms": round(1000 * t, 1)}
                  for k, (n, t) in parts.items()},
        "gil_held_ms_mean": gil_held_ms(parts),
        "clear_in_place": alloc._clear_in_place,
        "record_signature": signature(alloc._record),
        "events_bytes_mean": sum(sizes["events"]) // max(1, len(sizes["events"])),
        "state_bytes_mean": sum(sizes["state"]) // max(1, len(sizes["state"])),
    }), flush=True)


def gil_held_ms(parts):
    """A checkpoint's mean time less its parts that release the GIL."""
    n, total = parts.get("checkpoint in all", (0, 0.0))
    if not n:
        return None
    off = sum(parts.get(k, (0, 0.0))[1] for k in OFF_THE_GIL)
    return round(1000 * (total - off) / n, 3)


def signature(fn):
    try:
        return str(inspect.signature(getattr(fn, "_vramtop_original", fn)))
    except (TypeError, ValueError):
        return None


if __name__ == "__main__":
    main()
