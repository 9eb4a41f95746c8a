#!/usr/bin/env bash
# Many slow-reader streams through the gateway: its RSS per stream and threads,
# and an embedding to another service through it vs straight to its worker.
#   bench/concurrent_streams.sh [BUILD_DIR]     (STREAMS, PAIRS, HOLD_S, JOURNAL override the defaults)
set -euo pipefail
BUILD=${1:-build}
cmake --build "$BUILD" --target concurrent_streams >/dev/null  # benchmarks are not part of make build
"$BUILD/bench/concurrent_streams" --bin "$BUILD/bin" --models "$BUILD/models" --streams "${STREAMS:-2000}" \
  --pairs "${PAIRS:-1000}" --hold-s "${HOLD_S:-10}" --journal "${JOURNAL:-normal}"
