#!/usr/bin/env bash
# The job's history at its OOM, on the GPU (issue "Right on real training jobs"):
#   1. remedies A/B: each workload once under a plain `vramtop run` (its live verdicts and
#      the kept file's replay), then each remedy in a fresh process (PyTorch's outcome);
#   2. what the hook's states cost a GPT-2 step, in one process (hook_read_cost.py), with
#      a 65,536-entry ring (hook 1.5's default, checkpointed) and with none;
#   3. the hook's host memory with and without the ring (VmHWM of the same GPT-2 loop);
#   4. what reading the ring whole before each checkpoint costs a GPT-2 step (hook 1.5), in
#      one process (ring_history_cost.py), and what PyTorch's C++ read itself costs
#      against _snapshot() (ring_pickled_cost.py, without the hook).
# Parts run alone (each fits one 10-minute device call):
#   recording-parts  what a ring entry and PyTorch's annotation callback each cost the
#               job's thread, priced apart (recording_parts.py, no hook, about 2 minutes)
#   step-cost   the history's whole cost to a GPT-2 step, ring on against off in one
#               process, with no viewer and with a real one (about a state an 'on'
#               second; hook_step_cost.py; RINGS, VIEWERS, EXPERIMENTS); run it with
#               nothing else on the GPU
#   memory      the hook's peak host memory with a full history (hook_memory.py, 2,200
#               steps, so the history fills), rings of 0, 65536, 32768, 24576 and 16384
#               entries side by side (MEMORY_CASES: "RING" or "RING:--trim" for
#               malloc_trim after every read); the figure is each one's peak over its own
#               start (baselines differ between processes)
#   profile     where a checkpoint's time goes (checkpoint_profile.py), rings of 32768
#               (the default) and 16384 (RINGS sets others)
#   scan CAP... where gpt2mixed (SCAN_WORKLOAD: another) dies under each cap, plainly and
#               with expandable segments
#   ab-autocap WORKLOAD...  ab, each workload under AUTOCAP (0.8) of its own uncapped
#               peak (for new workloads); WHATIF_BASE_CONF: the job's own allocator
#               settings, kept in every run (whatif_ab.py says how)
#   burst [OLD] what 30 caught OOMs in a row cost the job's thread (oom_burst.py), after 20 s
#               and 75 s of history; with a second binary OLD, the same under it, for a
#               before and after on one machine; and which OOM the "last" file holds
# WHATIF_JOBS runs that many remedy processes side by side in `ab` (each under its cap).
# Usage: scripts/gpu/history.sh path/to/vramtop [ab|ab-autocap|cost|step-cost|recording-parts|memory|profile|scan|burst|all] [arg...]
set -uo pipefail
BIN=$(realpath "${1:?usage: history.sh path/to/vramtop [ab|cost|all] [workload...]}")
PART=${2:-all}
shift 2 2>/dev/null || shift
OUT=${OUT:-/tmp/vramtop-history}
mkdir -p "$OUT"
cd "$(dirname "$0")/jobs" || exit 1

if [ "$PART" = ab ] || [ "$PART" = all ]; then
  python3 whatif_ab.py ab "$BIN" "$OUT/ab" "$@"
fi

if [ "$PART" = ab-autocap ]; then
  # `ab` with each workload's cap taken from its own uncapped run (WHATIF_PROFILE, 100 GiB,
  # WHATIF_STEP_LIMIT steps): AUTOCAP (default 0.8) of the most it reserved, so that plain
  # PyTorch dies in the later steps. For workloads whose peaks no run has sized yet.
  for w in "$@"; do
    var=$(python3 -c "import whatif_ab; print(whatif_ab.CAP_ENV['$w'][0])") || exit 2
    # Sized under the job's own settings (WHATIF_BASE_CONF), as every run of it goes.
    env -u PYTORCH_CUDA_ALLOC_CONF ${WHATIF_BASE_CONF:+"PYTORCH_CUDA_ALLOC_CONF=$WHATIF_BASE_CONF"} "$var=100" \
      WHATIF_PROFILE=1 python3 whatif_ab.py job "$w" none > "$OUT/profile-$w.log" 2>&1
    gib=$(python3 -c 'import re, sys
peaks = [int(m) for m in re.findall(r"peak_reserved ([0-9]+)", open(sys.argv[1]).read())]
print(round(float(sys.argv[2]) * max(peaks) / 2**30, 2) if peaks else "")' "$OUT/profile-$w.log" "${AUTOCAP:-0.8}")
    if [ -z "$gib" ]; then echo "$w: no peaks in its uncapped run (see profile-$w.log)"; continue; fi
    echo "$w: cap $gib GiB (${AUTOCAP:-0.8} of its uncapped peak)"
    env "$var=$gib" python3 whatif_ab.py ab "$BIN" "$OUT/ab-$w" "$w"
  done
fi

if [ "$PART" = scan ]; then
  python3 whatif_ab.py scan "${SCAN_WORKLOAD:-gpt2mixed}" "$@" | tee "$OUT/scan-$(echo "$@" | tr ' ' _).jsonl"
fi

if [ "$PART" = burst ]; then
  for seconds in 20 75; do
    for bin in "$BIN" ${1:+"$(realpath "$1")"}; do
      name=burst-$(basename "$bin")-$seconds
      dir=$(mktemp -d)
      VRAMTOP_OOM_DIR=$dir "$bin" run --quiet -- python3 oom_burst.py --seconds "$seconds" --ooms 30 \
        > "$OUT/$name.log" 2>&1
      echo "== $name"
      grep -h "burst:" "$OUT/$name.log" | cut -c1-600
      python3 -c 'import glob, pickle, sys
for p in glob.glob(sys.argv[1] + "/*-last.pickle"):
    print("the last file holds OOM", pickle.load(open(p, "rb"))["vramtop_oom"]["number"])' "$dir"
      rm -rf "$dir"
    done
  done
fi

if [ "$PART" = recording-parts ]; then
  python3 recording_parts.py > "$OUT/recording-parts.jsonl" 2> "$OUT/recording-parts.err"
  tail -1 "$OUT/recording-parts.jsonl"
fi

if [ "$PART" = step-cost ]; then
  # RINGS: the ring sizes to run (default the hook's); VIEWERS: "none", "real" or both;
  # EXPERIMENTS: hook_step_cost.py's experiment flags, one run each, comma-separated
  # ("-" for the hook as it is; say "-,--no-checkpoints,--no-state-read").
  for ring in ${RINGS:-32768}; do
    for viewer in ${VIEWERS:-none real}; do
      for experiment in $(echo "${EXPERIMENTS:--}" | tr , ' '); do
        flag=$([ "$viewer" = real ] && echo --viewer)
        [ "$experiment" != - ] && flag="$flag $experiment"
        name=step-cost-ring$ring-$viewer$([ "$experiment" != - ] && echo "$experiment")
        VRAMTOP_RING=$ring "$BIN" run --quiet -- python3 hook_step_cost.py $flag "$@" \
          > "$OUT/$name.json" 2> "$OUT/$name.err"
        label=$([ "$experiment" = - ] && echo "as it is" || echo "$experiment")
        echo "history's cost to a step, ring $ring, viewer $viewer, $label: $(tail -1 "$OUT/$name.json" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); d.pop("block_medians_ms",None); d.pop("block_steps_ms",None); print(json.dumps(d))' 2>/dev/null)"
      done
    done
  done
fi

if [ "$PART" = profile ]; then
  for ring in ${RINGS:-32768 16384}; do
    VRAMTOP_RING=$ring "$BIN" run --quiet -- python3 checkpoint_profile.py "$@" \
      > "$OUT/profile-ring$ring.json" 2> "$OUT/profile-ring$ring.err"
    echo "checkpoint parts, ring $ring: $(tail -1 "$OUT/profile-ring$ring.json")"
  done
fi

if [ "$PART" = memory ]; then
  for case in ${MEMORY_CASES:-0 65536 32768 24576 16384}; do
    ring=${case%%:*}
    trim=$([ "$case" != "${case#*:}" ] && echo "${case#*:}")
    VRAMTOP_RING=$ring "$BIN" run --quiet -- python3 hook_memory.py --steps 2200 $trim "$@" \
      > "$OUT/memory-ring$ring$trim.json" 2> "$OUT/memory-ring$ring$trim.err" &
  done
  wait
  for f in "$OUT"/memory-ring*.json; do echo "host memory, $(basename "$f" .json): $(tail -1 "$f")"; done
fi

if [ "$PART" = cost ] || [ "$PART" = all ]; then
  for ring in 65536 0; do
    VRAMTOP_RING=$ring "$BIN" run --quiet -- python3 hook_read_cost.py --blocks 20 --block-steps 40 --rate 20 \
      > "$OUT/read-cost-ring$ring.json" 2> "$OUT/read-cost-ring$ring.err"
    echo "read cost, ring $ring: $(tail -1 "$OUT/read-cost-ring$ring.json")"
  done
  for ring in 65536 0; do
    VRAMTOP_RING=$ring "$BIN" run --quiet -- python3 -c '
import re, torch
from train_gpt2 import build, train_step
config, model, optimizer = build(8)
ids = torch.randint(0, config.vocab_size, (8, 512), device="cuda")
for _ in range(300):
    train_step(model, optimizer, ids)
torch.cuda.synchronize()
print(re.search(r"VmHWM:\s+(\d+) kB", open("/proc/self/status").read()).group(1))
' > "$OUT/hwm-ring$ring.txt" 2>&1
    echo "VmHWM kB, ring $ring: $(tail -1 "$OUT/hwm-ring$ring.txt")"
  done
  "$BIN" run --quiet -- python3 ring_history_cost.py --blocks 60 \
    > "$OUT/history-cost.json" 2> "$OUT/history-cost.err"
  echo "history read cost: $(tail -1 "$OUT/history-cost.json")"
  OUT="$OUT" python3 ring_pickled_cost.py > "$OUT/ring-pickled.log" 2>&1
  echo "ring read off the GIL: $OUT/ring_pickled.json"
fi
