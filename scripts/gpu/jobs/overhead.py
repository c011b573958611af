#!/usr/bin/env python3
"""The hook's cost to a training job, measured on the GPU machine: runs train_gpt2.py with
no hook, with the hook and no viewer, with a viewer subscribed at 1 s, and with history and
a viewer at 1 s; compares mean step times (warm-up steps left out). The no-hook run is
repeated last to show the drift between runs, which bounds what can be told apart.
Prints one JSON line per run, then one with the comparison. Also checks, in the run with
a viewer, that the viewer's last state equals the job's own final memory_reserved /
memory_allocated.

With --rounds N the five runs are made N times, each round in a rotated order, and each
configuration's figure is the mean of its rounds: the same job drifts between processes
by 5 to 22 % on the H100, more than the 1 % to be told apart (history_ab.py measures
history's cost inside one process instead).
A first no-hook run is made before the rounds and not counted (the cold machine's first
process runs slower), and the comparison lists every run's mean, so drift can be seen.

usage: overhead.py --hook-dir DIR [--steps 80] [--warmup 10] [--rounds 1] [--log FILE]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = (
    ("no hook", False, False, False),
    ("hook, viewer at 1 s", True, True, False),
    ("hook + history, viewer at 1 s", True, True, True),
    ("hook, no viewer", True, False, False),
    ("no hook (again)", False, False, False),
)


def median(values):
    values = sorted(values)
    return values[len(values) // 2] if values else None


def run_one(name, hooked, viewed, history, args, log):
    env = dict(os.environ)
    for key in ("VRAMTOP_HISTORY", "VRAMTOP_SOCKET_DIR", "VRAMTOP_HOOK"):
        env.pop(key, None)
    # Whatever PYTHONPATH the machine needs for torch stays; the hook goes in front of it.
    theirs = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != args.hook_dir]
    env["PYTHONPATH"] = os.pathsep.join(theirs)
    sockets = tempfile.mkdtemp(prefix="vramtop-oh-")
    if hooked:
        env["PYTHONPATH"] = os.pathsep.join([args.hook_dir] + theirs)
        env["VRAMTOP_SOCKET_DIR"] = sockets
    if history:
        env["VRAMTOP_HISTORY"] = "1"
    job = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "train_gpt2.py"), "--steps", str(args.steps), "--hold", "4"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    viewer = None
    if viewed:
        viewer = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "viewer.py"), "--dir", sockets, "--pid", str(job.pid),
             "--interval", "1", "--wait", "120", "--timeout", "60"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
    out, err = job.communicate()
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    steps = [l["step_s"] for l in lines if "step_s" in l][args.warmup:]
    final = next((l for l in lines if l.get("final")), None)
    # The mean, not the median: a read once a second lands on one step in many, and a
    # median would hide exactly that cost.
    result = {"run": name, "rc": job.returncode, "steps": len(steps),
              "mean_step_ms": round(sum(steps) / len(steps) * 1000, 3) if steps else None,
              "median_step_ms": round(median(steps) * 1000, 3) if steps else None, "final": final}
    if viewer is not None:
        vout, verr = viewer.communicate(timeout=120)
        summary = json.loads(vout) if vout.strip().startswith("{") else {"viewer_error": verr[-500:]}
        result["viewer"] = {k: summary.get(k) for k in ("states", "collect_ms_median", "collect_ms_max", "last_state", "history_shares", "viewer_error")}
        if history:
            result["viewer"]["history"] = any(h.get("history") for h in summary.get("hellos", []))
    log.write("== %s\n%s\n-- stderr --\n%s\n" % (name, json.dumps(result), err[-4000:]))
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hook-dir", required=True)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--log", default=os.devnull)
    args = parser.parse_args()
    results = {}  # name -> the last round's result (viewer figures, totals)
    means = {name: [] for name, *_ in RUNS}
    with open(args.log, "a") as log:
        # A first run that counts for nothing: the first process on a cold machine loads
        # kernels and ramps clocks, and that must not land on one configuration.
        print(json.dumps({"warm_up": run_one("warm-up (not counted)", False, False, False, args, log)["mean_step_ms"]}), flush=True)
        for round_index in range(max(args.rounds, 1)):
            shift = round_index % len(RUNS)
            for name, hooked, viewed, history in RUNS[shift:] + RUNS[:shift]:
                result = run_one(name, hooked, viewed, history, args, log)
                result["round"] = round_index + 1
                results[name] = result
                if result["mean_step_ms"]:
                    means[name].append(result["mean_step_ms"])
                print(json.dumps(result), flush=True)
    base = means["no hook"] + means["no hook (again)"]
    base_ms = sum(base) / len(base) if base else None
    comparison = {"baseline_ms": base_ms, "rounds": max(args.rounds, 1), "means_ms": means,
                  "drift_pct": round(100 * (max(base) / min(base) - 1), 2) if len(base) >= 2 else None}
    for name in ("hook, no viewer", "hook, viewer at 1 s", "hook + history, viewer at 1 s"):
        ms = sum(means[name]) / len(means[name]) if means[name] else None
        comparison[name] = round(100 * (ms / base_ms - 1), 2) if ms and base_ms else None
    viewed = results["hook, viewer at 1 s"]
    last = (viewed.get("viewer") or {}).get("last_state") or {}
    final = viewed.get("final") or {}
    comparison["totals"] = {
        "job_reserved": final.get("reserved"), "job_allocated": final.get("allocated"),
        "hook_reserved": (last.get("stats") or {}).get("reserved_bytes"),
        "hook_allocated": (last.get("stats") or {}).get("allocated_bytes"),
        "segments_total": last.get("segments_total"), "segments": last.get("segments"),
        "blocks": last.get("blocks"),
    }
    print(json.dumps({"comparison": comparison}), flush=True)


if __name__ == "__main__":
    main()
