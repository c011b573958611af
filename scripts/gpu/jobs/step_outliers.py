#!/usr/bin/env python3
"""How a GPT-2 step's time spreads in one process (8 layers, batch 8 x 384, 2,500 steps
after 20 warm-up): its mean, median, 90th and 99th percentiles, and the steps over 45 and
60 ms, with where the first of them fell. Run it with no vramtop, under `vramtop run`, or
with --no-gc (Python's collector off), to see whether slow steps are the hook's.

  python3 step_outliers.py LABEL [--no-gc]
  vramtop run --quiet -- python3 step_outliers.py LABEL
Prints one JSON line.
"""
import gc
import json
import sys

import torch

from train_gpt2 import build, train_step


def main():
    if "--no-gc" in sys.argv:
        gc.disable()
    torch.manual_seed(0)
    config, model, optimizer = build(8)
    ids = torch.randint(0, config.vocab_size, (8, 384), device="cuda")
    for _ in range(20):
        train_step(model, optimizer, ids)
    times = [1000 * train_step(model, optimizer, ids)[1] for _ in range(2500)]
    ordered = sorted(times)
    n = len(ordered)
    print(json.dumps({
        "args": sys.argv[1:], "mean": round(sum(times) / n, 3), "median": round(ordered[n // 2], 3),
        "p90": round(ordered[int(0.9 * n)], 3), "p99": round(ordered[int(0.99 * n)], 3),
        "max": round(ordered[-1], 3), "over_45ms": sum(t > 45 for t in times),
        "over_60ms": sum(t > 60 for t in times), "slow_at": [i for i, t in enumerate(times) if t > 45][:60],
    }), flush=True)


if __name__ == "__main__":
    main()
