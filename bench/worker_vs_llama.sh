#!/usr/bin/env bash
# spillway-worker vs llama-bench (same llama.cpp source, same model, same threads).
#   bench/worker_vs_llama.sh [BUILD_DIR] [PRESET]    PRESET: bench (~410 MB, default) | bench-large (~1.2 GB)
set -euo pipefail
BUILD=${1:-build}
cmake --build "$BUILD" --target worker_vs_llama >/dev/null  # benchmarks are not part of make build
PRESET=${2:-bench}
source "$BUILD/bench/bench.env"
MODEL="$BUILD/models/$PRESET.gguf"
[ -f "$MODEL" ] || "$BUILD/bin/spillway" mkmodel --preset "$PRESET" --vocab "$LLAMA_VOCAB" --out "$MODEL"
"$BUILD/bench/worker_vs_llama" --model "$MODEL" --llama-bench "$LLAMA_BENCH" --worker "$BUILD/bin/spillway-worker" \
  --threads "${THREADS:-$(nproc)}" --reps "${REPS:-3}" --rounds "${ROUNDS:-5}"
