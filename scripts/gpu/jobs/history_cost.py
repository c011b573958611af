#!/usr/bin/env python3
"""Where a hooked job's state read goes with history on: leak_list.py's loop in the main
thread, and in a second thread (as the hook's) the hook's own collect() every 0.5 s with
each part timed (wall and thread CPU). Run with the hook on PYTHONPATH and VRAMTOP_HISTORY=1.
Prints one JSON line per read, then the cost of switching history off and on.
usage: history_cost.py [--steps 24] [--period 0.25]
"""
import argparse, json, threading, time, sys

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=24)
parser.add_argument("--period", type=float, default=0.25)
args = parser.parse_args()

import vramtop_hook as vh  # noqa: E402  (sitecustomize imported it with torch)

hook = vh.running.hook
if hook is None:
    hook = vh.server.Hook(True, forked=False)
    hook.meet_torch(torch)
alloc = hook.alloc
parts = {}


def timed(name, fn):
    def wrapper(*a, **k):
        w, c = time.monotonic(), time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            parts[name] = (round((time.monotonic() - w) * 1e3, 3), round((time.thread_time() - c) * 1e3, 3))
    return wrapper


alloc._snapshot = timed("snapshot", alloc._snapshot)
alloc.convert_segments = timed("convert", alloc.convert_segments)
alloc.stats = timed("stats", alloc.stats)
alloc.settings = timed("settings", alloc.settings)
kept = []
done = threading.Event()


def reader():
    while not done.is_set():
        if torch.cuda.is_initialized():
            parts.clear()
            w, c = time.monotonic(), time.thread_time()
            state = alloc.collect()
            print(json.dumps({"read_ms": round((time.monotonic() - w) * 1e3, 3), "cpu_ms": round((time.thread_time() - c) * 1e3, 3),
                              "parts_ms_wall_cpu": dict(parts), "kept": len(kept), "history": alloc.history_on,
                              "blocks": sum(len(s["blocks"]) for s in state["segments"]),
                              "sites": sorted({b["site"] for s in state["segments"] for b in s["blocks"] if b["site"]})}), flush=True)
        time.sleep(0.5)


t = threading.Thread(target=reader, daemon=True)
torch.cuda.init()
t.start()
for i in range(args.steps):
    w = time.monotonic()
    transient = torch.randn(512, 1024, device="cuda") @ torch.randn(1024, 512, device="cuda")
    float(transient.sum())
    kept.append(torch.empty(4 << 20, dtype=torch.uint8, device="cuda"))
    print(json.dumps({"step": i, "step_ms": round((time.monotonic() - w) * 1e3, 3)}), flush=True)
    time.sleep(args.period)
done.set()
t.join()
raw = torch.cuda.memory._snapshot()
blocks = [b for s in raw["segments"] for b in s["blocks"]]
print(json.dumps({"frames_per_block": [len(b.get("frames") or []) for b in blocks][:10],
                  "first_frames": [f.get("filename") for f in (blocks[0].get("frames") or [])][:12]}), flush=True)
for on in (False, True, False, True):
    w = time.monotonic()
    ok = alloc.set_recording(on) if hasattr(alloc, "set_recording") else None
    print(json.dumps({"set_recording": on, "ok": ok, "ms": round((time.monotonic() - w) * 1e3, 3)}), flush=True)
n0 = torch.cuda.memory_stats()["allocation.all.allocated"]
w = time.monotonic()
for _ in range(2000):
    torch.empty(1024, device="cuda")
rec = (time.monotonic() - w) / 2000 * 1e6
alloc.set_recording(False)
w = time.monotonic()
for _ in range(2000):
    torch.empty(1024, device="cuda")
plain = (time.monotonic() - w) / 2000 * 1e6
print(json.dumps({"alloc_us_recorded": round(rec, 2), "alloc_us_plain": round(plain, 2), "counted": torch.cuda.memory_stats()["allocation.all.allocated"] - n0,
                  "raw_stats_ok": int(torch._C._cuda_memoryStats(0)["allocation"]["all"]["allocated"]) > 0}), flush=True)
