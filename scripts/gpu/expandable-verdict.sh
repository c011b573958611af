#!/usr/bin/env bash
# The live expandable verdict against what PyTorch then does: each job of
# scripts/gpu/jobs/oom_batch.py under `vramtop run` (batch), watched by `vramtop attach
# --json` for the verdict at its OOM; then the same job in a fresh process with
# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (did the failed request fit?).
# usage: scripts/gpu/expandable-verdict.sh PATH/TO/vramtop
set -uo pipefail
BIN=$(readlink -f "${1:?usage: expandable-verdict.sh PATH/TO/vramtop}")
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$PWD/gpu-verdict-out}
mkdir -p "$OUT"
LOG=$OUT/verdict.log
: > "$LOG"
for kind in capfill dies grows; do
  W=$(mktemp -d); export VRAMTOP_SOCKET_DIR=$W/sock VRAMTOP_OOM_DIR=$W
  "$BIN" attach --json --interval 0.2 --seconds 120 --until-ended > "$W/attach.jsonl" 2>/dev/null &
  WATCH=$!
  "$BIN" run -- python3 "$REPO/scripts/gpu/jobs/oom_batch.py" "$kind" > "$W/job.log" 2>&1 < /dev/null
  rc=$?
  wait $WATCH
  verdict=$(python3 - "$W/attach.jsonl" <<'PY'
import json, sys
last = None
for line in open(sys.argv[1]):
    for job in json.loads(line).get("attached", []):
        if job.get("last_oom"):
            last = job["last_oom"]
print(json.dumps({"answer": last["expandable"]["answer"], "line": last["expandable_line"], "oom": last["line"]}) if last else "no OOM seen")
PY
)
  unset VRAMTOP_SOCKET_DIR VRAMTOP_OOM_DIR
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 "$REPO/scripts/gpu/jobs/oom_batch.py" "$kind" > "$W/ab.log" 2>&1 < /dev/null
  ab=$?
  echo "$kind: under vramtop exit $rc; verdict $verdict; with expandable_segments:True exit $ab ($(grep -c '^pytorch:' "$W/ab.log") OOM line(s))" | tee -a "$LOG"
  rm -rf "$W"
done
