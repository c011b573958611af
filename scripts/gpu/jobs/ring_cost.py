#!/usr/bin/env python3
"""What a bounded ring of PyTorch's alloc/free events (no stacks) costs a GPT-2 training
step, and what it costs to read: the evidence behind the hook's event ring.

1. Recording: blocks of steps alternate between the ring off and the ring on
   (`_record_memory_history(enabled="all", context=None, max_entries=N)`), in one process,
   each 'on' block against the mean of the 'off' blocks either side (the step time drifts
   about 4 % from block to block; history_ab.py does the same for stacks).
2. Reading: `torch.cuda.memory._snapshot()` timed with the ring off and with a full ring
   of N entries, for several N (the hook reads a state every second; the ring must not be
   converted into Python on each of them).

With several --entries (8192,32768), the 'on' blocks take each size in turn, every one
between two 'off' blocks, so the sizes are compared in one process; --skip-free-requested
records as the hook does.

usage: ring_cost.py [--blocks 30] [--block-steps 40] [--entries 65536[,N...]] [--skip-free-requested]
       ring_cost.py --micro-only [--micro-entries 8192,32768] [--micro-cold-mb 0,2]
Prints JSON lines; the last is the summary.
"""
import argparse
import inspect
import json
import time

import torch

from hook_read_cost import spread  # the same statistics as the hook's cost check
from train_gpt2 import build, train_step

SKIP = ["free_requested"] if "skip_actions" in inspect.signature(
    torch.cuda.memory._record_memory_history).parameters else None


def ring(entries, skip=False):
    """The ring on with `entries` (with `skip`, without free_requested, as the hook 1.7+
    records where PyTorch can), or off with 0."""
    if entries:
        extra = {"skip_actions": SKIP} if skip and SKIP else {}
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                                 max_entries=entries, **extra)
    else:
        torch.cuda.memory._record_memory_history(enabled=None)


def snapshot_ms(times=10):
    best = []
    for _ in range(times):
        began = time.perf_counter()
        snap = torch.cuda.memory._snapshot()
        best.append(1000 * (time.perf_counter() - began))
    traces = sum(len(t) for t in snap.get("device_traces", []))
    best.sort()
    return {"median_ms": round(best[len(best) // 2], 3), "min_ms": round(best[0], 3), "trace_entries": traces}


def micro(entries=65536, blocks=20, iterations=40000, cold_mb=0):
    """The ring's price per event, where nothing else hides it: a cached 1 MiB alloc and free
    (alloc, free_requested, free_completed: 3 entries), blocks alternating ring off/on.
    With `cold_mb`, each iteration also reads that many MiB of host memory, as a training
    step's own work would, so the ring's lines are not all in cache when written (the
    reading is in both modes, so it cancels)."""
    x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    del x
    sweep = torch.ones(cold_mb << 18, dtype=torch.float32) if cold_mb else None  # host memory
    times = {"off": [], "on": []}
    for block in range(blocks + 1):
        mode = "on" if block % 2 else "off"
        ring(entries if mode == "on" else 0)
        began = time.perf_counter()
        for _ in range(iterations):
            x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
            del x
            if sweep is not None:
                sweep.sum()
        if block:
            times[mode].append((time.perf_counter() - began) / iterations * 1e6)
    ring(0)
    pairs = [on - (times["off"][i] + times["off"][min(i + 1, len(times["off"]) - 1)]) / 2
             for i, on in enumerate(times["on"])]
    per_event = [p / 3 for p in pairs]
    return {"entries": entries, "cold_mb": cold_mb, "iterations": iterations,
            "iteration_off_us": round(sum(times["off"]) / len(times["off"]), 3),
            "per_event_us": spread(per_event)}


def entries_per_step(model, optimizer, ids, steps=20):
    """The ring entries one step of the loop writes (the ring's own count, large enough to
    hold them all), and its allocations."""
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    ring(1 << 20)
    for _ in range(steps):
        train_step(model, optimizer, ids)
    snap = torch.cuda.memory._snapshot()
    ring(0)
    entries = sum(len(t) for t in snap.get("device_traces", []))
    allocations = torch.cuda.memory_stats()["allocation.all.allocated"] - before
    return {"entries_per_step": entries / steps, "allocations_per_step": allocations / steps}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--block-steps", type=int, default=40)
    parser.add_argument("--entries", default="65536", help="ring sizes, comma-separated")
    parser.add_argument("--skip-free-requested", action="store_true")
    parser.add_argument("--micro-only", action="store_true",
                        help="the per-event price at each of --micro-entries and --micro-cold-mb, and the "
                             "entries a GPT-2 step writes; no block run of the loop")
    parser.add_argument("--micro-entries", default="8192,32768")
    parser.add_argument("--micro-cold-mb", default="0,2")
    args = parser.parse_args()
    sizes = [int(e) for e in args.entries.split(",")]
    if not args.micro_only and (min(sizes) <= 0 or args.blocks < 2 * len(sizes) + 2):
        parser.error("every --entries must be above 0, and --blocks at least 2 per size and 2 more")
    if args.micro_only:
        torch.set_num_threads(1)  # the sweep's sum on one thread, as steady as it can be
        for cold in [int(c) for c in args.micro_cold_mb.split(",")]:
            for entries in [int(e) for e in args.micro_entries.split(",")]:
                print(json.dumps({"micro": micro(entries, blocks=20, iterations=5000 if cold else 40000,
                                                 cold_mb=cold)}), flush=True)
        torch.manual_seed(0)
        config, model, optimizer = build(8)
        ids = torch.randint(0, config.vocab_size, (8, 384), device="cuda")
        times = [train_step(model, optimizer, ids)[1] for _ in range(30)][10:]
        print(json.dumps({"step": entries_per_step(model, optimizer, ids),
                          "step_ms_median": round(1000 * sorted(times)[len(times) // 2], 3)}), flush=True)
        return
    print(json.dumps({
        "torch": torch.__version__,
        "_snapshot": str(inspect.signature(torch.cuda.memory._snapshot)),
        "_record_memory_history": str(inspect.signature(torch.cuda.memory._record_memory_history)),
        "_cuda_memorySnapshot_doc": getattr(torch._C._cuda_memorySnapshot, "__doc__", None),
        "_snapshot_source": inspect.getsource(torch.cuda.memory._snapshot)[-600:],
    }), flush=True)
    print(json.dumps({"micro": micro()}), flush=True)
    torch.manual_seed(0)
    config, model, optimizer = build(8)
    ids = torch.randint(0, config.vocab_size, (8, 384), device="cuda")
    for _ in range(10):
        train_step(model, optimizer, ids)
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    train_step(model, optimizer, ids)
    per_step = torch.cuda.memory_stats()["allocation.all.allocated"] - before

    # Each 'on' block is compared with the 'off' blocks either side; the first size loses
    # its first block (it has no 'off' before it), so it may have one pair fewer.
    blocks = []
    for block in range(args.blocks + 1):
        entries = sizes[(block // 2) % len(sizes)] if block % 2 else 0
        ring(entries, skip=args.skip_free_requested)
        times = [train_step(model, optimizer, ids)[1] for _ in range(args.block_steps)]
        if block:
            blocks.append((entries, sum(times) / len(times)))
    ring(0)
    by_size = {}
    for i, (entries, mean) in enumerate(blocks):
        if entries and 0 < i < len(blocks) - 1:
            off = (blocks[i - 1][1] + blocks[i + 1][1]) / 2
            by_size.setdefault(entries, []).append(100.0 * (mean - off) / off)
    off_ms = 1000 * sum(m for k, m in blocks if not k) / sum(not k for k, _ in blocks)
    # Entries an allocation writes: alloc and free_completed, and free_requested unless skipped.
    entries_per_step = (2 if args.skip_free_requested and SKIP else 3) * per_step
    for entries, pairs in sorted(by_size.items()):
        pct = spread(pairs)
        print(json.dumps({"entries": entries, "skip_free_requested": args.skip_free_requested,
                          "entries_per_step": entries_per_step, "recording_pct": pct,
                          "per_event_us": round(pct["mean"] / 100 * off_ms * 1000 / entries_per_step, 4),
                          "pairs": [round(p, 3) for p in pairs]}), flush=True)
    recording = spread(by_size[sizes[0]])

    reads = {"off": snapshot_ms()}
    for entries in (4096, 16384, 65536, 262144):
        ring(entries)
        for _ in range(entries // (2 * per_step) + 2):  # fill the ring
            train_step(model, optimizer, ids)
        reads[str(entries)] = snapshot_ms(5)
        ring(0)
    print(json.dumps({
        "summary": True, "allocations_per_step": per_step, "events_per_step": entries_per_step,
        "off_step_ms": round(off_ms, 3), "recording_pct": recording, "recording_entries": sizes[0],
        "per_event_us": round(recording["mean"] / 100 * off_ms * 1000 / entries_per_step, 4),
        "snapshot_reads": reads,
    }), flush=True)


if __name__ == "__main__":
    main()
