#!/usr/bin/env bash
# Fetch the pinned llama.cpp (source bundle inside the npm package
# node-llama-cpp@3.21.1, tag v0.4.0) and build it once into a cache prefix
# outside the repository, keyed by version and build flags.
#
#   scripts/llama.sh            build if missing, print the prefix
#   scripts/llama.sh --print    print the prefix only (no build)
#
# Environment:
#   SPILLWAY_CACHE      cache root (default ~/.cache/spillway)
#   SPILLWAY_CUDA=1     also build the CUDA backend module (not needed for tests)
#   SPILLWAY_CUDA_ARCH  CUDA architectures (default: native)
#   SPILLWAY_JOBS       parallel build jobs (default: nproc)
set -euo pipefail
source "$(dirname "$0")/ggml-build.sh"

NPM_PKG="node-llama-cpp@3.21.1"
LLAMA_TAG="v0.4.0"
CACHE_ROOT="${SPILLWAY_CACHE:-$HOME/.cache/spillway}"
JOBS="${SPILLWAY_JOBS:-$(nproc)}"
CUDA="${SPILLWAY_CUDA:-0}"
CUDA_ARCH="${SPILLWAY_CUDA_ARCH:-native}"

FLAGS=(
  -DCMAKE_BUILD_TYPE=Release
  -DBUILD_SHARED_LIBS=ON
  -DGGML_BACKEND_DL=ON
  -DGGML_NATIVE=OFF
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_TOOLS=ON
  -DLLAMA_BUILD_SERVER=ON
  -DLLAMA_BUILD_APP=OFF
  -DLLAMA_BUILD_UI=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_OPENSSL=OFF
  # Batch-invariant CPU matrix products: llamafile's sgemm serves batches of
  # two or more tokens and ggml's dot products single tokens, with different
  # rounding, so a token's logits would depend on what else was in its batch
  # and a failover replay or continuation would not reproduce the tokens.
  -DGGML_LLAMAFILE=OFF
)
# GGML_NATIVE cannot be combined with GGML_BACKEND_DL: enable the CPU backend's
# instruction sets this machine has, one by one.
ggml_cpu_flags
TARGETS=(llama ggml ggml-base ggml-cpu llama-server llama-bench)
if [ "$CUDA" = "1" ]; then
  FLAGS+=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH")
  TARGETS+=(ggml-cuda)
fi

log() { echo "[llama.sh] $*" >&2; }
prepare_prefix "llama-$LLAMA_TAG" "${1:-}" "$NPM_PKG" "$LLAMA_TAG" "${FLAGS[*]}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

tarball=$(npm_tarball "$NPM_PKG" "$CACHE_ROOT")
tar -xzf "$tarball" -C "$tmp" package/llama/gitRelease.bundle package/llama/llama.cpp.info.json
grep -q "\"$LLAMA_TAG\"" "$tmp/package/llama/llama.cpp.info.json" || { log "bundle is not $LLAMA_TAG"; exit 1; }
log "cloning llama.cpp $LLAMA_TAG from the bundle"
git clone -q "$tmp/package/llama/gitRelease.bundle" "$PREFIX/src" 2>/dev/null

log "configuring (${FLAGS[*]})"
cmake -S "$PREFIX/src" -B "$PREFIX/build" -G Ninja "${FLAGS[@]}" >"$PREFIX/configure.log" 2>&1 \
  || { tail -40 "$PREFIX/configure.log" >&2; exit 1; }
log "building ${TARGETS[*]} with $JOBS jobs (7 to 10 minutes on 2 cores; once per machine, cached in $CACHE_ROOT)"
build_with_progress llama.cpp "$PREFIX/build" "$PREFIX/build.log" "$JOBS" "${TARGETS[@]}"
printf '%s\n' "$NPM_PKG" "$LLAMA_TAG" "${FLAGS[*]}" >"$PREFIX/.complete"
log "done: $PREFIX"
echo "$PREFIX"
