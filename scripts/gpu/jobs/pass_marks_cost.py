#!/usr/bin/env python3
"""What the hook's pass marks (roles.PassMarks, hook 1.14) cost a training step, measured
inside one process. They live from a job's first forward until its first marked step, so for
the whole life of a job that marks none (a hand-written update, an optimizer outside
torch.optim): two module hooks a forward, a prehook on the output's grad_fn, two final
callbacks a backward.

Blocks of steps alternate between the marks following the model (each pass marked: the
gradients are released between steps, the path that reads them) and the marks taken out,
with nothing else of the hook loaded (PassMarks is imported from the repository's hook
directory; no `vramtop run`, no ring). Two loops:
  micro  a 2-layer MLP of width 64 (a step of about 0.7 ms, all launch): the cost of one
         pass in microseconds stands well above the noise here;
  gpt2   GPT-2 (8 layers, 768 wide, batch 8 x 384, bf16 autocast, AdamW), a step bound by
         the job's thread, where any CPU cost shows most: the cost in % of its step.

  python3 pass_marks_cost.py [--blocks 60] [--micro-steps 400] [--gpt2-steps 10]
Prints one JSON line.
"""
import argparse
import collections
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "python", "vramtop", "_hook"))
sys.path.insert(0, HERE)

from vramtop_hook.roles import PassMarks  # noqa: E402  (the repository's hook)
from hook_read_cost import on_minus_off, spread  # noqa: E402
from train_gpt2 import build, train_step  # noqa: E402


def alternate(model, step, blocks, block_steps):
    """Blocks of `block_steps` steps, 'off' then 'on' in turn (the first 'off' a warm-up):
    [(mode, mean step seconds)], and how many passes the marks marked."""
    marks = collections.deque(maxlen=1 << 16)
    marked = 0
    out = []
    for block in range(blocks + 1):
        mode = "on" if block % 2 else "off"
        follower = None
        if mode == "on":
            follower = PassMarks(torch, marks, lambda: False)
            follower.follow(model)
        before = len(marks)
        torch.cuda.synchronize()
        began = time.perf_counter()
        for _ in range(block_steps):
            step()
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - began) / block_steps
        if follower is not None:
            follower.stop()
            marked += len(marks) - before
        if block:
            out.append((mode, seconds))
    return out, marked


class Part:
    """Pieces of PassMarks' work on their own, for finding where its cost is (--parts):
    'hooks' the two module hooks doing nothing; 'prehook' and the grad_fn prehook the post
    hook registers; 'callback' and the final callback that prehook queues; 'requeue' a final
    callback that queues another, as PassMarks' does."""

    def __init__(self, upto):
        self.upto = upto
        self.handles = []

    def follow(self, module):
        engine = torch.autograd.Variable._execution_engine
        upto = self.upto

        def done():
            return None

        def again():
            engine.queue_callback(done)

        def ran(grad_outputs):
            if upto == "callback":
                engine.queue_callback(done)
            elif upto == "requeue":
                engine.queue_callback(again)
            return None

        def pre(module, args):
            return None

        def post(module, args, output):
            if upto != "hooks":
                output.grad_fn.register_prehook(ran)
            return None

        self.handles = [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]

    def stop(self):
        for h in self.handles:
            h.remove()


def warmed_mlp():
    """The micro loop's MLP after 200 steps, and its step (a hand-written update that
    releases the gradients, so each pass is marked): (model, step)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64)).cuda()
    x = torch.randn(32, 64, device="cuda")
    params = list(model.parameters())

    def step():
        loss = model(x).square().mean()
        loss.backward()
        with torch.no_grad():
            for p in params:
                p.add_(p.grad, alpha=-1e-3)
                p.grad = None

    for _ in range(200):
        step()
    return model, step


def micro_parts(rounds, block_steps):
    """Blocks alternating 'off' and each part in turn: {part: its difference in us}."""
    model, step = warmed_mlp()
    parts = ["hooks", "prehook", "callback", "requeue", "passmarks"]
    seq = []
    for _ in range(rounds):
        for part in parts:
            seq += ["off", part]
    seq.append("off")
    timed = []
    marks = collections.deque(maxlen=1 << 16)
    for mode in seq:
        follower = None
        if mode == "passmarks":
            follower = PassMarks(torch, marks, lambda: False)
        elif mode != "off":
            follower = Part(mode)
        if follower is not None:
            follower.follow(model)
        torch.cuda.synchronize()
        began = time.perf_counter()
        for _ in range(block_steps):
            step()
        torch.cuda.synchronize()
        timed.append((mode, (time.perf_counter() - began) / block_steps))
        if follower is not None:
            follower.stop()
    out = {}
    off = [s for m, s in timed if m == "off"]
    off_us = 1e6 * sum(off) / len(off)
    for part in parts:
        # Only each part's block against the 'off' blocks either side of it.
        pairs = []
        for i, (m, s) in enumerate(timed):
            if m == part:
                pairs.append(1e6 * (s - (timed[i - 1][1] + timed[i + 1][1]) / 2))
        d = spread(pairs)  # Student's t for the few pairs
        out[part] = {"per_step_us": d["mean"], "ci95": d["ci95"], "n": d["n"]}
    out["off_step_us"] = round(off_us, 2)
    return out


def micro(blocks, block_steps):
    model, step = warmed_mlp()
    return alternate(model, step, blocks, block_steps)


def gpt2(blocks, block_steps):
    torch.manual_seed(0)
    config, model, optimizer = build(8)
    ids = torch.randint(0, config.vocab_size, (8, 384), device="cuda")
    for _ in range(20):
        train_step(model, optimizer, ids)
    return alternate(model, lambda: train_step(model, optimizer, ids), blocks, block_steps)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=60)
    parser.add_argument("--micro-steps", type=int, default=400)
    parser.add_argument("--gpt2-steps", type=int, default=10)
    parser.add_argument("--parts", type=int, default=0, help="rounds of the parts, micro only")
    args = parser.parse_args()
    result = {"torch": torch.__version__, "device": torch.cuda.get_device_name()}
    if args.parts:
        result["parts"] = micro_parts(args.parts, args.micro_steps)
        print(json.dumps(result), flush=True)
        return
    for name, run, block_steps in (("micro", micro, args.micro_steps), ("gpt2", gpt2, args.gpt2_steps)):
        blocks, marked = run(args.blocks, block_steps)
        off = [s for mode, s in blocks if mode == "off"]
        off_us = 1e6 * sum(off) / len(off)
        pct = on_minus_off([(mode, s) for mode, s in blocks])
        on_steps = block_steps * sum(mode == "on" for mode, _ in blocks)
        result[name] = {
            "block_steps": block_steps, "blocks": len(blocks), "off_step_us": round(off_us, 2),
            "on_minus_off_pct": pct,
            # The cost of one pass, from the difference in % of the 'off' step.
            "per_pass_us": None if pct is None else {
                "mean": round(pct["mean"] * off_us / 100, 3),
                "ci95": [round(c * off_us / 100, 3) for c in pct["ci95"]]},
            "passes_marked": marked, "on_steps": on_steps,
        }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
