#!/usr/bin/env python3
"""OOMs a job catches under backend:cudaMallocAsync, as batch-size finders catch them: a
GPT-2 (6 layers, 1024 wide, AdamW, bf16 autocast) under a memory fraction, its batch
halved after each OOM until a step fits, then a few steps at that batch. Run under `vramtop
run` (hook 1.11 sees each OOM as PyTorch makes its exception) with
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync.

usage: async_caught.py own          a hand-written finder: except torch.OutOfMemoryError
       async_caught.py accelerate   accelerate.utils.find_executable_batch_size
       async_caught.py die          no finder: the first OOM goes uncaught
Prints one line per try ("try batch N: OOM" / "fits") and "done batch N" at the end;
WHATIF-style caps: ASYNC_CAUGHT_FRACTION (default 0.06 of the GPU).
"""
import os
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main():
    how = sys.argv[1] if len(sys.argv) > 1 else "own"
    torch.cuda.set_per_process_memory_fraction(float(os.environ.get("ASYNC_CAUGHT_FRACTION", "0.06")))
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=1024, n_head=16, n_positions=1024)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def steps(batch, n=3):
        for _ in range(n):
            x = torch.randint(0, 50257, (batch, 1024), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()

    if how == "accelerate":
        from accelerate.utils import find_executable_batch_size

        @find_executable_batch_size(starting_batch_size=64)
        def train(batch):
            print("try batch %d" % batch, flush=True)
            steps(batch)
            return batch

        batch = train()
    elif how == "die":
        batch = 64
        steps(batch)
    else:
        batch = 64
        while True:
            try:
                steps(batch, 1)
                print("try batch %d: fits" % batch, flush=True)
                break
            except torch.OutOfMemoryError:
                print("try batch %d: OOM" % batch, flush=True)
                batch //= 2
                opt.zero_grad(set_to_none=True)
        steps(batch)
    print("done batch %d" % batch, flush=True)


if __name__ == "__main__":
    main()
