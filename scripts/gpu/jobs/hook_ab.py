#!/usr/bin/env python3
"""What vramtop's hook costs a training job while a viewer watches it ("cost you can
prove"), measured inside one process so that the drift between processes (5 to 22 % on
the H100) drops out, as history_ab.py does for history.

Run it UNDER the hook: `vramtop run -- python3 hook_ab.py` (stdout not a terminal: the job
passes straight through), or with the hook's directory first on PYTHONPATH
(`PYTHONPATH=$(vramtop hook-path) python3 hook_ab.py`, as overhead.py does), or with
--hook-dir DIR to start it by hand. The script then plays the viewer of its OWN process:
a background thread connects to the hook's socket (vramtop-<pid>.sock in the hook's
socket directory), speaks protocol v1 and drains every frame as it comes.

Blocks of GPT-2 training steps (train_gpt2.build(8), ids (8, 384), as history_ab.py)
alternate: off (no viewer connected), on (a viewer connected and subscribed at 1 s or at
0.1 s). Each on block is flanked by off blocks (off, 1 s, off, 0.1 s, off, 0.1 s, off,
1 s, ...: the on conditions in ABBA order), and is compared with the mean of its two
neighbours, so a slow drift of the GPU's pace cancels. Warm-up blocks (--warmup-blocks,
the hook's first read included) are left out. A block is timed by the wall clock between
two torch.cuda.synchronize(), so a read that lands between steps is counted too.

A viewer connects at the start of its block and subscribes; the hook answers a subscribe
with a state at once, so a block of T seconds at 1 s gets ceil(T) reads where a long
watch gets T: short blocks overstate the cost at 1 s (the figures are an upper bound).
--block-seconds sets the length (default 4 s, steps counted from the warm-up's pace).

The viewer thread does next to nothing with a frame: it reads the length, counts a state
by its first bytes and takes `collect_ms` (the hook's wall time per read) off its tail,
without parsing the JSON: a real viewer is another process, and the thread's own work
would otherwise be charged to the hook. --viewer process puts the same viewer in a child
process instead, for comparison.

Prints one JSON line: per-step mean of each condition (ms), the difference of 1 s and
0.1 s from off in % (from the condition means, and from the per-pair differences with
their std and 95 % interval), frames received per condition, the hook's time per frame
(collect_ms) and its thread's CPU time (/proc/self/task/TID/stat), and whether the goals
(<= 0.5 % at 1 s, <= 2 % at 0.1 s) are met (by the mean) and proven (by the interval's
upper end).

--selftest: a CPU check of the plumbing (stub torch, a sleeping "step"), no GPU.
usage: hook_ab.py [--blocks 16] [--block-seconds 4 | --block-steps N] [--warmup-blocks 2]
                  [--viewer thread|process] [--hook-dir DIR] [--selftest]
"""

import argparse
import json
import math
import os
import queue
import re
import select
import socket
import struct
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
try:  # viewer.py, beside this file: the protocol's frame limit
    sys.path.insert(0, HERE)
    from viewer import MAX_FRAME
except Exception:  # pragma: no cover - viewer.py missing
    MAX_FRAME = 16 * 1024 * 1024

CONDITIONS = {"1s": 1.0, "0.1s": 0.1}
GOALS_PCT = {"1s": 0.5, "0.1s": 2.0}
STATE_PREFIX = b'{"type":"state"'
COLLECT_MS = re.compile(rb'"collect_ms":(-?[0-9][0-9.eE+-]*)')
# 97.5 % quantiles of Student's t by degrees of freedom, for the 95 % intervals.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042, 60: 2.000}


def t975(df):
    if df < 1:
        return None
    return T975[max(k for k in T975 if k <= df)] if df <= 60 else 1.96


def frame(message):
    body = json.dumps(message).encode("utf-8")
    return struct.pack(">I", len(body)) + body


# ----- the viewer ------------------------------------------------------------------------


class Viewer:
    """A protocol-v1 viewer on a thread of its own, told by `subscribe` / `off` / `close`
    (each waits for the thread's answer). While off it holds no connection: the hook has
    no viewer. Counts of the connection just closed come back from `off`."""

    def __init__(self, path):
        self.path = path
        self.commands = queue.Queue()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        self.sock = None
        self.buffer = bytearray()
        self.counts = None
        self.thread = threading.Thread(target=self._loop, name="hook_ab-viewer", daemon=True)
        self.thread.start()

    # the job's side
    def _call(self, *command):
        done, box = threading.Event(), {}
        self.commands.put((command, done, box))
        os.write(self.wake_w, b"x")
        if not done.wait(30.0):
            return {"error": "the viewer thread did not answer %r" % (command[0],)}
        return box.get("result")

    def subscribe(self, interval):
        return self._call("subscribe", interval)

    def off(self):
        return self._call("off")

    def peek(self):
        return self._call("peek")

    def close(self):
        return self._call("close")

    # the thread's side
    def _loop(self):
        while True:
            watched = [self.wake_r] + ([self.sock] if self.sock is not None else [])
            try:
                ready, _, _ = select.select(watched, [], [])
            except (OSError, ValueError):
                ready = [self.wake_r]
            if self.sock is not None and self.sock in ready:
                self._receive()
            if self.wake_r in ready:
                try:
                    while os.read(self.wake_r, 512):
                        pass
                except (BlockingIOError, OSError):
                    pass
                while True:
                    try:
                        command, done, box = self.commands.get_nowait()
                    except queue.Empty:
                        break
                    try:
                        box["result"] = self._do(command)
                    except Exception as err:  # answer, never leave the caller waiting
                        box["result"] = {"error": repr(err)}
                    done.set()
                    if command[0] == "close":
                        return

    def _do(self, command):
        name = command[0]
        if name == "subscribe":
            if self.sock is None:
                self._connect()
            self.sock.sendall(frame({"type": "subscribe", "interval_s": command[1]}))
            return {"ok": True}
        if name == "peek":
            return dict(self.counts or {})
        if name in ("off", "close"):
            counts = self.counts
            self._disconnect()
            return counts
        raise ValueError("unknown command %r" % (name,))

    def _connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(5.0)
        sock.connect(self.path)
        sock.setblocking(False)
        self.sock = sock
        self.buffer = bytearray()
        self.counts = {"states": 0, "collect_ms": [], "bytes": 0, "other": {}, "hello_pid": None,
                       "connected_at": time.monotonic(), "closed_by_hook": False}

    def _disconnect(self):
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        self.sock = None
        self.counts = None

    def _receive(self):
        try:
            data = self.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.counts["closed_by_hook"] = True
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None
            return
        self.counts["bytes"] += len(data)
        buffer = self.buffer
        buffer += data
        start = 0
        while len(buffer) - start >= 4:
            (length,) = struct.unpack_from(">I", buffer, start)
            if length > MAX_FRAME:
                self.counts["other"]["bad_frame"] = length
                self.buffer = bytearray()
                return
            end = start + 4 + length
            if len(buffer) < end:
                break
            body = start + 4
            if buffer[body:body + len(STATE_PREFIX)] == STATE_PREFIX:
                self.counts["states"] += 1
                match = COLLECT_MS.search(buffer, max(body, end - 256), end)
                if match:
                    self.counts["collect_ms"].append(float(match.group(1)))
            else:  # hello, oom, error, bye: small, parsed in full
                try:
                    message = json.loads(bytes(buffer[body:end]).decode("utf-8"))
                    kind = message.get("type")
                except ValueError:
                    message, kind = {}, "unparsed"
                self.counts["other"][kind] = self.counts["other"].get(kind, 0) + 1
                if kind == "hello":
                    self.counts["hello_pid"] = message.get("pid")
            start = end
        del buffer[:start]


class ProcessViewer:
    """The same viewer in a child process (`hook_ab.py --viewer-child PATH`), driven over
    its stdin/stdout one JSON line per command."""

    def __init__(self, path):
        env = dict(os.environ, VRAMTOP_HOOK="0")
        self.child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--viewer-child", path],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def _call(self, *command):
        try:
            self.child.stdin.write(json.dumps(list(command)) + "\n")
            self.child.stdin.flush()
            line = self.child.stdout.readline()
            return json.loads(line) if line.strip() else {"error": "the viewer child said nothing"}
        except (OSError, ValueError) as err:
            return {"error": repr(err)}

    def subscribe(self, interval):
        return self._call("subscribe", interval)

    def off(self):
        return self._call("off")

    def peek(self):
        return self._call("peek")

    def close(self):
        result = self._call("close")
        try:
            self.child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.child.kill()
        return result


def viewer_child(path):
    viewer = Viewer(path)
    for line in sys.stdin:
        command = json.loads(line)
        result = viewer._call(*command)
        print(json.dumps(result), flush=True)
        if command[0] == "close":
            break
    return 0


# ----- the hook --------------------------------------------------------------------------


def find_hook(hook_dir):
    """The hook module serving this process: the one the bootstrap started, else one
    started here from `hook_dir`; None when there is none."""
    module = sys.modules.get("vramtop_hook")
    if module is None and hook_dir:
        sys.path.insert(0, hook_dir)
        import vramtop_hook as module

        module.start()
    return module


def hook_socket(module, wait_s):
    """The path the hook of this process listens on, once it does; None after wait_s."""
    deadline = time.monotonic() + wait_s
    fallback = None
    sockets = getattr(module, "sockets", None)
    if sockets is not None:
        fallback = os.path.join(sockets.socket_dir(), "vramtop-%d.sock" % os.getpid())
    while time.monotonic() < deadline:
        hook = getattr(getattr(module, "running", None), "hook", None)
        path = getattr(hook, "path", None) or fallback
        if path and os.path.exists(path) and (hook is None or getattr(hook, "path", None)):
            return path
        time.sleep(0.05)
    return None


def hook_viewers(module):
    """How many viewers the hook has now (None if it does not say)."""
    hook = getattr(getattr(module, "running", None), "hook", None)
    viewers = getattr(hook, "viewers", None)
    return len(viewers) if isinstance(viewers, list) else None


def settle(module, wait_s=1.0):
    """Viewers the hook still has, once it has seen ours go (at most wait_s): an off block
    starts with no viewer of ours; any left are another program's (vramtop's live view)."""
    deadline = time.monotonic() + wait_s
    count = hook_viewers(module)
    while count and time.monotonic() < deadline:
        time.sleep(0.005)
        count = hook_viewers(module)
    return count


def hook_thread_ticks():
    """CPU ticks (user + system) of the hook's thread so far, from /proc; None if unknown."""
    for thread in threading.enumerate():
        if thread.name == "vramtop-hook" and getattr(thread, "native_id", None):
            try:
                with open("/proc/self/task/%d/stat" % thread.native_id) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                return int(fields[11]) + int(fields[12])  # stat fields 14 and 15
            except (OSError, IndexError, ValueError):
                return None
    return None


# ----- the job ---------------------------------------------------------------------------


def gpu_job():
    import torch

    from train_gpt2 import build, train_step  # the overhead check's own loop, beside this file

    torch.manual_seed(0)
    config, model, optimizer = build(8)
    ids = torch.randint(0, config.vocab_size, (8, 384), device="cuda")

    def step():
        return train_step(model, optimizer, ids)[1]

    return step, torch.cuda.synchronize


def selftest_job():
    """CPU only: the stub torch of tests/hook (CUDA "initialised" by hand, a few blocks
    held), and a step that sleeps 5 ms."""
    import torch

    torch.cuda.init()
    for n, size in enumerate((1 << 20, 2 << 20, 512 << 10)):
        torch.cuda.stub_alloc("block%d" % n, size)

    def step():
        began = time.perf_counter()
        time.sleep(0.005)
        return time.perf_counter() - began

    return step, lambda: None


def schedule(blocks):
    """Off at even blocks; on at odd ones, 1 s and 0.1 s in ABBA order."""
    order = []
    for b in range(blocks):
        if b % 2 == 0:
            order.append("off")
        else:
            order.append("1s" if (b // 2) % 4 in (0, 3) else "0.1s")
    return order


def mean(values):
    return sum(values) / len(values) if values else None


def spread(values):
    """n, mean, sample std and the 95 % interval of the mean."""
    n = len(values)
    if n == 0:
        return {"n": 0}
    m = mean(values)
    std = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1)) if n > 1 else None
    t = t975(n - 1)
    half = t * std / math.sqrt(n) if std is not None and t else None
    return {"n": n, "mean": round(m, 3), "std": round(std, 3) if std is not None else None,
            "ci95": [round(m - half, 3), round(m + half, 3)] if half is not None else None}


def main():
    parser = argparse.ArgumentParser(description="The hook's in-process cost with a viewer at 1 s and 0.1 s.")
    parser.add_argument("--blocks", type=int, default=16, help="measured blocks (off and on alternate)")
    parser.add_argument("--block-seconds", type=float, default=4.0, help="length of a block")
    parser.add_argument("--block-steps", type=int, default=0, help="steps per block (overrides --block-seconds)")
    parser.add_argument("--warmup-steps", type=int, default=20)
    parser.add_argument("--warmup-blocks", type=int, default=2, help="blocks left out: 0.1 s, then off")
    parser.add_argument("--viewer", choices=("thread", "process"), default="thread")
    parser.add_argument("--hook-dir", default=None, help="start the hook from here if the bootstrap did not")
    parser.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the hook's socket")
    parser.add_argument("--selftest", action="store_true", help="CPU plumbing check with the stub torch")
    parser.add_argument("--viewer-child", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.viewer_child:
        return viewer_child(args.viewer_child)
    if args.blocks < 2:
        parser.error("--blocks must be at least 2")

    step, sync = selftest_job() if args.selftest else gpu_job()
    module = find_hook(args.hook_dir)
    if module is None:
        print(json.dumps({"error": "no vramtop hook in this process: run under `vramtop run`, with the hook "
                                   "first on PYTHONPATH, or pass --hook-dir"}), flush=True)
        return 2
    path = hook_socket(module, args.wait)
    if path is None:
        print(json.dumps({"error": "the hook's socket did not appear in %.0f s" % args.wait}), flush=True)
        return 2
    viewer = ProcessViewer(path) if args.viewer == "process" else Viewer(path)
    interval = {"off": None}
    interval.update(CONDITIONS)

    warm = [step() for _ in range(args.warmup_steps)]
    pace = mean(warm[len(warm) // 2:]) or 0.03
    steps = args.block_steps or max(5, int(round(args.block_seconds / pace)))
    tick_s = 1.0 / os.sysconf("SC_CLK_TCK")

    def run_block(condition):
        others = settle(module)  # viewers not ours, before ours connects
        answer = None
        if interval[condition] is not None:
            answer = viewer.subscribe(interval[condition])
        ticks0 = hook_thread_ticks()
        sync()
        began = time.perf_counter()
        step_sum = 0.0
        for _ in range(steps):
            step_sum += step()
        sync()
        wall = time.perf_counter() - began
        ticks1 = hook_thread_ticks()
        counts = viewer.off() if interval[condition] is not None else None
        if isinstance(counts, dict) and "connected_at" in counts:
            counts.pop("connected_at")
        return {"condition": condition, "steps": steps, "wall_s": wall,
                "per_step_ms": 1000.0 * wall / steps, "timed_step_ms": 1000.0 * step_sum / steps,
                "hook_cpu_s": (ticks1 - ticks0) * tick_s if ticks0 is not None and ticks1 is not None else None,
                "other_viewers": others, "subscribe": answer, "counts": counts}

    # Warm-up blocks: the hook's first read (the slowest) and the viewer's first connect.
    warmup = [run_block(c) for c in (["0.1s", "off"] * args.warmup_blocks)[:args.warmup_blocks]]
    first_states = sum((b["counts"] or {}).get("states", 0) for b in warmup)
    order = schedule(args.blocks)
    blocks = [run_block(c) for c in order]
    viewer.close()

    report = {"pid": os.getpid(), "socket": path, "viewer": args.viewer, "selftest": args.selftest,
              "steps_per_block": steps, "blocks": len(blocks), "warmup_blocks": len(warmup),
              "warmup_states": first_states, "order": order}
    by = {c: [b for b in blocks if b["condition"] == c] for c in ("off",) + tuple(CONDITIONS)}
    per_step = {c: mean([b["per_step_ms"] for b in bs]) for c, bs in by.items()}
    report["per_step_ms"] = {c: round(v, 4) if v is not None else None for c, v in per_step.items()}
    report["timed_step_ms"] = {c: round(mean([b["timed_step_ms"] for b in bs]), 4) if bs else None
                               for c, bs in by.items()}
    report["block_per_step_ms"] = {c: [round(b["per_step_ms"], 3) for b in bs] for c, bs in by.items()}
    off_states = sum(((b["counts"] or {}).get("states", 0)) for b in by["off"])
    report["off_blocks_with_other_viewers"] = sum(1 for b in by["off"] if b["other_viewers"])
    report["frames"] = {"off": off_states}
    conditions = {}
    for c in CONDITIONS:
        pairs = []
        for i, b in enumerate(blocks):
            if b["condition"] != c:
                continue
            near = [blocks[j]["per_step_ms"] for j in (i - 1, i + 1)
                    if 0 <= j < len(blocks) and blocks[j]["condition"] == "off"]
            if near:
                pairs.append(100.0 * (b["per_step_ms"] / mean(near) - 1.0))
        counts = [b["counts"] or {} for b in by[c]]
        states = sum(k.get("states", 0) for k in counts)
        collect = [ms for k in counts for ms in k.get("collect_ms", [])]
        wall = sum(b["wall_s"] for b in by[c])
        cpu = [b["hook_cpu_s"] for b in by[c] if b["hook_cpu_s"] is not None]
        off_cpu = [b["hook_cpu_s"] for b in by["off"] if b["hook_cpu_s"] is not None]
        off_wall = sum(b["wall_s"] for b in by["off"])
        diff = 100.0 * (per_step[c] / per_step["off"] - 1.0) if per_step[c] and per_step["off"] else None
        pair = spread(pairs)
        entry = {
            "diff_pct": round(diff, 3) if diff is not None else None,
            "pairs_pct": [round(p, 3) for p in pairs],
            "pair_diff": pair,
            "states": states,
            "states_per_s": round(states / wall, 3) if wall else None,
            "bytes": sum(k.get("bytes", 0) for k in counts),
            "hello_pids_ok": all(k.get("hello_pid") == os.getpid() for k in counts) if counts else None,
            "dropped_by_hook": sum(1 for k in counts if k.get("closed_by_hook")),
            "errors": [b["subscribe"] for b in by[c] if isinstance(b["subscribe"], dict) and "error" in b["subscribe"]],
            "collect_ms": {"n": len(collect), "mean": round(mean(collect), 3) if collect else None,
                           "median": sorted(collect)[len(collect) // 2] if collect else None,
                           "max": max(collect) if collect else None},
            # The hook's own time as a share of the job's: its reads' wall time per second
            # of blocks, and its thread's CPU time per second (less the off blocks' idle).
            "collect_share_pct": round(100.0 * sum(collect) / 1000.0 / wall, 3) if wall and collect else None,
            "hook_cpu_pct": round(100.0 * (sum(cpu) / wall - (sum(off_cpu) / off_wall if off_wall and off_cpu else 0.0)), 3)
            if cpu and wall else None,
            "goal_pct": GOALS_PCT[c],
            "goal_met": diff is not None and diff <= GOALS_PCT[c],
            "goal_proven": bool(pair.get("ci95")) and pair["ci95"][1] <= GOALS_PCT[c],
        }
        conditions[c] = entry
        report["frames"][c] = states
    report["conditions"] = conditions
    report["viewer_received"] = all(conditions[c]["states"] > 0 for c in CONDITIONS) and off_states == 0
    report["goals_met"] = all(conditions[c]["goal_met"] for c in CONDITIONS)
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
