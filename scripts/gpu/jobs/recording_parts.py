#!/usr/bin/env python3
"""Where PyTorch's recording costs a GPT-2 step: its two parts priced apart, in one process.

The step-cost runs (hook_step_cost.py) put PyTorch's recording alone at about 2.5 % of a
GPT-2 step on an H200, with intervals too wide to rank its parts. Here each part is timed
where nothing else hides it, each mode's blocks alternating with 'off' blocks:
  dispatch  a CPU op (x.add_(1), a 1-element CPU tensor: the dispatcher and no CUDA
            allocation), which pays any RecordFunction callback the ring registers (the
            annotation callback) and nothing else of the ring;
  event     a cached 1 MiB CUDA alloc and free (2 ring entries, free_requested skipped).
Modes, the ring of 32,768 entries on each way the hook could turn it on:
  global    global_record_annotations=True, as the hook records (its callback on every thread)
  elsewhere the callback local to a short-lived helper thread (none on this one)
  here      the callback local to this thread (PyTorch's default, from the job's thread)
Then one GPT-2 step's counts (8 layers, 768 wide, batch 8 x 512, AdamW, bf16 autocast):
RecordFunction calls (the torch.profiler CPU events of a step) and ring entries (a step's
trace), so that each part's price times its count gives its share of the step.

usage: recording_parts.py [--repeats 10]     prints JSON lines; the last is the summary
"""
import argparse
import inspect
import json
import threading
import time

import torch

from hook_read_cost import spread
from train_gpt2 import build, train_step

RECORD = torch.cuda.memory._record_memory_history
TAKES = inspect.signature(RECORD).parameters
ENTRIES = 32768


def ring(mode):
    if mode == "off":
        RECORD(enabled=None)
        return
    kwargs = {"enabled": "all", "context": None, "stacks": "python", "max_entries": ENTRIES}
    if "skip_actions" in TAKES:
        kwargs["skip_actions"] = ["free_requested"]
    if "global_record_annotations" in TAKES:
        kwargs["global_record_annotations"] = mode == "global"
    if mode == "elsewhere":
        helper = threading.Thread(target=lambda: RECORD(**kwargs))
        helper.start()
        helper.join()
    else:
        RECORD(**kwargs)


def dispatch_ns(iterations):
    x = torch.zeros(1)
    began = time.perf_counter()
    for _ in range(iterations):
        x.add_(1)
    return (time.perf_counter() - began) / iterations * 1e9


def event_ns(iterations):
    """Per alloc and free of a cached 1 MiB block (2 ring entries with the skip)."""
    began = time.perf_counter()
    for _ in range(iterations):
        t = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        del t
    return (time.perf_counter() - began) / iterations * 1e9


def priced(measure, iterations, modes, repeats):
    """{mode: spread of (mode block - mean of the 'off' blocks either side), in ns}, and
    the first 'off' block before any ring was on (against later ones: a callback left
    registered after 'off' would show as later 'off' blocks slower than the first)."""
    measure(iterations // 10)  # warm
    first_off = measure(iterations)
    deltas = {m: [] for m in modes}
    offs = []
    for _ in range(repeats):
        for mode in modes:
            ring("off")
            before = measure(iterations)
            ring(mode)
            on = measure(iterations)
            ring("off")
            after = measure(iterations)
            offs += [before, after]
            deltas[mode].append(on - (before + after) / 2)
    ring("off")
    return {m: spread(d) for m, d in deltas.items()}, round(first_off, 2), spread(offs)


def gpt2_counts():
    _, model, opt = build(8)
    ids = torch.randint(0, 50257, (8, 512), device="cuda")
    for _ in range(3):
        train_step(model, opt, ids)
    steps = [train_step(model, opt, ids)[1] for _ in range(20)]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        train_step(model, opt, ids)
    calls = len(prof.events())
    ring("global")
    train_step(model, opt, ids)  # the ring's own first entries out of the way
    ring("off")
    ring("global")
    train_step(model, opt, ids)
    traces = torch.cuda.memory._snapshot()["device_traces"]
    ring("off")
    actions = {}
    for trace in traces:
        for entry in trace:
            actions[entry["action"]] = actions.get(entry["action"], 0) + 1
    return {"step_ms": round(1000 * sum(steps) / len(steps), 3), "recordfunction_calls": calls,
            "ring_entries": actions}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    torch.cuda.init()
    modes = ["global", "elsewhere", "here"]
    dispatch, dispatch_first_off, dispatch_offs = priced(dispatch_ns, 200_000, modes, args.repeats)
    print(json.dumps({"dispatch_ns_delta": dispatch, "first_off_ns": dispatch_first_off,
                      "off_ns": dispatch_offs}), flush=True)
    event, event_first_off, event_offs = priced(event_ns, 50_000, modes, args.repeats)
    print(json.dumps({"event_pair_ns_delta": event, "first_off_ns": event_first_off,
                      "off_ns": event_offs}), flush=True)
    counts = gpt2_counts()
    print(json.dumps(counts), flush=True)
    step_ns = counts["step_ms"] * 1e6
    entries = sum(v for k, v in counts["ring_entries"].items() if k != "snapshot")
    share = {}
    for mode in modes:
        share[mode] = {
            "dispatch_pct": round(100 * dispatch[mode]["mean"] * counts["recordfunction_calls"] / step_ns, 3),
            # a pair is 2 entries: the price of an entry is half a pair's
            "events_pct": round(100 * event[mode]["mean"] / 2 * entries / step_ns, 3),
        }
    print(json.dumps({"summary": {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
                                  "share_of_step": share, **counts}}), flush=True)


if __name__ == "__main__":
    main()
