#!/usr/bin/env bash
# GPU checks of live attach, through the vramtop binary: real PyTorch jobs started with
# `vramtop run` (stdout not a terminal: passthrough), watched headless with
# `vramtop attach --json` (one JSON line per interval, as `--once --json`'s `attached`).
# Job scripts: scripts/gpu/jobs/ (the hook's checks share them).
# usage: scripts/gpu/attach.sh PATH/TO/vramtop
# Writes $OUT/gpu-attach.log (default ./gpu-attach-out) and the results as
# "check|verdict|detail" rows (lib.sh) in $VT_ROWS, default $OUT/gpu-attach-results.txt;
# prints a table last.
# env: ATTACH_CHECKS  the checks to run, by name (default all): gpt2 oom leak ranks cpu
# Checks: (1) GPT-2 training: vramtop's totals, read off the segments and from the hook's
# stats, equal memory_reserved()/memory_allocated() read in the job while it holds still;
# (2) an OOM under set_per_process_memory_fraction(0.1): vramtop's free/allocated agree
# with PyTorch's message and figures within 1 MiB, and expandable segments would fit;
# (3) a list that grows each step, with --history: the leak suspect names the right
# file:line; (4) two ranks under torchrun on one GPU: both hooked; (5) vramtop's CPU
# share (live TUI at 1 s, 200x60) while a hooked job runs.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
BIN=$(readlink -f "${1:?usage: scripts/gpu/attach.sh PATH/TO/vramtop}")
HERE=$(cd "$(dirname "$0")" && pwd)
JOBS="$HERE/jobs"
OUT=${OUT:-$PWD/gpu-attach-out}
mkdir -p "$OUT"
LOG="$OUT/gpu-attach.log"
: > "$LOG"
: "${VT_ROWS:=$OUT/gpu-attach-results.txt}"
: > "$VT_ROWS"
WORK=$(mktemp -d)
declare -a RESULTS
result() {
  RESULTS+=("$(printf '%-40s %-6s %s' "$1" "$2" "$3")")
  vt_row "$1" "$2" "$3" | tee -a "$LOG"
}
say() { echo "== $*" | tee -a "$LOG"; }
# ATTACH_CHECKS picks checks by name (default all), for a short rerun of one.
want() { [ -z "${ATTACH_CHECKS:-}" ] || [[ " $ATTACH_CHECKS " == *" $1 "* ]]; }
for name in ${ATTACH_CHECKS:-}; do
  [[ " gpt2 oom leak ranks cpu " == *" $name "* ]] || { echo "$(basename "$0"): unknown name '$name' in ATTACH_CHECKS; names: gpt2 oom leak ranks cpu" >&2; exit 2; }
done

# Runs `vramtop run [FLAGS] -- python3 JOB ARGS` with `vramtop attach --json` beside it.
# usage: watched NAME "RUN FLAGS" JOB ARGS...   -> $WORK/NAME.out (job), NAME.jsonl (attach)
watched() {
  local name=$1 flags=$2; shift 2
  export VRAMTOP_SOCKET_DIR="$WORK/sock-$name"
  mkdir -m 700 -p "$VRAMTOP_SOCKET_DIR"
  timeout 200 "$BIN" attach --json --interval "${LEAK_INTERVAL:-1}" --seconds 180 --until-ended \
    > "$WORK/$name.jsonl" 2>> "$LOG" &
  local watcher=$!
  # shellcheck disable=SC2086
  timeout 180 "$BIN" run $flags -- "$@" > "$WORK/$name.out" 2> "$WORK/$name.err"
  local rc=$?
  wait $watcher
  { echo "-- $name: rc=$rc"; tail -n 5 "$WORK/$name.out"; echo "-- stderr"; tail -n 20 "$WORK/$name.err";
    echo "-- attach (last line)"; tail -n 1 "$WORK/$name.jsonl" | cut -c1-4000; } >> "$LOG"
  unset VRAMTOP_SOCKET_DIR
  return $rc
}

say "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$LOG" 2>&1
python3 -c 'import torch; print("torch", torch.__version__)' >> "$LOG" 2>&1

if want gpt2; then
# 1. GPT-2 training loop: totals.
say "gpt2 totals"
watched gpt2 "" python3 "$JOBS/train_gpt2.py" --steps 40 --hold 5
line=$(python3 - "$WORK/gpt2.out" "$WORK/gpt2.jsonl" <<'PY'
import json, sys
final = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{") and '"final"' in l]
lines = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
jobs = [j for l in lines for j in l["attached"] if j["states"] > 0]
if not final or not jobs:
    print("FAIL no final line or no attached state"); sys.exit()
f = final[-1]; last = jobs[-1]
seg = (last["reserved_bytes"], last["allocated_bytes"])
hook = (last["stats"]["reserved_bytes"], last["stats"]["allocated_bytes"])
ok = seg == (f["reserved"], f["allocated"]) and hook == seg
print(("ok" if ok else "FAIL"),
      f"job reserved {f['reserved']} allocated {f['allocated']}; vramtop segments {seg[0]} {seg[1]},"
      f" hook stats {hook[0]} {hook[1]}; {last['segments']} segments, {last['blocks']} blocks, torch {last['torch_version']}")
PY
)
result "gpt2: totals = memory_reserved/allocated" "${line%% *}" "${line#* }"

fi

if want oom; then
# 2. OOM under a 10 % cap.
say "oom under a cap"
watched oom "" python3 "$JOBS/oom_cap.py" --hold 4
line=$(python3 - "$WORK/oom.out" "$WORK/oom.jsonl" <<'PY'
import json, re, sys
MiB = 1 << 20
rep = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
lines = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
ooms = [j["last_oom"] for l in lines for j in l["attached"] if j.get("last_oom")]
if not rep or not rep[-1].get("oom") or not ooms:
    print("FAIL the job did not OOM, or vramtop saw no oom"); sys.exit()
r = rep[-1]; o = ooms[-1]
unit = {"KiB": 1 << 10, "MiB": MiB, "GiB": 1 << 30}
def fig(pattern):
    m = re.search(r"([\d.]+) (KiB|MiB|GiB) " + pattern, r["message"])
    return (float(m.group(1)) * unit[m.group(2)], m.group(2)) if m else (None, None)
msg_alloc, a_unit = fig("is allocated by PyTorch")
msg_free, f_unit = fig("is reserved by PyTorch but unallocated")
exact_free = r["reserved"] - r["allocated"]
checks = [abs(o["free_bytes"] - exact_free) <= MiB, abs(o["allocated_bytes"] - r["allocated"]) <= MiB]
# The message rounds to 2 decimals of its unit.
if msg_free is not None: checks.append(abs(o["free_bytes"] - msg_free) <= max(MiB, 0.005 * unit[f_unit]))
if msg_alloc is not None: checks.append(abs(o["allocated_bytes"] - msg_alloc) <= max(MiB, 0.005 * unit[a_unit]))
checks.append(o["expandable"]["would_fit"])
print("ok" if all(checks) else "FAIL",
      f"vramtop: {o['line']} | {o['expandable_line']} | job: allocated {r['allocated']}, reserved-but-unallocated {exact_free}; checks {checks}")
PY
)
result "oom: line vs PyTorch (1 MiB), expandable" "${line%% *}" "${line#* }"

fi

if want leak; then
# 3. A leak, with --history.
say "leak with --history"
LEAK_INTERVAL=0.25 watched leak "--history" python3 "$JOBS/leak_list.py" --steps 60 --period 0.25
line=$(python3 - "$WORK/leak.out" "$WORK/leak.jsonl" <<'PY'
import json, sys
head = [json.loads(l) for l in open(sys.argv[1]) if '"leak_line"' in l]
lines = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
if not head:
    print("FAIL the job printed no leak line"); sys.exit()
want = f'{head[0]["leak_file"]}:{head[0]["leak_line"]}'
first = None
for n, l in enumerate(lines):
    for j in l["attached"]:
        tags = [s["tag"] for s in j["leak_suspects"]]
        if tags and first is None:
            first = (n, tags, j["states"])
if first is None:
    print(f"FAIL no suspect; wanted {want}"); sys.exit()
n, tags, states = first
steps = [r["step"] for r in (json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")) if "step" in r]
print("ok" if tags[0].startswith(want) else "FAIL",
      f"first suspect after {states} states at 0.25 s ({len(steps)} steps in all): {tags[0]}; wanted {want}")
PY
)
result "leak: suspect at file:line (--history)" "${line%% *}" "${line#* }"

fi

if want ranks; then
# 4. Two ranks on one GPU under torchrun: both hooked, children of the launcher.
say "torchrun, two ranks"
watched ranks "" python3 -m torch.distributed.run --nproc-per-node 2 "$JOBS/leak_list.py" --steps 20 --period 0.25
line=$(python3 - "$WORK/ranks.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
pids = {}
for l in lines:
    for j in l["attached"]:
        if j["states"] > 0: pids[j["pid"]] = j["ppid"]
ok = len(pids) >= 2 and len(set(pids.values())) == 1
print("ok" if ok else "FAIL", f"hooked ranks with states: {sorted(pids)} (parents {sorted(set(pids.values()))})")
PY
)
result "torchrun: both ranks attached" "${line%% *}" "${line#* }"

fi

if want cpu; then
# 5. vramtop's CPU share: `vramtop run` in a 200x60 terminal at 1 s, the job selected and
#    its block map drawn, measured from /proc over 30 s (the job's own CPU not counted).
say "cpu share with an attached job"
export VRAMTOP_SOCKET_DIR="$WORK/sock-cpu"; mkdir -m 700 -p "$VRAMTOP_SOCKET_DIR"
( sleep 25; "$BIN" --once --json > "$WORK/cpu-once.json" 2>/dev/null ) &
share=$("$HERE/cpu-share.sh" 30 "$BIN" run --log "$WORK/cpu-job.log" -- python3 "$JOBS/train_gpt2.py" --steps 3000 --hold 1 2>> "$LOG")
wait
# vramtop leaves a job running when it is stopped: stop the job by the pid it attached to.
python3 - "$WORK/cpu-once.json" > "$WORK/cpu-pids" <<'PY'
import json, sys
try:
    for j in json.load(open(sys.argv[1])).get("attached", []): print(j["pid"], j["states"])
except Exception: pass
PY
while read -r pid states; do kill "$pid" 2>/dev/null; done < "$WORK/cpu-pids"
unset VRAMTOP_SOCKET_DIR
attached=$(awk '$2 > 0' "$WORK/cpu-pids" | wc -l)
echo "cpu share: $share (percent of a core, peak RSS KiB); attached jobs with states: $attached" >> "$LOG"
if [ "$attached" -ge 1 ]; then
  result "cpu share, vramtop run + attached job" info "${share%% *} % of a core at 1 s (nvtop's bar: 0.85 %), peak RSS ${share#* } KiB"
else
  result "cpu share, vramtop run + attached job" FAIL "no attached job seen (share ${share:-?})"
fi

fi

echo
echo "check                                    result details"
printf '%s\n' "${RESULTS[@]}"
