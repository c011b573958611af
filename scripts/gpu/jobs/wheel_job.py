#!/usr/bin/env python3
"""The wheel's package in a real job: `import vramtop; vramtop.start()` and a few GPT-2
training steps (train_gpt2.py's build and step), then PyTorch's own figures printed as
one JSON line while nothing allocates, held still so a viewer's state can be compared.

usage: wheel_job.py [--steps 20] [--hold 6]
"""

import argparse
import json
import os
import sys
import time

import vramtop

pid = vramtop.start()

import torch  # noqa: E402  (the hook is started first, as a notebook would)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_gpt2 import build, train_step  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--hold", type=float, default=6.0)
    args = parser.parse_args()
    torch.manual_seed(0)
    config, model, optimizer = build(8)
    for _ in range(args.steps):
        ids = torch.randint(0, config.vocab_size, (8, 512), device="cuda")
        train_step(model, optimizer, ids)
    torch.cuda.synchronize()
    print(json.dumps({
        "final": True, "pid": pid, "vramtop_module": vramtop.__file__,
        "reserved": torch.cuda.memory_reserved(), "allocated": torch.cuda.memory_allocated(),
    }), flush=True)
    time.sleep(args.hold)


if __name__ == "__main__":
    main()
