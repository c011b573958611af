#!/usr/bin/env bash
# The README's pictures, made on a GPU by anyone who reruns this: a GPT-2 training job
# (scripts/gpu/jobs/front_page.py) under `vramtop run` in a 150x45 terminal (tmux, on a
# server of its own so nobody's sessions are touched), pictured with the P key while it
# trains (the role bar) and after it died of "CUDA out of memory" (the OOM panel); the same
# job in batch, for the log block vramtop writes after it; and the A/B of the knobs line:
# the long batch again at half the batch size, without vramtop.
# usage: scripts/gpu/screenshots.sh PATH/TO/vramtop [ab]   (pictures and logs go to $OUT;
#        with `ab`, only the A/B runs of section 3)
# Then: tar xzf $OUT/shots.tgz; cp shots/run-*.svg assets/screenshots/; the log block into the README.
set -uo pipefail
BIN=$(readlink -f "${1:?usage: scripts/gpu/screenshots.sh PATH/TO/vramtop}")
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$PWD/gpu-screenshots-out}
JOB="$REPO/scripts/gpu/jobs/front_page.py"
mkdir -p "$OUT/shots"
LOG=$OUT/screenshots.log
: > "$LOG"
say() { echo "$*" | tee -a "$LOG"; }
. "$(dirname "$0")/lib.sh"
t() { vt_tmux "$@"; }

# wait_for TEXT SECONDS: until the screen shows TEXT; false when it never did.
wait_for() {
  local i
  for i in $(seq $(( $2 * 4 ))); do
    t capture-pane -p -t shot 2>/dev/null | grep -qF -- "$1" && return 0
    sleep 0.25
  done
  return 1
}

# picture NAME: P, then the file renamed NAME.svg, and the screen as text beside it.
picture() {
  local before; before=$(ls "$OUT/shots" | wc -l)
  t send-keys -t shot P
  for _ in $(seq 40); do
    [ "$(ls "$OUT/shots" | wc -l)" -gt "$before" ] && break
    sleep 0.25
  done
  local made; made=$(ls -t "$OUT/shots"/vramtop-run*.svg 2>/dev/null | head -1)
  if [ -n "$made" ]; then
    mv "$made" "$OUT/shots/$1.svg"
    t capture-pane -p -t shot > "$OUT/shots/$1.txt"
    say "picture $1: $(stat -c %s "$OUT/shots/$1.svg") bytes"
  else
    say "picture $1: FAILED (no file after P)"
  fi
}

nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee -a "$LOG"
ONLY_AB=${2:-}
if [ "$ONLY_AB" != ab ]; then
command -v tmux > /dev/null || { say "tmux not installed: no pictures"; exit 1; }

# 1. The live view, while training and after the OOM.
cd "$OUT"
t new-session -d -s shot -x 150 -y 45 \
  "$BIN --svg-dir $OUT/shots --interval 0.5 run --log $OUT/live-job.log -- python3 $JOB --batch 128 --warm-seconds 25; sleep 600"
# The block map comes with the hook's checkpoints (every few seconds at this job's pace;
# stats alone between them, the title then says "map N s old"): the picture is taken
# while the map is fresh, beside the role bar.
fresh_map() {
  local i screen
  for i in $(seq 120); do
    screen=$(t capture-pane -p -t shot 2>/dev/null)
    if grep -qF "optimizer" <<< "$screen" && ! grep -qE "map [0-9]+ s old" <<< "$screen"; then
      return 0
    fi
    sleep 0.25
  done
  return 1
}
if wait_for "optimizer" 120 && sleep 4 && fresh_map; then
  picture run-training
else
  say "training picture: the role bar never showed"
fi
if wait_for "OOM:" 120 && wait_for "ended (exit" 60; then
  sleep 2
  picture run-oom
else
  say "OOM picture: no OOM panel"
fi
t send-keys -t shot q
sleep 1
vt_tmux_end
say "job's log (live): $(tail -2 "$OUT/live-job.log" | tr '\n' ' ' | cut -c1-400)"

# 2. The same job in batch: the block vramtop writes after it.
"$BIN" run -- python3 "$JOB" --batch 128 --warm-seconds 10 > "$OUT/batch-job.out" 2> "$OUT/batch-job.err" < /dev/null
say "batch: exit $?; job said: $(grep -E '^\{' "$OUT/batch-job.out" | tail -1 | cut -c1-300)"
grep -E '^vramtop' "$OUT/batch-job.err" | tee "$OUT/batch-block.txt" | tee -a "$LOG"

fi

# 3. What the block says, done, without vramtop: the knobs line's "half the batch", and
# two of the remedies it says fail. Each is the same job in a fresh process.
# ab NAME BATCH [ALLOC_CONF]
ab() {
  env ${3:+PYTORCH_CUDA_ALLOC_CONF=$3} python3 "$JOB" --batch "$2" --warm-seconds 10 \
    > "$OUT/ab-$1.out" 2>&1 < /dev/null
  say "A/B $1 (batch $2${3:+, $3}): exit $?; $(grep -E '^\{"oom' "$OUT/ab-$1.out" | tail -1 | cut -c1-160)"
}
ab half_batch 64
ab expandable 128 expandable_segments:True
ab max_split_20 128 max_split_size_mb:20
rm -f "$OUT"/vramtop-oom-*.pickle
# Few files come back from the GPU machine: the pictures in one archive.
if [ -d "$OUT/shots" ]; then
  tar czf "$OUT/shots.tgz" -C "$OUT" shots && rm -rf "$OUT/shots"
fi
