#!/usr/bin/env bash
# Latency the gateway adds over calling the worker directly (same run, loopback).
#   bench/gateway_overhead.sh [BUILD_DIR]
set -euo pipefail
BUILD=${1:-build}
cmake --build "$BUILD" --target gateway_overhead >/dev/null  # benchmarks are not part of make build
"$BUILD/bench/gateway_overhead" --bin "$BUILD/bin" --model "$BUILD/models/tiny-chat.gguf" -n "${N:-400}"
