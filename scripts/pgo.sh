#!/usr/bin/env bash
# Rebuilds BUILD with profile-guided optimisation (`make pgo`; GCC only):
#   1. BUILD as usual, and its bench/gateway_overhead (the training's client);
#   2. an instrumented gateway in BUILD-pgo-gen (CMake's SPILLWAY_PGO=generate);
#   3. training: gateway_overhead's workload (one-token completions through the
#      gateway at the journal's NORMAL and FULL, beside nginx) sent through it;
#      the profiles it writes at its exit are kept in BUILD/pgo-profile;
#   4. BUILD's gateway again with them (SPILLWAY_PGO=use; the setting stays in
#      BUILD's CMake cache, so the next `make` builds the rest with it too;
#      `cmake -DSPILLWAY_PGO= BUILD` turns it off);
#   5. unless PGO_COMPARE=0: gateway_overhead with the new gateway against the
#      one built before, in the same rounds.
# Usage: scripts/pgo.sh [BUILD] [REQUESTS]   (defaults: build 2000)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=$(realpath -m "${1:-build}")
N=${2:-2000}
GEN="$BUILD-pgo-gen"
PROFILE="$BUILD/pgo-profile"
say() { echo "pgo: $*"; }

if ! "${CXX:-c++}" --version 2>/dev/null | grep -qi "gcc\|g++\|free software foundation"; then
  echo "pgo: needs GCC (${CXX:-c++} is not): profile-guided builds use GCC's -fprofile-generate/-use" >&2
  exit 2
fi

say "1/5 the usual gateway and worker in $BUILD, and its gateway_overhead"
# (Profiles off: an earlier `make pgo` left them on in BUILD's cache, and step 5 compares with this one.)
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPILLWAY_PGO= >/dev/null
cmake --build "$BUILD" --target spillway spillway-worker llama_runtime models gateway_overhead

say "2/5 an instrumented gateway in $GEN"
rm -rf "$GEN/profile"
cmake -S . -B "$GEN" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPILLWAY_PGO=generate -DSPILLWAY_PGO_DIR="$GEN/profile" \
  >/dev/null
cmake --build "$GEN" --target spillway

say "3/5 training: $N requests of gateway_overhead's workload through it"
# The instrumented gateway beside the usual worker and llama.cpp libraries.
rm -rf "$GEN/train-bin"
cp -a "$BUILD/bin" "$GEN/train-bin"
cp "$GEN/bin/spillway" "$GEN/train-bin/spillway"
"$BUILD/bench/gateway_overhead" --bin "$GEN/train-bin" --model "$BUILD/models/tiny-chat.gguf" -n "$N" \
  >"$GEN/training.log" 2>&1 || { tail -20 "$GEN/training.log" >&2; echo "pgo: the training run failed (log: $GEN/training.log)" >&2; exit 1; }
profiles=$(find "$GEN/profile" -name '*.gcda' 2>/dev/null | wc -l)
if [[ $profiles -eq 0 ]]; then
  echo "pgo: the training wrote no profile into $GEN/profile (did the gateway exit cleanly? log: $GEN/training.log)" >&2
  exit 1
fi
rm -rf "$PROFILE"
cp -a "$GEN/profile" "$PROFILE"
say "$profiles profiles kept in $PROFILE"

# The gateway as it was, for step 5.
rm -rf "$GEN/plain-bin"
cp -a "$BUILD/bin" "$GEN/plain-bin"

say "4/5 $BUILD's gateway again, with the profiles"
cmake -S . -B "$BUILD" -DSPILLWAY_PGO=use -DSPILLWAY_PGO_DIR="$PROFILE" >/dev/null
cmake --build "$BUILD" --target spillway gateway_overhead

if [[ ${PGO_COMPARE:-1} != 0 ]]; then
  say "5/5 the profile-guided gateway against the one built before (--against), same rounds"
  "$BUILD/bench/gateway_overhead" --bin "$BUILD/bin" --against "$GEN/plain-bin" --model "$BUILD/models/tiny-chat.gguf" -n 1000
fi
say "done: $BUILD/bin/spillway is built with profile-guided optimisation, and the next make builds the rest so;"
say "off again: cmake -DSPILLWAY_PGO= $BUILD"
