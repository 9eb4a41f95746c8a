#!/usr/bin/env bash
# Fetch the pinned whisper.cpp (its source, cpp/whisper.cpp, inside the npm
# package nodejs-whisper@0.3.1: whisper.cpp 1.9.1, ggml 0.15.1) and build its
# `whisper-server` once into a cache prefix outside the repository, keyed by
# version, build flags and compiler. Tests use it as a second kind of service.
#
#   scripts/whisper.sh            build if missing, print the prefix
#   scripts/whisper.sh --print    print the prefix only (no build)
#
# The server is $PREFIX/build/bin/whisper-server; its shared libraries
# (libwhisper, libggml*) lie beside it and are found through its RUNPATH, and
# ggml's headers under $PREFIX/src/ggml/include (a backend module built
# against them loads with GGML_BACKEND_PATH).
#
# Environment:
#   SPILLWAY_CACHE      cache root (default ~/.cache/spillway)
#   SPILLWAY_JOBS       parallel build jobs (default 2; the build runs under nice)
set -euo pipefail
source "$(dirname "$0")/ggml-build.sh"

NPM_PKG="nodejs-whisper@0.3.1"
WHISPER_VERSION="1.9.1"
CACHE_ROOT="${SPILLWAY_CACHE:-$HOME/.cache/spillway}"
JOBS="${SPILLWAY_JOBS:-2}"
NICE="nice -n 10"

FLAGS=(
  -DCMAKE_BUILD_TYPE=Release
  # Shared: a backend module loaded with GGML_BACKEND_PATH links against this
  # build's libggml-base. The libraries stay beside the binary in the prefix.
  -DBUILD_SHARED_LIBS=ON
  -DGGML_NATIVE=OFF
  -DGGML_LLAMAFILE=OFF
  -DWHISPER_BUILD_TESTS=OFF
  -DWHISPER_BUILD_EXAMPLES=ON   # the server is one of the examples; only its target is built
  -DWHISPER_BUILD_SERVER=ON
  -DWHISPER_SDL2=OFF
  -DWHISPER_CURL=OFF
  -DWHISPER_COMMON_FFMPEG=OFF
)
ggml_cpu_flags
TARGETS=(whisper-server)

log() { echo "[whisper.sh] $*" >&2; }
prepare_prefix "whisper-$WHISPER_VERSION" "${1:-}" "$NPM_PKG" "$WHISPER_VERSION" "${FLAGS[*]}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

tarball=$(npm_tarball "$NPM_PKG" "$CACHE_ROOT")
log "extracting whisper.cpp from $NPM_PKG"
tar -xzf "$tarball" -C "$tmp" package/cpp/whisper.cpp
mv "$tmp/package/cpp/whisper.cpp" "$PREFIX/src"
grep -q "project(\"whisper.cpp\" VERSION $WHISPER_VERSION)" "$PREFIX/src/CMakeLists.txt" \
  || { log "the package's whisper.cpp is not $WHISPER_VERSION"; exit 1; }

log "configuring (${FLAGS[*]})"
$NICE cmake -S "$PREFIX/src" -B "$PREFIX/build" -G Ninja "${FLAGS[@]}" >"$PREFIX/configure.log" 2>&1 \
  || { tail -40 "$PREFIX/configure.log" >&2; exit 1; }
log "building ${TARGETS[*]} with $JOBS jobs (once per machine, cached in $CACHE_ROOT)"
build_with_progress whisper.cpp "$PREFIX/build" "$PREFIX/build.log" "$JOBS" "${TARGETS[@]}"
"$PREFIX/build/bin/whisper-server" --help >/dev/null 2>&1 \
  || { log "the built whisper-server does not run"; exit 1; }
printf '%s\n' "$NPM_PKG" "$WHISPER_VERSION" "${FLAGS[*]}" >"$PREFIX/.complete"
log "done: $PREFIX"
echo "$PREFIX"
