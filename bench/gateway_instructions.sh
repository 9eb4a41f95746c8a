#!/usr/bin/env bash
# CPU instructions per request (valgrind's callgrind): spillway serve against
# nginx and a bare Asio proxy in front of the same kind of worker, same run.
#   bench/gateway_instructions.sh [BUILD_DIR]      # N=500; KEEP=1 keeps the dumps for callgrind_annotate;
#                                                  # STREAM=1: streamed 4-token completions instead of one-token answers
#                                                  # BY_OWNER=20: the gateway's code lines by whose code they are, the 20 largest
set -euo pipefail
BUILD=${1:-build}
cmake --build "$BUILD" --target gateway_instructions >/dev/null  # benchmarks are not part of make build
flags=()
[[ -n "${KEEP:-}" ]] && flags+=(--keep)
[[ -n "${STREAM:-}" ]] && flags+=(--stream)
[[ -n "${BY_OWNER:-}" ]] && flags+=(--by-owner "$BY_OWNER")
"$BUILD/bench/gateway_instructions" --bin "$BUILD/bin" --model "$BUILD/models/tiny-chat.gguf" -n "${N:-500}" "${flags[@]}"
