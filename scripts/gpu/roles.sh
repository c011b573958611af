#!/usr/bin/env bash
# Memory by role, judged on a GPU: jobs that print their own sums (parameters and buffers,
# gradients, optimizer state; scripts/gpu/jobs/roles_check.py) under a plain `vramtop run`
# in batch, read meanwhile by `vramtop attach --json`, then their sums against vramtop's:
# at the moment the job held still, and in the file kept at its OOM.
# usage: scripts/gpu/roles.sh PATH/TO/vramtop [plain inference trainer ddp]
set -uo pipefail
BIN=$(readlink -f "${1:?usage: roles.sh PATH/TO/vramtop [JOB...]}")
shift
JOBS=${*:-plain inference trainer ddp}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$PWD/gpu-roles-out}
mkdir -p "$OUT"
JOB="$REPO/scripts/gpu/jobs/roles_check.py"
for job in $JOBS; do
  W=$(mktemp -d)
  echo "=== $job"
  timeout 400 "$BIN" attach --json --until-ended --seconds 300 --interval 0.5 > "$W/attach.jsonl" 2>/dev/null &
  attach=$!
  sleep 1
  if [ "$job" = ddp ]; then
    "$BIN" run -- torchrun --nproc_per_node 2 "$JOB" ddp > "$W/job.out" 2> "$W/job.err" < /dev/null
  else
    "$BIN" run -- python3 "$JOB" "$job" > "$W/job.out" 2> "$W/job.err" < /dev/null
  fi
  echo "exit code $?"
  sleep 1
  kill $attach 2>/dev/null; wait $attach 2>/dev/null
  grep -E '^vramtop:   (cause|memory):' "$W/job.err" | cut -c1-300
  grep -E 'Error|Traceback' "$W/job.err" | grep -v OutOfMemoryError | head -5
  python3 "$JOB" compare "$W/job.out" "$W/attach.jsonl" "$W"/vramtop-oom-*.pickle | tee "$OUT/$job-compare.md"
  tar czf "$OUT/$job-files.tgz" -C "$W" . 2>/dev/null
  rm -rf "$W"
done
