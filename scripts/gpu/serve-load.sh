#!/usr/bin/env bash
# vramtop serve under load on the GPU machine (NVML telemetry, an otherwise idle host):
# RSS before and after 100,000 scrapes over 16 keep-alive connections, and the latency of
# fresh scrapes while 500 clients scrape and 200 slowloris clients hold half-sent requests.
# usage: scripts/gpu/serve-load.sh PATH/TO/vramtop PATH/TO/serve_load
#   serve_load is `cargo build --release --example serve_load` (target/release/examples/).
# Writes $OUT/gpu-check-serve-load.log; its last line is "serve load: ok|FAIL|skipped ...".
set -uo pipefail
BIN=${1:?usage: scripts/gpu/serve-load.sh PATH/TO/vramtop PATH/TO/serve_load}
LOADER=${2:-}
OUT=${OUT:-$PWD}
LOG="$OUT/gpu-check-serve-load.log"
if [ -z "$LOADER" ] || [ ! -x "$LOADER" ]; then
  echo "serve load: skipped (no serve_load binary; build it with cargo build --release --example serve_load)" | tee "$LOG"
  exit 0
fi
if "$LOADER" "$BIN" 100000 16 nvml > "$LOG" 2>&1; then
  status=ok
else
  status=FAIL
fi
rss=$(grep -o 'RSS before [0-9]* KiB, after [0-9]* KiB ([+-][0-9]* KiB)' "$LOG" | head -n 1)
rate=$(grep -o '([0-9]*/s)' "$LOG" | head -n 1)
siege=$(grep -o '[0-9]* of 20 answered, median [0-9.]* ms, max [0-9.]* ms' "$LOG" | head -n 1)
echo "serve load: $status 100k scrapes $rate; $rss; under 500 busy + 200 slowloris: $siege" | tee -a "$LOG"
