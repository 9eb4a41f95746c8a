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
cpu_flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { [[ " $cpu_flags " == *" $1 "* ]]; }
for pair in sse4_2:SSE42 avx:AVX avx2:AVX2 bmi2:BMI2 fma:FMA f16c:F16C avx_vnni:AVX_VNNI \
            avx512f:AVX512 avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
  if has "${pair%%:*}"; then FLAGS+=("-DGGML_${pair#*:}=ON"); else FLAGS+=("-DGGML_${pair#*:}=OFF"); fi
done
TARGETS=(llama ggml ggml-base ggml-cpu llama-server llama-bench)
if [ "$CUDA" = "1" ]; then
  FLAGS+=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH")
  TARGETS+=(ggml-cuda)
fi

key=$(printf '%s\n' "$NPM_PKG" "$LLAMA_TAG" "${FLAGS[*]}" "$(g++ -dumpfullversion 2>/dev/null)" | sha256sum | cut -c1-12)
PREFIX="$CACHE_ROOT/llama-$LLAMA_TAG-$key"

if [ "${1:-}" = "--print" ]; then echo "$PREFIX"; exit 0; fi
if [ -f "$PREFIX/.complete" ]; then echo "$PREFIX"; exit 0; fi

log() { echo "[llama.sh] $*" >&2; }
mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.lock-$key"
flock 9
if [ -f "$PREFIX/.complete" ]; then echo "$PREFIX"; exit 0; fi

rm -rf "$PREFIX"
mkdir -p "$PREFIX"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

tarball="$CACHE_ROOT/$(echo "$NPM_PKG" | tr '@/' '--').tgz"
if [ ! -s "$tarball" ]; then
  log "fetching $NPM_PKG from the npm registry"
  (cd "$tmp" && npm pack --silent "$NPM_PKG" >/dev/null)
  mv "$tmp"/node-llama-cpp-*.tgz "$tarball"
fi
tar -xzf "$tarball" -C "$tmp" package/llama/gitRelease.bundle package/llama/llama.cpp.info.json
grep -q "\"$LLAMA_TAG\"" "$tmp/package/llama/llama.cpp.info.json" || { log "bundle is not $LLAMA_TAG"; exit 1; }
log "cloning llama.cpp $LLAMA_TAG from the bundle"
git clone -q "$tmp/package/llama/gitRelease.bundle" "$PREFIX/src" 2>/dev/null

log "configuring (${FLAGS[*]})"
cmake -S "$PREFIX/src" -B "$PREFIX/build" -G Ninja "${FLAGS[@]}" >"$PREFIX/configure.log" 2>&1 \
  || { tail -40 "$PREFIX/configure.log" >&2; exit 1; }
log "building ${TARGETS[*]} with $JOBS jobs (7 to 10 minutes on 2 cores; once per machine, cached in $CACHE_ROOT)"
cmake --build "$PREFIX/build" -j "$JOBS" --target "${TARGETS[@]}" >"$PREFIX/build.log" 2>&1 &
build_pid=$!
# Say how far it is every 30 s, so a long first build never looks hung.
started=$(date +%s)
while kill -0 "$build_pid" 2>/dev/null; do
  for _ in $(seq 30); do kill -0 "$build_pid" 2>/dev/null || break; sleep 1; done
  step=$(grep -o '^\[[0-9]*/[0-9]*\]' "$PREFIX/build.log" 2>/dev/null | tail -1 || true)
  kill -0 "$build_pid" 2>/dev/null && log "llama.cpp build ${step:-starting} after $(( $(date +%s) - started )) s"
done
wait "$build_pid" || { tail -40 "$PREFIX/build.log" >&2; exit 1; }
printf '%s\n' "$NPM_PKG" "$LLAMA_TAG" "${FLAGS[*]}" >"$PREFIX/.complete"
log "done: $PREFIX"
echo "$PREFIX"
