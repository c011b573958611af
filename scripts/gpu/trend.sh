#!/usr/bin/env bash
# Memory per process over time, both series in one run, for DURATION seconds (default
# 200), while four hooked jobs run side by side on one GPU: a GPT-2 loop, a ResNet-50 loop,
# two DDP ranks (gloo, both on GPU 0) and a job that leaks 8 MiB/s from its 60th second.
#   $OUT/attach.jsonl  PyTorch's allocated bytes per hooked process, as `vramtop attach
#                      --json` reads them from the hook every second (the leak flag of an
#                      attached job reads this: its allocated floor per window);
#   $OUT/driver.jsonl  NVML's figure per pid by nvidia-smi, on the same clock ({"t":
#                      seconds since the start, "unix": time, "used": {pid: bytes}}): what
#                      the process table's trend reads;
#   $OUT/jobs.json     pid -> job, and the leak's onset;
#   $OUT/screen-*.txt  the live view at 180 s and at the end, in a 200x60 tmux.
# (tests/fixtures/allocated_series.json and process_series.json hold such series; the
# latter was made by the script this one replaced, with the jobs not hooked and `t` in
# unix time.)
# usage: scripts/gpu/trend.sh PATH/TO/vramtop [DURATION]
set -uo pipefail
. "$(dirname "$0")/lib.sh"
export VT_TMUX_SERVER
BIN=$(readlink -f "${1:?usage: trend.sh PATH/TO/vramtop [DURATION]}")
DURATION=${2:-200}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
JOBS=$REPO/scripts/gpu/jobs
OUT=${OUT:-$PWD/gpu-trend-out}
mkdir -p "$OUT"
W=$(mktemp -d)
export VRAMTOP_SOCKET_DIR=$W/sock PYTHONPATH=$REPO/python/vramtop/_hook${PYTHONPATH:+:$PYTHONPATH}
python3 "$JOBS/train_gpt2.py" --steps 1000000 --hold 0 > "$W/gpt2.log" 2>&1 & GPT2=$!
python3 "$JOBS/trend_jobs.py" resnet > "$W/resnet.log" 2>&1 & RESNET=$!
MASTER_PORT=29518 python3 -m torch.distributed.run --nproc-per-node 2 "$JOBS/trend_jobs.py" ddp > "$W/ddp.log" 2>&1 & DDP=$!
python3 "$JOBS/trend_jobs.py" leak --onset 60 > "$W/leak.log" 2>&1 & LEAK=$!
vt_tmux new-session -d -s trend -x 200 -y 60 "VRAMTOP_SOCKET_DIR=$W/sock $BIN --interval 1"
"$BIN" attach --json --interval 1 --seconds "$DURATION" > "$OUT/attach.jsonl" 2> "$OUT/attach.err" &
ATTACH=$!
# The driver's figure per process on the same clock (seconds since the attach began).
python3 - "$DURATION" "$OUT/driver.jsonl" <<'PY' &
import json, subprocess, sys, time
duration, path = float(sys.argv[1]), sys.argv[2]
start = time.time()
with open(path, "w") as out:
    while time.time() - start < duration:
        tick = time.time()
        rows = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
        used = {}
        for row in rows.splitlines():
            try:
                pid, mib = (int(x) for x in row.split(","))
            except ValueError:
                continue
            used[pid] = mib * 1024 * 1024
        out.write(json.dumps({"t": tick - start, "unix": tick, "used": used}) + "\n")
        out.flush()
        time.sleep(max(0.0, 1.0 - (time.time() - tick)))
PY
sleep 180; vt_tmux capture-pane -p -t trend > "$OUT/screen-180s.txt"
wait "$ATTACH"
vt_tmux capture-pane -p -t trend > "$OUT/screen-end.txt"
vt_tmux_end
ranks=$(pgrep -P "$DDP" -d ' ' || true)
python3 - "$OUT/jobs.json" "$GPT2" "$RESNET" "$LEAK" "$W/leak.log" $ranks <<'PY'
import json, sys
path, gpt2, resnet, leak, leak_log = sys.argv[1:6]
ranks = sys.argv[6:]
onset = next((float(l.split()[2]) for l in open(leak_log) if l.startswith("leak onset")), None)
jobs = {gpt2: "gpt2", resnet: "resnet", leak: "leak"}
jobs.update({r: "ddp-rank" for r in ranks})
json.dump({"jobs": jobs, "leak_onset": onset}, open(path, "w"))
print(json.dumps({"jobs": jobs, "leak_onset": onset}))
PY
kill "$GPT2" "$RESNET" "$LEAK" 2>/dev/null; kill -- "$DDP" 2>/dev/null; pkill -P "$DDP" 2>/dev/null
sleep 2
tail -n 3 "$W/resnet.log" "$W/ddp.log" "$W/leak.log" "$W/gpt2.log" | cut -c1-200 > "$OUT/job-tails.txt"
rm -rf "$W"
