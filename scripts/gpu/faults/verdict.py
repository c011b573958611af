#!/usr/bin/env python3
"""Verdicts of scripts/gpu/faults.sh: vramtop's `--once --json` beside nvidia-smi.

usage:
  verdict.py nonroot ONCE.json SMI_GPU.csv SMI_APPS.csv JOB_PID
  verdict.py namespace ONCE.json SMI_GPU.csv SMI_APPS.csv OUTSIDE_PID INSIDE_HOST_PID INSIDE_NS_PID
  verdict.py hidepid ONCE.json SMI_APPS.csv JOB_PID

SMI_GPU.csv: `nvidia-smi -i 0 --query-gpu=memory.used,memory.total,memory.reserved
--format=csv,noheader,nounits`; SMI_APPS.csv: `nvidia-smi --query-compute-apps=pid,used_memory
--format=csv,noheader,nounits`. Prints one line: "ok ..." or "FAIL ...". MiB throughout;
figures may differ by 2 MiB (the two reads are moments apart).
"""
import json
import sys

SLACK_MIB = 2


def mib(b):
    return None if b is None else b >> 20


def read_json(path):
    with open(path) as f:
        return json.load(f)


def smi_gpu(path):
    with open(path) as f:
        used, total, reserved = [int(x) for x in f.read().strip().split(",")]
    return used, total, reserved


def smi_apps(path):
    apps = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                pid, used = [x.strip() for x in line.split(",")]
                apps[int(pid)] = int(used) if used.isdigit() else None
    return apps


def device_rows(dev, gpu):
    """Problems with the device figures, and a short description."""
    used, total, reserved = gpu
    ours = (mib(dev.get("memory_used_bytes")), mib(dev.get("memory_total_bytes")),
            mib(dev.get("memory_reserved_bytes")))
    problems = [name for name, a, b in zip(("used", "total", "reserved"), ours, gpu)
                if a is None or abs(a - b) > SLACK_MIB]
    return problems, f"device used {ours[0]}/{used} total {ours[1]}/{total} reserved {ours[2]}/{reserved} MiB (vramtop/smi)"


def process(dev, pid):
    return next((p for p in dev.get("processes", []) if p["pid"] == pid), None)


def unattributed(dev):
    used = dev.get("memory_used_bytes") or 0
    listed = sum(p.get("used_memory_bytes") or 0 for p in dev.get("processes", []))
    return max(used - listed, 0) >> 20


def nonroot(once, gpu_csv, apps_csv, job_pid):
    snap = read_json(once)
    dev = snap["devices"][0]
    apps = smi_apps(apps_csv)
    problems, rows = device_rows(dev, smi_gpu(gpu_csv))
    job_mib = apps.get(job_pid)
    if job_mib is None:
        return f"FAIL nvidia-smi does not list root's job {job_pid}; {rows}"
    p = process(dev, job_pid)
    if p is not None and p.get("used_memory_bytes") is not None:
        how = (f"root's job {job_pid} listed with {mib(p['used_memory_bytes'])}/{job_mib} MiB, "
               f"user {p.get('user')}, command {p.get('command')!r}, view {p.get('host_view')}")
        if abs(mib(p["used_memory_bytes"]) - job_mib) > SLACK_MIB:
            problems.append("job memory")
    else:
        un = unattributed(dev)
        said = [w for w in snap.get("warnings", []) if "permission" in w]
        how = (f"root's job {job_pid} ({job_mib} MiB) hidden: {'listed without memory' if p else 'not listed'}, "
               f"unattributed {un} MiB; warning: {said[0] if said else 'none'}")
        if un + SLACK_MIB < job_mib:
            problems.append("hidden memory not shown as unattributed")
        if not said and p is None:
            problems.append("nothing says what is hidden")
    verdict = "FAIL" if problems else "ok"
    off = f"; off: {', '.join(problems)}" if problems else ""
    return f"{verdict} {rows}; {how}{off}"


def namespace(once, gpu_csv, apps_csv, outside_pid, inside_host_pid, inside_ns_pid):
    snap = read_json(once)
    dev = snap["devices"][0]
    apps = smi_apps(apps_csv)
    problems, rows = device_rows(dev, smi_gpu(gpu_csv))
    out_mib = apps.get(outside_pid)
    in_mib = apps.get(inside_host_pid)
    if out_mib is None or in_mib is None:
        return (f"FAIL nvidia-smi lists outside {outside_pid}: {out_mib}, inside {inside_host_pid}: {in_mib}; "
                f"{rows}")
    # The outside job: either listed under its host pid as another namespace's (drivers
    # that do not translate pids), or left out by the driver (drivers that translate pids
    # into the caller's namespace and drop the rest), its memory then unattributed.
    p = process(dev, outside_pid)
    if p is not None:
        outside = f"outside job {outside_pid} listed as {p.get('host_view')} with {mib(p.get('used_memory_bytes'))}/{out_mib} MiB"
        if p.get("host_view") != "other-namespace":
            problems.append("outside job not marked as another namespace's")
    else:
        others = [q for q in dev.get("processes", []) if q.get("host_view") == "other-namespace"]
        un = unattributed(dev)
        outside = (f"outside job {outside_pid} ({out_mib} MiB) not listed by the driver; "
                   f"unattributed {un} MiB, other-namespace rows {len(others)}")
        if un + SLACK_MIB < out_mib:
            problems.append("outside job's memory lost")
    q = process(dev, inside_ns_pid)
    if q is None:
        inside = f"inside job (ns pid {inside_ns_pid}, host pid {inside_host_pid}) NOT matched"
        problems.append("inside job not matched to its own pid")
    else:
        inside = (f"inside job matched to ns pid {inside_ns_pid} (host {inside_host_pid}) with "
                  f"{mib(q.get('used_memory_bytes'))}/{in_mib} MiB, view {q.get('host_view')}, command {q.get('command')!r}")
        if q.get("host_view") != "visible" or q.get("used_memory_bytes") is None \
                or abs(mib(q["used_memory_bytes"]) - in_mib) > SLACK_MIB:
            problems.append("inside job's row")
    verdict = "FAIL" if problems else "ok"
    off = f"; off: {', '.join(problems)}" if problems else ""
    return f"{verdict} {rows}; {outside}; {inside}{off}"


def hidepid(once, apps_csv, job_pid):
    """Information only: what a non-root user sees of root's job when /proc hides it."""
    dev = read_json(once)["devices"][0]
    apps = smi_apps(apps_csv)
    p = process(dev, job_pid)
    if p is None:
        return f"info root's job {job_pid} ({apps.get(job_pid)} MiB) not listed; unattributed {unattributed(dev)} MiB"
    return (f"info root's job {job_pid} listed as {p.get('host_view')}, {mib(p.get('used_memory_bytes'))}/"
            f"{apps.get(job_pid)} MiB, user {p.get('user')}, command {p.get('command')!r}")


def main(argv):
    try:
        case, args = argv[1], argv[2:]
        if case == "nonroot":
            print(nonroot(args[0], args[1], args[2], int(args[3])))
        elif case == "namespace":
            print(namespace(args[0], args[1], args[2], int(args[3]), int(args[4]), int(args[5])))
        elif case == "hidepid":
            print(hidepid(args[0], args[1], int(args[2])))
        else:
            print(f"FAIL verdict.py: unknown case {case}")
    except (IndexError, ValueError, OSError, KeyError, json.JSONDecodeError) as e:
        print(f"FAIL could not judge: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main(sys.argv)
