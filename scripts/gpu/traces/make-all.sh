#!/usr/bin/env bash
# Make every trace vramtop's tests and benchmarks use, on the GPU machine.
# usage: scripts/gpu/traces/make-all.sh OUT_DIR     (figures to OUT_DIR/traces.jsonl)
set -uo pipefail
OUT=${1:?usage: make-all.sh OUT_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
J="$OUT/traces.jsonl"
: > "$J"
mk() { echo "== $*" >&2; env "${ENVS[@]}" python3 "$HERE/make_traces.py" "$@" >> "$J" || echo "{\"failed\": \"$*\"}" >> "$J"; }
ENVS=(PYTORCH_CUDA_ALLOC_CONF=)
mk oom-cap "$OUT" --name oom_cap --max-entries 100000
ENVS=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)
mk oom-cap "$OUT" --name oom_cap_expandable --max-entries 100000
ENVS=(PYTORCH_CUDA_ALLOC_CONF=)
mk gpt2-train "$OUT" --name gpt2_train --steps 20
mk resnet-train "$OUT" --name resnet_train --steps 30
ENVS=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)
mk gpt2-train "$OUT" --name gpt2_train_expandable --steps 20
mk resnet-train "$OUT" --name resnet_train_expandable --steps 30
ENVS=(PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64,roundup_power2_divisions:4,garbage_collection_threshold:0.6)
mk resnet-train "$OUT" --name resnet_train_settings --steps 30
ENVS=(PYTORCH_CUDA_ALLOC_CONF=)
mk decode "$OUT" --name decode_2m --max-entries 2000000 --tokens 1000 --sequences 10
cat "$J"
