#!/usr/bin/env python3
"""The README's front-page job: a GPT-2 (transformers, 6 layers, random weights, AdamW)
trained on short sequences for a while, then handed one batch of full-length sequences,
which is where jobs like it die of "CUDA out of memory" after an hour of steps.

  front_page.py [--batch N] [--warm-seconds S]

Prints one JSON line per phase and, at the end, PyTorch's outcome (`"oom": true/false`);
exits 1 on an OOM, 0 when the long batch fit (the A/B of the knobs line).
"""

import argparse
import itertools
import json
import sys
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--warm-seconds", type=float, default=20.0)
    args = parser.parse_args()

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=768, n_head=12, n_positions=1024)).cuda()
    opt = torch.optim.AdamW(model.parameters())

    def step(seq):
        ids = torch.randint(0, 50257, (args.batch, seq), device="cuda")
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    steps = 0
    started = time.monotonic()
    for seq in itertools.cycle([128, 256, 384]):
        step(seq)
        steps += 1
        if time.monotonic() - started > args.warm_seconds:
            break
    torch.cuda.synchronize()
    print(json.dumps({"warm_steps": steps, "batch": args.batch,
                      "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}), flush=True)
    try:
        step(1024)
        torch.cuda.synchronize()
    except torch.OutOfMemoryError as e:
        print(json.dumps({"oom": True, "batch": args.batch, "seq": 1024,
                          "message": str(e).splitlines()[0]}), flush=True)
        sys.exit(1)
    print(json.dumps({"oom": False, "batch": args.batch, "seq": 1024,
                      "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}), flush=True)


if __name__ == "__main__":
    main()
