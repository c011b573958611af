#!/usr/bin/env python3
"""Loops for the process-trend check (scripts/gpu/trend.sh): jobs whose device
memory warms up and levels off, and one that leaks. Random weights; they run until killed.

  resnet  torchvision ResNet-50, batch drawn from {16,32,48,64}, SGD, bf16 autocast
  ddp     GPT-2 (4 layers) under DistributedDataParallel, gloo, every rank on cuda:0
          (run with torchrun --nproc-per-node 2)
  leak    a small training loop that, from --onset seconds on, keeps 8 MiB every second
          (prints the onset time as `leak onset <unix time>`)

usage: trend_jobs.py resnet|ddp|leak [--onset 60]
"""

import argparse
import os
import random
import sys
import time

import torch

MiB = 1024 * 1024


def resnet():
    import torchvision

    model = torchvision.models.resnet50().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    draw = random.Random(0)
    while True:
        batch = draw.choice([16, 32, 48, 64])
        x = torch.randn(batch, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (batch,), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def ddp():
    import torch.distributed as dist
    from transformers import GPT2Config, GPT2LMHeadModel

    dist.init_process_group("gloo")
    torch.cuda.set_device(0)  # both ranks share the one GPU: gloo, not NCCL
    torch.manual_seed(0)
    config = GPT2Config(n_layer=4, n_embd=768, n_head=12, n_positions=1024)
    model = torch.nn.parallel.DistributedDataParallel(GPT2LMHeadModel(config).cuda(), device_ids=[0])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    lengths = random.Random(dist.get_rank())
    while True:
        ids = torch.randint(0, config.vocab_size, (4, lengths.choice([128, 256, 384, 512])), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def leak(onset_s):
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    started = time.time()
    kept = []
    next_leak = None
    while True:
        x = torch.randn(256, 4096, device="cuda")
        model(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        now = time.time()
        if now - started >= onset_s:
            if next_leak is None:
                next_leak = now
                print("leak onset %.3f" % now, flush=True)
            while now >= next_leak:
                kept.append(torch.empty(8 * MiB, dtype=torch.uint8, device="cuda"))
                next_leak += 1.0
        torch.cuda.synchronize()
        time.sleep(0.01)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=["resnet", "ddp", "leak"])
    parser.add_argument("--onset", type=float, default=60.0)
    args = parser.parse_args()
    if args.kind == "resnet":
        resnet()
    elif args.kind == "ddp":
        ddp()
    else:
        leak(args.onset)


if __name__ == "__main__":
    sys.exit(main())
