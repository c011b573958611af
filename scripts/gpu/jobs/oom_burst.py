#!/usr/bin/env python3
"""What a burst of caught OOMs costs the job's thread (scripts/gpu/history.sh ... burst).

A GPT-2 training loop (6 layers, 1024 wide, bf16, AdamW, batch 8 x 512) runs for
--seconds, so that the hook's history grows as a real job's does; then the job asks
--ooms times in a row for more than its cap allows (set_per_process_memory_fraction) and
catches each OutOfMemoryError, as a batch-size search or cuDNN's workspace search does;
then it runs --after more steps. Each OOM is timed from the request to the caught error on
the job's thread: PyTorch's own work (releasing its cache, retrying) and whatever the OOM
observers do. Run it with the hook (`vramtop run`) and without (VRAMTOP_HOOK=0) on one
machine; the difference is the hook's.

Prints one JSON line starting `burst:` with each OOM's milliseconds, the steps' median
before and after, and the hook's kept files (VRAMTOP_OOM_DIR) as the job saw them.

usage: oom_burst.py [--seconds S] [--ooms K] [--after N]
"""

import argparse
import glob
import json
import os
import statistics
import time

import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--ooms", type=int, default=30)
    parser.add_argument("--after", type=int, default=20)
    args = parser.parse_args()

    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cap = 12 << 30
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(cap / total)
    model = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=1024, n_head=16, n_positions=1024)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        x = torch.randint(0, 50257, (8, 512), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()

    def timed_steps(n):
        times = []
        for _ in range(n):
            t = time.perf_counter()
            step()
            times.append(1e3 * (time.perf_counter() - t))
        return times

    start = time.perf_counter()
    before = []
    while time.perf_counter() - start < args.seconds:
        before += timed_steps(1)

    ooms = []
    for _ in range(args.ooms):
        t = time.perf_counter()
        try:
            torch.empty(cap + (1 << 30), dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            pass
        ooms.append(1e3 * (time.perf_counter() - t))
    after = timed_steps(args.after)

    folder = os.environ.get("VRAMTOP_OOM_DIR")
    kept = sorted(glob.glob(os.path.join(folder, "vramtop-oom-*.pickle"))) if folder else []
    print("burst: " + json.dumps({
        "hook": os.environ.get("VRAMTOP_HOOK", "1") != "0",
        "seconds": args.seconds,
        "steps_before": len(before),
        "step_ms_before": round(statistics.median(before[len(before) // 2:]), 2),
        "step_ms_after": round(statistics.median(after), 2),
        "first_step_after_ms": round(after[0], 2),
        "oom_ms": [round(x, 2) for x in ooms],
        "oom_ms_median": round(statistics.median(ooms), 2),
        "oom_ms_sum": round(sum(ooms), 1),
        "kept": {os.path.basename(p): os.path.getsize(p) for p in kept},
    }), flush=True)


if __name__ == "__main__":
    main()
