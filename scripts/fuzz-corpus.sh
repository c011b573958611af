#!/usr/bin/env bash
# Builds fuzz/corpus/TARGET for each TARGET given (default: all) from the small seeds kept
# in fuzz/seeds/, the scenario and story files in assets/, and the real PyTorch traces in
# tests/fixtures (or $VRAMTOP_TRACES, e.g. a folder of GPU-made traces) when present.
# Existing corpus files are kept, so a longer run goes on from what earlier runs found.
set -euo pipefail
cd "$(dirname "$0")/.."
TRACES=${VRAMTOP_TRACES:-tests/fixtures}
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(pickle pytorch rmm record scenario story remote)
for t in "${TARGETS[@]}"; do
  dir="fuzz/corpus/$t"
  mkdir -p "$dir"
  if [ -d "fuzz/seeds/$t" ]; then cp -n fuzz/seeds/"$t"/* "$dir"/ 2>/dev/null || true; fi
  case "$t" in
    scenario) cp -n assets/scenarios/*.toml "$dir"/ ;;
    story) cp -n assets/stories/*.toml "$dir"/ ;;
    pickle | pytorch)
      if [ -d "$TRACES" ]; then
        # The small trace as it is and unzipped; the big one gzipped only (6 MB unzipped
        # is past -max_len, and libFuzzer would only see its first 64 KB).
        for f in "$TRACES"/*.pickle.gz; do
          [ -e "$f" ] || continue
          base=$(basename "$f" .gz)
          if [ "$(gzip -dc "$f" | wc -c)" -le 65536 ]; then
            gzip -dc "$f" > "$dir/$base"
          fi
          if [ "$t" = pytorch ]; then cp -n "$f" "$dir/"; fi
        done
      else
        echo "fuzz-corpus.sh: $TRACES not found; seeding $t from fuzz/seeds only" >&2
      fi
      ;;
  esac
done
