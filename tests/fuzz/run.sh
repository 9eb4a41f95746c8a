#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) into BUILD/fuzz,
# once (rebuilt when a source under src/ or tests/fuzz/ is newer), and runs
# each for SECONDS on its checked-in seed corpus (tests/fuzz/corpus/<name>/)
# plus what earlier runs found (BUILD/fuzz/corpus/<name>/).
#
#   tests/fuzz/run.sh BUILD SECONDS [name...]     make test: 10 s each at -O0 (FUZZ_OPT=0); make fuzz: 300 s each
#
# FUZZ_SEED=N: libFuzzer's -seed (make test sets 1: from a clean build the
# same inputs in the same order, as many as the time allows; a build's own
# corpus, grown by earlier runs, adds its finds).
# Exit 0: no crash, leak, timeout or sanitizer report. A failing input is kept
# as BUILD/fuzz[-O0]/artifacts/<name>-crash-*; replay it with BUILD/fuzz[-O0]/<name> FILE.
# Exit 77 (ctest: skipped) when clang's libFuzzer is not installed.
set -euo pipefail
BUILD=$(realpath "${1:?usage: run.sh BUILD SECONDS [name...]}")
SECONDS_EACH=${2:-25}
shift 2 || true
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# FUZZ_OPT=0 (make test): built at -O0, half the compile time of -O1 on 2
# cores, fewer executions per second (enough for 10 s on the seed corpus);
# make fuzz keeps -O1, in a directory of its own.
OPT=${FUZZ_OPT:-1}
OUT="$BUILD/fuzz"
[ "$OPT" = "1" ] || OUT="$BUILD/fuzz-O$OPT"
CXX=${FUZZ_CXX:-clang++}

declare -A SOURCES=(
  [http_request]="tests/fuzz/http_request_fuzz.cpp src/api/http_server.cpp src/common/status.cpp"
  [openai_request]="tests/fuzz/openai_request_fuzz.cpp src/api/json_limits.cpp src/api/openai_request.cpp src/api/openai_logit_bias.cpp src/api/openai_tools.cpp src/common/status.cpp"
  [sse_relay]="tests/fuzz/sse_relay_fuzz.cpp src/failover/stream_progress.cpp src/protocol/worker_protocol.cpp src/api/http_client.cpp src/common/status.cpp"
  [config]="tests/fuzz/config_fuzz.cpp src/config/config.cpp src/common/status.cpp src/common/hash.cpp src/common/names.cpp src/common/proc_file.cpp src/models/ollama_store.cpp"
  [external_route]="tests/fuzz/external_route_fuzz.cpp src/gateway/external_route.cpp src/api/json_limits.cpp src/config/config.cpp src/common/status.cpp src/common/hash.cpp src/common/names.cpp src/common/proc_file.cpp src/models/ollama_store.cpp"
  [gguf_reader]="tests/fuzz/gguf_reader_fuzz.cpp src/gguf/gguf_reader.cpp src/common/status.cpp"
  [ollama_api]="tests/fuzz/ollama_api_fuzz.cpp src/api/ollama_request.cpp src/api/ollama_response.cpp src/api/json_limits.cpp src/api/openai_request.cpp src/api/openai_logit_bias.cpp src/api/openai_tools.cpp src/common/status.cpp"
)
# The fuzz builds compile library assertions away as release builds do
# (ASan and UBSan still check memory and undefined behaviour): toml++ 3.3
# asserts a precondition its parser then handles with a clean error (a table
# header such as "[%x]"); Beast 1.74 asserts in its re-parse of a final
# chunk's trailer.
declare -A FLAGS=(
  [config]="-DTOML_ASSERT(x)=static_assert(true)"
  [external_route]="-DTOML_ASSERT(x)=static_assert(true)"
  [http_request]="-DBOOST_DISABLE_ASSERTS"
)
NAMES=("$@")
[ ${#NAMES[@]} -gt 0 ] || NAMES=(http_request openai_request sse_relay config gguf_reader ollama_api external_route)

if ! command -v "$CXX" >/dev/null 2>&1; then
  echo "[fuzz] $CXX not found (scripts/deps.sh installs clang): skipped"; exit 77
fi
mkdir -p "$OUT/artifacts"
probe="$OUT/.probe"
if [ ! -x "$probe" ]; then
  echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$OUT/probe.cpp"
  if ! $CXX -fsanitize=fuzzer "$OUT/probe.cpp" -o "$probe" 2>"$OUT/probe.log"; then
    echo "[fuzz] $CXX cannot link libFuzzer (libclang-rt-*-dev missing?): skipped"; cat "$OUT/probe.log"; exit 77
  fi
fi

# Build what is missing or older than its sources (or any header under src/):
# each source is compiled to its own object (through ccache when installed, so
# a fresh clone reuses them; sources shared by several targets compile once per
# flag set), two at a time, then each target is linked.
CCACHE=$(command -v ccache || true)
export CCACHE_BASEDIR="$ROOT" CCACHE_NOHASHDIR=1
stale() {
  local name=$1 bin="$OUT/$1"
  local srcs=(${SOURCES[$name]})
  [ ! -x "$bin" ] || [ -n "$(cd "$ROOT" && { find "${srcs[@]}" -newer "$bin"; find src -name '*.h' -newer "$bin"; } | head -1)" ]
}
objdir() { local f=${FLAGS[$1]:-}; echo "$OUT/obj/$( [ -z "$f" ] && echo plain || echo "$f" | md5sum | cut -c1-8)"; }
compile_one() {  # FLAGSET_DIR SOURCE FLAGS...
  local dir=$1 src=$2; shift 2
  local obj="$dir/${src//\//_}.o"
  mkdir -p "$dir"
  # (_GLIBCXX_ASSERTIONS: an empty optional read or an index past a vector's end aborts; UBSan sees neither.)
  (cd "$ROOT" && nice -n 10 ${CCACHE:+"$CCACHE"} $CXX -std=c++20 -g -O"$OPT" -D_GLIBCXX_ASSERTIONS -fsanitize=fuzzer-no-link,address,undefined \
    -fno-sanitize-recover=undefined "$@" -Isrc -c "$src" -o "$obj.new" 2>"$obj.log") && mv "$obj.new" "$obj" ||
    { echo "[fuzz] $src does not compile:"; cat "$obj.log"; return 1; }
}
export -f compile_one
export CXX OPT ROOT CCACHE
status=0
STALE=()
for name in "${NAMES[@]}"; do stale "$name" && STALE+=("$name"); done
if [ ${#STALE[@]} -gt 0 ]; then
  echo "[fuzz] building ${STALE[*]}"
  for name in "${STALE[@]}"; do
    for src in ${SOURCES[$name]}; do printf '%s\t%s\t%s\n' "$(objdir "$name")" "$src" "${FLAGS[$name]:-}"; done
  done | sort -u | xargs -d '\n' -n1 -P2 bash -c 'IFS=$'"'"'\t'"'"' read -r d s f <<<"$1"; compile_one "$d" "$s" $f' _ ||
    status=1
  [ $status -eq 0 ] || exit 1
  for name in "${STALE[@]}"; do
    objs=()
    for src in ${SOURCES[$name]}; do objs+=("$(objdir "$name")/${src//\//_}.o"); done
    $CXX -g -fsanitize=fuzzer,address,undefined "${objs[@]}" -lcrypto -lpthread -o "$OUT/$name.new" 2>"$OUT/$name.build.log" &&
      mv "$OUT/$name.new" "$OUT/$name" || { echo "[fuzz] $name does not link:"; cat "$OUT/$name.build.log"; exit 1; }
  done
fi
[ $status -eq 0 ] || exit 1

# Two targets at a time (one per core of the 2-core machines this runs on):
# each is a single-threaded process, so neither slows the other much.
fuzz_one() {  # NAME: 0 when it found nothing
  local name=$1 bin="$OUT/$1" corpus="$OUT/corpus/$1"
  mkdir -p "$corpus"
  if ! "$bin" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 ${FUZZ_SEED:+-seed=$FUZZ_SEED} \
       -artifact_prefix="$OUT/artifacts/$name-" "$corpus" "$ROOT/tests/fuzz/corpus/$name" >"$OUT/$name.log" 2>&1; then
    echo "[fuzz] $name FAILED:"; tail -40 "$OUT/$name.log"; return 1
  fi
  echo "[fuzz] $name: ${SECONDS_EACH}s"
  grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$OUT/$name.log" | sed "s/^/[fuzz] $name /" || true
}
export -f fuzz_one
export OUT SECONDS_EACH
export FUZZ_SEED=${FUZZ_SEED:-}  # (unset: libFuzzer's random seed)
printf '%s\n' "${NAMES[@]}" | xargs -d '\n' -n1 -P2 bash -c 'fuzz_one "$1"' _ || status=1
exit $status
