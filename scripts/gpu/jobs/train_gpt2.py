#!/usr/bin/env python3
"""A GPT-2-size training loop for the GPU checks (random weights, no network): transformers
GPT2LMHeadModel from a GPT2Config, AdamW, bf16 autocast, a sequence length drawn per step.
Prints one JSON line per step (step time, memory_reserved, memory_allocated) and, after
the loop, a "final" line read while nothing allocates, then holds still --hold seconds so a
viewer's last state can be compared with it. For the overhead baseline run it with no hook
(PYTHONPATH without vramtop's hook directory); the script itself is the same.

usage: train_gpt2.py [--steps 100] [--layers 8] [--batch 8] [--hold 3]
"""

import argparse
import json
import random
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def build(layers):
    """GPT-2 with random weights on the GPU, and its AdamW: (config, model, optimizer)."""
    config = GPT2Config(n_layer=layers, n_embd=768, n_head=12, n_positions=1024)
    model = GPT2LMHeadModel(config).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return config, model, optimizer


def train_step(model, optimizer, ids, launches=None):
    """One step, timed between two synchronizes: (loss, seconds). With `launches` (a list),
    also how long the job's thread took to launch the step's work, before the second
    synchronize, appended to it."""
    torch.cuda.synchronize()
    started = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if launches is not None:
        launches.append(time.perf_counter() - started)
    torch.cuda.synchronize()
    return loss, time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--hold", type=float, default=3.0)
    args = parser.parse_args()
    torch.manual_seed(0)
    lengths = random.Random(0)
    config, model, optimizer = build(args.layers)
    for step in range(args.steps):
        seq = lengths.choice([128, 256, 384, 512])
        ids = torch.randint(0, config.vocab_size, (args.batch, seq), device="cuda")
        loss, step_s = train_step(model, optimizer, ids)
        print(json.dumps({
            "step": step, "seq": seq, "step_s": step_s, "loss": float(loss),
            "reserved": torch.cuda.memory_reserved(), "allocated": torch.cuda.memory_allocated(),
            "allocations": torch.cuda.memory_stats().get("allocation.all.allocated"),
        }), flush=True)
    del ids, loss
    torch.cuda.synchronize()
    print(json.dumps({
        "final": True, "reserved": torch.cuda.memory_reserved(),
        "allocated": torch.cuda.memory_allocated(),
    }), flush=True)
    time.sleep(args.hold)


if __name__ == "__main__":
    main()
