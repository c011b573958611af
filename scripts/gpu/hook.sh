#!/usr/bin/env bash
# GPU checks of vramtop's job hook (python/vramtop/_hook), with python only: real PyTorch jobs under
# the hook, read by scripts/gpu/jobs/viewer.py. Run on the GPU machine (../shared/gpu.md).
# usage: scripts/gpu/hook.sh [PATH/TO/vramtop]
#   With a binary, the hook it ships (`vramtop hook-path`) is checked; else python/vramtop/_hook.
# Writes one log, $OUT/gpu-hook-check.log (default ./gpu-hook-out), and the results as
# "check|verdict|detail" rows (lib.sh) in $VT_ROWS, default $OUT/gpu-hook-results.txt;
# prints a table last.
# env: HOOK_CHECKS  the checks to run, by name (default all): overhead ab oom leak two
#      OVERHEAD_ROUNDS  rounds of the five overhead runs, averaged (default 1). One run took
#                       25 to 65 s on the H100 (a cold machine's imports are slow), and
#                       run-to-run drift of the same job there reached 22 %
#      OVERHEAD_STEPS   training steps per overhead run (default 150, 27 ms each on the H100)
# Checks: state totals = the job's memory_reserved()/memory_allocated(); the OOM message's
# figures; history sites name leak_list.py's line; the hook's step-time overhead; history's
# cost inside one process (ab: history_ab.py, free of the drift between processes).
set -uo pipefail
. "$(dirname "$0")/lib.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
JOBS="$HERE/jobs"
OUT=${OUT:-$PWD/gpu-hook-out}
mkdir -p "$OUT"
LOG="$OUT/gpu-hook-check.log"
: > "$LOG"
WORK=$(mktemp -d)
declare -a RESULTS
: "${VT_ROWS:=$OUT/gpu-hook-results.txt}"
: > "$VT_ROWS"
result() {
  RESULTS+=("$(printf '%-34s %-6s %s' "$1" "$2" "$3")")
  vt_row "$1" "$2" "$3" | tee -a "$LOG"
}
say() { echo "== $*" | tee -a "$LOG"; }
# HOOK_CHECKS picks checks by name (default all), for a short rerun of one.
want() { [ -z "${HOOK_CHECKS:-}" ] || [[ " $HOOK_CHECKS " == *" $1 "* ]]; }
for name in ${HOOK_CHECKS:-}; do
  [[ " overhead ab oom leak two " == *" $name "* ]] || { echo "$(basename "$0"): unknown name '$name' in HOOK_CHECKS; names: overhead ab oom leak two" >&2; exit 2; }
done

HOOK="$REPO/python/vramtop/_hook"
if [ $# -ge 1 ] && [ -x "$1" ]; then
  shipped=$(timeout 10 "$1" hook-path < /dev/null 2>>"$LOG" | tail -n 1)
  if [ -n "$shipped" ] && [ -f "$shipped/vramtop_hook/__init__.py" ]; then HOOK="$shipped"; fi
fi
say "hook directory: $HOOK"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$LOG" 2>&1
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' 2>&1 | tee -a "$LOG"

# Runs a job under the hook with a viewer attached; job stdout -> $WORK/NAME.out,
# viewer summary -> $WORK/NAME.view. Extra env as leading VAR=VALUE arguments.
hooked() {
  local name=$1 interval=$2; shift 2
  local sockets="$WORK/sock-$name"; mkdir -m 700 -p "$sockets"
  timeout 150 env PYTHONPATH="$HOOK${PYTHONPATH:+:$PYTHONPATH}" VRAMTOP_SOCKET_DIR="$sockets" "$@" > "$WORK/$name.out" 2> "$WORK/$name.err" &
  local job=$!
  python3 "$JOBS/viewer.py" --dir "$sockets" --interval "$interval" --wait 120 --timeout 90 \
    > "$WORK/$name.view" 2>> "$LOG" &
  local viewer=$!
  wait $job; local rc=$?
  wait $viewer
  { echo "-- $name: rc=$rc"; cat "$WORK/$name.out"; echo "-- stderr"; tail -n 20 "$WORK/$name.err"; echo "-- viewer"; cat "$WORK/$name.view"; } >> "$LOG"
  return $rc
}

if want overhead; then
# 1. Overhead and totals: train_gpt2.py with no hook / hook / viewer / history.
say "overhead (train_gpt2.py, 5 runs)"
ROUNDS=${OVERHEAD_ROUNDS:-1}
STEPS=${OVERHEAD_STEPS:-150}
timeout $(( (5 * ROUNDS + 1) * (60 + STEPS / 10) )) python3 "$JOBS/overhead.py" --hook-dir "$HOOK" --steps "$STEPS" --rounds "$ROUNDS" --log "$LOG" > "$WORK/overhead.jsonl" 2>> "$LOG"
cat "$WORK/overhead.jsonl" >> "$LOG"
python3 - "$WORK/overhead.jsonl" > "$WORK/overhead.rows" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
cmp = next((r["comparison"] for r in rows if "comparison" in r), None)
if cmp is None:
    print("overhead|FAIL|no comparison (see log)"); sys.exit()
t = cmp["totals"]
ok = t["hook_reserved"] is not None and t["hook_reserved"] == t["job_reserved"] == t["segments_total"] and t["hook_allocated"] == t["job_allocated"]
print("state totals = job's own|%s|reserved %s / job %s / segments %s; allocated %s / job %s; %s segments, %s blocks" % (
    "ok" if ok else "FAIL", t["hook_reserved"], t["job_reserved"], t["segments_total"], t["hook_allocated"], t["job_allocated"], t["segments"], t["blocks"]))
drift = cmp["drift_pct"] or 0.0
means = cmp.get("means_ms") or {}
print("step means per run|info|%s" % "; ".join("%s: %s ms" % (name, ", ".join("%.2f" % m for m in ms)) for name, ms in means.items()))
for name, budget in (("hook, no viewer", 1.0), ("hook, viewer at 1 s", 1.0), ("hook + history, viewer at 1 s", 5.0)):
    pct = cmp.get(name)
    verdict = "FAIL" if pct is None else "ok" if pct <= budget else "noisy" if pct <= budget + drift else "FAIL"
    print("overhead %s|%s|%s %% of %.2f ms/step (mean) (budget %.0f %%, run-to-run drift %.2f %%)" % (name, verdict, pct, cmp["baseline_ms"] or 0, budget, drift))
for r in rows:
    v = r.get("viewer")
    if v and r.get("mean_step_ms") and v.get("collect_ms_median") is not None:
        # Reads hold the GIL: their share of the job's time, one read per interval (1 s).
        share = 100.0 * v["collect_ms_median"] / 1000.0
        print("collect cost: %s|info|%s states, median %s ms, max %s ms: about %.2f %% of the job's time at 1 s" % (
            r["run"], v.get("states"), v.get("collect_ms_median"), v.get("collect_ms_max"), share))
        shares = sorted(v.get("history_shares") or [])
        if shares:
            # States read while the job starts or holds still say 100 %: the least and the
            # median are what the running steps got.
            print("history share: %s|info|stacks recorded for %.0f %% (least) and %.0f %% (median) of each second, over %d states (idle ones read 100 %%)" % (
                r["run"], 100.0 * shares[0], 100.0 * shares[len(shares) // 2], len(shares)))
PY
while IFS='|' read -r name verdict detail; do result "$name" "$verdict" "$detail"; done < "$WORK/overhead.rows"

fi

if want ab; then
# 1b. History's cost inside one process (history_ab.py: blocks of steps with history off
#     and on), free of the drift between processes, and what the hook's share makes of it.
say "history on/off in one process (history_ab.py)"
timeout 200 python3 "$JOBS/history_ab.py" > "$WORK/ab.json" 2>> "$LOG"
cat "$WORK/ab.json" >> "$LOG"
python3 - "$WORK/ab.json" "${VRAMTOP_HISTORY_RATE:-5000}" > "$WORK/ab.rows" <<'PY'
import json, sys
try:
    r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
except Exception:
    print("history cost in one process|FAIL|history_ab.py printed nothing (see log)"); sys.exit()
rate = float(sys.argv[2])
share = min(1.0, rate / r["allocs_per_s"]) if r["allocs_per_s"] else 1.0
# Recording a share of each second costs that share of full recording's cost.
pct = share * max(r["full_history_pct"], 0.0)
print("history cost in one process|%s|full recording %.2f %% of %.2f ms/step (%.2f us per recorded allocation, %d allocations/s); at %d/s the hook records %.0f %% of each second: about %.2f %% (budget 5 %%)" % (
    "ok" if pct <= 5.0 else "FAIL", r["full_history_pct"], r["off_ms"], r["cost_per_recorded_alloc_us"] or 0, r["allocs_per_s"], rate, 100 * share, pct))
PY
while IFS='|' read -r name verdict detail; do result "$name" "$verdict" "$detail"; done < "$WORK/ab.rows"

fi

if want oom; then
# 2. OOM with memory free under a 10 % cap.
say "oom_cap.py"
hooked oom 0.5 python3 "$JOBS/oom_cap.py" --hold 4
oom_rc=$?
python3 - "$WORK/oom.out" "$WORK/oom.view" "$oom_rc" > "$WORK/oom.rows" <<'PY'
import json, re, sys
MiB = 1 << 20
job = json.loads(next(l for l in open(sys.argv[1]) if l.startswith("{")))
view = json.load(open(sys.argv[2]))
rc = int(sys.argv[3])
if not job.get("oom") or not view.get("ooms"):
    print("oom message|FAIL|job oom=%s, viewer ooms=%s, rc=%s" % (job.get("oom"), len(view.get("ooms", [])), rc)); sys.exit()
o = view["ooms"][-1]
s = o["stats"]
exact = s["allocated_bytes"] == job["allocated"] and s["reserved_bytes"] == job["reserved"]
print("oom: hook state = job's figures|%s|allocated %d / %d, reserved %d / %d" % ("ok" if exact else "FAIL", s["allocated_bytes"], job["allocated"], s["reserved_bytes"], job["reserved"]))
m = re.search(r"(\S+ \S+) is allocated by PyTorch, (?:.*?)and (\S+ \S+) is reserved by PyTorch but unallocated", job["message"])
unit = {"bytes": 1, "KiB": 1024, "MiB": MiB, "GiB": 1 << 30}
def parse(t):
    n, u = t.split(); return float(n) * unit[u]
if m:
    a, r = parse(m.group(1)), parse(m.group(2))
    tol = 0.006 * (1 << 30) if "GiB" in m.group(0) else MiB  # the message rounds to 2 decimals
    close = abs(a - s["allocated_bytes"]) <= tol and abs(r - (s["reserved_bytes"] - s["allocated_bytes"])) <= tol
    same_words = ("%s is allocated by PyTorch" % m.group(1)) in (o["summary"] or "") and ("%s is reserved by PyTorch but unallocated" % m.group(2)) in (o["summary"] or "")
    print("oom: PyTorch's message vs hook|%s|message says %s allocated, %s reserved-unallocated; summary: %s" % ("ok" if close and same_words else "FAIL", m.group(1), m.group(2), o["summary"]))
else:
    print("oom: PyTorch's message vs hook|FAIL|message not understood: %s" % job["message"][:200])
req_ok = o["requested_bytes"] == 1024 * MiB and abs((o["device_total_bytes"] or 0) - job["cap_bytes"]) <= MiB
fr = o["free_runs"]
fits = fr["free_bytes"] + (o["device_total_bytes"] - s["reserved_bytes"]) >= o["requested_bytes"]
print("oom: request, cap, free runs|%s|requested %d, cap %s (job %d), %d free in %d runs, largest %d; expandable would fit: %s; job rc %d" % (
    "ok" if req_ok and rc == 1 else "FAIL", o["requested_bytes"], o["device_total_bytes"], job["cap_bytes"], fr["free_bytes"], fr["runs"], fr["largest"], fits, rc))
PY
while IFS='|' read -r name verdict detail; do result "$name" "$verdict" "$detail"; done < "$WORK/oom.rows"

fi

if want leak; then
# 3. A leak, with history: the site must name leak_list.py's line.
say "leak_list.py with history"
hooked leak 0.5 env VRAMTOP_HISTORY=1 python3 "$JOBS/leak_list.py" --steps 30 --period 0.2
python3 - "$WORK/leak.out" "$WORK/leak.view" > "$WORK/leak.rows" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
truth = lines[0]
view = json.load(open(sys.argv[2]))
want = "%s:%d %s" % (truth["leak_file"], truth["leak_line"], truth["leak_function"])
sites = view.get("sites") or []
top = sites[0] if sites else {"site": None, "bytes_by_state": []}
series = top["bytes_by_state"]
grows = len(series) >= 3 and all(b >= a for a, b in zip(series, series[1:])) and series[-1] > series[0]
first = next((i for i, b in enumerate(series) if b >= 3 * 4 * 1024 * 1024), None)
print("history: leak site|%s|top site %s (want %s); bytes %s; >= 3 leaked tensors from state %s" % (
    "ok" if top["site"] == want and grows else "FAIL", top["site"], want, series[:8] + (["..."] if len(series) > 8 else []), first))
PY
while IFS='|' read -r name verdict detail; do result "$name" "$verdict" "$detail"; done < "$WORK/leak.rows"

fi

if want two; then
# 4. Two hooked processes on one GPU at once: each its own socket and state.
say "two processes"
hooked two_a 0.5 python3 "$JOBS/leak_list.py" --steps 15 &
hooked two_b 0.5 python3 "$JOBS/leak_list.py" --steps 15
wait
python3 - "$WORK/two_a.view" "$WORK/two_b.view" > "$WORK/two.rows" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
pids = {h["pid"] for v in (a, b) for h in v.get("hellos", [])}
ok = a.get("states", 0) > 2 and b.get("states", 0) > 2 and len(pids) == 2
print("two processes, one GPU|%s|%s and %s states from pids %s" % ("ok" if ok else "FAIL", a.get("states"), b.get("states"), sorted(pids)))
PY
while IFS='|' read -r name verdict detail; do result "$name" "$verdict" "$detail"; done < "$WORK/two.rows"

fi

rm -rf "$WORK"
echo
printf '%-34s %-6s %s\n' "check" "result" "detail"
for r in "${RESULTS[@]}"; do echo "$r"; done
