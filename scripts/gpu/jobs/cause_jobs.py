#!/usr/bin/env python3
"""Jobs that die of "CUDA out of memory" for each cause users meet, for the GPU checks of
the OOM's cause line (scripts/gpu/causes.sh). Each prints one JSON line with PyTorch's
outcome (`"oom": true/false`, its message) and exits 1 on an OOM, 0 when it fit.

  jax_hold SECONDS   a JAX process that makes one array (XLA preallocates 75 % of the GPU
                     unless XLA_PYTHON_CLIENT_PREALLOCATE=false) and sits idle
  cupy_hold SECONDS [freed]  a CuPy process that allocates 30 GiB, frees it (its pool
                     keeps it; with `freed`, then calls free_all_blocks())
  big GIB            a PyTorch job asking for GIB at once (beside a holder)
  cap FRACTION       set_per_process_memory_fraction(FRACTION), 6 GiB live, asks for 3 GiB
  leak               a training loop that keeps each step's output (8 MiB a step) under a
                     7.9 GiB cap (fraction 0.1 on an H100), one optimizer step each
  leak_loop          the same without a model or optimizer: keeps 8 MiB a pass
  toobig             a GPT-2 (transformers, random weights) whose batch doubles each step
  inproc KIND GIB [fixed]  the same process holds the GPU before PyTorch asks for GIB:
                     `jax` (XLA's preallocation; `fixed`: XLA_PYTHON_CLIENT_PREALLOCATE=false,
                     as the cause line says), `cupy` (110 GiB allocated and freed, kept in its
                     pool; `fixed`: then free_all_blocks()), `raw` (110 GiB through the CUDA
                     driver, as a CUDA extension would)
  inproc jax train [fixed]  JAX in the process with XLA_PYTHON_CLIENT_MEM_FRACTION=.9
                     (unless `fixed`: XLA_PYTHON_CLIENT_PREALLOCATE=false), then a GPT-2
                     (6 layers, 1024 wide, random weights, bf16 autocast, AdamW) trained on
                     batches of 32 x 1024 for 3 steps
"""

import json
import sys
import time

GiB = 1 << 30
MiB = 1 << 20


def report(outcome):
    print(json.dumps(outcome), flush=True)
    sys.exit(1 if outcome.get("oom") else 0)


def hold(make, seconds):
    thing = make()
    print(json.dumps({"holding": True}), flush=True)
    time.sleep(float(seconds))
    del thing


def jax_hold(seconds):
    import jax.numpy as jnp

    hold(lambda: jnp.ones((1024,)).block_until_ready(), seconds)


def cupy_hold(seconds, freed=""):
    import cupy

    def make():
        a = cupy.empty(30 * GiB, dtype=cupy.uint8)
        del a  # back to CuPy's pool, not to the driver
        pool = cupy.get_default_memory_pool()
        if freed == "freed":  # what the cause line says to do there
            pool.free_all_blocks()
        return pool

    hold(make, seconds)


def torch_oom(body):
    import torch

    try:
        body(torch)
        report({"oom": False})
    except torch.cuda.OutOfMemoryError as err:
        report({"oom": True, "message": str(err)[:400]})


def big(gib):
    torch_oom(lambda torch: torch.empty(int(float(gib) * GiB), dtype=torch.uint8, device="cuda"))


def cap(fraction):
    def body(torch):
        torch.cuda.set_per_process_memory_fraction(float(fraction))
        live = torch.empty(6 * GiB, dtype=torch.uint8, device="cuda")
        more = torch.empty(3 * GiB, dtype=torch.uint8, device="cuda")
        del live, more

    torch_oom(body)


def leak(with_model):
    def body(torch):
        torch.cuda.set_per_process_memory_fraction(0.1)
        kept = []
        if with_model:
            model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
            opt = torch.optim.AdamW(model.parameters())
        for step in range(100000):
            x = torch.randn(2048, 1024, device="cuda")
            if with_model:
                out = model(x)
                out.sum().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                kept.append(out.detach().clone())  # the leak: 8 MiB a step
            else:
                kept.append(x * 2)  # the leak: 8 MiB a pass
            time.sleep(0.01)

    torch_oom(body)


def toobig():
    def body(torch):
        from transformers import GPT2Config, GPT2LMHeadModel

        model = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=768, n_head=12, n_positions=1024)).cuda()
        opt = torch.optim.AdamW(model.parameters())
        batch = 4
        while True:
            ids = torch.randint(0, 50257, (batch, 1024), device="cuda")
            loss = model(ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            print(json.dumps({"batch": batch}), flush=True)
            batch *= 2

    torch_oom(body)


def inproc(kind, gib, fixed=""):
    import os

    held = None
    if kind == "jax":
        if fixed == "fixed":
            os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        elif gib == "train":
            os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = ".9"
        import jax.numpy as jnp

        held = jnp.ones((1024,)).block_until_ready()
    elif kind == "cupy":
        import cupy

        a = cupy.empty(110 * GiB, dtype=cupy.uint8)
        del a  # back to CuPy's pool, not to the driver
        held = cupy.get_default_memory_pool()
        if fixed == "fixed":
            held.free_all_blocks()
    elif kind == "raw":
        import ctypes

        cu = ctypes.CDLL("libcuda.so.1")
        device, context, pointer = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
        for rc in (cu.cuInit(0), cu.cuDeviceGet(ctypes.byref(device), 0),
                   cu.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), cu.cuCtxSetCurrent(context),
                   cu.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(110 * GiB))):
            if rc != 0:
                sys.exit(f"raw: CUDA driver call failed ({rc})")
        held = pointer
    print(json.dumps({"holding": kind, "fixed": fixed == "fixed"}), flush=True)
    if gib == "train":
        train_gpt2(32, 3)
    else:
        big(gib)
    del held


def train_gpt2(batch, steps):
    def body(torch):
        from transformers import GPT2Config, GPT2LMHeadModel

        model = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=1024, n_head=16, n_positions=1024)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for step in range(steps):
            ids = torch.randint(0, 50257, (batch, 1024), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            print(json.dumps({"step": step, "reserved": torch.cuda.memory_reserved()}), flush=True)

    torch_oom(body)


if __name__ == "__main__":
    what, args = sys.argv[1], sys.argv[2:]
    jobs = {
        "jax_hold": jax_hold,
        "cupy_hold": cupy_hold,
        "big": big,
        "cap": cap,
        "leak": lambda: leak(True),
        "leak_loop": lambda: leak(False),
        "toobig": toobig,
        "inproc": inproc,
    }
    jobs[what](*args)
