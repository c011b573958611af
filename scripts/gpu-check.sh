#!/usr/bin/env bash
# The GPU checks of vramtop, on a machine with an NVIDIA GPU (../shared/gpu.md): the one
# entry to the harness in scripts/gpu/ (its parts, their jobs in scripts/gpu/jobs/, and
# lib.sh, which every part sources: tmux on a private server, one row format).
#
# usage: scripts/gpu-check.sh PATH/TO/vramtop [PART...]   (logs go to $OUT, or ./gpu-check-out)
#   no PART: every section below, in order, then a table of every row;
#   PART among core (sections 1-8), hook, attach, monitor, faults, whatif, ranks, ring:
#     those sections only, then their table;
#   any other PART names a script of scripts/gpu/ (history, causes, roles, oom-batch,
#     screenshots, trend, expandable-verdict, serve, serve-load): it runs alone, given the
#     binary and the arguments after its name, e.g.
#     scripts/gpu-check.sh .gpu/vramtop history ab gpt2var
#   (scripts/gpu/wheel.sh takes a wheel, not a binary: run it directly.)
# Rows are "check|status|detail" (scripts/gpu/lib.sh), all of them in $OUT/rows.txt.
# Takes device memory with plain allocations only. The whole run takes longer than one
# `device` command may (10 minutes): there, run its parts as separate calls, each with the
# binary carried: core, then hook attach, monitor faults (FAULT_CASES without soak), and
# the soak alone (FAULT_CASES=soak SOAK_S=560 ... faults).
set -uo pipefail
. "$(dirname "$0")/gpu/lib.sh"
BIN=$(readlink -f "${1:?usage: scripts/gpu-check.sh PATH/TO/vramtop [PART...]}")
shift
HERE=$(cd "$(dirname "$0")" && pwd)
SECTIONS="core hook attach monitor faults whatif ranks ring"
if [ $# -gt 0 ] && [[ " $SECTIONS " != *" $1 "* ]]; then
  part="$HERE/gpu/$1.sh"
  case "$1" in
    wheel|cpu-share|lib)
      echo "gpu-check.sh: scripts/gpu/$1.sh is not given the binary: run it directly" >&2
      exit 2 ;;
  esac
  if [ ! -f "$part" ]; then
    echo "gpu-check.sh: no part '$1': name a section ($SECTIONS) or a script of scripts/gpu/" >&2
    exit 2
  fi
  shift
  exec bash "$part" "$BIN" "$@"
fi
PARTS=" ${*:-$SECTIONS} "
for p in $PARTS; do
  if [[ " $SECTIONS " != *" $p "* ]]; then
    echo "gpu-check.sh: '$p' is not a section ($SECTIONS); run other parts one at a time" >&2
    exit 2
  fi
done
want() { [[ "$PARTS" == *" $1 "* ]]; }
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
# Scratch files stay out of $OUT: what comes back from the GPU machine is limited to a few
# files, so $OUT keeps the log, the summary and the screens only.
WORK=$(mktemp -d)
LOG="$OUT/gpu-check.log"
: > "$LOG"
declare -a RESULTS
: > "$OUT/rows.txt"
result() {
  RESULTS+=("$(printf '%-44s %-6s %s' "$1" "$2" "$3")")
  VT_ROWS="$OUT/rows.txt" vt_row "$1" "$2" "$3" | tee -a "$LOG"
}
say() { echo "== $*" | tee -a "$LOG"; }
# A part's rows, each a row of this table under PREFIX; FAIL when it wrote none.
rows_of() { # PREFIX FILE WHAT
  if [ -s "$2" ]; then
    while IFS='|' read -r name status detail; do result "$1$name" "$status" "$detail"; done < "$2"
  else
    result "$3" FAIL "no rows (see gpu-check.log)"
  fi
}

say "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.reserved --format=csv | tee -a "$LOG"

if want core; then

# 1. CUDA backing self-check: segments, pages, fill and verify kernels.
say "cuda self-check"
if "$BIN" gpu-self-check > "$OUT/self-check.txt" 2>&1; then
  result "cuda self-check" ok "$(tail -n 1 "$OUT/self-check.txt")"
else
  result "cuda self-check" FAIL "$(tail -n 1 "$OUT/self-check.txt")"
fi
cat "$OUT/self-check.txt" >> "$LOG"

# 2. Every scenario under every policy on the cuda backing: zero mismatches.
say "scenarios on cuda"
total_mismatch=0; runs=0; failed=0
for s in checkerboard churn training leak streams steady; do
  for p in caching best-fit first-fit tlsf expandable; do
    f="$WORK/probe-$s-$p.json"
    "$BIN" probe "$s" --policy "$p" --backing cuda --probe-limit 2GiB --seconds 60 --json > "$f" 2>> "$LOG"
    rc=$?
    line=$(python3 - "$f" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
s = r["stats"]
print(f'{r["verify_mismatches"]} {r["verified_blocks"]} {r["complete"]} {r["ooms"]} {len(r["backing_errors"])} {s["peak_reserved_bytes"]>>20} {r["elapsed_s"]:.2f}')
PY
) || line="parse-error 0 False 0 1 0 0"
    read -r mm vb done ooms errs peak secs <<< "$line"
    echo "$s/$p rc=$rc mismatches=$mm verified=$vb complete=$done ooms=$ooms backing_errors=$errs peak_reserved_MiB=$peak ${secs}s" | tee -a "$LOG"
    runs=$((runs + 1))
    if [ "$rc" != 0 ] || [ "$mm" != 0 ] || [ "$done" != True ] || [ "$errs" != 0 ]; then failed=$((failed + 1)); fi
    [[ "$mm" =~ ^[0-9]+$ ]] && total_mismatch=$((total_mismatch + mm))
  done
done
if [ $failed = 0 ]; then result "scenarios x policies on cuda" ok "$runs runs, $total_mismatch mismatched words"
else result "scenarios x policies on cuda" FAIL "$failed of $runs runs failed, $total_mismatch mismatched words"; fi

# 3. Expandable: mapped bytes vs what the driver says the process holds.
say "expandable mapped bytes vs nvidia-smi"
"$BIN" probe checkerboard --policy expandable --backing cuda --probe-limit 4GiB --json --hold 12 > "$WORK/hold-expandable.json" 2>>"$LOG" &
holder=$!
for _ in $(seq 60); do [ -s "$WORK/hold-expandable.json" ] && break; sleep 0.5; done
sleep 1
mapped=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["stats"]["reserved_bytes"]>>20)' "$WORK/hold-expandable.json" 2>/dev/null || echo "?")
smi=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -F', ' -v p=$holder '$1==p {print $2}')
echo "expandable mapped ${mapped} MiB; nvidia-smi says pid $holder uses ${smi:-?} MiB" | tee -a "$LOG"
if [[ "$mapped" =~ ^[0-9]+$ && "$smi" =~ ^[0-9]+$ ]]; then
  overhead=$((smi - mapped))
  if [ $overhead -ge 0 ] && [ $overhead -le 1024 ]; then result "expandable mapped vs nvidia-smi" ok "mapped ${mapped} MiB, driver ${smi} MiB, context overhead ${overhead} MiB"
  else result "expandable mapped vs nvidia-smi" FAIL "mapped ${mapped} MiB, driver ${smi} MiB"; fi
else result "expandable mapped vs nvidia-smi" FAIL "mapped=${mapped} smi=${smi:-none}"; fi

# 4. --once --json vs nvidia-smi while the probe holds memory.
say "--once --json vs nvidia-smi"
"$BIN" --once --json --device nvml > "$OUT/once.json" 2>>"$LOG"
nvidia-smi --query-gpu=memory.used,memory.total,memory.reserved --format=csv,noheader,nounits > "$WORK/smi-gpu.csv"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits > "$WORK/smi-apps.csv"
cmp=$(python3 - "$OUT/once.json" "$WORK/smi-gpu.csv" "$WORK/smi-apps.csv" <<'PY'
import json, sys
snap = json.load(open(sys.argv[1]))
d = snap["devices"][0]
used, total, reserved = [int(x) for x in open(sys.argv[2]).read().split(",")]
mib = lambda b: (b or 0) >> 20
ok = abs(mib(d["memory_used_bytes"]) - used) <= 2 and abs(mib(d["memory_total_bytes"]) - total) <= 1 and abs(mib(d["memory_reserved_bytes"]) - reserved) <= 1
apps = {}
for line in open(sys.argv[3]):
    if line.strip():
        pid, mem = [x.strip() for x in line.split(",")]
        apps[int(pid)] = int(mem)
ours = {p["pid"]: mib(p["used_memory_bytes"]) for p in d["processes"]}
apps_ok = set(apps) == set(ours) and all(abs(apps[p] - ours[p]) <= 2 for p in apps)
print(("ok" if ok and apps_ok else "FAIL"),
      f"used {mib(d['memory_used_bytes'])}/{used} total {mib(d['memory_total_bytes'])}/{total} reserved {mib(d['memory_reserved_bytes'])}/{reserved} MiB (vramtop/smi); pids vramtop {sorted(ours.items())} smi {sorted(apps.items())}")
PY
)
result "--once --json vs nvidia-smi" "${cmp%% *}" "${cmp#* }"
wait $holder

# 5. CPU share: the live TUI at 1 s and 0.1 s, and nvidia-smi -l 1, in the same 20 s,
#    with a probe process holding memory beside them.
say "CPU share over 20 s under a pty of 200x60"
"$BIN" probe steady --backing cuda --probe-limit 2GiB --hold 45 --json > /dev/null 2>&1 &
bg=$!
sleep 3
"$HERE/gpu/cpu-share.sh" 20 "$BIN" --interval 1 --device nvml > "$WORK/cpu-1s.txt" 2>>"$LOG" &
a=$!
"$HERE/gpu/cpu-share.sh" 20 "$BIN" --interval 0.1 --device nvml > "$WORK/cpu-0.1s.txt" 2>>"$LOG" &
b=$!
"$HERE/gpu/cpu-share.sh" 20 nvidia-smi -l 1 > "$WORK/cpu-smi.txt" 2>>"$LOG" &
c=$!
wait $a $b $c
result "CPU vramtop --interval 1 (target <= 0.375 %)" "$(awk '{print ($1 <= 0.375) ? "ok" : "MISS"}' "$WORK/cpu-1s.txt")" "$(awk '{printf "%.3f %% of a core, peak RSS %d MB", $1, $2/1024}' "$WORK/cpu-1s.txt")"
result "CPU vramtop --interval 0.1 (target <= 2.2 %)" "$(awk '{print ($1 <= 2.225) ? "ok" : "MISS"}' "$WORK/cpu-0.1s.txt")" "$(awk '{printf "%.3f %% of a core, peak RSS %d MB", $1, $2/1024}' "$WORK/cpu-0.1s.txt")"
result "CPU nvidia-smi -l 1 (reference)" info "$(awk '{printf "%.3f %% of a core, peak RSS %d MB", $1, $2/1024}' "$WORK/cpu-smi.txt")"
kill $bg 2>/dev/null; wait $bg 2>/dev/null

# 6. A look at the live screen with a probe on the GPU, as a user would see it.
say "live screen with --probe checkerboard --backing cuda"
if command -v tmux >/dev/null; then
  vt_tmux new-session -d -s vt -x 120 -y 40 "$BIN --probe checkerboard --backing cuda --probe-limit 1GiB --ops-per-s 400"
  sleep 8
  vt_tmux capture-pane -p -t vt > "$OUT/screen-probe.txt"
  vt_tmux send-keys -t vt q; sleep 1; vt_tmux_end
  if grep -q "OOM: needed" "$OUT/screen-probe.txt" && grep -q "gpu0" "$OUT/screen-probe.txt"; then
    result "live TUI, checkerboard on the GPU" ok "OOM explained on screen (screen-probe.txt)"
  else result "live TUI, checkerboard on the GPU" FAIL "see screen-probe.txt"; fi
  # The leak probe on the GPU, and the leaks view (L) pointing at the leaking site.
  vt_tmux new-session -d -s vl -x 120 -y 40 "$BIN --probe leak --backing cuda --probe-limit 1GiB --ops-per-s 300"
  sleep 2; vt_tmux send-keys -t vl L; sleep 6
  vt_tmux capture-pane -p -t vl > "$OUT/screen-leaks.txt"
  vt_tmux send-keys -t vl q; sleep 1; vt_tmux_end
  if grep -q "leak suspects" "$OUT/screen-leaks.txt" && grep -q "leak: kept output" "$OUT/screen-leaks.txt"; then
    result "leaks view, leak probe on the GPU" ok "suspect 'leak: kept output' on screen (screen-leaks.txt)"
  else result "leaks view, leak probe on the GPU" FAIL "see screen-leaks.txt"; fi
fi

# 7. vramtop serve against nvidia-smi (Prometheus /metrics).
say "serve /metrics vs nvidia-smi"
# A probe holds memory meanwhile, so the comparison is not of an idle board's zeros.
"$BIN" probe checkerboard --backing cuda --probe-limit 3GiB --hold 20 --json > /dev/null 2>&1 &
holder=$!
sleep 4
serve_line=$(OUT="$WORK" "$HERE/gpu/serve.sh" "$BIN" 2>&1 | tail -n 1)
kill $holder 2>/dev/null; wait $holder 2>/dev/null
cat "$WORK/gpu-check-serve.log" >> "$LOG" 2>/dev/null
case "$serve_line" in
  *": ok"*) result "serve /metrics vs nvidia-smi" ok "${serve_line#*: ok}" ;;
  *) result "serve /metrics vs nvidia-smi" FAIL "$serve_line" ;;
esac

# 7b. serve under load: RSS over 100k scrapes, scrape latency beside slowloris clients.
#     Needs the serve_load example built beside the binary (SERVE_LOAD=path to override).
say "serve under load"
SERVE_LOAD=${SERVE_LOAD:-$(dirname "$BIN")/examples/serve_load}
load_line=$(OUT="$WORK" "$HERE/gpu/serve-load.sh" "$BIN" "$SERVE_LOAD" 2>&1 | tail -n 1)
cat "$WORK/gpu-check-serve-load.log" >> "$LOG" 2>/dev/null
case "$load_line" in
  *": ok"*) result "serve 100k scrapes, RSS, slowloris" ok "${load_line#*: ok }" ;;
  *": skipped"*) result "serve 100k scrapes, RSS, slowloris" skip "${load_line#*: skipped }" ;;
  *) result "serve 100k scrapes, RSS, slowloris" FAIL "$load_line" ;;
esac

# 8. Draw cost on this machine.
"$BIN" bench render > "$WORK/bench-render.txt" 2>&1
result "bench render 200x60" info "$(cat "$WORK/bench-render.txt")"
fi

# 9. The job hook inside real PyTorch jobs (python only; scripts/gpu/hook.sh).
if want hook; then
  say "job hook (gpu/hook.sh)"
  mkdir -p "$WORK/hook"
  # Six overhead runs of 25 to 65 s each, history_ab.py, then the OOM, leak and two-process jobs.
  OUT="$WORK/hook" VT_ROWS="$WORK/rows-hook.txt" timeout 900 "$HERE/gpu/hook.sh" "$BIN" > /dev/null 2>&1
  cat "$WORK/hook/gpu-hook-check.log" >> "$LOG" 2>/dev/null
  rows_of "hook: " "$WORK/rows-hook.txt" "job hook"
fi
# 10. Live attach to real PyTorch jobs through `vramtop run` (scripts/gpu/attach.sh).
if want attach; then
  say "live attach (gpu/attach.sh)"
  OUT="$WORK/attach" VT_ROWS="$WORK/rows-attach.txt" timeout 900 "$HERE/gpu/attach.sh" "$BIN" > /dev/null 2>&1
  cat "$WORK/attach/gpu-attach.log" >> "$LOG" 2>/dev/null
  rows_of "attach: " "$WORK/rows-attach.txt" "live attach"
fi
# 11. Issue 15, the monitor beside nvtop and nvidia-smi: screen at 200x60 with a busy
#    PyTorch process, --once wall time (10 runs) vs nvidia-smi, the CUDA checkerboard
#    compare screen, CPU share at 1 s and 0.1 s beside nvtop, two GPUs when present.
#    Its screens and timings go to $OUT/monitor.log.
if want monitor; then
  say "monitor (issue 15)"
  OUT="$OUT" VT_ROWS="$WORK/rows-monitor.txt" "$HERE/gpu/monitor.sh" "$BIN" > /dev/null 2>>"$LOG"
  rows_of "" "$WORK/rows-monitor.txt" "monitor"
fi
# 12. Faults: non-root, a PID namespace, a hung NVML call, GPUs CUDA cannot see, a job
#    killed mid-poll, and a soak (scripts/gpu/faults.sh; its log is $OUT/gpu-faults.log).
#    STALL_SO: a prebuilt scripts/gpu/faults/nvml_stall.c where this machine has no cc;
#    SOAK_S: the soak's length in seconds (default 120).
if want faults; then
  say "faults (scripts/gpu/faults.sh)"
  OUT="$OUT" VT_ROWS="$WORK/rows-faults.txt" "$HERE/gpu/faults.sh" "$BIN" "${STALL_SO:--}" "${SOAK_S:-120}" > /dev/null 2>> "$LOG"
  rows_of "fault: " "$WORK/rows-faults.txt" "faults"
fi
# 13. Issue 25, the remedies judged: each workload of scripts/gpu/jobs/whatif_ab.py under
#    a plain `vramtop run` (vramtop's verdicts at its OOM), then once per remedy in a fresh
#    process (PyTorch's outcome). Its table goes to $OUT/whatif/table.md.
if want whatif; then
  say "remedies A/B (whatif_ab.py)"
  timeout 1200 python3 "$HERE/gpu/jobs/whatif_ab.py" ab "$BIN" "$OUT/whatif" >> "$LOG" 2>&1
  if [ -s "$OUT/whatif/table.md" ]; then
    wrong=$(grep -c 'WRONG' "$OUT/whatif/table.md")
    result "remedies A/B" "$([ "$wrong" = 0 ] && echo ok || echo FAIL)" "$(tail -1 "$OUT/whatif/table.md")"
  else result "remedies A/B" FAIL "whatif_ab.py wrote no table (see gpu-check.log)"; fi
fi
# 14. Issue 27, whole jobs: two gloo ranks on one GPU under `vramtop run` in a 200x60
#    tmux (first screen on rank 0, rank 1's OOM followed), serve per rank vs each rank's
#    printed figures, --once/attach rank fields, vramtop's RSS and CPU, and the hook's
#    in-process cost (scripts/gpu/ranks.sh; about 8 minutes). Its rows join this table.
if want ranks; then
  say "whole jobs (gpu/ranks.sh)"
  VT_ROWS="$WORK/rows-ranks.txt" bash "$HERE/gpu/ranks.sh" "$BIN" "$OUT/ranks" >> "$LOG" 2>&1
  rows_of "ranks: " "$WORK/rows-ranks.txt" "whole jobs"
fi
# 15. The hook's event ring in real jobs (scripts/gpu/ring.sh): GPT-2 with history
#    (the ring turned off mid-run), a small ring wrapped then turned off and the job's own
#    history after it, the checkerboard's OOM replayed live from its whole history.
if want ring; then
  say "event ring (gpu/ring.sh)"
  OUT="$OUT/ring" VT_ROWS="$WORK/rows-ring.txt" bash "$HERE/gpu/ring.sh" "$BIN" >> "$LOG" 2>&1
  rows_of "ring: " "$WORK/rows-ring.txt" "event ring"
fi

echo
echo "check                                        result details"
printf '%s\n' "${RESULTS[@]}" | tee "$OUT/summary.txt"
