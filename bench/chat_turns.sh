#!/usr/bin/env bash
# A chat's turns (the whole conversation resent each turn): spillway-worker, with and without prompt
# prefix reuse, against llama-server built from the same llama.cpp source (same model, threads, context);
# then again with each worker turn counted first (tokenize, then the run, as a gateway with several
# placements does), with and without the worker's kept renderings; then, on a tiny model with Qwen 2's
# vocabulary (its ChatML markers are special tokens there; written into the build's bench/ once), a longer
# chat only counted, the worker with and without its kept prompt tokens against llama-server's
# /apply-template and /tokenize.
#   bench/chat_turns.sh [BUILD_DIR] [MODEL]      MODEL: a GGUF (default: the build's tiny-chat test model)
#   TURNS=8 ROUNDS=5 MAX_TOKENS=16 REPLY_WORDS=120 THREADS=$(nproc)
set -euo pipefail
BUILD=${1:-build}
cmake --build "$BUILD" --target chat_turns >/dev/null  # benchmarks are not part of make build
source "$BUILD/bench/bench.env"
MODEL=${2:-$BUILD/models/tiny-chat.gguf}
"$BUILD/bench/chat_turns" --model "$MODEL" --worker "$BUILD/bin/spillway-worker" --llama-server "$LLAMA_SERVER" \
  --threads "${THREADS:-$(nproc)}" --turns "${TURNS:-8}" --rounds "${ROUNDS:-5}" --max-tokens "${MAX_TOKENS:-16}" \
  --reply-words "${REPLY_WORDS:-120}"
echo
"$BUILD/bench/chat_turns" --model "$MODEL" --worker "$BUILD/bin/spillway-worker" --llama-server "$LLAMA_SERVER" \
  --threads "${THREADS:-$(nproc)}" --turns "${TURNS:-8}" --rounds "${ROUNDS:-5}" --max-tokens "${MAX_TOKENS:-16}" \
  --reply-words "${REPLY_WORDS:-120}" --count-first
echo
QWEN_MODEL="$BUILD/bench/tiny-qwen2.gguf"
[ -f "$QWEN_MODEL" ] || "$BUILD/bin/spillway" mkmodel --preset tiny --vocab "$(dirname "$LLAMA_VOCAB")/ggml-vocab-qwen2.gguf" \
  --out "$QWEN_MODEL" >/dev/null
"$BUILD/bench/chat_turns" --model "$QWEN_MODEL" --worker "$BUILD/bin/spillway-worker" --llama-server "$LLAMA_SERVER" \
  --threads "${THREADS:-$(nproc)}" --turns 16 --rounds "${ROUNDS:-5}" --reply-words 300 --count-only
