#!/usr/bin/env bash
# Coverage-guided fuzzing of vramtop's readers (cargo-fuzz, libFuzzer), one target after
# another for a fixed time each.
#
# usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#   SECONDS_PER_TARGET  default 60; the issue's full run is 1200 (20 minutes) each
#   TARGET              default all: pickle pytorch rmm record scenario story remote
# env:  FUZZ_SANITIZER  address|none (default none: about twice the executions per second;
#                       the readers are safe Rust, so what is looked for is panics,
#                       overflows, stack overflows, hangs and memory blow-ups)
#       FUZZ_JOBS       parallel libFuzzer workers per target (default 1)
#       FUZZ_LOG        where the summary rows go (default fuzz/fuzz-summary.txt)
#       FUZZ_TIMEOUT    seconds one input may take before it counts as a hang (default 10;
#                       raise it when the machine is busy: a starved fuzzer reports its
#                       slowest ordinary inputs as hangs, and libFuzzer stops at the first)
#
# Needs `cargo +nightly` and cargo-fuzz (`cargo install cargo-fuzz --locked`).
# The corpus lives in fuzz/corpus/TARGET (git-ignored), seeded from fuzz/seeds/TARGET,
# assets/ and the real traces in tests/fixtures (or $VRAMTOP_TRACES). A crash leaves
# its input in fuzz/artifacts/TARGET/ and makes this script exit 1; keep each one as a
# regression test under tests/ (beside tests/reader_limits.rs).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SECONDS_EACH=${1:-60}
shift || true
ALL=(pickle pytorch rmm record scenario story remote)
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=("${ALL[@]}")
SANITIZER=${FUZZ_SANITIZER:-none}
JOBS=${FUZZ_JOBS:-1}
SUMMARY=${FUZZ_LOG:-$ROOT/fuzz/fuzz-summary.txt}
TIMEOUT=${FUZZ_TIMEOUT:-10}

if ! [[ "$SECONDS_EACH" =~ ^[0-9]+$ ]] || [ "$SECONDS_EACH" -lt 1 ]; then
  echo "fuzz.sh: SECONDS_PER_TARGET must be a whole number of seconds, 1 or more (got '$SECONDS_EACH')" >&2
  exit 2
fi
for t in "${TARGETS[@]}"; do
  if [[ " ${ALL[*]} " != *" $t "* ]]; then
    echo "fuzz.sh: unknown target '$t'; targets: ${ALL[*]}" >&2
    exit 2
  fi
done
if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz.sh: no nightly toolchain: run 'rustup toolchain install nightly --profile minimal'" >&2
  exit 2
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "fuzz.sh: cargo-fuzz not found: run 'cargo install cargo-fuzz --locked'" >&2
  exit 2
fi

if ! "$ROOT/scripts/fuzz-corpus.sh" "${TARGETS[@]}"; then
  echo "fuzz.sh: building the corpus failed (scripts/fuzz-corpus.sh, see above)" >&2
  exit 2
fi

cd "$ROOT/fuzz"
echo "building fuzz targets (sanitizer $SANITIZER)..." >&2
if ! cargo +nightly fuzz build -a --sanitizer "$SANITIZER" >&2; then
  echo "fuzz.sh: building the fuzz targets failed (see above)" >&2
  exit 2
fi

status=0
for t in "${TARGETS[@]}"; do
  log="$ROOT/fuzz/fuzz-$t.log"
  mkdir -p "artifacts/$t"
  # -rss_limit_mb: a reader that holds more than this on a small input is a finding.
  # -timeout: one input taking longer than this is a hang.
  # -max_len: the seeds are at most ~20 KB; longer inputs only slow the search down.
  cargo +nightly fuzz run -a --sanitizer "$SANITIZER" --jobs "$JOBS" "$t" "corpus/$t" -- \
    -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -timeout="$TIMEOUT" -max_len=65536 \
    -print_final_stats=1 > "$log" 2>&1
  rc=$?
  # -print_final_stats gives the executions; the last status line ("#N DONE cov: C
  # ft: F corp: K/S ...") the edges covered, features and corpus size.
  execs=$(grep -a 'stat::number_of_executed_units' "$log" | tail -n 1 | awk '{print $2}')
  cov=$(grep -a -o 'cov: [0-9]*' "$log" | tail -n 1 | awk '{print $2}')
  ft=$(grep -a -o 'ft: [0-9]*' "$log" | tail -n 1 | awk '{print $2}')
  corp=$(grep -a -o 'corp: [0-9]*/[0-9]*[a-zA-Z]*' "$log" | tail -n 1 | awk '{print $2}')
  crashes=$(find "artifacts/$t" -type f | wc -l)
  verdict=ok
  if [ "$rc" != 0 ] || [ "$crashes" != 0 ]; then verdict=CRASH; status=1; fi
  row=$(printf '%-9s %-6s %5ss execs %-10s cov %-6s ft %-6s corpus %-12s artifacts %s' \
    "$t" "$verdict" "$SECONDS_EACH" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$crashes")
  echo "$row" | tee -a "$SUMMARY"
  if [ "$verdict" = CRASH ]; then
    grep -a -m 3 -E 'panicked at|ERROR: libFuzzer|SUMMARY' "$log" | sed 's/^/    /'
    find "artifacts/$t" -type f | sed 's/^/    input: fuzz\//'
  fi
done
exit $status
