#!/usr/bin/env bash
# Issue 15 on a GPU machine: the monitor beside nvtop and nvidia-smi.
#   - a busy PyTorch process (20 GiB held, matrix products, leaking 8 MiB/s) throughout;
#   - the live screen at 200x60 in tmux, and nvtop's beside it when nvtop is installed;
#   - `--once` wall time beside nvidia-smi's, 10 runs each, min and median; one
#     `--once --timings` breakdown;
#   - the CUDA checkerboard compare screen (caching vs expandable) at 200x60;
#   - CPU share at 1 s and 0.1 s beside nvtop's, in the same 20 s;
#   - with two GPUs: the 2-device screen, and a probe on the second GPU.
# usage: scripts/gpu/monitor.sh PATH/TO/vramtop
# Everything goes to one file, $OUT/monitor.log; its rows ("check|status|detail", lib.sh)
# to $VT_ROWS (default $OUT/monitor-rows.txt), which gpu-check.sh reads.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
BIN=$(readlink -f "${1:?usage: scripts/gpu/monitor.sh PATH/TO/vramtop}")
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
LOG="$OUT/monitor.log"
: > "$LOG"
WORK=$(mktemp -d)
: "${VT_ROWS:=$OUT/monitor-rows.txt}"
: > "$VT_ROWS"
row() { vt_row "$1" "$2" "$3" >> "$LOG"; }
say() { echo "== $*" >> "$LOG"; }

# The busy process: holds 20 GiB, runs matrix products, leaks 8 MiB a second.
cat > "$WORK/busy.py" <<'PY'
import sys, time, torch
dev = torch.device("cuda:0")
hold = torch.empty(20 << 30, dtype=torch.uint8, device=dev)
a = torch.randn(4096, 4096, device=dev)
leak, end, next_leak = [], time.time() + float(sys.argv[1]), time.time()
print("ready", flush=True)
while time.time() < end:
    for _ in range(4):
        b = a @ a
    torch.cuda.synchronize()
    if time.time() >= next_leak:
        leak.append(torch.empty(8 << 20, dtype=torch.uint8, device=dev))
        next_leak += 1.0
    time.sleep(0.02)
PY
say "busy process: 20 GiB held, matmuls, +8 MiB/s"
python3 "$WORK/busy.py" 240 > "$WORK/busy.out" 2>> "$LOG" &
busy=$!
for _ in $(seq 120); do grep -q ready "$WORK/busy.out" 2>/dev/null && break; sleep 0.5; done
if grep -q ready "$WORK/busy.out"; then row "busy PyTorch process" info "pid $busy holds 20 GiB"
else row "busy PyTorch process" FAIL "did not start (see monitor.log)"; fi
sleep 5   # a few samples of trend before the screens

NVTOP=$(command -v nvtop || true)
if [ -n "$NVTOP" ]; then say "nvtop: $NVTOP ($(nvtop --version 2>&1 | head -n 1))"
else say "nvtop: not installed on this machine"; fi

# 1. --once wall time beside nvidia-smi, 10 runs each.
say "--once wall time, 10 runs each"
python3 - "$BIN" >> "$WORK/once-times.txt" 2>> "$LOG" <<'PY'
import statistics, subprocess, sys, time
binary = sys.argv[1]
def runs(cmd, n=10):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append((time.perf_counter() - t) * 1e3)
    return min(times), statistics.median(times)
for name, cmd in [
    ("nvidia-smi", ["nvidia-smi"]),
    ("vramtop --once", [binary, "--once", "--device", "nvml"]),
    ("vramtop --once --json", [binary, "--once", "--json", "--device", "nvml"]),
    ("vramtop --once --all-fields", [binary, "--once", "--all-fields", "--device", "nvml"]),
]:
    lo, med = runs(cmd)
    print(f"{name}|{lo:.1f}|{med:.1f}")
PY
cat "$WORK/once-times.txt" >> "$LOG"
smi_med=$(awk -F'|' '$1=="nvidia-smi" {print $3}' "$WORK/once-times.txt")
smi_min=$(awk -F'|' '$1=="nvidia-smi" {print $2}' "$WORK/once-times.txt")
vt_med=$(awk -F'|' '$1=="vramtop --once" {print $3}' "$WORK/once-times.txt")
vt_min=$(awk -F'|' '$1=="vramtop --once" {print $2}' "$WORK/once-times.txt")
full_med=$(awk -F'|' '$1=="vramtop --once --all-fields" {print $3}' "$WORK/once-times.txt")
if [ -n "$smi_med" ] && [ -n "$vt_med" ]; then
  status=$(awk -v a="$vt_med" -v b="$smi_med" 'BEGIN {print (a <= b) ? "ok" : "MISS"}')
  row "--once wall vs nvidia-smi (10 runs)" "$status" "vramtop min ${vt_min} median ${vt_med} ms; nvidia-smi min ${smi_min} median ${smi_med} ms; --all-fields median ${full_med} ms"
else
  row "--once wall vs nvidia-smi (10 runs)" FAIL "no timings (see monitor.log)"
fi
say "--once --timings"
"$BIN" --once --timings --device nvml > /dev/null 2>> "$LOG"

# 2. The live screen at 200x60 with the busy process, beside nvtop's.
say "live screen 200x60"
if command -v tmux > /dev/null; then
  vt_tmux new-session -d -s mon -x 200 -y 60 "$BIN --device nvml --interval 0.5"
  [ -n "$NVTOP" ] && vt_tmux new-session -d -s nvt -x 200 -y 60 "$NVTOP"
  sleep 12
  vt_tmux capture-pane -p -t mon > "$WORK/screen-vramtop.txt"
  [ -n "$NVTOP" ] && vt_tmux capture-pane -p -t nvt > "$WORK/screen-nvtop.txt"
  # The filter and the sort keys on the live screen: / python Enter, then s (next column).
  vt_tmux send-keys -t mon / p y t h o n Enter; sleep 1.5
  vt_tmux capture-pane -p -t mon > "$WORK/screen-filter.txt"
  vt_tmux send-keys -t mon q; sleep 1
  vt_tmux_end
  { echo "--- vramtop 200x60"; cat "$WORK/screen-vramtop.txt";
    echo "--- vramtop 200x60, filter 'python'"; cat "$WORK/screen-filter.txt";
    if [ -n "$NVTOP" ]; then echo "--- nvtop 200x60"; cat "$WORK/screen-nvtop.txt";
    else echo "--- nvtop: not installed"; fi; } >> "$LOG"
  checks=0
  grep -q "memory: used" "$WORK/screen-vramtop.txt" && checks=$((checks + 1))
  grep -q "now" "$WORK/screen-vramtop.txt" && checks=$((checks + 1))
  grep -q " $busy " "$WORK/screen-vramtop.txt" && checks=$((checks + 1))
  grep -q "allocator" "$WORK/screen-vramtop.txt" && checks=$((checks + 1))
  grep -q "filter 'python'" "$WORK/screen-filter.txt" && checks=$((checks + 1))
  proc_rows=$(grep -c "python" "$WORK/screen-vramtop.txt")
  if [ $checks = 5 ]; then
    row "live screen 200x60 (charts, busy pid, filter)" ok "charts with time axis, pid $busy listed, filter shown; nvtop ${NVTOP:+captured}${NVTOP:-not installed}"
  else
    row "live screen 200x60 (charts, busy pid, filter)" FAIL "$checks of 5 marks found (see monitor.log); python rows: $proc_rows"
  fi
else
  row "live screen 200x60" FAIL "tmux not installed"
fi

# 3. The CUDA checkerboard compare screen: the default size must show holes as on host.
say "checkerboard compare on cuda, 200x60"
if command -v tmux > /dev/null; then
  vt_tmux new-session -d -s cmp -x 200 -y 60 "$BIN --probe checkerboard --compare caching,expandable --backing cuda --ops-per-s 400"
  sleep 12
  vt_tmux capture-pane -p -t cmp > "$WORK/screen-compare.txt"
  vt_tmux send-keys -t cmp q; sleep 1; vt_tmux_end
  { echo "--- compare screen"; cat "$WORK/screen-compare.txt"; } >> "$LOG"
  free_cells=$(grep "█" "$WORK/screen-compare.txt" | grep -o "·" | wc -l)
  scale=$(grep -o "1 cell = [0-9.]* [KMG]iB" "$WORK/screen-compare.txt" | head -n 1)
  if grep -q "cuda 512.0 MiB" "$WORK/screen-compare.txt" && [ "$free_cells" -gt 20 ]; then
    row "checkerboard compare on cuda (default size)" ok "cuda 512 MiB, ${scale:-scale?}, $free_cells free cells visible"
  else
    row "checkerboard compare on cuda (default size)" FAIL "${scale:-no scale}, $free_cells free cells (see monitor.log)"
  fi
fi

# 4. CPU share at 1 s and 0.1 s beside nvtop, in the same 20 s, busy process present.
say "CPU share over 20 s, 200x60 pty"
"$HERE/cpu-share.sh" 20 "$BIN" --interval 1 --device nvml > "$WORK/cpu-vt-1.txt" 2>> "$LOG" &
p1=$!
"$HERE/cpu-share.sh" 20 "$BIN" --interval 0.1 --device nvml > "$WORK/cpu-vt-01.txt" 2>> "$LOG" &
p2=$!
if [ -n "$NVTOP" ]; then
  "$HERE/cpu-share.sh" 20 "$NVTOP" -d 10 > "$WORK/cpu-nvtop-1.txt" 2>> "$LOG" &
  p3=$!
  "$HERE/cpu-share.sh" 20 "$NVTOP" -d 1 > "$WORK/cpu-nvtop-01.txt" 2>> "$LOG" &
  p4=$!
  wait $p3 $p4
fi
wait $p1 $p2
cpu() { awk '{printf "%.3f %%, RSS %d MB", $1, $2/1024}' "$1" 2>/dev/null; }
nv1=$( [ -n "$NVTOP" ] && cpu "$WORK/cpu-nvtop-1.txt" || echo "nvtop not installed")
nv01=$( [ -n "$NVTOP" ] && cpu "$WORK/cpu-nvtop-01.txt" || echo "nvtop not installed")
row "CPU at 1 s (target <= 0.35 %)" "$(awk '{print ($1 <= 0.35) ? "ok" : "MISS"}' "$WORK/cpu-vt-1.txt")" "vramtop $(cpu "$WORK/cpu-vt-1.txt"); nvtop $nv1"
row "CPU at 0.1 s (target <= 1.6 %)" "$(awk '{print ($1 <= 1.6) ? "ok" : "MISS"}' "$WORK/cpu-vt-01.txt")" "vramtop $(cpu "$WORK/cpu-vt-01.txt"); nvtop $nv01"

# 5. Two GPUs: the 2-device screen and a probe on the second GPU.
gpus=$(nvidia-smi -L | grep -c "^GPU")
if [ "$gpus" -ge 2 ] && command -v tmux > /dev/null; then
  say "two GPUs"
  CUDA_VISIBLE_DEVICES=1 "$BIN" probe checkerboard --backing cuda --hold 15 --json > "$WORK/probe-gpu1.json" 2>> "$LOG" &
  second=$!
  sleep 5
  vt_tmux new-session -d -s two -x 200 -y 60 "$BIN --device nvml"
  sleep 5
  vt_tmux capture-pane -p -t two > "$WORK/screen-2gpu.txt"
  vt_tmux send-keys -t two q; sleep 1; vt_tmux_end
  { echo "--- 2-GPU screen"; cat "$WORK/screen-2gpu.txt"; } >> "$LOG"
  uuid1=$(nvidia-smi --query-gpu=index,uuid --format=csv,noheader | awk -F', ' '$1==1 {print $2}')
  on1=$(nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader | awk -F', ' -v p=$second -v u="$uuid1" '$1==p && $2==u' | wc -l)
  wait $second
  if grep -q "gpu1" "$WORK/screen-2gpu.txt" && [ "$on1" -ge 1 ]; then
    row "2 GPUs: screen and a probe on GPU 1" ok "both devices drawn; probe pid $second on GPU 1"
  else
    row "2 GPUs: screen and a probe on GPU 1" FAIL "gpu1 on screen: $(grep -c gpu1 "$WORK/screen-2gpu.txt"), probe on GPU 1: $on1"
  fi
else
  say "one GPU here: 2-device checks skipped"
  row "2 GPUs" info "skipped: $gpus GPU(s) on this machine"
fi

kill $busy 2> /dev/null; wait $busy 2> /dev/null
rm -rf "$WORK"
