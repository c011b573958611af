#!/usr/bin/env bash
# The OOM's cause line, judged on a GPU: jobs that die of each cause users meet
# (scripts/gpu/jobs/cause_jobs.py) under a plain `vramtop run` in batch (stdout to a file),
# the cause vramtop names in the log, in `vramtop snapshot --once` of the kept file and in
# `vramtop attach --json` (`last_oom.cause`), then the A/B: what the cause line says to do,
# done, and what PyTorch then does. Kept files go to $OUT/files (test fixtures).
# usage: scripts/gpu/causes.sh PATH/TO/vramtop [CASE...]   (cases: jax cupy cap leak toobig)
set -uo pipefail
BIN=$(readlink -f "${1:?usage: causes.sh PATH/TO/vramtop [CASE...]}")
shift
CASES=${*:-jax cupy cap leak toobig}  # also: inproc (needs a 140 GiB card)
want() { [[ " $CASES " == *" $1 "* ]]; }
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$PWD/gpu-cause-out}
mkdir -p "$OUT/files"
LOG=$OUT/cause.log
: > "$LOG"
JOB="$REPO/scripts/gpu/jobs/cause_jobs.py"
ROWS=()

say() { echo "$*" | tee -a "$LOG"; }

# holder NAME ARGS...: a process holding GPU memory, started and waited for.
holder() {
  local name=$1; shift
  env "$@" > "$OUT/holder-$name.log" 2>&1 &
  HOLDER=$!
  for _ in $(seq 120); do
    grep -q holding "$OUT/holder-$name.log" 2>/dev/null && break
    kill -0 $HOLDER 2>/dev/null || break
    sleep 0.5
  done
  say "--- holder $name (pid $HOLDER): $(tail -c 300 "$OUT/holder-$name.log" | tr '\n' ' ')"
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tee -a "$LOG"
}

stop_holder() { kill "$HOLDER" 2>/dev/null; wait "$HOLDER" 2>/dev/null; }

# case NAME [--history] -- JOB ARGS: the job under vramtop run in batch; its cause line.
case_run() {
  local name=$1; shift
  local flags=()
  while [ "$1" != "--" ]; do flags+=("$1"); shift; done
  shift
  local W; W=$(mktemp -d)
  say "=== $name: vramtop run ${flags[*]} -- cause_jobs.py $*"
  timeout 300 "$BIN" attach --json --until-ended --seconds 240 --interval 1 > "$OUT/$name-attach.jsonl" 2>/dev/null &
  local attach=$!
  sleep 1
  "$BIN" run "${flags[@]}" -- python3 "$JOB" "$@" > "$W/job.out" 2> "$W/job.err" < /dev/null
  local rc=$?
  cp "$W/job.err" "$OUT/$name.err"
  sleep 2
  kill $attach 2>/dev/null; wait $attach 2>/dev/null
  say "exit code $rc; job said: $(grep -E '^\{' "$W/job.out" | tail -1 | cut -c1-300)"
  grep -E '^vramtop' "$W/job.err" | cut -c1-700 | tee -a "$LOG"
  local cause
  cause=$(grep -E '^vramtop:   cause:' "$W/job.err" | head -1 | sed 's/^vramtop:   cause: //')
  local live
  live=$(python3 - "$OUT/$name-attach.jsonl" <<'EOF'
import json, sys
cause = None
for line in open(sys.argv[1]):
    try:
        for job in json.loads(line).get("attached", []):
            oom = job.get("last_oom")
            if oom and oom.get("cause"):
                cause = oom["cause"]
    except ValueError:
        pass
print(cause or "(none)")
EOF
)
  say "live (attach --json last_oom.cause): $live"
  for f in "$W"/vramtop-oom-*.pickle; do
    [ -e "$f" ] || continue
    cp "$f" "$OUT/files/$name-$(basename "$f")"
    say "--- vramtop snapshot --once $(basename "$f") ($(stat -c %s "$f") bytes)"
    "$BIN" snapshot --once "$f" 2>&1 | grep -E 'cause:|also:' | cut -c1-500 | tee -a "$LOG"
  done
  ROWS+=("$name|$rc|${cause:-(no cause line)}")
  rm -rf "$W"
}

# ab NAME ENV... -- JOB ARGS: the same job after doing what the cause line said, no vramtop.
ab() {
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" python3 "$JOB" "$@" > "$OUT/ab-$name.log" 2>&1 < /dev/null
  local rc=$?
  local outcome
  outcome=$(grep -E '^\{"oom' "$OUT/ab-$name.log" | tail -1 | cut -c1-200)
  say "A/B $name (${envs[*]}): exit $rc $outcome"
  ROWS+=("A/B $name|$rc|$outcome")
}

nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee -a "$LOG"

# 1. Another process: JAX's preallocation, then its documented switch.
if want jax; then
holder jax python3 "$JOB" jax_hold 120
case_run jax -- big 40
stop_holder
holder jax_noprealloc XLA_PYTHON_CLIENT_PREALLOCATE=false python3 "$JOB" jax_hold 60
ab jax_noprealloc -- big 40
stop_holder
holder jax_fraction XLA_PYTHON_CLIENT_MEM_FRACTION=.25 python3 "$JOB" jax_hold 60
ab jax_fraction -- big 40
stop_holder
fi

# 1b. Another library in the job's own process: JAX's preallocation, CuPy's pool, memory
# taken through the driver; then each one's switch, in the same process.
if want inproc; then
case_run inproc_jax -- inproc jax 40
ab inproc_jax_noprealloc -- inproc jax 40 fixed
case_run inproc_cupy -- inproc cupy 40
ab inproc_cupy_freed -- inproc cupy 40 fixed
case_run inproc_raw -- inproc raw 40
case_run inproc_jax_train -- inproc jax train
ab inproc_jax_train_noprealloc -- inproc jax train fixed
fi

# 2. Another process: CuPy's pool holding what it freed.
if want cupy; then
holder cupy python3 "$JOB" cupy_hold 120
case_run cupy -- big 60
stop_holder
holder cupy_freed python3 "$JOB" cupy_hold 60 freed
ab cupy_free_all_blocks -- big 60
stop_holder
fi

# 3. The job's own cap, then a larger one.
if want cap; then
case_run cap -- cap 0.1
ab cap_raised -- cap 0.2
fi

# 4. Leaks, without and with --history.
if want leak; then
case_run leak -- leak
case_run leak_history --history -- leak
case_run leak_loop -- leak_loop
case_run leak_loop_history --history -- leak_loop
fi

# 5. Too big: no allocator setting would have saved it.
if want toobig; then
case_run toobig -- toobig
ab toobig_expandable PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -- toobig
fi

# Few files come back from the GPU machine: one archive of the kept files and logs.
tar czf "$OUT/cause-files.tgz" -C "$OUT" files $(cd "$OUT" && ls *.jsonl *.err holder-*.log 2>/dev/null) && rm -rf "$OUT/files" "$OUT"/*.jsonl "$OUT"/*.err
say ""
say "case | exit | cause line (vramtop run's batch block) / A/B outcome"
for row in "${ROWS[@]}"; do say "$row"; done
