// Writes deterministic llama-architecture GGUF files with random weights and a
// real tokenizer vocabulary, for tests, benchmarks and the built-in demo.
//
// The text these models produce is meaningless: the weights are random. They
// exist so that every code path of llama.cpp (load, offload, KV cache,
// decode, sampling, embeddings) runs for real on machines that have no model
// weights. Same spec (including seed) -> byte-identical file.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace spillway {

struct DemoModelSpec {
  std::string vocab_path;       // a llama.cpp models/ggml-vocab-*.gguf file
  std::string name = "spillway-demo";
  uint32_t n_layer = 2;
  uint32_t n_embd = 64;         // multiple of 32 (quantization blocks) and of n_head
  uint32_t n_head = 4;
  uint32_t n_head_kv = 2;       // divides n_head
  uint32_t n_ff = 128;          // multiple of 32
  uint32_t n_ctx_train = 2048;
  std::string type = "f16";     // f32 | f16 | q8_0 | q4_0 (matrices; norms stay f32)
  // "llama", or "lfm2": a hybrid (LFM2's layout) whose even layers are short
  // convolutions with a recurrent state instead of attention and a KV cache
  // (its head_count_kv is given per layer, 0 for those), as Liquid's LFM2,
  // Granite 4.0-H or Qwen3-Next mix them. Not for embedding models.
  std::string arch = "llama";
  bool embedding = false;       // announced as an embedding model, pooled by `pooling`
  std::string pooling = "mean";  // embedding models: mean | cls | last (llama.cpp's LLAMA_POOLING_TYPE_*)
  uint64_t seed = 42;
  // The chat template (jinja source) written as tokenizer.chat_template;
  // "" = kDemoChatTemplate. Not written for embedding models.
  std::string chat_template;
  // For tests that prove a check catches a different model: the file differs
  // from the unmutated one in exactly one weight (blk.0.attn_norm.weight[0]).
  bool mutate_one_weight = false;
  // For plans and dry runs, which read the shape but never the weights: the
  // tensor data is left as a hole of zeros (a sparse file), so a model of
  // any size is written in milliseconds. Such a model loads but is all zeros.
  bool weights_as_holes = false;
};

// Named presets: "tiny" (tests, a few MB), "demo-chat", "demo-embed",
// "bench" (~300 MB), "bench-large" (~1.2 GB, memory-bound regime).
StatusOr<DemoModelSpec> DemoModelPreset(const std::string& name);

Status ValidateDemoModelSpec(const DemoModelSpec& spec);

// Writes the model to `out_path` (via a temporary file renamed into place).
Status WriteDemoModel(const DemoModelSpec& spec, const std::string& out_path);

// The chat template written into demo models: Qwen 2.5's without its default
// system prompt (ChatML, plus tools and tool calls).
extern const char* const kDemoChatTemplate;

}  // namespace spillway
