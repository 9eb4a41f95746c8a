# Shared by scripts/llama.sh and scripts/whisper.sh (sourced, not run): the
# CPU instruction-set flags, the cached npm package and a build that reports
# its progress. Callers define log().

# Appends to FLAGS one -DGGML_<SET>=ON|OFF per instruction set, as this
# machine has it: GGML_NATIVE cannot be combined with GGML_BACKEND_DL, and a
# cache keyed by these flags must not depend on what -march=native resolves to.
ggml_cpu_flags() {
  local cpu_flags pair
  cpu_flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
  for pair in sse4_2:SSE42 avx:AVX avx2:AVX2 bmi2:BMI2 fma:FMA f16c:F16C avx_vnni:AVX_VNNI \
              avx512f:AVX512 avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
    if [[ " $cpu_flags " == *" ${pair%%:*} "* ]]; then FLAGS+=("-DGGML_${pair#*:}=ON"); else FLAGS+=("-DGGML_${pair#*:}=OFF"); fi
  done
}

# npm_tarball PKG@VERSION CACHE_ROOT: prints the path of the package's .tgz,
# fetched once with `npm pack` (npm's registry or its mirror) into CACHE_ROOT.
npm_tarball() {
  local pkg=$1 cache_root=$2 tarball dir
  tarball="$cache_root/$(echo "$pkg" | tr '@/' '--').tgz"
  if [ ! -s "$tarball" ]; then
    log "fetching $pkg from the npm registry"
    dir=$(mktemp -d)
    (cd "$dir" && npm pack --silent "$pkg" >/dev/null) || { rm -rf "$dir"; return 1; }
    mv "$dir"/*.tgz "$tarball.part" && mv "$tarball.part" "$tarball" || { rm -rf "$dir"; return 1; }
    rm -rf "$dir"
  fi
  echo "$tarball"
}

# build_with_progress WHAT BUILD_DIR LOG JOBS TARGET...: builds the targets,
# saying how far it is every 30 s so that a long first build never looks hung.
# NICE (e.g. "nice -n 10") prefixes the build when set.
build_with_progress() {
  local what=$1 dir=$2 logfile=$3 jobs=$4 build_pid started step
  shift 4
  ${NICE:-} cmake --build "$dir" -j "$jobs" --target "$@" >"$logfile" 2>&1 &
  build_pid=$!
  started=$(date +%s)
  while kill -0 "$build_pid" 2>/dev/null; do
    for _ in $(seq 30); do kill -0 "$build_pid" 2>/dev/null || break; sleep 1; done
    step=$(grep -o '^\[[0-9]*/[0-9]*\]' "$logfile" 2>/dev/null | tail -1 || true)
    kill -0 "$build_pid" 2>/dev/null && log "$what build ${step:-starting} after $(( $(date +%s) - started )) s"
  done
  wait "$build_pid" || { tail -40 "$logfile" >&2; return 1; }
  log "$what built in $(( $(date +%s) - started )) s"
}

# prepare_prefix LABEL MODE IDENTITY...: sets PREFIX to
# $CACHE_ROOT/LABEL-<key>, the key a hash of the identity lines and the
# compiler's version. MODE --print, or a prefix already complete: prints it and
# exits. Otherwise takes the cache's lock for that key (a concurrent build of
# the same prefix waits, then finds it complete) and leaves PREFIX empty.
prepare_prefix() {
  local label=$1 mode=$2 key
  shift 2
  key=$(printf '%s\n' "$@" "$(g++ -dumpfullversion 2>/dev/null)" | sha256sum | cut -c1-12)
  PREFIX="$CACHE_ROOT/$label-$key"
  if [ "$mode" = "--print" ] || [ -f "$PREFIX/.complete" ]; then echo "$PREFIX"; exit 0; fi
  mkdir -p "$CACHE_ROOT"
  exec 9>"$CACHE_ROOT/.lock-$key"
  flock 9
  if [ -f "$PREFIX/.complete" ]; then echo "$PREFIX"; exit 0; fi
  rm -rf "$PREFIX"
  mkdir -p "$PREFIX"
}
