#!/usr/bin/env bash
# The wheel on the GPU machine: installed with pip from the file alone (no index), its
# package started inside a GPT-2 job (`import vramtop; vramtop.start()`), watched by the
# wheel's own binary (`vramtop attach --json`); the job's printed memory_reserved() /
# memory_allocated() beside vramtop's figures.
# usage: scripts/gpu/wheel.sh PATH/TO/vramtop-*.whl
set -uo pipefail
WHEEL=$(readlink -f "${1:?usage: wheel.sh PATH/TO/vramtop-*.whl}")
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$PWD/gpu-wheel-out}
mkdir -p "$OUT"
LOG=$OUT/wheel.log
DIR=$(mktemp -d)
pip install --no-index --target "$DIR/site" "$WHEEL" > "$OUT/pip.log" 2>&1
echo "pip install --no-index --target: exit $?; $(ls "$DIR/site" | tr '\n' ' ')" | tee "$LOG"
BIN="$DIR/site/bin/vramtop"
"$BIN" --version | tee -a "$LOG"
export VRAMTOP_SOCKET_DIR=$DIR/sockets
PYTHONPATH="$DIR/site" python3 "$REPO/scripts/gpu/jobs/wheel_job.py" > "$OUT/job.out" 2> "$OUT/job.err" &
JOB=$!
# Wait for the job's final line, then read vramtop's view while it holds still.
for _ in $(seq 1 240); do
  grep -q '"final"' "$OUT/job.out" 2>/dev/null && break
  sleep 0.5
done
echo "job: $(grep '"final"' "$OUT/job.out")" | tee -a "$LOG"
"$BIN" attach --json --pid "$JOB" --seconds 2 --interval 0.5 > "$OUT/attach.jsonl" 2>> "$LOG"
python3 - "$OUT/job.out" "$OUT/attach.jsonl" <<'PY' | tee -a "$LOG"
import json, sys
final = [json.loads(l) for l in open(sys.argv[1]) if '"final"' in l][-1]
rows = [j for l in open(sys.argv[2]) for j in json.loads(l)["attached"] if j.get("states")]
last = rows[-1]
stats = last.get("stats") or {}
print("module:", final["vramtop_module"])
for key in ("reserved", "allocated"):
    mine = last[key + "_bytes"]
    print(f"{key}: job printed {final[key]:,} B; vramtop attach (segments) {mine:,} B; "
          f"memory_stats {stats.get(key + '_bytes')}; equal: {mine == final[key]}")
PY
wait $JOB
echo "job exit code $?" | tee -a "$LOG"
rm -rf "$DIR"
