#!/usr/bin/env bash
# Rebuilds BUILD with profile-guided and link-time optimisation (`make pgo`; GCC only):
#   1. BUILD as usual, and its bench/gateway_overhead (the training's client);
#   2. an instrumented gateway in BUILD-pgo-gen (CMake's SPILLWAY_PGO=generate);
#   3. training: gateway_overhead's workload (one-token completions and short
#      streams through the gateway at the journal's NORMAL and FULL, beside
#      nginx) sent through it; the profiles it writes at its exit are kept in
#      BUILD/pgo-profile;
#   4. BUILD's gateway again with them (SPILLWAY_PGO=use) and linked with
#      link-time optimisation (SPILLWAY_LTO=ON); the settings stay in BUILD's
#      CMake cache, so the next `make` builds the rest with them too;
#      `cmake -DSPILLWAY_PGO= -DSPILLWAY_LTO=OFF BUILD` turns them off);
#   5. unless PGO_COMPARE=0: gateway_overhead with the new gateway against the
#      one built before, in the same rounds.
# Usage: scripts/pgo.sh [BUILD] [REQUESTS]   (defaults: build 2000, each kind, each journal mode)
# CMAKE_FLAGS (as for make build) goes to every configure; the instrumented
# build also takes BUILD's compiler and CMAKE_CXX_FLAGS, so that its profiles
# match the code they are used for.
set -euo pipefail
BUILD=$(realpath -m "${1:-build}")
N=${2:-2000}
cd "$(dirname "$0")/.."
GEN="$BUILD-pgo-gen"
PROFILE="$BUILD/pgo-profile"
read -r -a EXTRA <<<"${CMAKE_FLAGS:-}"
say() { echo "pgo: $*"; }
cached() { sed -n "s/^$1:[A-Z]*=//p" "$BUILD/CMakeCache.txt" 2>/dev/null | head -1; }

CXX_USED=$(cached CMAKE_CXX_COMPILER)
CXX_USED=${CXX_USED:-${CXX:-c++}}
if ! "$CXX_USED" --version 2>/dev/null | grep -qi "gcc\|g++\|free software foundation"; then
  echo "pgo: needs GCC ($CXX_USED is not): profile-guided builds use GCC's -fprofile-generate/-use" >&2
  exit 2
fi

say "1/5 the usual gateway and worker in $BUILD, and its gateway_overhead"
# (Profiles and LTO off: an earlier `make pgo` left them on in BUILD's cache, and step 5 compares with this one.)
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPILLWAY_TESTS=ON "${EXTRA[@]}" -DSPILLWAY_PGO= -DSPILLWAY_LTO=OFF >/dev/null
cmake --build "$BUILD" --target spillway spillway-worker llama_runtime models gateway_overhead

say "2/5 an instrumented gateway in $GEN"
rm -rf "$GEN/profile"
cmake -S . -B "$GEN" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$(cached CMAKE_CXX_COMPILER)" \
  -DCMAKE_CXX_FLAGS="$(cached CMAKE_CXX_FLAGS)" -DSPILLWAY_TESTS=OFF "${EXTRA[@]}" -DSPILLWAY_PGO=generate \
  -DSPILLWAY_PGO_DIR="$GEN/profile" >/dev/null
cmake --build "$GEN" --target spillway

say "3/5 training: $N requests of gateway_overhead's workload through it"
# The instrumented gateway beside the usual worker and llama.cpp libraries.
rm -rf "$GEN/train-bin"
cp -a "$BUILD/bin" "$GEN/train-bin"
cp "$GEN/bin/spillway" "$GEN/train-bin/spillway"
"$BUILD/bench/gateway_overhead" --bin "$GEN/train-bin" --model "$BUILD/models/tiny-chat.gguf" -n "$N" \
  >"$GEN/training.log" 2>&1 || { tail -20 "$GEN/training.log" >&2; echo "pgo: the training run failed (log: $GEN/training.log)" >&2; exit 1; }
# (It goes on past failed rounds: a profile of error paths would train the wrong code.)
if grep -q "rounds failed" "$GEN/training.log"; then
  grep "rounds failed" "$GEN/training.log" >&2
  echo "pgo: requests of the training failed; no profile is used (log: $GEN/training.log)" >&2
  exit 1
fi
profiles=0
[[ -d $GEN/profile ]] && profiles=$(find "$GEN/profile" -name '*.gcda' | wc -l)
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

say "4/5 $BUILD's gateway again, with the profiles and link-time optimisation"
cmake -S . -B "$BUILD" "${EXTRA[@]}" -DSPILLWAY_PGO=use -DSPILLWAY_PGO_DIR="$PROFILE" -DSPILLWAY_LTO=ON >/dev/null
cmake --build "$BUILD" --target spillway gateway_overhead

if [[ ${PGO_COMPARE:-1} != 0 ]]; then
  say "5/5 the profile-guided gateway against the one built before (--against), same rounds"
  "$BUILD/bench/gateway_overhead" --bin "$BUILD/bin" --against "$GEN/plain-bin" --model "$BUILD/models/tiny-chat.gguf" -n 1000
fi
say "done: $BUILD/bin/spillway is built with profile-guided and link-time optimisation, and the next make builds the rest so;"
say "off again: cmake -DSPILLWAY_PGO= -DSPILLWAY_LTO=OFF $BUILD"
