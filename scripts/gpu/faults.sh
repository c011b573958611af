#!/usr/bin/env bash
# vramtop where monitors break, on a machine with an NVIDIA GPU: run as non-root, inside a
# PID namespace, with a hung NVML call, with a CUDA_VISIBLE_DEVICES or --gpu that names no
# GPU, with a job SIGKILLed mid-poll, and a soak of the live view. Each case is judged
# beside nvidia-smi's ground truth and printed as one table row.
#
# usage: scripts/gpu/faults.sh PATH/TO/vramtop [STALL_SO|-] [SOAK_SECONDS]
#   STALL_SO      a prebuilt scripts/gpu/faults/nvml_stall.c, used when this machine has no C
#                 compiler ("-" or empty: build it here with cc)
#   SOAK_SECONDS  length of the soak (default 120; the issue's full soak is 600)
# env:  FAULT_CASES  the cases to run, by name (default all): nonroot ns stall missing kill soak
# Run as root (the non-root case drops to uid 65534 with setpriv; the namespace case uses
# unshare). Logs, screens included, go to $OUT/gpu-faults.log (default ./gpu-check-out).
# Its rows ("case|result|details", lib.sh) go to $VT_ROWS (default $OUT/faults-rows.txt),
# which gpu-check.sh reads.
# Takes device memory with plain allocations only (PyTorch, or vramtop's cuda probes).
set -uo pipefail
. "$(dirname "$0")/lib.sh"
BIN_IN=$(readlink -f "${1:?usage: scripts/gpu/faults.sh PATH/TO/vramtop [STALL_SO|-] [SOAK_SECONDS]}")
STALL_SO_IN=${2:-}
[ "$STALL_SO_IN" = - ] && STALL_SO_IN=""
SOAK_S=${3:-120}
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
LOG="$OUT/gpu-faults.log"
: > "$LOG"
: "${VT_ROWS:=$OUT/faults-rows.txt}"
: > "$VT_ROWS"
WORK=$(mktemp -d)
VERDICT="python3 $HERE/faults/verdict.py"
if ! [[ "$SOAK_S" =~ ^[0-9]+$ ]] || [ "$SOAK_S" -lt 20 ]; then
  echo "faults.sh: SOAK_SECONDS must be a whole number of seconds, 20 or more (got '$SOAK_S')" >&2
  exit 2
fi

for name in ${FAULT_CASES:-}; do
  [[ " nonroot ns stall missing kill soak " == *" $name "* ]] || { echo "$(basename "$0"): unknown name '$name' in FAULT_CASES; names: nonroot ns stall missing kill soak" >&2; exit 2; }
done

# The binary must be readable and runnable by nobody (uid 65534): a copy in its own folder.
TDIR=$(mktemp -d /tmp/vramtop-faults.XXXXXX)
chmod 755 "$TDIR"
BIN="$TDIR/vramtop"
cp "$BIN_IN" "$BIN" && chmod 755 "$BIN"

declare -a RESULTS
declare -a JOBS
result() {
  RESULTS+=("$(printf '%-34s %-5s %s' "$1" "$2" "$3")")
  vt_row "$1" "$2" "$3" >> "$LOG"
}
say() { echo "== $*" >> "$LOG"; }
# FAULT_CASES picks cases by name (default all), so the 10-minute soak can have a run of its own.
want() { [ -z "${FAULT_CASES:-}" ] || [[ " $FAULT_CASES " == *" $1 "* ]]; }
log_file() { { echo "-- $1"; cat "$2" 2>/dev/null; echo; } >> "$LOG"; }
cleanup() {
  # Jobs started in command substitutions are not ours to `wait`; their pids are listed.
  for p in "${JOBS[@]}" $(cat "$WORK/jobs.pids" 2>/dev/null); do kill "$p" 2>/dev/null; done
  tmux -L vtfaults kill-server 2>/dev/null
  rm -rf "$WORK" "$TDIR"
}
trap cleanup EXIT
TMUX_="tmux -L vtfaults"

smi_gpu() { nvidia-smi -i 0 --query-gpu=memory.used,memory.total,memory.reserved --format=csv,noheader,nounits > "$1"; }
smi_apps() { nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits > "$1"; }
smi_has_pid() { nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -qw "$1"; }

# A job holding MIB of device memory for SECONDS: PyTorch when it imports, else a vramtop
# cuda probe. Prints its pid once nvidia-smi lists it (empty on failure).
HAVE_TORCH=$(python3 -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)
hold_job() {
  local mib=$1 seconds=$2 tag=$3 pid
  if [ "$HAVE_TORCH" = 1 ]; then
    python3 -c "import torch, time
x = torch.empty($mib << 20, dtype=torch.uint8, device='cuda'); x.fill_(1); torch.cuda.synchronize()
time.sleep($seconds)" >> "$LOG" 2>&1 &
  else
    "$BIN" probe steady --backing cuda --probe-limit "${mib}MiB" --hold "$seconds" --json > "$WORK/$tag.json" 2>> "$LOG" &
  fi
  pid=$!
  echo "$pid" >> "$WORK/jobs.pids"
  for _ in $(seq 120); do
    smi_has_pid "$pid" && { sleep 1; echo "$pid"; return; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  echo ""
}

# One screen of the TUI running in tmux session $1, into the log under title $2.
screen() { $TMUX_ capture-pane -p -t "$1" > "$WORK/screen.txt" 2>/dev/null; log_file "$2" "$WORK/screen.txt"; }

say "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$LOG" 2>&1
echo "torch: $HAVE_TORCH; kernel $(uname -r)" >> "$LOG"

if want nonroot; then
# 1. Non-root: root's job holds memory; vramtop runs as nobody.
say "non-root"
job=$(hold_job 2048 60 nonroot-job)
if [ -z "$job" ]; then
  result "non-root: device rows, hidden memory" FAIL "root's job did not start (see log)"
else
  setpriv --reuid=65534 --regid=65534 --clear-groups "$BIN" --once --json --device nvml \
    > "$WORK/nonroot.json" 2> "$WORK/nonroot.err"
  rc=$?
  smi_gpu "$WORK/smi-gpu.csv"; smi_apps "$WORK/smi-apps.csv"
  log_file "vramtop as nobody (rc $rc)" "$WORK/nonroot.json"; log_file "stderr" "$WORK/nonroot.err"
  log_file "nvidia-smi apps" "$WORK/smi-apps.csv"
  v=$($VERDICT nonroot "$WORK/nonroot.json" "$WORK/smi-gpu.csv" "$WORK/smi-apps.csv" "$job")
  [ "$rc" = 0 ] || v="FAIL exit $rc: $(head -c 300 "$WORK/nonroot.err")"
  # The live view as nobody shows the unattributed figure.
  $TMUX_ new-session -d -s nr -x 160 -y 40 "exec setpriv --reuid=65534 --regid=65534 --clear-groups $BIN --device nvml --interval 0.5"
  sleep 3; screen nr "live view as nobody"
  $TMUX_ send-keys -t nr q 2>/dev/null; sleep 1
  seen=$(grep -o 'unattributed [0-9.]* [KMGT]*i*B' "$WORK/screen.txt" | head -n 1)
  result "non-root: device rows, hidden memory" "${v%% *}" "${v#* }; screen: ${seen:-no unattributed figure}"

  # 1b. The same with /proc mounted hidepid=invisible (a fresh proc instance in a private
  # mount namespace, so the machine's /proc is untouched): root's job is invisible to nobody.
  say "non-root with hidepid"
  if unshare --mount --propagation private sh -c "mount -t proc -o hidepid=invisible proc /proc && exec setpriv --reuid=65534 --regid=65534 --clear-groups $BIN --once --json --device nvml" \
      > "$WORK/hidepid.json" 2> "$WORK/hidepid.err"; then
    smi_apps "$WORK/smi-apps.csv"
    log_file "vramtop as nobody, hidepid" "$WORK/hidepid.json"
    v=$($VERDICT hidepid "$WORK/hidepid.json" "$WORK/smi-apps.csv" "$job")
    result "non-root, /proc hidepid=invisible" "${v%% *}" "${v#* }"
  else
    result "non-root, /proc hidepid=invisible" info "could not mount proc with hidepid: $(head -c 200 "$WORK/hidepid.err")"
  fi
  kill "$job" 2>/dev/null
fi

fi

if want ns; then
# 2. A new PID namespace: a job outside, a job inside, vramtop inside.
say "pid namespace"
outside=$(hold_job 1024 90 outside-job)
if [ -z "$outside" ]; then
  result "pid namespace: outside + inside jobs" FAIL "the outside job did not start"
else
  rm -f "$WORK/ns.done"
  unshare --pid --fork --mount-proc bash -c '
    "$0" probe steady --backing cuda --probe-limit 1GiB --hold 60 --json > "$1/inside-job.json" 2>&1 &
    job=$!
    echo "$job" > "$1/inside.nspid"
    for _ in $(seq 120); do [ -s "$1/inside-job.json" ] && break; sleep 0.5; done
    sleep 2
    "$0" --once --json --device nvml > "$1/ns-once.json" 2> "$1/ns-once.err"
    touch "$1/ns.done"
    sleep 8
    kill "$job" 2>/dev/null; wait' "$BIN" "$WORK" >> "$LOG" 2>&1 &
  nsjob=$!
  JOBS+=("$nsjob")
  for _ in $(seq 120); do [ -e "$WORK/ns.done" ] && break; sleep 0.5; done
  smi_gpu "$WORK/smi-gpu.csv"; smi_apps "$WORK/smi-apps.csv"
  nspid=$(cat "$WORK/inside.nspid" 2>/dev/null)
  # The inside job's pid out here: the GPU process whose NSpid ends in its namespace pid.
  inside_host=""
  while IFS=, read -r pid _; do
    ns=$(awk '/^NSpid:/ {print $NF, NF}' "/proc/$pid/status" 2>/dev/null)
    [ "${ns% *}" = "$nspid" ] && [ "${ns#* }" -ge 3 ] && inside_host=$pid
  done < "$WORK/smi-apps.csv"
  log_file "vramtop inside the namespace" "$WORK/ns-once.json"; log_file "stderr" "$WORK/ns-once.err"
  log_file "nvidia-smi apps (outside $outside, inside ns pid $nspid = host pid ${inside_host:-?})" "$WORK/smi-apps.csv"
  if [ -e "$WORK/ns.done" ] && [ -n "$inside_host" ]; then
    v=$($VERDICT namespace "$WORK/ns-once.json" "$WORK/smi-gpu.csv" "$WORK/smi-apps.csv" "$outside" "$inside_host" "$nspid")
  else
    v="FAIL the inside job or vramtop did not run (ns pid ${nspid:-?}, host pid ${inside_host:-?})"
  fi
  result "pid namespace: outside + inside jobs" "${v%% *}" "${v#* }"
  kill "$outside" "$nsjob" 2>/dev/null; wait "$nsjob" 2>/dev/null
fi

fi

if want stall; then
# 3. A hung driver call: nvmlDeviceGetMemoryInfo_v2 stalls 10 s once (nvml_stall.c says
#    how the interposer reaches calls that nvml-wrapper resolves with dlopen/dlsym).
say "hung NVML call"
STALL_SO=""
if command -v cc >/dev/null; then
  cc -shared -fPIC -O2 -Wl,-soname,libnvidia-ml.so.1 -o "$WORK/nvml_stall.so" "$HERE/faults/nvml_stall.c" -ldl >> "$LOG" 2>&1 \
    && STALL_SO="$WORK/nvml_stall.so"
fi
[ -z "$STALL_SO" ] && [ -n "$STALL_SO_IN" ] && [ -r "$STALL_SO_IN" ] && STALL_SO=$(readlink -f "$STALL_SO_IN")
# The real library: $VRAMTOP_REAL_NVML, else where ldconfig or the usual folders have it.
REAL_NVML=${VRAMTOP_REAL_NVML:-$(ldconfig -p 2>/dev/null | awk '/libnvidia-ml\.so\.1 .*x86-64/ {print $NF; exit}')}
[ -z "$REAL_NVML" ] && for f in /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 /usr/lib64/libnvidia-ml.so.1; do [ -e "$f" ] && REAL_NVML=$f && break; done
if [ -z "$STALL_SO" ] || [ -z "$REAL_NVML" ]; then
  result "hung NVML call: keys, STALE, recovery" SKIP "no interposer (no cc here and no STALL_SO given) or no libnvidia-ml.so.1 (${REAL_NVML:-none})"
else
  stall_env="LD_PRELOAD=$STALL_SO NVML_STALL_REAL=$REAL_NVML NVML_STALL_AFTER=10 NVML_STALL_SECONDS=10"
  : > "$WORK/stall.mark"
  $TMUX_ new-session -d -s st -x 140 -y 40 "exec env $stall_env NVML_STALL_MARK=$WORK/stall.mark $BIN --device nvml --interval 0.2"
  for _ in $(seq 80); do grep -q "stall begin" "$WORK/stall.mark" && break; sleep 0.25; done
  sleep 3; screen st "during the stall (3 s in)"; stale_during=$(grep -c STALE "$WORK/screen.txt")
  $TMUX_ send-keys -t st '?' 2>/dev/null; sleep 0.7; screen st "'?' pressed during the stall"
  help_during=$(grep -c "show / hide help" "$WORK/screen.txt")
  $TMUX_ send-keys -t st Escape 2>/dev/null
  for _ in $(seq 80); do grep -q "stall end" "$WORK/stall.mark" && break; sleep 0.25; done
  sleep 1.5; screen st "1.5 s after the stall"; stale_after=$(grep -c STALE "$WORK/screen.txt")
  smi_gpu "$WORK/smi-gpu.csv"
  shown=$(grep -o 'used [0-9.]* [KMGT]*i*B' "$WORK/screen.txt" | head -n 1)
  log_file "stall marks" "$WORK/stall.mark"
  $TMUX_ send-keys -t st q 2>/dev/null; sleep 1
  # And quitting while the call is still hung: the UI must not wait for the driver.
  : > "$WORK/stall2.mark"
  $TMUX_ new-session -d -s st2 -x 140 -y 40 "exec env $stall_env NVML_STALL_MARK=$WORK/stall2.mark $BIN --device nvml --interval 0.2"
  for _ in $(seq 80); do grep -q "stall begin" "$WORK/stall2.mark" && break; sleep 0.25; done
  sleep 1; $TMUX_ send-keys -t st2 q 2>/dev/null; sleep 1.5
  if $TMUX_ has-session -t st2 2>/dev/null; then quit_during=no; $TMUX_ kill-session -t st2; else quit_during=yes; fi
  detail="STALE shown during: $stale_during, help opened during: $help_during, STALE after: $stale_after, quit during the stall: $quit_during; after: ${shown:-?} (smi used $(cut -d, -f1 "$WORK/smi-gpu.csv") MiB)"
  if [ "$stale_during" -ge 1 ] && [ "$help_during" -ge 1 ] && [ "$stale_after" = 0 ] && [ "$quit_during" = yes ]; then
    result "hung NVML call: keys, STALE, recovery" ok "$detail"
  else
    result "hung NVML call: keys, STALE, recovery" FAIL "$detail"
  fi
fi

fi

if want missing; then
# 4. A GPU CUDA cannot see: CUDA_VISIBLE_DEVICES naming none, and --gpu past the last one.
say "missing GPUs"
count=$(nvidia-smi -L | grep -c '^GPU ')
one_line_case() { # name, expected needle, command...
  local name=$1 needle=$2; shift 2
  "$@" > "$WORK/case.out" 2> "$WORK/case.err"
  local rc=$? lines
  lines=$(grep -c . "$WORK/case.err")
  log_file "$name (rc $rc)" "$WORK/case.err"
  if [ "$rc" = 2 ] && [ "$lines" = 1 ] && grep -q -- "$needle" "$WORK/case.err" && [ ! -s "$WORK/case.out" ]; then
    result "$name" ok "exit 2, one line: $(head -c 200 "$WORK/case.err")"
  else
    result "$name" FAIL "exit $rc, $lines line(s): $(head -c 200 "$WORK/case.err")"
  fi
}
one_line_case "CUDA_VISIBLE_DEVICES=99 cuda probe" "CUDA_VISIBLE_DEVICES" \
  env CUDA_VISIBLE_DEVICES=99 "$BIN" probe checkerboard --backing cuda --seconds 5 --json
one_line_case "--gpu $count (smi: $count GPU) cuda probe" "--gpu 0 to" \
  "$BIN" probe checkerboard --backing cuda --gpu "$count" --seconds 5 --json
# NVML does not read CUDA_VISIBLE_DEVICES: the monitor still shows every GPU.
env CUDA_VISIBLE_DEVICES=99 "$BIN" --once --json --device nvml > "$WORK/cvd.json" 2>> "$LOG"
n=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["devices"]))' "$WORK/cvd.json" 2>/dev/null || echo "?")
result "CUDA_VISIBLE_DEVICES=99 monitor" "$([ "$n" = "$count" ] && echo ok || echo FAIL)" "--once lists $n device(s); nvidia-smi $count"

fi

if want kill; then
# 5. A job SIGKILLed while vramtop polls every 0.05 s: no error, its row goes.
say "job killed mid-poll"
victim=$(hold_job 1024 60 victim)
if [ -z "$victim" ]; then
  result "job SIGKILLed mid-poll" FAIL "the job did not start"
else
  $TMUX_ new-session -d -s kp -x 160 -y 40 "exec $BIN --device nvml --interval 0.05"
  for _ in $(seq 40); do $TMUX_ capture-pane -p -t kp | grep -qw "$victim" && break; sleep 0.25; done
  screen kp "before the kill"; before=$(grep -cw "$victim" "$WORK/screen.txt")
  kill -9 "$victim"
  for _ in $(seq 40); do smi_has_pid "$victim" || break; sleep 0.25; done
  sleep 1; screen kp "1 s after the kill"
  after=$(grep -cw "$victim" "$WORK/screen.txt")
  errors=$(grep -ciE "error|panic|stale" "$WORK/screen.txt")
  smi_apps "$WORK/smi-apps.csv"; smi_left=$(grep -cw "$victim" "$WORK/smi-apps.csv")
  $TMUX_ send-keys -t kp q 2>/dev/null; sleep 1
  if $TMUX_ has-session -t kp 2>/dev/null; then alive_quit=no; $TMUX_ kill-session -t kp; else alive_quit=yes; fi
  detail="row before: $before, after: $after (smi lists it: $smi_left), error/STALE lines: $errors, quit on q: $alive_quit"
  if [ "$before" -ge 1 ] && [ "$after" = 0 ] && [ "$errors" = 0 ] && [ "$alive_quit" = yes ]; then
    result "job SIGKILLed mid-poll" ok "$detail"
  else
    result "job SIGKILLed mid-poll" FAIL "$detail"
  fi
fi

fi

if want soak; then
# 6. Soak: the live view at 0.1 s with a cuda probe churning inside it, RSS every 10 s;
#    a headless probe of the same churn beside it counts verification mismatches.
say "soak ${SOAK_S} s"
ops=1000
cat > "$WORK/soak.toml" <<EOF
name = "soak"
summary = "Churn for the whole soak: allocate and free blocks of 512 B to 8 MiB at random."

[[phase]]
kind = "churn"
caption = "Churn ${SOAK_S} s"
tag = "soak"
count = $((SOAK_S * ops))
size = ["512B", "8MiB"]
max_live = 200
EOF
$TMUX_ new-session -d -s soak -x 160 -y 45 "exec $BIN --device nvml --interval 0.1 --probe $WORK/soak.toml --backing cuda --probe-limit 1GiB --ops-per-s $ops"
sleep 2
tuipid=$($TMUX_ list-panes -t soak -F '#{pane_pid}' 2>/dev/null | head -n 1)
"$BIN" probe "$WORK/soak.toml" --backing cuda --probe-limit 1GiB --seconds "$SOAK_S" --json > "$WORK/soak-headless.json" 2>> "$LOG" &
headless=$!
JOBS+=("$headless")
series=""
for t in $(seq 0 10 "$SOAK_S"); do
  rss=$(awk '/^VmRSS:/ {printf "%.1f", $2/1024}' "/proc/$tuipid/status" 2>/dev/null)
  series="$series${series:+ }${t}s:${rss:-gone}"
  [ "$t" -lt "$SOAK_S" ] && sleep 10
done
screen soak "live view at the end of the soak"
mismatch_screen=$(grep -c "VERIFY MISMATCHES" "$WORK/screen.txt")
probe_shown=$(grep -c "probe soak" "$WORK/screen.txt")
$TMUX_ send-keys -t soak q 2>/dev/null; sleep 1
wait "$headless"; hrc=$?
hm=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["verify_mismatches"], r["verified_blocks"])' "$WORK/soak-headless.json" 2>/dev/null || echo "? ?")
read -r mism verified <<< "$hm"
# Flat: the last sample within 10 % (and 4 MiB) of the one at 20 s, after warm-up.
flat=$(echo "$series" | tr ' ' '\n' | awk -F: '$1=="20s"{a=$2} {b=$2} END {d=b-a; if (a=="" || b=="gone") print "?"; else print ((d <= a*0.1 || d <= 4) ? "yes" : "no")}')
detail="RSS MiB ${series}; flat: $flat; TUI probe on screen: $probe_shown, mismatches on screen: $mismatch_screen; headless probe rc $hrc, $mism mismatched words in $verified verified blocks"
if [ "$flat" = yes ] && [ "$probe_shown" -ge 1 ] && [ "$mismatch_screen" = 0 ] && [ "$hrc" = 0 ] && [ "$mism" = 0 ] && [ "${verified:-0}" != 0 ]; then
  result "soak ${SOAK_S} s at 0.1 s, cuda churn" ok "$detail"
else
  result "soak ${SOAK_S} s at 0.1 s, cuda churn" FAIL "$detail"
fi

fi

echo
echo "fault case                         result details"
printf '%s\n' "${RESULTS[@]}" | tee -a "$LOG"
