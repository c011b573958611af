#!/usr/bin/env python3
"""The hook's host memory with a full history (issue "Right on real training jobs": its
extra host memory under 64 MiB): a GPT-2 loop (8 layers, batch 8 x 512) run for --steps,
long enough to fill VRAMTOP_HISTORY_MB, then this process's peak resident memory (VmHWM)
and what the hook holds. Run it under `vramtop run` twice, with VRAMTOP_RING=0 (no ring, no
history) and with the default ring: the difference of the two peaks is the hook's history.

  VRAMTOP_RING=0 vramtop run --quiet -- python3 hook_memory.py [--steps 3000]
Prints one JSON line.
"""
import argparse
import ctypes
import json
import re
import time

import torch

from train_gpt2 import build, train_step


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--trim", action="store_true",
                        help="experiment: malloc_trim(0) after each read of the ring")
    args = parser.parse_args()
    torch.manual_seed(0)
    config, model, optimizer = build(8)
    ids = torch.randint(0, config.vocab_size, (8, 512), device="cuda")
    train_step(model, optimizer, ids)
    if args.trim:
        trim_after_reads()
    before = kb("VmRSS")  # the model built and stepped once: the loop's own memory from here
    began = time.monotonic()
    rss = []  # VmRSS every tenth of the run: where the memory grows
    for step in range(args.steps):
        train_step(model, optimizer, ids)
        if (step + 1) % max(1, args.steps // 10) == 0:
            rss.append(kb("VmRSS"))
    seconds = time.monotonic() - began
    time.sleep(1.0)  # the hook's last checkpoint
    history = {}
    try:
        import vramtop_hook

        alloc = vramtop_hook.running.hook.alloc
        history = {"history_pieces": len(alloc.history.pieces), "history_bytes": alloc.history.bytes,
                   "ring_entries": alloc.ring_entries,
                   "allocations": torch.cuda.memory_stats().get("allocation.all.allocated")}
    except Exception as err:  # not under the hook, or no allocator
        history = {"hook": repr(err)}
    hwm, now = kb("VmHWM"), kb("VmRSS")
    # What of it malloc holds freed but not given back (glibc only).
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        trimmed = kb("VmRSS")
    except (OSError, AttributeError):
        trimmed = None
    print(json.dumps(dict(steps=args.steps, seconds=round(seconds, 1), vm_rss_before_kb=before,
                          vm_hwm_kb=hwm, hwm_over_before_kb=hwm - before, vm_rss_kb=now, vm_rss_after_malloc_trim_kb=trimmed, rss_kb=rss,
                          **history)), flush=True)


def trim_after_reads():
    import vramtop_hook

    alloc = vramtop_hook.running.hook.alloc
    read, trim = alloc.read_pickled, ctypes.CDLL("libc.so.6").malloc_trim

    def read_then_trim():
        data = read()
        trim(0)
        return data

    alloc.read_pickled = read_then_trim


def kb(field):
    status = open("/proc/self/status").read()
    return int(re.search(field + r":\s+(\d+) kB", status).group(1))


if __name__ == "__main__":
    main()
