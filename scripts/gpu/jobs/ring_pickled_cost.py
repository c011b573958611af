#!/usr/bin/env python3
"""Can the hook read PyTorch's allocator event ring without holding the GIL?

torch::cuda::_memory_snapshot_pickled() (torch/csrc/cuda/memory_snapshot.cpp) builds the
allocator snapshot as a pickle in C++; it is not bound to Python, but may be exported from
a torch shared library. Called through ctypes (which releases the GIL during the call) it
returns a std::string through a hidden pointer (x86-64 SysV); the libstdc++ cxx11 layout is
(char* data, size_t size, union{capacity; char local[16]}).

Parts (results as JSON to $OUT/ring_pickled.json, progress lines on stdout):
 0. a probe in a child process: the symbol, the ABI, one ctypes call (a crash stops here);
 1. the pickled blob against torch.cuda.memory._snapshot(); a small sample blob, gzipped;
 2. cost per entry (wall, thread CPU) of _snapshot(), the ctypes read and pickle.loads, at
    several ring sizes; the longest allocation stall another thread sees while a read runs;
    whether freeing the returned buffer keeps RSS flat;
 3. the cost to a GPT-2 training step, blocks of steps alternating off / read modes.

usage: ring_pickled_cost.py [--quick] [--blocks-per-mode 15] [--block-steps 40]
"""
import argparse
import ctypes
import gzip
import json
import os
import pickle
import random
import re
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # train_gpt2, beside this file

OUT = os.environ.get("OUT") or "/tmp/ring_pickled_out"
os.makedirs(OUT, exist_ok=True)
RESULTS = {}


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def save():
    with open(os.path.join(OUT, "ring_pickled.json"), "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)


# ---------------------------------------------------------------- finding the symbol

def find_symbol(torch):
    libdir = os.path.join(os.path.dirname(torch.__file__), "lib")
    found = []
    tool = {}
    for name in sorted(os.listdir(libdir)):
        if ".so" not in name:
            continue
        path = os.path.join(libdir, name)
        try:
            out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True,
                                 text=True, timeout=120).stdout
            tool["nm"] = True
        except (OSError, subprocess.TimeoutExpired) as e:
            tool["nm"] = repr(e)
            out = None
        if out is None:  # no nm: look for the mangled name in the file's bytes
            with open(path, "rb") as f:
                data = f.read()
            names = set(m.decode() for m in re.findall(rb"_ZN[0-9A-Za-z_]*_memory_snapshot_pickled[0-9A-Za-z_]*", data))
            found += [(path, n, "bytes") for n in sorted(names)]
            continue
        for line in out.splitlines():
            parts = line.split()
            if parts and "_memory_snapshot_pickled" in parts[-1]:
                found.append((path, parts[-1], parts[-2] if len(parts) >= 2 else "?"))
    demangled = {}
    for _, n, _ in found:
        try:
            demangled[n] = subprocess.run(["c++filt", n], capture_output=True, text=True,
                                          timeout=10).stdout.strip()
        except OSError:
            demangled[n] = None
    return found, demangled, tool


class Pickled:
    """ctypes binding of std::string torch::cuda::_memory_snapshot_pickled()."""

    def __init__(self, path, name, free=True):
        self.lib = ctypes.CDLL(path)
        self.fn = getattr(self.lib, name)
        self.fn.argtypes = [ctypes.c_void_p]
        self.fn.restype = ctypes.c_void_p
        self.libc = ctypes.CDLL(None)
        self.libc.free.argtypes = [ctypes.c_void_p]
        self.libc.free.restype = None
        self.free = free
        self.last = {}

    def __call__(self):
        buf = ctypes.create_string_buffer(64)
        w, c = time.perf_counter(), time.thread_time()
        ret = self.fn(ctypes.addressof(buf))  # the GIL is released during this
        w1, c1 = time.perf_counter(), time.thread_time()
        data = ctypes.c_void_p.from_buffer(buf, 0).value
        size = ctypes.c_size_t.from_buffer(buf, 8).value
        blob = ctypes.string_at(data, size)
        local = data == ctypes.addressof(buf) + 16
        if not local and self.free:
            self.libc.free(data)
        w2, c2 = time.perf_counter(), time.thread_time()
        self.last = {"ret_is_buf": ret == ctypes.addressof(buf), "sso": local,
                     "call_wall": w1 - w, "call_cpu": c1 - c, "copy_wall": w2 - w1,
                     "copy_cpu": c2 - c1}
        return blob


class _MI2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                              "fsmblks", "uordblks", "fordblks", "keepcost")]


def heap_in_use():
    """glibc's bytes in use (mallinfo2: uordblks + hblkhd)."""
    libc = ctypes.CDLL(None)
    fn = libc.mallinfo2
    fn.restype = _MI2
    m = fn()
    return m.uordblks + m.hblkhd


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def ring(torch, entries):
    torch.cuda.memory._record_memory_history(enabled=None)
    if entries:
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                                 max_entries=entries)


def entry_key(e):
    return (e.get("action"), e.get("addr", e.get("device_free")), e.get("size"))


def compare(snap, got):
    r = {"keys_snapshot": sorted(snap.keys()), "keys_pickled": sorted(got.keys()),
         "segments": [len(snap.get("segments", [])), len(got.get("segments", []))],
         "traces_per_device": [[len(t) for t in snap.get("device_traces", [])],
                               [len(t) for t in got.get("device_traces", [])]]}
    firsts, lasts = [], []
    for a, b in zip(snap.get("device_traces", []), got.get("device_traces", [])):
        if a or b:
            firsts.append([entry_key(a[0]) if a else None, entry_key(b[0]) if b else None])
            lasts.append([entry_key(a[-1]) if a else None, entry_key(b[-1]) if b else None])
    # Each read appends a 'snapshot' entry to the ring after copying it; align for that.
    # time_us is converted from an approximate clock at each read, so it is compared apart.
    align = []
    for a, b in zip(snap.get("device_traces", []), got.get("device_traces", [])):
        ka = [entry_key(x) + (x.get("stream"),) for x in a]
        kb = [entry_key(x) + (x.get("stream"),) for x in b]
        cands = [("identical", 0, 0, len(ka)),
                 ("snapshot marker appended by the earlier read at the end of the first", 0, 0, len(kb)),
                 ("snapshot marker appended by the earlier read at the end of the second", 0, 0, len(ka)),
                 ("shifted by one: the earlier read's snapshot marker pushed the oldest entry out", 1, 0, len(ka) - 1),
                 ("shifted by one (other way)", 0, 1, len(kb) - 1)]
        verdict = "DIFFERENT"
        for name, oa, ob, n in cands:
            if n <= 0 or oa + n > len(ka) or ob + n > len(kb):
                continue
            if ka[oa:oa + n] == kb[ob:ob + n] and (len(ka) - oa - n) + (len(kb) - ob - n) <= 1:
                dt = max(abs((a[oa + i].get("time_us") or 0) - (b[ob + i].get("time_us") or 0)) for i in range(n))
                verdict = name + "; max time_us difference %d" % dt
                break
        align.append(verdict)
    r["aligned"] = align
    r["first"] = firsts
    r["last"] = lasts
    r["same"] = (r["segments"][0] == r["segments"][1]
                 and r["traces_per_device"][0] == r["traces_per_device"][1]
                 and all(x == y for x, y in firsts) and all(x == y for x, y in lasts))
    # every entry the same (action, addr, size)?
    mism = 0
    for a, b in zip(snap.get("device_traces", []), got.get("device_traces", [])):
        mism += sum(entry_key(x) != entry_key(y) for x, y in zip(a, b))
    r["entries_differing"] = mism
    sa = snap.get("segments", [])
    sb = got.get("segments", [])
    key = lambda s: (s.get("address"), s.get("total_size"), s.get("allocated_size"))
    r["segments_same"] = sorted(map(key, sa)) == sorted(map(key, sb))
    norm = lambda segs: sorted(json.dumps(x, sort_keys=True, default=str) for x in segs)
    r["segments_equal_full"] = norm(sa) == norm(sb)
    return r


def entries_of(s):
    return sum(len(t) for t in s.get("device_traces", []))


# ---------------------------------------------------------------- part 0: the probe

def probe():
    import torch
    r = {"torch": torch.__version__, "cxx11_abi": bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", None)),
         "python": sys.version.split()[0]}
    found, demangled, tool = find_symbol(torch)
    r["found"] = found
    r["demangled"] = demangled
    r["nm"] = tool.get("nm")
    print("PROBE-PRE " + json.dumps(r), flush=True)
    if not r["cxx11_abi"]:
        print("PROBE-FAIL not the cxx11 ABI: the std::string layout assumed here is wrong", flush=True)
        sys.exit(3)
    plain = [f for f in found if f[1].startswith("_ZN5torch4cuda24_memory_snapshot_pickled") and f[1].endswith("Ev")]
    if not plain:
        print("PROBE-FAIL no exported _memory_snapshot_pickled() taking no arguments", flush=True)
        sys.exit(4)
    torch.zeros(1, device="cuda")
    ring(torch, 65536)
    keep = [torch.empty(1 << s, dtype=torch.uint8, device="cuda") for s in range(10, 20)]
    del keep
    f = Pickled(plain[0][0], plain[0][1])
    blob = f()
    r["lib"], r["symbol"] = plain[0][0], plain[0][1]
    r["bytes"] = len(blob)
    r["head"] = blob[:16].hex()
    r["call"] = f.last
    got = pickle.loads(blob)
    r["entries"] = entries_of(got)
    r["top_keys"] = sorted(got.keys())
    ring(torch, 0)
    print("PROBE-OK " + json.dumps(r, default=str), flush=True)


# ---------------------------------------------------------------- part 1

def part1(torch, f):
    ring(torch, 65536)
    rng = random.Random(1)
    live = []
    for i in range(120):
        live.append(torch.empty(rng.choice([512, 4096, 1 << 16, 1 << 20, 3 << 20]), dtype=torch.uint8, device="cuda"))
        if len(live) > 8:
            live.pop(rng.randrange(len(live)))
    torch.cuda.synchronize()
    blob = f()
    snap = torch.cuda.memory._snapshot()
    got = pickle.loads(blob)
    with gzip.open(os.path.join(OUT, "pickled_sample.pickle.gz"), "wb") as g:
        g.write(blob)
    with open(os.path.join(OUT, "snapshot_sample.pickle"), "wb") as g:  # _snapshot()'s dict, for comparison
        pickle.dump(snap, g)
    res = {"compare": compare(snap, got), "bytes": len(blob), "entries": entries_of(got)}
    tr = [e for t in got["device_traces"] for e in t]
    trs = [e for t in snap["device_traces"] for e in t]
    res["trace_entry_keys_pickled"] = sorted(tr[0].keys()) if tr else None
    res["trace_entry_keys_snapshot"] = sorted(trs[0].keys()) if trs else None
    res["trace_entry_example"] = tr[len(tr) // 2] if tr else None
    seg = got["segments"][0] if got["segments"] else {}
    segs = snap["segments"][0] if snap["segments"] else {}
    res["segment_keys_pickled"] = sorted(seg.keys())
    res["segment_keys_snapshot"] = sorted(segs.keys())
    res["block_keys_pickled"] = sorted(seg["blocks"][0].keys()) if seg.get("blocks") else None
    res["block_keys_snapshot"] = sorted(segs["blocks"][0].keys()) if segs.get("blocks") else None
    res["segment_example"] = {k: v for k, v in seg.items() if k != "blocks"}
    res["allocator_settings_pickled"] = got.get("allocator_settings")
    res["actions"] = sorted({e["action"] for e in tr})
    del live
    ring(torch, 0)
    return res


# ---------------------------------------------------------------- part 2

def fill(torch, n, rng, live):
    sizes = [512, 4096, 1 << 16, 1 << 18, 1 << 20, 3 << 20, 12 << 20]
    for _ in range(n):
        live.append(torch.empty(rng.choice(sizes), dtype=torch.uint8, device="cuda"))
        if len(live) > 32:
            live.pop(rng.randrange(len(live)))


def stall_probe(torch, box, stop):
    """Tight torch.empty loop in its own thread. Slow allocations (t0..t1 holds no bytecode
    boundary, so no GIL hand-over: the allocator lock or other C++ waits) and gaps between
    iterations (the GIL) over 50 us are kept with their times."""
    torch.cuda.set_device(0)
    slow, gaps = box["slow"], box["gaps"]
    last = time.perf_counter_ns()
    while not stop.is_set():
        t0 = time.perf_counter_ns()
        x = torch.empty(1 << 16, dtype=torch.uint8, device="cuda")
        t1 = time.perf_counter_ns()
        del x
        box["n"] += 1
        if t1 - t0 > 50_000:
            slow.append((t0, t1))
        if t0 - last > 50_000:
            gaps.append((last, t0))
        last = t1


def stall_phases(torch, f, box, phases):
    """phases: [(name, fn or None, min seconds)]; returns per phase the longest allocation
    and the longest gap overlapping it, and allocations a second."""
    res = {}
    for name, fn, secs in phases:
        n0 = box["n"]
        a = time.perf_counter_ns()
        reads = []
        if fn is None:
            time.sleep(secs)
        else:
            while len(reads) < 3 or time.perf_counter_ns() - a < secs * 1e9:
                w = time.perf_counter()
                fn()
                reads.append(time.perf_counter() - w)
        b = time.perf_counter_ns()
        n1 = box["n"]
        over = lambda lst: [(y - x) / 1000 for x, y in lst if y > a and x < b]
        sl, gp = over(box["slow"]), over(box["gaps"])
        res[name] = {"phase_s": round((b - a) / 1e9, 3), "allocs_per_s": round((n1 - n0) / ((b - a) / 1e9)),
                     "max_alloc_us": round(max(sl, default=0), 1), "allocs_over_1ms": sum(x > 1000 for x in sl),
                     "max_gap_us": round(max(gp, default=0), 1), "gaps_over_1ms": sum(x > 1000 for x in gp)}
        if reads:
            res[name]["reads"] = len(reads)
            res[name]["read_ms_max"] = round(max(reads) * 1e3, 2)
            res[name]["read_ms_mean"] = round(sum(reads) / len(reads) * 1e3, 2)
    return res


def part2(torch, f, sizes, reps):
    rng = random.Random(2)
    live = []
    out = {}
    for n in sizes:
        ring(torch, n)
        t = time.perf_counter()
        fill(torch, n, rng, live)
        torch.cuda.synchronize()
        fill_s = time.perf_counter() - t
        r = {"fill_s": round(fill_s, 2)}
        snap_w, snap_c, pk_w, pk_c, call_w, call_c, ld_w, ld_c = [], [], [], [], [], [], [], []
        for i in range(reps):
            w, c = time.perf_counter(), time.thread_time()
            s = torch.cuda.memory._snapshot()
            snap_w.append(time.perf_counter() - w)
            snap_c.append(time.thread_time() - c)
            w, c = time.perf_counter(), time.thread_time()
            blob = f()
            pk_w.append(time.perf_counter() - w)
            pk_c.append(time.thread_time() - c)
            call_w.append(f.last["call_wall"])
            call_c.append(f.last["call_cpu"])
            w, c = time.perf_counter(), time.thread_time()
            g = pickle.loads(blob)
            ld_w.append(time.perf_counter() - w)
            ld_c.append(time.thread_time() - c)
            if i == 0:
                r["compare"] = compare(s, g)
        ent = entries_of(g)
        r["entries"] = ent
        r["segments"] = len(g["segments"])
        r["bytes"] = len(blob)
        r["bytes_per_entry"] = round(len(blob) / max(ent, 1), 1)
        med = lambda v: sorted(v)[len(v) // 2]
        per = lambda v: round(med(v) / max(ent, 1) * 1e6, 4)
        r["ms"] = {"snapshot_wall": round(med(snap_w) * 1e3, 2), "snapshot_cpu": round(med(snap_c) * 1e3, 2),
                   "pickled_wall": round(med(pk_w) * 1e3, 2), "pickled_cpu": round(med(pk_c) * 1e3, 2),
                   "pickled_call_wall": round(med(call_w) * 1e3, 2),
                   "pickle_loads_wall": round(med(ld_w) * 1e3, 2), "pickle_loads_cpu": round(med(ld_c) * 1e3, 2)}
        r["us_per_entry"] = {"snapshot_wall": per(snap_w), "snapshot_cpu": per(snap_c),
                             "pickled_wall": per(pk_w), "pickled_cpu": per(pk_c),
                             "pickle_loads_wall": per(ld_w), "pickle_loads_cpu": per(ld_c)}
        del s, g, blob
        # The allocator lock: another thread allocates in a tight loop while reads run.
        box = {"n": 0, "slow": [], "gaps": []}
        stop = threading.Event()
        th = threading.Thread(target=stall_probe, args=(torch, box, stop), daemon=True)
        th.start()
        time.sleep(0.1)
        r["stall"] = stall_phases(torch, f, box, [
            ("idle", None, 0.5), ("pickled", f, 0.5), ("idle2", None, 0.3),
            ("snapshot", torch.cuda.memory._snapshot, 0.5), ("idle3", None, 0.3)])
        stop.set()
        th.join()
        out[str(n)] = r
        log("part2", n, json.dumps({k: r[k] for k in ("entries", "bytes", "us_per_entry", "stall")}))
        RESULTS["part2"] = out
        save()
    # Clearing (history off, then on) with a full 65,536 ring: time, and does it empty the ring?
    ring(torch, 65536)
    fill(torch, 40000, rng, live)
    torch.cuda.synchronize()
    w, c = time.perf_counter(), time.thread_time()
    ring(torch, 65536)
    cl = {"clear_wall_ms": round((time.perf_counter() - w) * 1e3, 3),
          "clear_cpu_ms": round((time.thread_time() - c) * 1e3, 3)}
    cl["entries_after_clear"] = entries_of(pickle.loads(f()))
    out["clear"] = cl
    # Freeing: RSS over many reads of a full ring, with free() and without.
    fill(torch, 40000, rng, live)
    torch.cuda.synchronize()
    size = len(f())
    for _ in range(3):
        f()
    r0, h0 = rss(), heap_in_use()
    for _ in range(40):
        f()
    r1, h1 = rss(), heap_in_use()
    f.free = False
    for _ in range(10):
        f()
    r2, h2 = rss(), heap_in_use()
    f.free = True
    out["leak"] = {"blob_bytes": size, "rss_delta_40_reads_with_free_MB": round((r1 - r0) / 2**20, 2),
                   "rss_delta_10_reads_without_free_MB": round((r2 - r1) / 2**20, 2),
                   "heap_in_use_delta_40_reads_with_free_MB": round((h1 - h0) / 2**20, 3),
                   "heap_in_use_delta_10_reads_without_free_MB": round((h2 - h1) / 2**20, 3),
                   "expected_leak_10_reads_MB": round(10 * size / 2**20, 2)}
    log("part2 clear/leak", json.dumps(out["clear"]), json.dumps(out["leak"]))
    del live
    ring(torch, 0)
    torch.cuda.empty_cache()
    return out


# ---------------------------------------------------------------- part 3

def spread(values):
    from hook_read_cost import spread as s
    return s(values)


class Reader(threading.Thread):
    def __init__(self, torch, f, period):
        super().__init__(daemon=True)
        self.torch, self.f, self.period = torch, f, period
        self.mode = None
        self.stop = False
        self.lock = threading.Lock()
        self.acc = {}

    def take(self):
        with self.lock:
            a, self.acc = self.acc, {}
        return a

    def add(self, **kv):
        with self.lock:
            for k, v in kv.items():
                self.acc[k] = self.acc.get(k, 0) + v

    def run(self):
        torch = self.torch
        nxt = time.perf_counter()
        while not self.stop:
            mode = self.mode
            if mode is None:
                time.sleep(0.01)
                nxt = time.perf_counter()
                continue
            now = time.perf_counter()
            if now < nxt:
                time.sleep(min(nxt - now, 0.02))
                continue
            nxt = now + self.period
            w, c = time.perf_counter(), time.thread_time()
            entries = nbytes = 0
            if mode == "pickled":
                blob = self.f()
                nbytes = len(blob)
            elif mode == "pickled_loads":
                blob = self.f()
                nbytes = len(blob)
                entries = entries_of(pickle.loads(blob))
            elif mode == "snapshot":
                entries = entries_of(torch.cuda.memory._snapshot())
            rw, rc = time.perf_counter() - w, time.thread_time() - c
            w, c = time.perf_counter(), time.thread_time()
            ring(torch, 65536)
            cw, cc = time.perf_counter() - w, time.thread_time() - c
            self.add(reads=1, entries=entries, bytes=nbytes, read_wall=rw, read_cpu=rc,
                     clear_wall=cw, clear_cpu=cc, read_wall_max=0)
            with self.lock:
                self.acc["read_wall_max"] = max(self.acc.get("read_wall_max", 0), rw)


def part3(torch, f, blocks_per_mode, block_steps, period):
    from train_gpt2 import build, train_step
    torch.manual_seed(0)
    config, model, optimizer = build(8)
    ids = torch.randint(0, config.vocab_size, (8, 384), device="cuda")
    for _ in range(15):
        train_step(model, optimizer, ids)
    ring(torch, 65536)
    for _ in range(10):
        train_step(model, optimizer, ids)
    reader = Reader(torch, f, period)
    reader.start()
    cycle = ["off", "pickled", "off", "snapshot", "off", "clear", "off", "pickled_loads"]
    order = ["off"] + cycle * blocks_per_mode + ["off"]  # the first is a warm-up
    blocks = []
    t_start = time.perf_counter()
    for bi, mode in enumerate(order):
        reader.take()
        st0 = torch.cuda.memory_stats()
        reader.mode = None if mode == "off" else mode
        began = time.perf_counter()
        times = [train_step(model, optimizer, ids)[1] for _ in range(block_steps)]
        wall = time.perf_counter() - began
        reader.mode = None
        st1 = torch.cuda.memory_stats()
        acc = reader.take()
        ev = ((st1["allocation.all.allocated"] - st0["allocation.all.allocated"])
              + 2 * (st1["allocation.all.freed"] - st0["allocation.all.freed"])
              + (st1["segment.all.allocated"] - st0["segment.all.allocated"])
              + (st1["segment.all.freed"] - st0["segment.all.freed"]))
        if bi:
            blocks.append({"mode": mode, "step_ms": 1e3 * sum(times) / len(times), "wall": wall,
                           "events_per_s": ev / wall, **acc})
        if bi % 16 == 0:
            log("part3 block", bi, "of", len(order), mode, round(1e3 * sum(times) / len(times), 3), "ms",
                json.dumps({k: round(v, 4) for k, v in acc.items()}))
    reader.stop = True
    ring(torch, 0)
    res = {"block_steps": block_steps, "blocks_per_mode": blocks_per_mode, "period_s": period,
           "wall_s": round(time.perf_counter() - t_start, 1)}
    offs = [b["step_ms"] for b in blocks if b["mode"] == "off"]
    res["off_step_ms"] = round(sum(offs) / len(offs), 3)
    res["events_per_s_from_stats"] = round(sum(b["events_per_s"] for b in blocks) / len(blocks))
    modes = {}
    for m in ("pickled", "snapshot", "clear", "pickled_loads"):
        pairs, rps, eps, bps = [], [], [], []
        tot = {}
        for i, b in enumerate(blocks):
            if b["mode"] != m or i == 0 or i + 1 >= len(blocks):
                continue
            off = (blocks[i - 1]["step_ms"] + blocks[i + 1]["step_ms"]) / 2
            pairs.append(100.0 * (b["step_ms"] - off) / off)
            rps.append(b.get("reads", 0) / b["wall"])
            eps.append(b.get("entries", 0) / b["wall"])
            bps.append(b.get("bytes", 0) / b["wall"])
            for k in ("reads", "entries", "bytes", "read_wall", "read_cpu", "clear_wall", "clear_cpu"):
                tot[k] = tot.get(k, 0) + b.get(k, 0)
            tot["read_wall_max"] = max(tot.get("read_wall_max", 0), b.get("read_wall_max", 0))
        steps = [b["step_ms"] for b in blocks if b["mode"] == m]
        n = max(tot.get("reads", 0), 1)
        d = {"step_ms": round(sum(steps) / len(steps), 3), "vs_off_pct": spread(pairs),
             "reads_per_s": round(sum(rps) / len(rps), 3),
             "entries_read_per_s": round(sum(eps) / len(eps)), "bytes_per_s": round(sum(bps) / len(bps)),
             "per_read_ms": {"read_wall": round(1e3 * tot.get("read_wall", 0) / n, 3),
                             "read_cpu": round(1e3 * tot.get("read_cpu", 0) / n, 3),
                             "read_wall_max": round(1e3 * tot.get("read_wall_max", 0), 3),
                             "clear_wall": round(1e3 * tot.get("clear_wall", 0) / n, 3),
                             "clear_cpu": round(1e3 * tot.get("clear_cpu", 0) / n, 3)},
             "entries_per_read": round(tot.get("entries", 0) / n), "bytes_per_read": round(tot.get("bytes", 0) / n),
             "pairs_pct": [round(p, 3) for p in pairs]}
        modes[m] = d
        log("part3", m, json.dumps({k: d[k] for k in ("step_ms", "vs_off_pct", "reads_per_s", "entries_read_per_s", "per_read_ms")}))
    res["modes"] = modes
    res["blocks"] = [{k: (round(v, 5) if isinstance(v, float) else v) for k, v in b.items()} for b in blocks]
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--blocks-per-mode", type=int, default=15)
    ap.add_argument("--block-steps", type=int, default=40)
    ap.add_argument("--period", type=float, default=0.35)
    ap.add_argument("--sizes", default="4096,32768,65536,200000")
    ap.add_argument("--skip3", action="store_true")
    args = ap.parse_args()
    if args.probe:
        probe()
        return
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--probe"], capture_output=True, text=True, timeout=300)
    sys.stdout.write(p.stdout[-4000:])
    sys.stdout.write(p.stderr[-3000:])
    RESULTS["probe_rc"] = p.returncode
    ok = [l for l in p.stdout.splitlines() if l.startswith("PROBE-OK ")]
    pre = [l for l in p.stdout.splitlines() if l.startswith("PROBE-PRE ")]
    if pre:
        RESULTS["probe_pre"] = json.loads(pre[0][len("PROBE-PRE "):])
    if not ok:
        RESULTS["probe_error"] = (p.stdout[-2000:] + p.stderr[-2000:])
        save()
        log("probe failed, rc", p.returncode)
        sys.exit(1)
    pr = json.loads(ok[0][len("PROBE-OK "):])
    RESULTS["probe"] = pr
    save()
    log("probe ok", round(time.perf_counter() - t0, 1), "s")
    import torch
    torch.zeros(1, device="cuda")
    # Does torch replace operator delete (then free() would be wrong)?
    libdir = os.path.join(os.path.dirname(torch.__file__), "lib")
    dl = {}
    for name in sorted(os.listdir(libdir)):
        if ".so" in name:
            try:
                out = subprocess.run(["nm", "-D", "--defined-only", os.path.join(libdir, name)],
                                     capture_output=True, text=True, timeout=60).stdout
            except OSError:
                break
            syms = [l.split()[-1] for l in out.splitlines() if re.search(r" _Zdl\S*$", l)]
            if syms:
                dl[name] = syms
    RESULTS["operator_delete_defined_in_torch_libs"] = dl
    f = Pickled(pr["lib"], pr["symbol"])
    RESULTS["part1"] = part1(torch, f)
    log("part1", json.dumps(RESULTS["part1"]["compare"]))
    save()
    sizes = [int(s) for s in args.sizes.split(",")]
    RESULTS["part2"] = part2(torch, f, sizes[:1] if args.quick else sizes, 2 if args.quick else 5)
    save()
    if args.quick or args.skip3:
        return
    RESULTS["part3"] = part3(torch, f, args.blocks_per_mode, args.block_steps, args.period)
    RESULTS["total_s"] = round(time.perf_counter() - t0, 1)
    save()
    log("done", RESULTS["total_s"], "s")


if __name__ == "__main__":
    main()
