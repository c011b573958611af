#!/usr/bin/env bash
# CPU share of a terminal program over N seconds under a pseudo-terminal of 200x60,
# as in ../shared/anchors.md: user+system ticks from /proc/PID/stat (fields 14 and 15)
# before and after, divided by the wall time. Prints "PERCENT_OF_ONE_CORE PEAK_RSS_KB".
# usage: scripts/gpu/cpu-share.sh SECONDS COMMAND...
set -euo pipefail
secs=$1; shift
cmd="stty cols 200 rows 60; exec $*"
# Standard input is a pipe that stays open and silent: no keystrokes arrive.
(sleep $((secs + 30)) | script -q -c "$cmd" /dev/null >/dev/null 2>&1) &
wrapper=$!
# Find the program itself: the newest process whose command line starts with our command.
target=""
for _ in $(seq 50); do
  sleep 0.1
  target=$(pgrep -n -f -- "^$*\$" || true)
  [ -n "$target" ] && break
done
[ -n "$target" ] || { echo "could not find the process of: $*" >&2; kill $wrapper 2>/dev/null; exit 1; }
sleep 2   # let start-up finish: we measure steady state
ticks() { awk '{ s = $0; sub(/^.*\) /, "", s); split(s, f, " "); print f[12] + f[13] }' "/proc/$target/stat"; }
hz=$(getconf CLK_TCK)
t0=$(ticks); s0=$(date +%s.%N)
sleep "$secs"
t1=$(ticks); s1=$(date +%s.%N)
rss=$(awk '/VmHWM/ {print $2}' "/proc/$target/status")
kill -TERM "$target" 2>/dev/null || true
sleep 0.3; kill $wrapper 2>/dev/null || true
echo "$t0 $t1 $s0 $s1 $hz $rss" | awk '{ printf "%.3f %d\n", ($2-$1)/$5/($4-$3)*100, $6 }'
