#!/usr/bin/env bash
# `vramtop serve --device nvml` against nvidia-smi, on a machine with an NVIDIA GPU.
# usage: scripts/gpu/serve.sh PATH/TO/vramtop    (logs go to $OUT, or ./gpu-check-out)
# Prints one line: "serve vs nvidia-smi: ok|FAIL ...". Exit 0 when ok, 1 otherwise.
# Memory used, total and reserved must agree within 2 MiB on every GPU.
set -uo pipefail
BIN=$(readlink -f "${1:?usage: scripts/gpu/serve.sh PATH/TO/vramtop}")
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
LOG="$OUT/gpu-check-serve.log"
: > "$LOG"

fail() { echo "serve vs nvidia-smi: FAIL $*" | tee -a "$LOG"; exit 1; }

# Port 0: the kernel picks a free loopback port; serve prints which.
"$BIN" serve --device nvml --listen 127.0.0.1:0 2> "$OUT/serve.err" &
serve=$!
trap 'kill "$serve" 2>/dev/null; wait "$serve" 2>/dev/null' EXIT

addr=""
for _ in $(seq 150); do
  addr=$(sed -n 's#.*listening on http://\([^/]*\)/.*#\1#p' "$OUT/serve.err")
  [ -n "$addr" ] && break
  kill -0 "$serve" 2>/dev/null || break
  sleep 0.1
done
cat "$OUT/serve.err" >> "$LOG"
[ -n "$addr" ] || fail "serve did not start: $(tail -n 1 "$OUT/serve.err")"

# The first poll answers within a second; until then /metrics is 503.
ok=""
for _ in $(seq 20); do
  if curl -sf "http://$addr/metrics" > "$OUT/serve-metrics.txt"; then ok=1; break; fi
  sleep 0.5
done
[ -n "$ok" ] || fail "no /metrics from http://$addr"
nvidia-smi --query-gpu=index,memory.used,memory.total,memory.reserved --format=csv,noheader,nounits \
  > "$OUT/serve-smi.csv" 2>> "$LOG" || fail "nvidia-smi failed"
cat "$OUT/serve-metrics.txt" "$OUT/serve-smi.csv" >> "$LOG"

line=$(python3 - "$OUT/serve-metrics.txt" "$OUT/serve-smi.csv" <<'PY'
import re, sys
series = {}
for line in open(sys.argv[1]):
    m = re.match(r'(vramtop_memory_(used|total|reserved)_bytes)\{([^}]*)\} (\S+)$', line.strip())
    if m:
        gpu = re.search(r'gpu="(\d+)"', m.group(3)).group(1)
        series[(int(gpu), m.group(2))] = int(float(m.group(4))) >> 20
problems, shown = [], []
for row in open(sys.argv[2]):
    if not row.strip():
        continue
    idx, used, total, reserved = [int(x.strip()) for x in row.split(",")]
    for what, smi in (("used", used), ("total", total), ("reserved", reserved)):
        ours = series.get((idx, what))
        shown.append(f"gpu{idx} {what} {ours}/{smi}")
        if ours is None or abs(ours - smi) > 2:
            problems.append(f"gpu{idx} {what}")
verdict = "FAIL" if problems or not shown else "ok"
print(verdict, ", ".join(shown) + " MiB (serve/nvidia-smi)" + (f"; off: {', '.join(problems)}" if problems else ""))
PY
) || line="FAIL could not compare (see $LOG)"
echo "serve vs nvidia-smi: $line" | tee -a "$LOG"
[ "${line%% *}" = ok ]
