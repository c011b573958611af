#!/usr/bin/env python3
"""A leak for the GPU checks: each step keeps a 4 MiB tensor in a list (at a line printed
first as JSON: file, line, function) and makes transient tensors that are freed.

usage: leak_list.py [--steps 40] [--period 0.2]
"""

import argparse
import json
import os
import sys
import time

import torch

kept = []


def step(i):
    transient = torch.randn(512, 1024, device="cuda") @ torch.randn(1024, 512, device="cuda")
    total = float(transient.sum())
    kept.append(torch.empty(4 * 1024 * 1024, dtype=torch.uint8, device="cuda"))  # the leak
    return total


def leak_line():
    with open(__file__) as source:
        for number, line in enumerate(source, 1):
            if line.rstrip().endswith("# the leak"):
                return number
    return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--period", type=float, default=0.2)
    args = parser.parse_args()
    print(json.dumps({"leak_file": os.path.abspath(__file__), "leak_line": leak_line(),
                      "leak_function": "step"}), flush=True)
    torch.cuda.init()
    for i in range(args.steps):
        step(i)
        print(json.dumps({"step": i, "kept": len(kept), "allocated": torch.cuda.memory_allocated()}), flush=True)
        time.sleep(args.period)
    return 0


if __name__ == "__main__":
    sys.exit(main())
