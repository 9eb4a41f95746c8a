#!/usr/bin/env bash
# Latency the gateway adds over calling the worker directly (same run, loopback).
#   bench/gateway_overhead.sh [BUILD_DIR] [AGAINST_BIN_DIR]
#   (AGAINST_BIN_DIR: another build's bin directory, e.g. a copy of build/bin
#   made before a change; its gateway runs beside this one's in the same rounds)
#   SLOW_SYNC_US=2000 bench/gateway_overhead.sh   # every fsync/fdatasync 2 ms slower (slow_sync.cpp)
set -euo pipefail
BUILD=${1:-build}
cmake --build "$BUILD" --target gateway_overhead >/dev/null  # benchmarks are not part of make build
preload=()
if [[ -n "${SLOW_SYNC_US:-}" ]]; then
  cmake --build "$BUILD" --target slow_sync >/dev/null
  preload=(env LD_PRELOAD="$(realpath "$BUILD/bench/libslow_sync.so")" SLOW_SYNC_US="$SLOW_SYNC_US")
fi
against=()
[[ -n "${2:-}" ]] && against=(--against "$2")
"${preload[@]}" "$BUILD/bench/gateway_overhead" --bin "$BUILD/bin" --model "$BUILD/models/tiny-chat.gguf" -n "${N:-400}" "${against[@]}"
