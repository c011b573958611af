#!/usr/bin/env bash
# The hook's event ring in real PyTorch jobs (hook 1.2), three checks in one go:
#  1. a GPT-2 loop under `vramtop run --history` with a viewer: the ring fills in its first
#     steps and is turned off with stacks still recorded (the path that once crashed
#     PyTorch 2.11 with SIGSEGV when the ring was shrunk in place); the job must end 0;
#  2. a small ring (VRAMTOP_RING=8) that wraps before it is turned off, history on, with
#     the job's own _record_memory_history call afterwards: the job must end 0;
#  3. the capped checkerboard (whatif_ab.py checker): its OOM replayed from the whole
#     history, live (`attach --json`: history_events) and after the job.
# usage: scripts/gpu/ring.sh PATH/TO/vramtop   (logs under $OUT, default ./gpu-ring-out)
set -uo pipefail
. "$(dirname "$0")/lib.sh"
BIN=$(readlink -f "${1:?usage: ring.sh PATH/TO/vramtop}")
REPO=$(cd "$(dirname "$0")/../.." && pwd)
JOBS=$REPO/scripts/gpu/jobs
OUT=${OUT:-$PWD/gpu-ring-out}
mkdir -p "$OUT"
: > "$OUT/summary.txt"
W=$(mktemp -d)
export VRAMTOP_SOCKET_DIR=$W/sock VRAMTOP_OOM_DIR=$W
: "${VT_ROWS:=$OUT/rows.txt}"
: > "$VT_ROWS"
passed() { if [ "$1" = 0 ]; then echo ok; else echo FAIL; fi; }

"$BIN" attach --json --interval 0.2 --seconds 120 --until-ended > "$OUT/gpt2-attach.jsonl" 2>/dev/null &
A=$!
sleep 0.5
"$BIN" run --history -- python3 "$JOBS/train_gpt2.py" --steps 60 --hold 1 > "$OUT/gpt2.log" 2>&1
rc=$?; wait "$A"
states=$(grep -c '"states"' "$OUT/gpt2-attach.jsonl")
vt_row "gpt2 --history, ring turned off mid-run" "$(passed "$rc")" "rc $rc (want 0), $states attach lines" | tee -a "$OUT/summary.txt"

cat > "$W/small.py" <<'PY'
import torch
xs = []
for i in range(40):
    xs.append(torch.empty(1 << 20, device="cuda"))
    if i % 3 == 0:
        xs.pop(0)
import time; time.sleep(2.5)          # the viewer's state read and the 1 s check go by
for i in range(40):
    xs.append(torch.empty(1 << 20, device="cuda")); xs.pop(0)
torch.cuda.memory._record_memory_history(enabled="all", max_entries=1000)
for i in range(40):
    xs.append(torch.empty(1 << 20, device="cuda")); xs.pop(0)
snap = torch.cuda.memory._snapshot()
print("user trace entries", len(snap["device_traces"][0]))
PY
"$BIN" attach --json --interval 0.2 --seconds 60 --until-ended > /dev/null 2>&1 &
A=$!
sleep 0.5
VRAMTOP_RING=8 "$BIN" run --history -- python3 "$W/small.py" > "$OUT/small.log" 2>&1
rc=$?; wait "$A"
vt_row "ring of 8 wrapped, then turned off; the job's own history after" "$(passed "$rc")" \
  "rc $rc (want 0); $(grep -o 'user trace entries [0-9]*' "$OUT/small.log")" | tee -a "$OUT/summary.txt"

"$BIN" attach --json --interval 0.5 --seconds 120 --until-ended > "$OUT/checker-attach.jsonl" 2>/dev/null &
A=$!
sleep 0.5
"$BIN" run --history -- python3 "$JOBS/whatif_ab.py" job checker none > "$OUT/checker.log" 2>&1
rc=$?; wait "$A"
events=$(python3 - "$OUT/checker-attach.jsonl" <<'PY'
import json, sys
last = None
for line in open(sys.argv[1]):
    try:
        for job in json.loads(line).get("attached", []):
            if job.get("last_oom"):
                last = job["last_oom"]
    except ValueError:
        pass
print("history_events %s; %s" % (last and last.get("history_events"),
      last and ", ".join("%s %s" % (r["remedy"], r["verdict"]) for r in last["remedies"])))
PY
)
vt_row "checker: live OOM from the whole history" "$(passed "$rc")" "rc $rc; $events" | tee -a "$OUT/summary.txt"
grep -h "vramtop:" "$OUT/checker.log" | head -12 > "$OUT/checker-block.txt"

rm -rf "$W"
