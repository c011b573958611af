#!/usr/bin/env bash
# GPU check of whole jobs (ranks), on the GPU machine (../shared/gpu.md), about 8 minutes:
#  a. `vramtop run -- torchrun --nproc-per-node 2 scripts/gpu/jobs/ddp_ranks.py --one-gpu`
#     (two gloo ranks on cuda:0; rank 1 trains a larger batch and runs out of memory at
#     OOM_AFTER s, caught) in tmux at 200x60; screens at the first holds (>= 20 s), at 40 s,
#     3 s after rank 1's OOM (the view should have gone to rank 1: "rank 1 ... ran out of
#     memory"), after the key 0 and after Tab -> OUTDIR/screen-*.txt;
#  b. `vramtop serve` beside it, /metrics scraped every SCRAPE_EVERY s for SCRAPE_SECONDS s
#     (OUTDIR/metrics/); vramtop_torch_reserved_bytes / _allocated_bytes of each rank
#     compared with the figures the rank printed at its hold (a scrape counts when it falls
#     inside a hold, COMPARE_LAG s or more after the print: the value served may be that
#     old);
#  c. `vramtop --once --json` (OUTDIR/once.json: rank, local_rank, world_size on attached
#     entries) and `vramtop attach --json` for a few seconds (OUTDIR/attach.jsonl);
#  d. the RSS (VmRSS) and CPU ticks (/proc/PID/stat 14+15) of the `vramtop run` process
#     at the first screen and near the end: MiB, and CPU % of a core between them;
#  e. after the ranks: scripts/gpu/jobs/hook_ab.py under `vramtop run` (batch mode), the
#     hook's cost with a viewer at 1 s and 0.1 s (OUTDIR/hook_ab.json).
# usage: scripts/gpu/ranks.sh PATH/TO/vramtop OUTDIR
# Writes everything under OUTDIR (the log is OUTDIR/gpu-job-ranks.log, the results
# "check|verdict|detail" rows (lib.sh) in $VT_ROWS, default OUTDIR/results.txt, the table OUTDIR/summary.txt); prints the table
# last. BUNDLE=FILE.tar.gz also packs OUTDIR into one file (the device tool brings back
# only 8 files: e.g. OUTDIR=/tmp/ranks BUNDLE=$OUT/ranks.tar.gz, then cp the summary).
# env (defaults): RANK_SECONDS 420, OOM_AFTER 60, BATCH0 4, BATCH1 8, PRINT_EVERY 2,
#   HOLD 1.5, SERVE_INTERVAL 0.5, SCRAPE_SECONDS 30, SCRAPE_EVERY 0.5, COMPARE_LAG 0.75,
#   AB_BLOCKS 16, AB_BLOCK_SECONDS 3, AB_VIEWER process, DEADLINE_S 590 (hook_ab.py is skipped when it would
#   end past it: one device command may run 600 s).
set -uo pipefail
. "$(dirname "$0")/lib.sh"
BIN=$(readlink -f "${1:?usage: scripts/gpu/ranks.sh PATH/TO/vramtop OUTDIR}")
OUTDIR=${2:?usage: scripts/gpu/ranks.sh PATH/TO/vramtop OUTDIR}
mkdir -p "$OUTDIR" && OUTDIR=$(cd "$OUTDIR" && pwd) || { echo "cannot use $OUTDIR" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
JOBS="$HERE/jobs"
RANK_SECONDS=${RANK_SECONDS:-420}
OOM_AFTER=${OOM_AFTER:-60}
BATCH0=${BATCH0:-4}
BATCH1=${BATCH1:-8}
PRINT_EVERY=${PRINT_EVERY:-2}
HOLD=${HOLD:-1.5}
SERVE_INTERVAL=${SERVE_INTERVAL:-0.5}
SCRAPE_SECONDS=${SCRAPE_SECONDS:-30}
SCRAPE_EVERY=${SCRAPE_EVERY:-0.5}
COMPARE_LAG=${COMPARE_LAG:-0.75}
AB_BLOCKS=${AB_BLOCKS:-16}
AB_BLOCK_SECONDS=${AB_BLOCK_SECONDS:-3}
# process: the viewer in a child process, as vramtop is; thread: in the job itself.
AB_VIEWER=${AB_VIEWER:-process}
DEADLINE_S=${DEADLINE_S:-590}
LOG="$OUTDIR/gpu-job-ranks.log"
: > "$LOG"
: "${VT_ROWS:=$OUTDIR/results.txt}"
: > "$VT_ROWS"
RANKS="$OUTDIR/ranks"
rm -rf "$RANKS" "$OUTDIR/metrics"
mkdir -p "$RANKS"
# Short paths: a Unix socket's path must stay under ~100 bytes.
WORK=$(mktemp -d /tmp/vtr.XXXXXX)
export VRAMTOP_SOCKET_DIR="$WORK/sock"
mkdir -m 700 -p "$VRAMTOP_SOCKET_DIR"
export PYTHONUNBUFFERED=1
TM=(tmux -L "vtr-$$" -f /dev/null)
SESSION=ranks
declare -a RESULTS
result() {
  RESULTS+=("$(printf '%-40s %-6s %s' "$1" "$2" "$3")")
  vt_row "$1" "$2" "$3" | tee -a "$LOG"
}
say() { echo "== $* (t=$(since) s)" | tee -a "$LOG"; }
LAUNCH=$SECONDS
since() { echo $((SECONDS - LAUNCH)); }
# job_gone: true, 15 s after the launch, once no process of the job is left: no child of
# `vramtop run` (torchrun) and no rank alive by the pid it printed. Waits stop early then.
# (Not pgrep -f: vramtop's own argv and the tmux server's hold the job's command line.)
job_gone() {
  [ $((SECONDS - LAUNCH)) -gt 15 ] || return 1
  [ -n "${VT_PID:-}" ] && pgrep -P "$VT_PID" > /dev/null 2>&1 && return 1
  local pid
  for pid in $(cat "$RANKS"/rank-*.jsonl 2>/dev/null | grep -o '"pid": [0-9]*' | awk '{print $2}' | sort -u); do
    [ -d "/proc/$pid" ] && return 1
  done
  return 0
}
# wait_until T: sleep until T seconds after the job's launch, or until the job is gone.
wait_until() {
  while [ $((SECONDS - LAUNCH)) -lt "$1" ]; do
    job_gone && { echo "the job is gone (t=$(since) s)" >> "$LOG"; return 0; }
    sleep 1
  done
}
# wait_grep FILE PATTERN SECONDS: true once FILE has a line matching PATTERN; false after
# SECONDS, or as soon as the job is gone.
wait_grep() {
  local deadline=$((SECONDS + $3))
  while [ $SECONDS -lt $deadline ]; do
    grep -q -- "$2" "$1" 2>/dev/null && return 0
    job_gone && break
    sleep 0.5
  done
  grep -q -- "$2" "$1" 2>/dev/null
}
SERVE_PID=""; SCRAPER_PID=""
cleanup() {
  for p in $SCRAPER_PID $SERVE_PID; do kill "$p" 2>/dev/null; done
  "${TM[@]}" kill-server 2>/dev/null
  # vramtop leaves a job running when it is stopped: end the ranks (and their launcher)
  # by the pids they printed, only while those pids are still ddp_ranks.py's.
  local pid ppid
  for pid in $(cat "$RANKS"/rank-*.jsonl 2>/dev/null | python3 -c 'import json,sys
for l in sys.stdin:
    try: print(json.loads(l)["pid"])
    except Exception: pass' 2>/dev/null | sort -u); do
    if { tr '\0' ' ' < "/proc/$pid/cmdline"; } 2>/dev/null | grep -q ddp_ranks.py; then
      ppid=$(awk '{print $4}' "/proc/$pid/stat" 2>/dev/null)
      kill "$pid" 2>/dev/null
      if [ -n "$ppid" ] && { tr '\0' ' ' < "/proc/$ppid/cmdline"; } 2>/dev/null | grep -q 'torchrun\|torch.distributed.run'; then
        kill "$ppid" 2>/dev/null
      fi
    fi
  done
  rm -rf "$WORK"
}
trap cleanup EXIT

# /proc figures of a process: "RSS_KiB CPU_TICKS EPOCH_S", or nothing when it is gone.
proc_sample() {
  local rss ticks
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null) || return 0
  # Fields after "pid (comm) ": state is $1, so utime (14) is $12 and stime (15) is $13.
  ticks=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | awk '{print $12 + $13}') || return 0
  [ -n "$rss" ] && [ -n "$ticks" ] && echo "$rss $ticks $(date +%s.%N)"
}

# The python helpers, written once.
cat > "$WORK/scrape.py" <<'PY'
"""Scrape URL every EVERY s for SECONDS s into DIR/scrape-NNN.prom, with DIR/index.jsonl."""
import json, os, sys, time, urllib.request
url, out, seconds, every = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
os.makedirs(out, exist_ok=True)
index = open(os.path.join(out, "index.jsonl"), "w", buffering=1)
ready = time.time() + 20
while time.time() < ready:  # serve takes a moment to listen
    try:
        urllib.request.urlopen(url, timeout=2).read()
        break
    except Exception:
        time.sleep(0.25)
end, n = time.time() + seconds, 0
while time.time() < end:
    t0 = time.time()
    try:
        body, status = urllib.request.urlopen(url, timeout=5).read().decode("utf-8", "replace"), "ok"
    except Exception as err:
        body, status = "", repr(err)
    t1 = time.time()
    name = "scrape-%03d.prom" % n
    with open(os.path.join(out, name), "w") as f:
        f.write(body)
    index.write(json.dumps({"n": n, "file": name, "t0": t0, "t1": t1, "status": status}) + "\n")
    n += 1
    time.sleep(max(0.0, every - (time.time() - t0)))
PY
cat > "$WORK/compare.py" <<'PY'
"""Each rank's vramtop_torch_reserved_bytes / _allocated_bytes in the scrapes against the
figures the rank printed at its holds. Prints "rank R|verdict|detail" lines."""
import glob, json, os, re, sys
metrics, ranks_dir, hold, lag = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
SERIES = re.compile(r'^(vramtop_torch_\w+)\{(.*)\}\s+(\S+)')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
prints, pid_rank = {}, {}
for path in glob.glob(os.path.join(ranks_dir, "rank-*.jsonl")):
    for line in open(path):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        pid_rank[str(r.get("pid"))] = r.get("rank")
        if "hold_s" in r:
            prints.setdefault(r["rank"], []).append(r)
for p in prints.values():
    p.sort(key=lambda r: r["time"])
scrapes = []
try:
    index = [json.loads(l) for l in open(os.path.join(metrics, "index.jsonl")) if l.strip()]
except OSError:
    index = []
names = set()
for entry in index:
    seen = {}
    try:
        text = open(os.path.join(metrics, entry["file"])).read()
    except OSError:
        continue
    for line in text.splitlines():
        m = SERIES.match(line)
        if not m:
            continue
        names.add(m.group(1))
        kind = {"vramtop_torch_reserved_bytes": "reserved", "vramtop_torch_allocated_bytes": "allocated"}.get(m.group(1))
        if kind is None:
            continue
        labels = dict(LABEL.findall(m.group(2)))
        rank = labels.get("rank", "")
        rank = int(rank) if rank.isdigit() else pid_rank.get(labels.get("pid"))
        if rank is None:
            continue
        seen.setdefault(rank, {})[kind] = int(round(float(m.group(3))))
    scrapes.append(((entry["t0"] + entry["t1"]) / 2, seen))
if not index:
    print("all|FAIL|no scrapes (see serve.out)"); sys.exit()
if not names:
    print("all|FAIL|%d scrapes, no vramtop_torch_* series in any" % len(index)); sys.exit()
for rank in sorted(set(prints) | {r for _, s in scrapes for r in s}):
    mine = prints.get(rank, [])
    with_series = in_window = equal = any_equal = 0
    bad = []
    for t, seen in scrapes:
        got = seen.get(rank)
        if not got or "reserved" not in got or "allocated" not in got:
            continue
        with_series += 1
        pair = (got["reserved"], got["allocated"])
        if any(abs(p["time"] - t) <= 3.0 and (p["reserved"], p["allocated"]) == pair for p in mine):
            any_equal += 1
        held = [p for p in mine if p["time"] + lag <= t <= p["time"] + hold]
        if held:
            in_window += 1
            p = held[-1]
            if (p["reserved"], p["allocated"]) == pair:
                equal += 1
            elif len(bad) < 3:
                bad.append("at +%.2f s served %d/%d, printed %d/%d" % (t - p["time"], pair[0], pair[1], p["reserved"], p["allocated"]))
    detail = ("%d scrapes with its series, %d inside a hold (>= %.2f s after the print): %d equal; "
              "%d equal a print within 3 s; %d prints" % (with_series, in_window, lag, equal, any_equal, len(mine)))
    if bad:
        detail += "; differ: " + "; ".join(bad)
    verdict = "ok" if in_window and equal == in_window else ("FAIL" if in_window else "n/a")
    print("rank %s|%s|%s" % (rank, verdict, detail))
PY

say "machine"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
  "$BIN" --version; } >> "$LOG" 2>&1
"$BIN" attach --help > "$OUTDIR/attach-help.txt" 2>&1
"$BIN" serve --help > "$OUTDIR/serve-help.txt" 2>&1
if command -v torchrun > /dev/null; then TORCHRUN=(torchrun); else TORCHRUN=(python3 -m torch.distributed.run); fi

# a. The job in a 200x60 terminal.
JOB=("$BIN" run --log "$OUTDIR/job.log" -- "${TORCHRUN[@]}" --nproc-per-node 2 "$JOBS/ddp_ranks.py" --one-gpu
     --seconds "$RANK_SECONDS" --oom-rank 1 --oom-after "$OOM_AFTER" --batch0 "$BATCH0" --batch1 "$BATCH1"
     --print-every "$PRINT_EVERY" --hold "$HOLD" --log-dir "$RANKS")
cmd="exec env VRAMTOP_SOCKET_DIR=$(printf '%q' "$VRAMTOP_SOCKET_DIR") PYTHONUNBUFFERED=1 $(printf '%q ' "${JOB[@]}")"
echo "command: $cmd" >> "$LOG"
LAUNCH=$SECONDS
say "vramtop run -- torchrun (2 ranks, gloo, cuda:0)"
if ! "${TM[@]}" new-session -d -s "$SESSION" -x 200 -y 60 "$cmd" 2>> "$LOG"; then
  result "vramtop run in tmux" FAIL "tmux new-session failed (see log)"
fi
"${TM[@]}" set-option -t "$SESSION" remain-on-exit on > /dev/null 2>&1
# The pane's process is vramtop itself (the shell execs env, env execs vramtop).
VT_PID=$("${TM[@]}" display-message -p -t "$SESSION" '#{pane_pid}' 2>/dev/null)

capture() {
  local f="$OUTDIR/screen-$1.txt"
  if timeout 10 "${TM[@]}" capture-pane -p -t "$SESSION" > "$f" 2>> "$LOG"; then
    echo "screen $1 at t=$(since) s -> $f" >> "$LOG"
  else
    echo "screen $1: capture failed at t=$(since) s" | tee -a "$LOG"
  fi
  local dead
  dead=$("${TM[@]}" display-message -p -t "$SESSION" '#{pane_dead} #{pane_dead_status}' 2>/dev/null)
  [ "${dead%% *}" = 1 ] && echo "screen $1: vramtop has exited (status ${dead#* })" | tee -a "$LOG"
  return 0
}
# grep_screen NAME PATTERN: how many lines of the screen match (extended regex).
grep_screen() { grep -c -E -- "$2" "$OUTDIR/screen-$1.txt" 2>/dev/null || true; }

# First screen: once both ranks have held once, and no sooner than 20 s.
wait_grep "$RANKS/rank-0.jsonl" '"hold_s"' 150
wait_grep "$RANKS/rank-1.jsonl" '"hold_s"' 30
wait_until 20
capture 1-first
START_SAMPLE=$(proc_sample "${VT_PID:-0}")
START_T=$(since)
echo "vramtop run (pid ${VT_PID:-?}, $(readlink "/proc/${VT_PID:-0}/exe" 2>/dev/null)) at t=$START_T s: ${START_SAMPLE:-gone} (RSS KiB, ticks, time)" >> "$LOG"
r0=$(grep_screen 1-first 'rank 0|▶ ?0 '); r1=$(grep_screen 1-first 'rank 1| 1 +[0-9]+ ')
grank=$(grep_screen 1-first '[0-9]+ ranks'); first_sel=$(grep_screen 1-first '▶ ?0 ')
# The job opens on rank 0 (no key pressed): the OOM check below then shows the view moved.
if [ "${r0:-0}" -gt 0 ] && [ "${r1:-0}" -gt 0 ] && [ "${first_sel:-0}" -gt 0 ]; then v=ok; else v=MISS; fi
result "first screen shows both ranks" "$v" "lines with rank 0: ${r0:-0}, rank 1: ${r1:-0}, 'N ranks': ${grank:-0}, row marker on 0: ${first_sel:-0} (screen-1-first.txt, t=$START_T s)"

# b. serve beside it, scraped.
say "serve /metrics"
PORT=${SERVE_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
timeout $((SCRAPE_SECONDS + 90)) "$BIN" serve --listen "127.0.0.1:$PORT" --interval "$SERVE_INTERVAL" > "$OUTDIR/serve.out" 2>&1 &
SERVE_PID=$!
timeout $((SCRAPE_SECONDS + 60)) python3 "$WORK/scrape.py" "http://127.0.0.1:$PORT/metrics" "$OUTDIR/metrics" "$SCRAPE_SECONDS" "$SCRAPE_EVERY" >> "$LOG" 2>&1 &
SCRAPER_PID=$!

wait_until 40
capture 2-40s

# c. --once --json and attach, while both ranks train.
say "--once --json, attach --json"
timeout 60 "$BIN" --once --json > "$OUTDIR/once.json" 2>> "$LOG"
echo "--once --json rc=$?" >> "$LOG"
timeout 30 "$BIN" attach --json --seconds 5 --interval 1 > "$OUTDIR/attach.jsonl" 2>> "$LOG"
echo "attach --json rc=$?" >> "$LOG"
line=$(python3 - "$OUTDIR/once.json" <<'PY'
import json, sys
try:
    jobs = json.load(open(sys.argv[1])).get("attached", [])
except Exception as err:
    print("FAIL could not read once.json: %r" % (err,)); sys.exit()
rows = [(j.get("pid"), j.get("rank"), j.get("local_rank"), j.get("world_size"), j.get("states")) for j in jobs]
ranked = {r[1] for r in rows if r[1] is not None}
ok = {0, 1} <= ranked and all(r[3] == 2 for r in rows if r[1] is not None)
print("ok" if ok else "FAIL", "attached (pid, rank, local_rank, world_size, states): %s" % rows)
PY
)
result "--once --json: rank fields" "${line%% *}" "${line#* }"
line=$(python3 - "$OUTDIR/attach.jsonl" <<'PY'
import json, sys
lines = []
for l in open(sys.argv[1]):
    try:
        lines.append(json.loads(l))
    except ValueError:
        pass
if not lines:
    print("FAIL no JSON lines"); sys.exit()
last = lines[-1].get("attached", [])
ranks = sorted({j.get("rank") for j in last if j.get("rank") is not None})
print("ok" if ranks == [0, 1] else "FAIL", "%d lines; last: ranks %s, pids %s" % (len(lines), ranks, sorted(j.get("pid") for j in last)))
PY
)
result "attach --json: ranks" "${line%% *}" "${line#* }"

# a (cont.). The OOM of rank 1, then the keys 0 and Tab.
say "waiting for rank 1's OOM"
if wait_grep "$RANKS/rank-1.jsonl" '"oom": true' $((OOM_AFTER + 90)); then
  oom_seen="rank 1 printed its OOM at t=$(since) s"
else
  oom_seen="rank 1 printed no OOM by t=$(since) s"
fi
echo "$oom_seen" >> "$LOG"
sleep 3
capture 3-oom
ran=$(grep_screen 3-oom 'rank 1.*ran out of memory'); sel=$(grep_screen 3-oom '▶ ?1 ')
if [ "${ran:-0}" -gt 0 ] && [ "${sel:-0}" -gt 0 ]; then v=ok; else v=MISS; fi
result "OOM followed to rank 1" "$v" "'rank 1 ... ran out of memory' lines: ${ran:-0}, row marker on 1: ${sel:-0}; $oom_seen (screen-3-oom.txt)"
timeout 5 "${TM[@]}" send-keys -t "$SESSION" 0; sleep 2
capture 4-key0
timeout 5 "${TM[@]}" send-keys -t "$SESSION" Tab; sleep 2
capture 5-tab
k0=$(grep_screen 4-key0 '▶ ?0 '); kt=$(grep_screen 5-tab '▶ ?1 ')
result "keys 0 and Tab" info "row marker on 0 after '0': ${k0:-0}; on 1 after Tab: ${kt:-0} (screen-4-key0.txt, screen-5-tab.txt)"

# b (cont.). The scrapes against the ranks' holds.
wait "$SCRAPER_PID" 2>/dev/null; SCRAPER_PID=""
kill "$SERVE_PID" 2>/dev/null; wait "$SERVE_PID" 2>/dev/null; SERVE_PID=""
say "serve vs the ranks' own figures"
python3 "$WORK/compare.py" "$OUTDIR/metrics" "$RANKS" "$HOLD" "$COMPARE_LAG" > "$WORK/compare.txt" 2>> "$LOG"
while IFS='|' read -r who verdict detail; do
  result "serve = rank's figures: $who" "$verdict" "$detail"
done < "$WORK/compare.txt"
[ -s "$WORK/compare.txt" ] || result "serve = rank's figures" FAIL "the comparison printed nothing (see log)"

# d. vramtop's own RSS and CPU, near the end of the run.
wait_until $((RANK_SECONDS - 20))
capture 6-late
END_SAMPLE=$(proc_sample "${VT_PID:-0}")
END_T=$(since)
echo "vramtop run at t=$END_T s: ${END_SAMPLE:-gone}" >> "$LOG"
if [ -n "${START_SAMPLE:-}" ] && [ -n "${END_SAMPLE:-}" ]; then
  line=$(python3 - "$START_SAMPLE" "$END_SAMPLE" "$START_T" "$END_T" "$(getconf CLK_TCK)" <<'PY'
import sys
(rss0, ticks0, t0), (rss1, ticks1, t1) = [[float(x) for x in a.split()] for a in sys.argv[1:3]]
hz, dt = float(sys.argv[5]), t1 - t0
cpu = 100.0 * (ticks1 - ticks0) / hz / dt if dt > 0 else float("nan")
print("RSS %.1f MiB at t=%s s, %.1f MiB at t=%s s; CPU %.3f %% of a core over %.0f s (%d ticks)"
      % (rss0 / 1024, sys.argv[3], rss1 / 1024, sys.argv[4], cpu, dt, ticks1 - ticks0))
PY
)
  result "vramtop run: RSS and CPU" info "$line"
else
  result "vramtop run: RSS and CPU" FAIL "no /proc sample (start '${START_SAMPLE:-}', end '${END_SAMPLE:-}'; pid ${VT_PID:-?})"
fi

# The ranks' end, then vramtop's (q exits once the job has ended).
say "waiting for the ranks to end"
wait_grep "$RANKS/rank-0.jsonl" '"final": true' $((RANK_SECONDS + 90 - $(since)))
wait_grep "$RANKS/rank-1.jsonl" '"final": true' 20
sleep 2
capture 7-ended
finals=$(cat "$RANKS"/rank-*.jsonl 2>/dev/null | grep -c '"final": true')
result "ranks ran to the end" "$([ "${finals:-0}" -ge 2 ] && echo ok || echo FAIL)" "final lines: ${finals:-0} of 2 (rank logs in ranks/, job output in job.log)"
timeout 5 "${TM[@]}" send-keys -t "$SESSION" q; sleep 2
timeout 5 "${TM[@]}" send-keys -t "$SESSION" q; sleep 1
"${TM[@]}" kill-server 2>/dev/null

# e. The hook's own cost, in one process, with a viewer at 1 s and 0.1 s.
say "hook_ab.py (hook cost, viewer at 1 s and 0.1 s)"
need=$((60 + (AB_BLOCKS + 2) * AB_BLOCK_SECONDS * 3 / 2))
left=$((DEADLINE_S - SECONDS))
if [ "$left" -lt "$need" ]; then
  result "hook cost (hook_ab.py)" skip "${left} s left of DEADLINE_S, about ${need} s needed"
else
  timeout "$left" "$BIN" run --quiet -- python3 "$JOBS/hook_ab.py" --blocks "$AB_BLOCKS" --block-seconds "$AB_BLOCK_SECONDS" --viewer "$AB_VIEWER" \
    > "$OUTDIR/hook_ab.json" 2> "$OUTDIR/hook_ab.err"
  echo "hook_ab.py rc=$?" >> "$LOG"
  line=$(python3 - "$OUTDIR/hook_ab.json" <<'PY'
import json, sys
rows = []
for l in open(sys.argv[1]):
    if l.startswith("{"):
        try:
            rows.append(json.loads(l))
        except ValueError:
            pass
if not rows or "conditions" not in rows[-1]:
    print("FAIL %s" % (rows[-1].get("error") if rows else "no JSON line (see hook_ab.err)")); sys.exit()
r = rows[-1]
parts = []
for c in ("1s", "0.1s"):
    e = r["conditions"][c]
    ci = e["pair_diff"].get("ci95")
    parts.append("%s: %+.2f %% (pairs %s, 95 %% %s; goal %s %%: %s), %d states, collect %s ms" % (
        c, e["diff_pct"], e["pair_diff"].get("mean"), ci, e["goal_pct"],
        "met" if e["goal_met"] else "MISSED", e["states"], e["collect_ms"].get("median")))
ok = r["viewer_received"] and r["goals_met"]
print("ok" if ok else "FAIL", "; ".join(parts) + "; off %.3f ms/step" % r["per_step_ms"]["off"]
      + ("" if r["viewer_received"] else "; the viewer received no states in a condition"))
PY
)
  result "hook cost (hook_ab.py)" "${line%% *}" "${line#* }"
fi

echo
echo "check                                    result details"
printf '%s\n' "${RESULTS[@]}" | tee "$OUTDIR/summary.txt"
if [ -n "${BUNDLE:-}" ]; then
  tar -czf "$BUNDLE" -C "$OUTDIR" . 2>> "$LOG" && echo "bundle: $BUNDLE"
fi
