#!/usr/bin/env bash
# The OOM nobody watched, on a GPU: three batch jobs under `vramtop run` with stdout to a
# file and stdin from /dev/null (scripts/gpu/jobs/oom_batch.py: dies, catches, grows).
# For each: the job's exit code, the log's vramtop block, the files kept and their sizes,
# PyTorch's own reader (torch.cuda._memory_viz stats) and `vramtop snapshot --once` on
# each file. The kept files are copied to $OUT/oom-files for reading on another machine.
# usage: scripts/gpu/oom-batch.sh PATH/TO/vramtop
set -uo pipefail
BIN=$(readlink -f "${1:?usage: oom-batch.sh PATH/TO/vramtop}")
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$PWD/gpu-oom-out}
mkdir -p "$OUT/oom-files"
LOG=$OUT/oom-batch.log
: > "$LOG"
for kind in dies catches grows; do
  W=$(mktemp -d)
  echo "=== $kind" | tee -a "$LOG"
  start=$(date +%s.%N)
  "$BIN" run -- python3 "$REPO/scripts/gpu/jobs/oom_batch.py" "$kind" > "$W/job.log" 2>&1 < /dev/null
  rc=$?
  end=$(date +%s.%N)
  echo "exit code $rc after $(python3 -c "print(round($end - $start, 1))") s" | tee -a "$LOG"
  echo "--- job.log: PyTorch's own line and vramtop's block" | tee -a "$LOG"
  grep -E '^pytorch:|^vramtop|OutOfMemoryError|went on' "$W/job.log" | cut -c1-400 | tee -a "$LOG"
  echo "--- files beside job.log" | tee -a "$LOG"
  ls -l "$W" | grep vramtop-oom | awk '{print $5, $9}' | tee -a "$LOG"
  for f in "$W"/vramtop-oom-*.pickle; do
    [ -e "$f" ] || continue
    echo "--- python3 -m torch.cuda._memory_viz stats $(basename "$f")" | tee -a "$LOG"
    python3 -m torch.cuda._memory_viz stats "$f" 2>&1 | head -20 | tee -a "$LOG"
    echo "--- vramtop snapshot --once $(basename "$f")" | tee -a "$LOG"
    "$BIN" snapshot --once "$f" 2>&1 | tail -12 | tee -a "$LOG"
    cp "$f" "$OUT/oom-files/$kind-$(basename "$f")"
  done
  rm -rf "$W"
done
# The replay line's verdict for pytorch-expandable, against what PyTorch then does: the same
# jobs with expandable segments on, no vramtop (does the request that failed fit now?).
echo "=== A/B: the same jobs with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, no vramtop" | tee -a "$LOG"
for kind in dies grows; do
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 "$REPO/scripts/gpu/jobs/oom_batch.py" "$kind" > "$OUT/ab-$kind.log" 2>&1 < /dev/null
  echo "$kind with expandable: exit code $?; $(grep -E '^pytorch:' "$OUT/ab-$kind.log" | cut -c1-300)" | tee -a "$LOG"
  grep -E '"batch"' "$OUT/ab-$kind.log" | tail -1 | tee -a "$LOG"
done
