#!/usr/bin/env python3
"""What recording allocation stacks costs a GPT-2 training step, measured inside one
process so that the drift between processes (5 to 22 % on the H100) drops out: blocks of
steps alternate between history off and history on (the hook's own form:
enabled="state", context="state", stacks="python"), and the per-step means of the two
are compared. From the cost per recorded allocation it prints the share of each second,
and the allocation rate (VRAMTOP_HISTORY_RATE), that keep history within a budget.
Run without the hook. Prints one JSON line.
usage: history_ab.py [--blocks 12] [--block-steps 20] [--budget-pct 5]
"""
import argparse
import json
import time

import torch

from train_gpt2 import build, train_step  # the overhead check's own loop, beside this file


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--block-steps", type=int, default=20)
    parser.add_argument("--budget-pct", type=float, default=5.0)
    args = parser.parse_args()
    torch.manual_seed(0)
    config, model, optimizer = build(8)
    ids = torch.randint(0, config.vocab_size, (8, 384), device="cuda")
    record = torch.cuda.memory._record_memory_history

    def count():
        return torch.cuda.memory_stats().get("allocation.all.allocated", 0)

    def step():
        return train_step(model, optimizer, ids)[1]

    for _ in range(20):  # warm-up: kernels, the allocator's pools
        step()
    times = {"off": [], "on": []}
    before = count()
    steps = 0
    switch_s = []
    for block in range(args.blocks):
        mode = "on" if block % 2 else "off"
        began = time.perf_counter()
        if mode == "on":
            record(enabled="state", context="state", stacks="python")
        else:
            record(enabled=None)
        switch_s.append(time.perf_counter() - began)
        for _ in range(args.block_steps):
            times[mode].append(step())
            steps += 1
    record(enabled=None)
    allocs_per_step = (count() - before) / max(steps, 1)
    off = sum(times["off"]) / len(times["off"])
    on = sum(times["on"]) / len(times["on"])
    per_alloc_us = (on - off) / allocs_per_step * 1e6 if allocs_per_step else None
    # Recording a share s of each second costs s * (on - off) / off of the job's time.
    share = args.budget_pct / 100.0 * off / (on - off) if on > off else 1.0
    print(json.dumps({
        "off_ms": round(off * 1000, 3), "on_ms": round(on * 1000, 3),
        "full_history_pct": round(100 * (on / off - 1), 2),
        "allocs_per_step": round(allocs_per_step, 1),
        "allocs_per_s": round(allocs_per_step / off, 0),
        "cost_per_recorded_alloc_us": round(per_alloc_us, 2) if per_alloc_us else None,
        "switch_ms_max": round(max(switch_s) * 1000, 3),
        "share_for_budget": round(min(share, 1.0), 3),
        "rate_for_budget": round(min(share, 1.0) * allocs_per_step / off, 0),
        "budget_pct": args.budget_pct,
        "block_means_ms": {m: [round(1000 * sum(t[i:i + args.block_steps]) / args.block_steps, 2)
                               for i in range(0, len(t), args.block_steps)] for m, t in times.items()},
    }), flush=True)


if __name__ == "__main__":
    main()
