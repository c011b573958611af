#!/usr/bin/env python3
"""An OOM with memory free, for the GPU checks: caps itself at 10 % of the GPU with
set_per_process_memory_fraction(0.1), fills with 6 MiB tensors, frees every other one and
asks for 1 GiB. Prints PyTorch's OOM message and memory_allocated / memory_reserved at that
moment as one JSON line, holds still --hold seconds (a viewer can still read the state),
then exits 1.

usage: oom_cap.py [--hold 4]
"""

import argparse
import json
import sys
import time

import torch

MiB = 1024 * 1024


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hold", type=float, default=4.0)
    args = parser.parse_args()
    torch.cuda.set_per_process_memory_fraction(0.1)
    cap = int(0.1 * torch.cuda.get_device_properties(0).total_memory)
    tensors = []
    # 6 MiB requests are carved from 20 MiB segments: stop well before the cap.
    while (len(tensors) + 1) * 6 * MiB < 0.8 * cap:
        tensors.append(torch.empty(6 * MiB, dtype=torch.uint8, device="cuda"))
    del tensors[::2]
    report = {"cap_bytes": cap, "kept_tensors": len(tensors), "requested": 1024 * MiB}
    try:
        big = torch.empty(1024 * MiB, dtype=torch.uint8, device="cuda")
        report["oom"] = False
        del big
    except torch.cuda.OutOfMemoryError as err:
        report.update({
            "oom": True, "message": str(err),
            "allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
        })
    print(json.dumps(report), flush=True)
    time.sleep(args.hold)
    return 1


if __name__ == "__main__":
    sys.exit(main())
