#!/usr/bin/env python3
"""A minimal vramtop viewer (protocol v1, stdlib only) for the GPU checks: connects to a
hooked job's socket, subscribes at an interval, and prints one JSON summary line at the
job's `bye` (or EOF / timeout): states counted, the last state's figures, collect cost,
OOMs, errors, and with history the bytes held per allocation site over time.

usage: viewer.py (--socket PATH | --dir DIR [--pid PID]) [--interval 1] [--timeout 300]
  With --dir alone it takes the first job socket that appears there.
"""

import argparse
import json
import os
import socket
import struct
import sys
import time

MAX_FRAME = 16 * 1024 * 1024


def read_frames(sock):
    buffer = b""
    while True:
        chunk = sock.recv(1 << 20)
        if not chunk:
            return
        buffer += chunk
        while len(buffer) >= 4:
            (length,) = struct.unpack(">I", buffer[:4])
            if length > MAX_FRAME:
                raise ValueError("frame of %d bytes" % length)
            if len(buffer) < 4 + length:
                break
            body, buffer = buffer[4 : 4 + length], buffer[4 + length :]
            yield json.loads(body.decode("utf-8"))


def wait_for_socket(path, wait_s, directory=None):
    """Connect to `path`, or to the first job socket that appears in `directory`."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if directory is not None:
            found = sorted(n for n in os.listdir(directory) if n.startswith("vramtop-") and n.endswith(".sock"))
            path = os.path.join(directory, found[0]) if found else None
        if path and os.path.exists(path):
            try:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(path)
                return sock
            except OSError:
                sock.close()
        time.sleep(0.05)
    raise SystemExit("viewer: no socket at %s after %.0f s" % (path or directory, wait_s))


def site_bytes(state):
    held = {}
    for segment in state.get("segments", []):
        for block in segment.get("blocks", []):
            if block.get("state") == "active_allocated" and block.get("site"):
                held[block["site"]] = held.get(block["site"], 0) + block["size"]
    return held


def summarise(messages, interval):
    summary = {"states": 0, "hellos": [], "ooms": [], "errors": [], "bye": None, "collect_ms": [],
               "history_shares": []}
    series = []  # (seq, {site: bytes})
    last = None
    for message in messages:
        kind = message.get("type")
        if kind == "hello":
            summary["hellos"].append({k: message.get(k) for k in ("pid", "torch_version", "cuda_ready", "history", "capabilities", "missing")})
        elif kind == "state":
            summary["states"] += 1
            last = message
            summary["collect_ms"].append(message.get("collect_ms"))
            # Each state's share of the last second's allocations whose stacks were kept:
            # the last state alone is read while the job idles, when the share is back at 1.
            if message.get("history_share") is not None:
                summary["history_shares"].append(message["history_share"])
            if any(b.get("site") for s in message["segments"] for b in s["blocks"]):
                series.append((message["seq"], site_bytes(message)))
        elif kind == "oom":
            summary["ooms"].append({
                "requested_bytes": message["requested_bytes"],
                "device_free_bytes": message.get("device_free_bytes"),
                "device_total_bytes": message.get("device_total_bytes"),
                "stats": message["stats"],
                "segments": len(message["segments"]),
                "segments_total": sum(s["total_size"] for s in message["segments"]),
                "free_runs": free_runs(message["segments"]),
                "summary": message.get("summary"),
            })
        elif kind == "error":
            summary["errors"].append({"kind": message.get("kind"), "message": message.get("message")})
        elif kind == "bye":
            summary["bye"] = message
            break
    if last is not None:
        summary["last_state"] = {
            "seq": last["seq"],
            "device": last["device"],
            "stats": last["stats"],
            "settings": last["settings"],
            "segments": len(last["segments"]),
            "blocks": sum(len(s["blocks"]) for s in last["segments"]),
            "segments_total": sum(s["total_size"] for s in last["segments"]),
            "allocated_in_blocks": sum(b["size"] for s in last["segments"] for b in s["blocks"] if b["state"] == "active_allocated"),
            "truncated": last["truncated"],
            "history_share": last.get("history_share"),
        }
    costs = sorted(c for c in summary.pop("collect_ms") if isinstance(c, (int, float)))
    if costs:
        summary["collect_ms_median"] = costs[len(costs) // 2]
        summary["collect_ms_max"] = costs[-1]
    if series:
        top = sorted(series[-1][1].items(), key=lambda kv: -kv[1])[:5]
        summary["sites"] = [{"site": site, "bytes_by_state": [held.get(site, 0) for _, held in series]} for site, _ in top]
    return summary


def free_runs(segments):
    """Free bytes, the number of free runs and the largest, as the block map would count them."""
    runs, total, largest = 0, 0, 0
    for segment in segments:
        run = 0
        for block in segment["blocks"] + [None]:
            if block is not None and block["state"] == "inactive":
                run += block["size"]
                continue
            if run:
                runs, total, largest = runs + 1, total + run, max(largest, run)
            run = 0
    return {"free_bytes": total, "runs": runs, "largest": largest}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket")
    parser.add_argument("--dir")
    parser.add_argument("--pid", type=int)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--wait", type=float, default=120.0)
    args = parser.parse_args()
    if args.socket or args.pid:
        sock = wait_for_socket(args.socket or os.path.join(args.dir, "vramtop-%d.sock" % args.pid), args.wait)
    else:
        sock = wait_for_socket(None, args.wait, directory=args.dir)
    sock.settimeout(args.timeout)
    body = json.dumps({"type": "subscribe", "interval_s": args.interval}).encode()
    sock.sendall(struct.pack(">I", len(body)) + body)
    try:
        summary = summarise(read_frames(sock), args.interval)
    except (OSError, ValueError) as err:
        summary = {"viewer_error": repr(err)}
    print(json.dumps(summary))


if __name__ == "__main__":
    sys.exit(main())
