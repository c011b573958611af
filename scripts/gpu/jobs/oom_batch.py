#!/usr/bin/env python3
"""Batch jobs that run out of memory, for the unattended-OOM check (scripts/gpu/oom-batch.sh):

  dies     the capped checkerboard (set_per_process_memory_fraction(0.1), 6 MiB tensors,
           every other freed, then 1 GiB): the OOM is not caught, the job dies of it.
  catches  the same, but the job catches the OOM, frees half of what it holds, asks for
           a smaller block and ends normally.
  capfill  the capped checkerboard filled until its first OOM (caught), every other
           tensor freed, then 1 GiB: dies of that OOM (the verdicts issue's workload).
  grows    a GPT-2 training loop (random weights) whose batch doubles every 2 steps until
           PyTorch cannot fit a step: dies of that OOM.

Before the OOM propagates (or after it is caught) the job prints PyTorch's own figures as
one JSON line starting `pytorch:` (memory_allocated, memory_reserved, the message), so the
log can be compared with what vramtop says after the job.

usage: oom_batch.py dies|catches|capfill|grows
"""

import json
import sys

import torch

MiB = 1024 * 1024


def say(err):
    print("pytorch: " + json.dumps({
        "allocated": torch.cuda.memory_allocated(),
        "reserved": torch.cuda.memory_reserved(),
        "num_ooms": torch.cuda.memory_stats().get("num_ooms"),
        "message": str(err).splitlines()[0],
    }), flush=True)


def checkerboard():
    torch.cuda.set_per_process_memory_fraction(0.1)
    cap = int(0.1 * torch.cuda.get_device_properties(0).total_memory)
    tensors = []
    while (len(tensors) + 1) * 6 * MiB < 0.8 * cap:
        tensors.append(torch.empty(6 * MiB, dtype=torch.uint8, device="cuda"))
    del tensors[::2]
    return tensors


def dies():
    tensors = checkerboard()
    try:
        torch.empty(1024 * MiB, dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError as err:
        say(err)
        raise
    return len(tensors)


def capfill():
    torch.cuda.set_per_process_memory_fraction(0.1)
    tensors = []
    try:
        while True:
            tensors.append(torch.empty(6 * MiB, dtype=torch.uint8, device="cuda"))
    except torch.cuda.OutOfMemoryError:
        pass
    del tensors[::2]
    try:
        torch.empty(1024 * MiB, dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError as err:
        say(err)
        raise
    return 0


def catches():
    tensors = checkerboard()
    try:
        torch.empty(1024 * MiB, dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError as err:
        say(err)
    del tensors[: len(tensors) // 2]
    smaller = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    print("went on: 64 MiB fit after the OOM", flush=True)
    del smaller
    return 0


def grows():
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from train_gpt2 import build, train_step

    torch.manual_seed(0)
    config, model, optimizer = build(8)
    batch = 8
    step = 0
    while True:
        ids = torch.randint(0, config.vocab_size, (batch, 512), device="cuda")
        try:
            train_step(model, optimizer, ids)
        except torch.cuda.OutOfMemoryError as err:
            say(err)
            raise
        print(json.dumps({"step": step, "batch": batch, "reserved": torch.cuda.memory_reserved()}), flush=True)
        step += 1
        if step % 2 == 0:
            batch *= 2


def main():
    kind = sys.argv[1] if len(sys.argv) > 1 else ""
    if kind not in ("dies", "catches", "capfill", "grows"):
        print("usage: oom_batch.py dies|catches|capfill|grows", file=sys.stderr)
        return 2
    if kind == "dies":
        dies()
    elif kind == "catches":
        return catches()
    elif kind == "capfill":
        capfill()
    else:
        grows()
    return 0


if __name__ == "__main__":
    sys.exit(main())
