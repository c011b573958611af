#!/usr/bin/env python3
"""A DDP GPT-2 training job of two (or more) ranks for the whole-jobs checks, under torchrun:

    torchrun --nproc-per-node 2 ddp_ranks.py --one-gpu --seconds 420 --log-dir DIR

With --one-gpu every rank trains on cuda:0 with the gloo backend (NCCL refuses two ranks
on one device; gloo takes CUDA tensors for DDP's allreduce), else rank r (LOCAL_RANK)
trains on cuda:r with NCCL. The model is a small GPT-2 from transformers with random
weights (no network); rank 0 trains on --batch0 sequences per step and every other rank on
--batch1, so the ranks hold different amounts of memory (DDP needs no equal batches: it
averages gradients, whatever each rank's batch).

About every --print-every seconds the ranks agree (one tiny allreduce per step) to hold
still: each synchronizes, reads torch.cuda.memory_reserved() / memory_allocated(), prints
one JSON line {"rank", "local_rank", "pid", "step", "reserved", "allocated", "time", ...},
appends it to DIR/rank-R.jsonl, then sleeps --hold seconds allocating nothing, so a viewer
(vramtop serve, attach) sampling in that window must read exactly the printed figures.
Both ranks hold at the same step: a rank waiting in an allreduce would be mid-step.

--oom-rank R --oom-after T: T seconds after its start, rank R asks for an impossible tensor
(twice the device's memory); the OutOfMemoryError is caught and printed as a line with
"oom": true, and training goes on (so a view can follow the rank that failed). With
--oom-dies the error is not caught: the rank dies and torchrun stops the others.

Each rank's lines, in order: {"start": true, ...}, the hold lines, maybe {"oom": true,...},
{"final": true, ...}. --seconds counts from the rank's start (after torch's import).
usage: ddp_ranks.py [--one-gpu] [--seconds 60] [--batch0 4] [--batch1 8] [--seq 256]
                    [--layers 4] [--embd 512] [--heads 8] [--print-every 2] [--hold 1.5]
                    [--oom-rank R --oom-after T [--oom-dies]] [--log-dir DIR]
"""

import argparse
import datetime
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--one-gpu", action="store_true",
                        help="every rank on cuda:0, gloo backend (else rank r on cuda:r, nccl)")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to train (from the rank's start)")
    parser.add_argument("--batch0", type=int, default=4, help="sequences per step on rank 0")
    parser.add_argument("--batch1", type=int, default=8, help="sequences per step on every other rank")
    parser.add_argument("--seq", type=int, default=256, help="tokens per sequence")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--embd", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--print-every", type=float, default=2.0, help="seconds between held prints")
    parser.add_argument("--hold", type=float, default=1.5, help="seconds to hold still after each print")
    parser.add_argument("--oom-rank", type=int, default=None)
    parser.add_argument("--oom-after", type=float, default=None, help="seconds after start of the OOM")
    parser.add_argument("--oom-dies", action="store_true", help="let the OutOfMemoryError kill the rank")
    parser.add_argument("--log-dir", default=None, help="where rank-R.jsonl files go")
    parser.add_argument("--pg-timeout", type=float, default=300.0,
                        help="seconds a collective may wait for a peer before it fails")
    args = parser.parse_args(argv)
    if args.oom_rank is not None and args.oom_after is None:
        parser.error("--oom-rank needs --oom-after")
    if args.hold >= args.print_every:
        parser.error("--hold must be shorter than --print-every")
    return args


def env_int(name, default):
    try:
        return int(os.environ.get(name, ""))
    except ValueError:
        return default


class Out:
    """One rank's lines: stdout (flushed) and DIR/rank-R.jsonl (flushed)."""

    def __init__(self, log_dir, rank):
        self.file = None
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)
            self.file = open(os.path.join(log_dir, "rank-%d.jsonl" % rank), "a", buffering=1)

    def line(self, record):
        text = json.dumps(record)
        print(text, flush=True)
        if self.file is not None:
            self.file.write(text + "\n")
            self.file.flush()

    def close(self):
        if self.file is not None:
            self.file.close()


def main():
    args = parse_args()
    started = time.monotonic()

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from transformers import GPT2Config, GPT2LMHeadModel

    sys.path.insert(0, HERE)
    from train_gpt2 import train_step  # one step between two synchronizes, bf16 autocast

    rank = env_int("RANK", 0)
    local_rank = env_int("LOCAL_RANK", rank)
    world = env_int("WORLD_SIZE", 1)
    if args.one_gpu:
        backend, index = "gloo", 0
    else:
        backend, index = "nccl", local_rank
        if index >= torch.cuda.device_count():
            sys.exit("ddp_ranks: local rank %d has no cuda:%d (%d GPUs); use --one-gpu"
                     % (local_rank, index, torch.cuda.device_count()))
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    out = Out(args.log_dir, rank)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.pg_timeout))

    torch.manual_seed(0)  # the same weights on every rank (DDP broadcasts rank 0's anyway)
    config = GPT2Config(n_layer=args.layers, n_embd=args.embd, n_head=args.heads, n_positions=max(args.seq, 128))
    model = GPT2LMHeadModel(config).to(device)
    ddp = DistributedDataParallel(model, device_ids=[index], broadcast_buffers=False)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    batch = args.batch0 if rank == 0 else args.batch1
    # One batch of ids for the whole run: nothing new is allocated between steps but the
    # step's own tensors, so the figures read at a hold are the run's steady state.
    torch.manual_seed(1 + rank)
    ids = torch.randint(0, config.vocab_size, (batch, args.seq), device=device)
    # The per-step agreement [stop, hold], decided by rank 0: gloo reduces CPU tensors
    # (no device memory for it), NCCL needs a device tensor (allocated once, reused).
    flags = torch.zeros(2, dtype=torch.int64, device=device if backend == "nccl" else "cpu")

    base = {"rank": rank, "local_rank": local_rank, "world_size": world, "pid": os.getpid()}

    def figures(step):
        torch.cuda.synchronize(device)
        record = dict(base)
        record.update({
            "step": step, "batch": batch,
            "reserved": torch.cuda.memory_reserved(device),
            "allocated": torch.cuda.memory_allocated(device),
            "time": time.time(),
        })
        return record

    start = dict(base)
    start.update({"start": True, "backend": backend, "device": str(device), "batch": batch, "seq": args.seq,
                  "params": sum(p.numel() for p in model.parameters()), "time": time.time(),
                  "setup_s": round(time.monotonic() - started, 3)})
    out.line(start)

    step = 0
    last_print = time.monotonic()
    oom_done = False
    step_s = []
    try:
        while True:
            now = time.monotonic()
            if (args.oom_rank == rank and not oom_done and args.oom_after is not None
                    and now - started >= args.oom_after):
                oom_done = True
                total = torch.cuda.get_device_properties(device).total_memory
                asked = 2 * total
                out.line(dict(base, oom_attempt=True, requested=asked, time=time.time(), step=step))
                oom_error = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
                if args.oom_dies:
                    torch.empty(asked, dtype=torch.uint8, device=device)  # raises; the rank dies
                try:
                    torch.empty(asked, dtype=torch.uint8, device=device)
                    out.line(dict(base, oom=False, requested=asked, note="the impossible tensor was granted", time=time.time()))
                except oom_error as err:
                    record = figures(step)
                    record.update({"oom": True, "requested": asked, "message": str(err)[:2000]})
                    out.line(record)

            _, seconds = train_step(ddp, optimizer, ids)
            step_s.append(seconds)
            step += 1

            if rank == 0:
                flags[0] = 1 if time.monotonic() - started >= args.seconds else 0
                flags[1] = 1 if time.monotonic() - last_print >= args.print_every else 0
            else:
                flags.zero_()
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            stop, hold = (int(v) for v in flags.tolist())
            if hold:
                record = figures(step)
                record["hold_s"] = args.hold
                recent = step_s[-20:]
                record["step_ms"] = round(1000 * sum(recent) / len(recent), 3)
                out.line(record)
                last_print = time.monotonic()
                time.sleep(args.hold)  # nothing allocates here: a viewer now reads `record`
            if stop:
                break
        dist.barrier()
        final = figures(step)
        final.update({"final": True, "steps": step,
                      "mean_step_ms": round(1000 * sum(step_s) / len(step_s), 3) if step_s else None,
                      "elapsed_s": round(time.monotonic() - started, 3)})
        out.line(final)
    finally:
        out.close()
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
