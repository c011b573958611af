"""A kept OOM file (hook 1.5 format) with a long synthetic history in pieces, to time
vramtop's replay of a full history on this machine. Not PyTorch's numbers: a loop of
STEPS steps, each allocating TENSORS tensors of varying sizes in fixed slots and freeing
them, with WEIGHTS tensors live throughout, a checkpoint every EVERY steps.

    python3 scripts/make_long_history.py STEPS TENSORS WEIGHTS EVERY OUT.pickle
    (the README's 32 MiB figure: 6300 300 50 200), then: vramtop replay --report OUT.pickle
"""
import pickle, random, sys, zlib

STEPS, TENSORS, WEIGHTS, EVERY = (int(a) for a in sys.argv[1:5])
OUT = sys.argv[5]
random.seed(7)
MiB = 1 << 20
BASE = 0x7F0000000000
SEG = 40 << 30
SLOT = 16 * MiB
w_addr = [BASE + i * SLOT for i in range(WEIGHTS)]
t_addr = [BASE + (WEIGHTS + j) * SLOT for j in range(TENSORS)]

def ev(action, addr, size):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": 0, "frames": []}

def state():
    blocks = [{"address": a, "size": SLOT, "requested_size": SLOT, "state": "active_allocated", "frames": []} for a in w_addr]
    used = WEIGHTS * SLOT
    blocks.append({"address": BASE + used, "size": SEG - used, "requested_size": 0, "state": "inactive", "frames": []})
    allocated = WEIGHTS * SLOT
    return [{"device": 0, "address": BASE, "total_size": SEG, "allocated_size": allocated,
             "active_size": allocated, "requested_size": allocated, "stream": 0,
             "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
             "frames": [], "blocks": blocks}]

def snap(segments, trace):
    return {"segments": segments, "device_traces": [trace],
            "allocator_settings": {}}

def step_events():
    out = []
    sizes = [random.randint(1, SLOT // 512) * 512 for _ in range(TENSORS)]
    for a, s in zip(t_addr, sizes):
        out.append(ev("alloc", a, s))
    for a, s in zip(t_addr, sizes):
        out.append(ev("free_requested", a, s))
        out.append(ev("free_completed", a, s))
    return out

pieces = []
first = [ev("segment_alloc", BASE, SEG)] + [ev("alloc", a, SLOT) for a in w_addr]
ring = first
entries = 0
for i in range(STEPS):
    ring += step_events()
    if (i + 1) % EVERY == 0:
        entries += len(ring)
        pieces.append({"kind": "events", "zlib": zlib.compress(pickle.dumps(snap(state(), ring), 4), 1)})
        pieces.append({"kind": "state", "zlib": zlib.compress(pickle.dumps(snap(state(), []), 4), 1)})
        ring = [ev("snapshot", 0, WEIGHTS * SLOT)]
after = ring + step_events()[:TENSORS] + [ev("oom", 0, 35 << 30)]
after[-1].pop("stream")
f = snap(state(), after)
f["vramtop_oom"] = {
    "number": 1, "pid": 4242, "time_s": 1795321079.0, "device": 0,
    "requested_bytes": 35 << 30, "device_free_bytes": 0, "device_total_bytes": 40 << 30,
    "ring": {"complete": True},
    "checkpoint": {"time_s": 1795321078.5, "skip": 0, "segments": state()},
    "history": {"version": 1, "from_start": True, "pieces": pieces},
}
data = pickle.dumps(f, 4)
open(OUT, "wb").write(data)
packed = sum(len(p["zlib"]) for p in pieces)
print(f"{entries} history entries in {len(pieces)} pieces, {packed / MiB:.1f} MiB compressed; file {len(data) / MiB:.1f} MiB")
