#!/usr/bin/env bash
# GPU check for a machine with an NVIDIA GPU and no network (not part of `make test`).
# Builds llama.cpp with its CUDA backend for the local GPU only, builds Spillway,
# and runs the worker scenarios on cuda:0 next to the CPU path, printing a summary.
#
# Offline: put the npm tarball of node-llama-cpp@3.21.1 at
#   $SPILLWAY_CACHE/node-llama-cpp-3.21.1.tgz   (default .device-cache/ in the repo)
# e.g. `mkdir -p .device-cache && cp ~/.cache/spillway/node-llama-cpp-3.21.1.tgz .device-cache/`
# and carry .device-cache to the machine. Fits one 10-minute call on 16 cores.
set -uo pipefail
cd "$(dirname "$0")/.."
export SPILLWAY_CACHE=${SPILLWAY_CACHE:-$PWD/.device-cache}
export SPILLWAY_CUDA=1 SPILLWAY_CUDA_ARCH=${SPILLWAY_CUDA_ARCH:-native} SPILLWAY_JOBS=${SPILLWAY_JOBS:-$(nproc)}
BUILD=${BUILD:-build-cuda}
OUT=${OUT:-/tmp/spillway-device-check}
mkdir -p "$OUT"
pass=0; fail=0
ok()  { echo "PASS  $*"; pass=$((pass+1)); }
bad() { echo "FAIL  $*"; fail=$((fail+1)); }
t0=$(date +%s)

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader | tee "$OUT/gpu.txt"
PREFIX=$(scripts/llama.sh) || { echo "llama.cpp build failed"; exit 1; }
echo "llama.cpp with CUDA at $PREFIX ($(( $(date +%s) - t0 ))s)"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_PREFIX="$PREFIX" >"$OUT/cmake.log" 2>&1 \
  && cmake --build "$BUILD" -j "$SPILLWAY_JOBS" >>"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
echo "spillway built ($(( $(date +%s) - t0 ))s)"
ls "$BUILD/bin"/libggml-cuda*.so >/dev/null 2>&1 && ok "CUDA backend module present" || bad "no libggml-cuda.so"

W="$BUILD/bin/spillway-worker"
M="$BUILD/models/demo-chat.gguf"
# Workers refuse requests without their secret (README: Security).
export SPILLWAY_WORKER_SECRET="device-check-$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
AUTH="Authorization: Bearer $SPILLWAY_WORKER_SECRET"
start() {  # start NAME ARGS... -> port in $OUT/NAME.port
  local name=$1; shift
  rm -f "$OUT/$name.port"
  "$W" --model "$M" --listen 127.0.0.1:0 --port-file "$OUT/$name.port" --ctx 2048 --slots 2 "$@" \
    >"$OUT/$name.out" 2>"$OUT/$name.err" &
  echo $! >"$OUT/$name.pid"
  for _ in $(seq 1 300); do [ -s "$OUT/$name.port" ] && return 0; sleep 0.1; done
  return 1
}
port() { cat "$OUT/$1.port"; }
complete() { curl -s -H "$AUTH" "http://127.0.0.1:$(port "$1")/v1/completions" \
  -d '{"prompt":"The GPU check","max_tokens":32,"temperature":0,"ignore_eos":true}'; }
text() { sed -n 's/.*"text":"\([^"]*\)".*/\1/p'; }

start cpu --device cpu && ok "CPU worker up" || bad "CPU worker did not start: $(cat "$OUT/cpu.err")"
start gpu --device cuda:0 --gpu-layers 99 && ok "cuda:0 worker up (all layers)" || bad "cuda:0 worker did not start: $(tail -5 "$OUT/gpu.err")"
start part --device cuda:0 --gpu-layers 2 && ok "cuda:0 worker up (2 layers)" || bad "partial worker did not start"
want=$(complete cpu | text)
[ -n "$want" ] || bad "CPU worker produced nothing"
[ "$(complete gpu | text)" = "$want" ] && ok "greedy cuda:0 == cpu" || bad "greedy cuda:0 differs from cpu (GPU kernels may round differently)"
[ "$(complete part | text)" = "$want" ] && ok "greedy partial offload == cpu" || bad "greedy partial offload differs from cpu"
info=$(curl -s -H "$AUTH" "http://127.0.0.1:$(port gpu)/v1/worker/info")
echo "$info" >"$OUT/gpu-info.json"
echo "$info" | grep -q '"name":"CUDA0"' && ok "memory breakdown names CUDA0" || bad "no CUDA0 buffer in /v1/worker/info"
grep -q "CUDA" "$OUT/cpu.err" && bad "CPU worker loaded a CUDA backend" || ok "CPU worker never loaded CUDA"
for n in cpu gpu part; do kill "$(cat "$OUT/$n.pid")" 2>/dev/null; done
wait 2>/dev/null

# A context whose KV cache cannot fit in GPU memory fails cleanly with phase=kv.
free_mib=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits 2>/dev/null | head -1)
[ -f "$BUILD/models/bench.gguf" ] || "$BUILD/bin/spillway" mkmodel --preset bench --vocab "$PREFIX/src/models/ggml-vocab-llama-spm.gguf" --out "$BUILD/models/bench.gguf" >/dev/null
"$W" --model "$BUILD/models/bench.gguf" --listen 127.0.0.1:0 --device cuda:0 --gpu-layers 99 --ctx 4194304 --slots 1 \
  >/dev/null 2>"$OUT/kv.err"; rc=$?
if [ "$rc" = 4 ] && grep -q '"phase":"kv"' "$OUT/kv.err"; then ok "KV over GPU memory (${free_mib} MiB free): exit 4 phase=kv"
elif [ "$rc" = 0 ]; then ok "KV of 4M cells fit in ${free_mib} MiB (nothing to fail)"
else bad "KV over GPU memory: exit $rc $(tail -2 "$OUT/kv.err")"; fi

# Throughput on the GPU against llama-bench on the same GPU.
if [ $(( $(date +%s) - t0 )) -lt 480 ]; then
  "$BUILD/bench/worker_vs_llama" --model "$BUILD/models/bench.gguf" --llama-bench "$PREFIX/build/bin/llama-bench" \
    --worker "$W" --threads 8 --reps 3 --rounds 2 --device cuda:0 --gpu-layers 99 2>/dev/null | tee "$OUT/bench-gpu.txt" | tail -3
fi
# The proving suite on the real device: the scenarios whose faults reach a GPU from outside.
if [ $(( $(date +%s) - t0 )) -lt 420 ]; then
  "$BUILD/bin/spillway" chaos --device cuda:0 --scenario driver_reset,gateway_restart,routing_before_admission \
    --duration 15 --baselines plain --no-profiles --report "$OUT/chaos" >"$OUT/chaos.txt" 2>&1 \
    && ok "spillway chaos on cuda:0 passed" || bad "spillway chaos on cuda:0: $(grep -E 'FAIL|chaos:    ' "$OUT/chaos.txt" | head -5)"
fi
echo "device check: $pass passed, $fail failed ($(( $(date +%s) - t0 ))s); logs in $OUT"
[ "$fail" = 0 ]
