#!/usr/bin/env python3
"""Jobs that print their own memory by role, for the GPU check of vramtop's roles
(scripts/gpu/roles.sh): the bytes of their parameters' and buffers' storages, of
their gradients' and of their optimizers' state tensors, each storage counted once, on the
job's device. Each prints a JSON line {"moment", "pid", "rank", "parameters", "gradients",
"optimizer_state"} and holds still HOLD_S seconds (a viewer reads it then), and at the end
prints its sums again and asks for more than the GPU has (the OOM's kept file carries the
roles then).

  plain      GPT-2 (transformers, 6 layers, random weights) with AdamW, a few steps
  inference  the same model in eval mode under no_grad: parameters only, no optimizer
  trainer    a Hugging Face Trainer fine-tuning it on random tokens (its own AdamW)
  ddp        the plain loop under DistributedDataParallel (torchrun; gloo when the ranks
             share a GPU, NCCL when each has its own)
  ema        the plain loop with two EMAs of the weights, torch's AveragedModel and timm's
             ModelEmaV3 (where timm is installed), updated after each step and never
             called: their weights are parameters no optimizer trains ("frozen"); it also
             times the hook's look through the loop's frames for them (`frames_walk_us`)
  compare JOB_OUT ATTACH_JSONL KEPT...   the job's sums against vramtop's, as a table
"""

import json
import os
import sys
import time

HOLD_S = 4.0


def sums(torch, models, optimizers, device):
    seen = set()
    out = {"parameters": 0, "gradients": 0, "optimizer_state": 0}

    def add(role, t):
        if not torch.is_tensor(t) or not t.is_cuda or t.device.index != device:
            return
        s = t.untyped_storage()
        if s.data_ptr() and s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            out[role] += s.nbytes()

    params = []
    for m in models:
        params.extend(m.parameters())
        for b in m.buffers():
            add("parameters", b)
    for o in optimizers:
        for g in o.param_groups:
            params.extend(g["params"])
    for p in params:
        add("parameters", p)
    for p in params:
        if p.grad is not None:
            add("gradients", p.grad)
    for o in optimizers:
        for st in o.state.values():
            for v in st.values():
                add("optimizer_state", v)
    return out


def say(moment, figures):
    rank = os.environ.get("RANK")
    print(json.dumps(dict(figures, moment=moment, pid=os.getpid(), rank=rank, time_s=time.time())), flush=True)


def gpt2(torch, device):
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=768, n_head=12, n_positions=512)).to(device)


def oom(torch, device, figures_fn):
    say("oom", figures_fn())
    try:
        torch.empty(200 << 30, dtype=torch.uint8, device=device)
    except torch.cuda.OutOfMemoryError:
        pass


def loop(ddp):
    import torch

    device = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    torch.cuda.set_device(device)
    model = gpt2(torch, device)
    wrapped = model
    if ddp:
        import torch.distributed as dist

        backend = "nccl" if torch.cuda.device_count() >= int(os.environ["WORLD_SIZE"]) else "gloo"
        dist.init_process_group(backend)
        wrapped = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device])
    opt = torch.optim.AdamW(model.parameters())
    for step in range(6):
        ids = torch.randint(0, 50257, (8, 512), device=device)
        wrapped(ids, labels=ids).loss.backward()
        opt.step()
        if step == 4:  # gradients alive, optimizer state made
            torch.cuda.synchronize()
            say("step", sums(torch, [wrapped], [opt], device))
            time.sleep(HOLD_S)
        opt.zero_grad(set_to_none=True)
    ids = torch.randint(0, 50257, (8, 512), device=device)
    wrapped(ids, labels=ids).loss.backward()
    oom(torch, device, lambda: sums(torch, [wrapped], [opt], device))
    if ddp:
        torch.distributed.destroy_process_group()


def ema():
    import torch
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    model = gpt2(torch, 0)
    opt = torch.optim.AdamW(model.parameters())
    averaged = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.999))
    copies = [averaged]
    try:
        from timm.utils import ModelEmaV3

        timm_ema = ModelEmaV3(model, decay=0.999)
        copies.append(timm_ema.module)
    except ImportError:
        timm_ema = None

    def figures():
        out = sums(torch, [model] + copies, [opt], 0)
        out["frozen"] = sums(torch, copies, [], 0)["parameters"]
        return out

    for step in range(6):
        ids = torch.randint(0, 50257, (8, 512), device=0)
        model(ids, labels=ids).loss.backward()
        opt.step()
        averaged.update_parameters(model)
        if timm_ema is not None:
            timm_ema.update(model)
        if step == 4:
            torch.cuda.synchronize()
            say("step", figures())
            time.sleep(HOLD_S)
        opt.zero_grad(set_to_none=True)
    ids = torch.randint(0, 50257, (8, 512), device=0)
    model(ids, labels=ids).loss.backward()
    frames_walk_us()
    oom(torch, 0, figures)


def frames_walk_us(times=200):
    """What the hook's look through the job's frames costs, here in the loop (median)."""
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                    "python", "vramtop", "_hook"))
    from vramtop_hook.roles import RoleWatch

    watch = RoleWatch(torch)
    took = []
    for _ in range(times):
        began = time.perf_counter()
        found = watch.held_in_frames()
        took.append(1e6 * (time.perf_counter() - began))
    took.sort()
    print(json.dumps({"frames_walk_us": round(took[len(took) // 2], 1), "found": len(found)}), flush=True)


def inference():
    import torch

    model = gpt2(torch, 0).eval()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randint(0, 50257, (8, 512), device=0))
    say("step", sums(torch, [model], [], 0))
    time.sleep(HOLD_S)
    oom(torch, 0, lambda: sums(torch, [model], [], 0))


def trainer():
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    model = gpt2(torch, 0)
    data = [{"input_ids": torch.randint(0, 50257, (512,)), "labels": None} for _ in range(64)]
    for row in data:
        row["labels"] = row["input_ids"].clone()

    class Hold(TrainerCallback):
        def __init__(self):
            self.trainer = None

        def on_optimizer_step(self, args, state, control, **kwargs):
            # After the optimizer stepped, before gradients are zeroed (transformers 4.4x+).
            if state.global_step == 4:
                opt = self.trainer.optimizer
                inner = getattr(opt, "optimizer", opt)  # accelerate wraps it
                torch.cuda.synchronize()
                say("step", sums(torch, [self.trainer.model], [inner], 0))
                time.sleep(HOLD_S)

        def on_train_end(self, args, state, control, **kwargs):
            opt = self.trainer.optimizer
            inner = getattr(opt, "optimizer", opt)
            oom(torch, 0, lambda: sums(torch, [self.trainer.model], [inner], 0))

    hold = Hold()
    args = TrainingArguments(output_dir="/tmp/roles-trainer", per_device_train_batch_size=8, max_steps=6,
                             report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True)
    t = Trainer(model=model, args=args, train_dataset=data, callbacks=[hold])
    hold.trainer = t
    t.train()


def compare(job_out, attach_jsonl, kept_files):
    """The job's sums against vramtop's at the same moment: a state read while the job
    held still (its `step` line), and the file kept at its OOM (its `oom` line)."""
    import pickle

    said = [json.loads(l) for l in open(job_out) if l.startswith("{\"parameters\"")]
    states = []
    for line in open(attach_jsonl):
        try:
            for job in json.loads(line).get("attached", []):
                if job.get("roles"):
                    states.append((job["pid"], job["roles"]))
        except ValueError:
            pass
    kept = {}
    for path in kept_files:
        with open(path, "rb") as f:
            oom = pickle.load(f).get("vramtop_oom", {})
        kept[oom.get("pid")] = oom.get("roles")
    rows, bad = [], 0
    for s in said:
        # The EMA job says its frozen bytes too (hook 1.17+ sends them).
        keys = ("parameters", "gradients", "optimizer_state") + (("frozen",) if "frozen" in s else ())
        own = tuple(s[k] for k in keys)
        if s["moment"] == "step":
            seen = [tuple(r[k] for k in keys) for pid, r in states if pid == s["pid"]]
            ours = own if own in seen else (seen[-1] if seen else None)
            where = "live state (attach --json)"
        else:
            r = kept.get(s["pid"])
            ours = tuple(r[k] for k in keys) if r else None
            where = "kept file at the OOM"
        ok = ours == own
        bad += not ok
        rows.append("| %s | rank %s | %s | %s | %s | %s |" % (s["pid"], s["rank"], where, own, ours, "equal" if ok else "DIFFERENT"))
    print("| pid | rank | vramtop's figure | the job's sums (params, grads, optimizer) | vramtop's | |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("equal: %d; different or missing: %d" % (len(rows) - bad, bad))


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "compare":
        compare(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif what == "plain":
        loop(False)
    elif what == "ddp":
        loop(True)
    elif what == "ema":
        ema()
    elif what == "inference":
        inference()
    elif what == "trainer":
        trainer()
