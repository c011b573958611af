#!/usr/bin/env python3
"""The advice of an OOM under backend:cudaMallocAsync held against PyTorch ("only less live
memory or a larger fraction fits it"): 6 GiB live and 1 GiB asked under a memory fraction
of 0.05 of an H200 (the job vramtop explained), then 0.051, then 0.05 with 16 MiB less
live, each in a fresh process under that backend.

usage: async_fraction_ab.py            prints one line a case
       async_fraction_ab.py FRACTION LESS   one case, in this process (LESS: 1 or 0)
"""
import os
import subprocess
import sys

MiB, GiB = 1 << 20, 1 << 30


def case(fraction, less_live):
    import torch

    torch.cuda.set_per_process_memory_fraction(fraction)
    live = [torch.empty(GiB - (16 * MiB if less_live and i == 0 else 0), dtype=torch.uint8, device="cuda")
            for i in range(6)]
    try:
        asked = torch.empty(GiB, dtype=torch.uint8, device="cuda")
        outcome = "fits"
        del asked
    except torch.OutOfMemoryError:
        outcome = "OOM"
    print("fraction %s, %s: %s" % (fraction, "16 MiB less live" if less_live else "6 GiB live", outcome), flush=True)
    del live


if __name__ == "__main__":
    if len(sys.argv) == 3:
        case(float(sys.argv[1]), sys.argv[2] == "1")
    else:
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")
        for fraction, less in (("0.05", "0"), ("0.051", "0"), ("0.05", "1")):
            subprocess.run([sys.executable, __file__, fraction, less], env=env, check=False)
