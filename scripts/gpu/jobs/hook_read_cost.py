#!/usr/bin/env python3
"""What one state costs a GPT-2 training step, measured inside one process: blocks of
steps alternate between no reads and the hook making states (its own `state_frame`: the
allocator read and the frame's encoding, as for a viewer, under the GIL) at a fixed rate
from a background thread, far faster than any viewer asks, so that the cost per state
stands well above the 4 % block-to-block drift of the step time. The cost at a viewer's
interval is then that per-state cost times the states per second the hook makes there
(1 at 1 s; at 0.1 s its 1 % pacing decides, from the CPU time a state takes).

Run under the hook, with no viewer attached:
  vramtop run --quiet -- python3 hook_read_cost.py [--blocks 40] [--block-steps 60] [--rate 20]
Prints one JSON line.
"""
import argparse
import json
import math
import statistics
import sys
import threading
import time

import torch

from train_gpt2 import build, train_step  # the overhead check's own loop, beside this file

# Student's t at 97.5 % for n-1 degrees of freedom, n = 2..31 (then 1.96).
T975 = [12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23, 2.20, 2.18, 2.16, 2.14,
        2.13, 2.12, 2.11, 2.10, 2.09, 2.09, 2.08, 2.07, 2.07, 2.06, 2.06, 2.06, 2.05, 2.05,
        2.05, 2.04]


def spread(values):
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    t = T975[n - 2] if 2 <= n <= 31 else 1.96
    half = t * std / math.sqrt(n) if n > 1 else float("inf")
    return {"n": n, "mean": round(mean, 4), "std": round(std, 4),
            "ci95": [round(mean - half, 4), round(mean + half, 4)]}


def on_vs_off(blocks):
    """Each 'on' block's step time (blocks: (mode, seconds, ...) in order) against the mean
    of the 'off' blocks either side of it, in % (the step time drifts over minutes)."""
    pairs = []
    for i, block in enumerate(blocks):
        if block[0] != "on" or i == 0 or i + 1 >= len(blocks):
            continue
        off = (blocks[i - 1][1] + blocks[i + 1][1]) / 2
        pairs.append(100.0 * (block[1] - off) / off)
    return pairs


def on_minus_off(blocks):
    """The mean of each 'on' block's step time less the mean of the 'off' blocks either side,
    in % of the mean 'off' step, with its 95 % interval. Unlike the mean of `on_vs_off`'s
    ratios it has no bias from noise in the denominator (with 4-step blocks, whose pairs
    spread +-13 %, the ratios read 0.4 % higher on the H100). Neighbouring differences share
    an 'off' block, so the interval is a little narrow (lag-1 correlation up to 0.17: +-0.88
    would be +-0.99); None without a pair."""
    diffs, offs = [], []
    for i, block in enumerate(blocks):
        if block[0] != "on" or i == 0 or i + 1 >= len(blocks):
            continue
        off = (blocks[i - 1][1] + blocks[i + 1][1]) / 2
        diffs.append(block[1] - off)
        offs.append(off)
    if not diffs:
        return None
    base = sum(offs) / len(offs)
    d = spread([100.0 * x / base for x in diffs])
    d["median"] = round(100.0 * statistics.median(diffs) / base, 4)
    return d


class Reader(threading.Thread):
    """Makes the hook's states at `rate` per second while `on` is set."""

    def __init__(self, hook, rate):
        super().__init__(daemon=True)
        self.hook, self.period = hook, 1.0 / rate
        self.on = threading.Event()
        self.stop = False
        self.states = 0
        self.cpu_s = 0.0
        self.bytes = 0

    def run(self):
        while not self.stop:
            if not self.on.wait(0.05):
                continue
            cpu = time.thread_time()
            frame = self.hook.state_frame()
            self.cpu_s += time.thread_time() - cpu
            self.states += 1
            self.bytes += len(frame or b"")
            time.sleep(self.period)


def warmed_gpt2_under_the_hook(batch=8, length=384):
    """GPT-2 (8 layers, batch 8 x 384 unless told) after 20 warm-up steps, and the hook of
    this process once it has seen CUDA: (hook, model, optimizer, ids). Exits with a JSON
    error line when there is no hook (not run under `vramtop run`) or it never saw CUDA."""
    try:
        import vramtop_hook
    except ImportError:
        print(json.dumps({"error": "no hook: run under `vramtop run`"}))
        sys.exit(2)
    torch.manual_seed(0)
    config, model, optimizer = build(8)
    ids = torch.randint(0, config.vocab_size, (batch, length), device="cuda")
    for _ in range(20):
        train_step(model, optimizer, ids)
    hook = vramtop_hook.running.hook
    deadline = time.monotonic() + 20
    while (hook is None or not hook.cuda_ready) and time.monotonic() < deadline:
        time.sleep(0.1)
        hook = vramtop_hook.running.hook
    if hook is None or not hook.cuda_ready:
        print(json.dumps({"error": "the hook never saw CUDA"}))
        sys.exit(2)
    return hook, model, optimizer, ids


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--block-steps", type=int, default=60)
    parser.add_argument("--rate", type=float, default=20.0, help="states per second in 'on' blocks")
    args = parser.parse_args()
    hook, model, optimizer, ids = warmed_gpt2_under_the_hook()
    if hook.viewers:
        print(json.dumps({"error": "a viewer is attached: its states would count as 'off'"}))
        sys.exit(2)
    reader = Reader(hook, args.rate)
    reader.start()
    blocks = []  # (mode, mean step seconds, states, wall seconds)
    for block in range(args.blocks + 1):  # the first, off, is a warm-up
        mode = "on" if block % 2 else "off"
        (reader.on.set if mode == "on" else reader.on.clear)()
        states = reader.states
        began = time.perf_counter()
        times = [train_step(model, optimizer, ids)[1] for _ in range(args.block_steps)]
        wall = time.perf_counter() - began
        reader.on.clear()
        if block:
            blocks.append((mode, sum(times) / len(times), reader.states - states, wall))
    reader.stop = True
    # Each 'on' block against the mean of the 'off' blocks either side of it.
    pairs, rates = [], []
    for i, (mode, mean, states, wall) in enumerate(blocks):
        if mode != "on" or i == 0 or i + 1 >= len(blocks):
            continue
        off = (blocks[i - 1][1] + blocks[i + 1][1]) / 2
        pairs.append(100.0 * (mean - off) / off)
        rates.append(states / wall)
    rate = sum(rates) / len(rates)
    pct = spread(pairs)
    per_state = {k: (round(v / rate, 4) if k != "n" and k != "ci95" else v)
                 for k, v in pct.items()}
    per_state["ci95"] = [round(c / rate, 4) for c in pct["ci95"]]
    cpu_per_state = reader.cpu_s / max(reader.states, 1)
    # The hook's pacing: at most 1 % of the time on its thread's CPU per state.
    paced_rate_01 = min(10.0, 0.01 / cpu_per_state) if cpu_per_state else 10.0
    off_ms = 1000 * sum(b[1] for b in blocks if b[0] == "off") / max(1, sum(b[0] == "off" for b in blocks))
    print(json.dumps({
        "rate_per_s": round(rate, 2),
        "blocks": len(blocks), "block_steps": args.block_steps, "off_step_ms": round(off_ms, 3),
        "on_vs_off_pct": pct,
        "cost_per_state_per_s_pct": per_state,
        "cpu_per_state_ms": round(1000 * cpu_per_state, 3),
        "frame_bytes": reader.bytes // max(reader.states, 1),
        "at_1s_pct": {"mean": per_state["mean"], "ci95": per_state["ci95"]},
        "paced_states_per_s_at_0.1s": round(paced_rate_01, 2),
        "at_0.1s_pct": {"mean": round(per_state["mean"] * paced_rate_01, 4),
                        "ci95": [round(c * paced_rate_01, 4) for c in per_state["ci95"]]},
        "goal_1s_pct": 0.5, "goal_0.1s_pct": 2.0,
        "pairs_pct": [round(p, 3) for p in pairs],
    }), flush=True)


if __name__ == "__main__":
    main()
