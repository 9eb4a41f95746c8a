#!/usr/bin/env bash
# Writes cmake/hot-functions.txt, the order in which the linker lays out the gateway's hot functions
# (CMakeLists.txt's SPILLWAY_HOT_ORDER), from a callgrind profile of one-token and of streamed
# completions: the I/O threads' dumps of gateway_instructions (spillway serve at NORMAL), ordered by
# bench/hot_functions.cpp.
# Run it on a plain build (not make pgo's) when the request's way has changed; a list gone stale only
# loses part of its gain (names the binary no longer has are skipped).
#   bench/hot_functions.sh [BUILD_DIR]
set -euo pipefail
BUILD=$(realpath "${1:-build}")
cd "$(dirname "$0")/.."  # (the list is the repository's)
cmake --build "$BUILD" --target gateway_instructions hot_functions >/dev/null  # benchmarks are not part of make build
# Two workloads: one-token answers, and streamed answers (the relay's way, event by event).
dirs=()
trap 'rm -rf "${dirs[@]}"' EXIT
args=()
for mode in "" --stream; do
  if ! report=$("$BUILD/bench/gateway_instructions" --bin "$BUILD/bin" --model "$BUILD/models/tiny-chat.gguf" \
                -n "${N:-500}" --keep $mode); then
    echo "$report"
    echo "hot_functions.sh: gateway_instructions $mode failed; cmake/hot-functions.txt is unchanged" >&2
    exit 1
  fi
  dir=$(sed -n 's/^callgrind dumps kept in \([^ ]*\).*/\1/p' <<<"$report")
  [[ -d "$dir" ]] || { echo "$report"; echo "hot_functions.sh: no dumps kept" >&2; exit 1; }
  dirs+=("$dir")
  # The NORMAL run's dumps of the threads that served requests.
  mapfile -t dumps < <(grep -l '^fn=spillway::gateway::Gateway::HandleGeneration' "$dir"/gateway-normal.*)
  [[ ${#dumps[@]} -gt 0 ]] || { echo "hot_functions.sh: no dump of a thread that served requests in $dir" >&2; exit 1; }
  for d in "${dumps[@]}"; do args+=(--dump "$d"); done
done
"$BUILD/bench/hot_functions" --bin "$BUILD/bin/spillway" "${args[@]}" -o cmake/hot-functions.txt
