"""Make real PyTorch allocator snapshots on a GPU machine, for vramtop's trace tests.

usage: python3 make_traces.py KIND OUT_DIR [options]

Kinds (each in a fresh process, since allocator settings are read once at start-up):
  oom-cap      checkerboard under set_per_process_memory_fraction: 6 MiB tensors, every
               other one freed, then a 1 GiB request that fails; snapshot after the OOM
  decode       a GPT-2 decode loop whose KV cache grows by torch.cat every token;
               --max-entries bounds the history ring (100_000, 1_000_000, 3_000_000)
  gpt2-train   GPT-2-style training, 8 layers, variable sequence length, AdamW, bf16
  resnet-train torchvision ResNet-50, batch drawn from {16,32,48,64}, SGD, bf16 autocast

PYTORCH_CUDA_ALLOC_CONF is taken from the environment (expandable_segments:True, ...).
Writes OUT_DIR/NAME.pickle.gz and prints one JSON line: name, events, PyTorch's peak
allocated/reserved, the settings, wall time.
"""
import argparse
import gzip
import json
import os
import pickle
import random
import sys
import time

import torch


def record(max_entries):
    torch.cuda.memory._record_memory_history(
        enabled="all", context="all", stacks="python", max_entries=max_entries
    )


def dump(path, name, started, extra):
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = sum(len(t) for t in snap["device_traces"])
    actions = {}
    for t in snap["device_traces"]:
        for e in t:
            actions[e["action"]] = actions.get(e["action"], 0) + 1
    out = os.path.join(path, f"{name}.pickle.gz")
    with gzip.open(out, "wb", compresslevel=6) as f:
        pickle.dump(snap, f, protocol=4)
    line = {
        "name": name,
        "file": os.path.basename(out),
        "bytes": os.path.getsize(out),
        "events": events,
        "actions": actions,
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
        "reserved_at_end_bytes": torch.cuda.memory_reserved(),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "allocator_settings": snap.get("allocator_settings"),
        "wall_s": round(time.time() - started, 2),
        "torch": torch.__version__,
    }
    line.update(extra)
    print(json.dumps(line, default=str), flush=True)


def oom_cap(args):
    torch.cuda.init()
    torch.cuda.set_per_process_memory_fraction(args.fraction)
    record(args.max_entries)
    block = 6 << 20
    kept = []
    try:
        while True:
            kept.append(torch.empty(block, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError:
        pass
    kept = kept[:-2]
    del kept[::2]
    torch.cuda.synchronize()
    message = None
    try:
        torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as e:
        message = str(e)
    return {
        "oom_message": message,
        "allocated_at_oom_bytes": torch.cuda.memory_allocated(),
        "reserved_at_oom_bytes": torch.cuda.memory_reserved(),
        "fraction": args.fraction,
        "total_bytes": torch.cuda.get_device_properties(0).total_memory,
    }


def decode(args):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=4, n_head=8, n_embd=512, n_positions=args.tokens + 64, vocab_size=8192)
    model = GPT2LMHeadModel(cfg).cuda().eval().half()
    record(args.max_entries)
    layers = len(model.transformer.h)
    steps = 0
    with torch.no_grad():
        for seq in range(args.sequences):
            ids = torch.randint(0, cfg.vocab_size, (4, 16), device="cuda")
            # A hand-rolled cache, grown with torch.cat every token as naive decode loops do.
            kv = [None] * layers
            x = ids
            for _ in range(args.tokens):
                h = model.transformer.wte(x) + model.transformer.wpe(
                    torch.arange(0, x.shape[1], device="cuda") + (0 if kv[0] is None else kv[0][0].shape[2])
                )
                for i, block in enumerate(model.transformer.h):
                    a = block.ln_1(h)
                    q, k, v = block.attn.c_attn(a).split(cfg.n_embd, dim=2)
                    shape = (a.shape[0], a.shape[1], cfg.n_head, cfg.n_embd // cfg.n_head)
                    q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
                    if kv[i] is not None:
                        k = torch.cat([kv[i][0], k], dim=2)
                        v = torch.cat([kv[i][1], v], dim=2)
                    kv[i] = (k, v)
                    y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
                    y = y.transpose(1, 2).reshape(a.shape)
                    h = h + block.attn.c_proj(y)
                    h = h + block.mlp(block.ln_2(h))
                logits = model.lm_head(model.transformer.ln_f(h[:, -1:]))
                x = logits.argmax(-1)
                steps += 1
            del kv
    return {"decode_steps": steps, "max_entries": args.max_entries}


def gpt2_train(args):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    random.seed(0)
    cfg = GPT2Config(n_layer=8, n_head=16, n_embd=1024, n_positions=1024, vocab_size=50257)
    model = GPT2LMHeadModel(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    record(args.max_entries)
    for _ in range(args.steps):
        seq = random.choice([128, 256, 384, 512, 768, 1024])
        ids = torch.randint(0, cfg.vocab_size, (8, seq), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"steps": args.steps}


def resnet_train(args):
    import torchvision

    torch.manual_seed(0)
    random.seed(0)
    model = torchvision.models.resnet50().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    record(args.max_entries)
    for _ in range(args.steps):
        b = random.choice([16, 32, 48, 64])
        x = torch.randn(b, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (b,), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"steps": args.steps}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=["oom-cap", "decode", "gpt2-train", "resnet-train"])
    p.add_argument("out")
    p.add_argument("--name")
    p.add_argument("--max-entries", type=int, default=1_000_000)
    p.add_argument("--fraction", type=float, default=0.1)
    p.add_argument("--tokens", type=int, default=1000)
    p.add_argument("--sequences", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    started = time.time()
    run = {"oom-cap": oom_cap, "decode": decode, "gpt2-train": gpt2_train, "resnet-train": resnet_train}
    extra = run[args.kind](args)
    dump(args.out, args.name or args.kind, started, extra)


if __name__ == "__main__":
    sys.exit(main())
