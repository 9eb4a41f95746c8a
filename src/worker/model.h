// A loaded model and what the worker knows about it: backends, devices,
// tokenizer, chat template and fingerprint. Wraps llama.cpp's C API; only
// src/worker includes llama.h.
//
// Thread contract: after Load() returns, every const method may be called from
// any thread (llama.cpp's vocabulary and template functions are read-only).
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "api/openai_request.h"
#include "common/status.h"
#include "worker/chat_template.h"
#include "worker/sampling.h"

struct llama_model;
struct llama_vocab;
struct ggml_backend_device;

namespace spillway::worker {

struct Placement {
  std::string device = "cpu";  // cpu | cuda:N
  int gpu_layers = 0;          // layers offloaded to `device` (-1 = all)
  int ctx = 4096;              // KV cells shared by all slots (unified pool)
  int slots = 4;
  int threads = 0;             // 0 = hardware concurrency
  int batch = 512;
  bool mmap = true;
  bool dry_run = false;        // llama.cpp's no_alloc: plan buffers, allocate nothing
  nlohmann::json ToJson() const;
};

// Routes llama.cpp's log to stderr (at `min_level` and above) and remembers
// the most recent error lines, which name what failed inside llama.cpp.
void InstallLlamaLog(int min_level);
std::string RecentLlamaErrors();
void ClearLlamaErrors();

// Loads ggml backend modules from `dir`: always the CPU backend; an
// accelerator's module only when `device` names one. A CPU placement never
// loads a GPU backend.
Status LoadBackends(const std::string& dir, const std::string& device);

struct Fingerprint {
  std::string model_sha256;
  std::string tokenizer_sha256;
  std::string chat_template_sha256;
  std::string quantization;
  nlohmann::json sampler_defaults;
  nlohmann::json stop_rules;
  std::string id;  // sha256 over all of the above
  nlohmann::json ToJson() const;
};

class Model {
 public:
  ~Model();
  // Loads weights onto the placement's devices. Allocation failures return
  // kResourceExhausted with phase=load. `on_progress` (optional) hears the
  // fraction loaded, on the loading thread.
  static StatusOr<std::unique_ptr<Model>> Load(const std::string& path, const Placement& placement,
                                               const std::function<void(float)>& on_progress = {});

  llama_model* raw() const { return model_; }
  const llama_vocab* vocab() const { return vocab_; }
  const std::vector<ggml_backend_device*>& devices() const { return devices_; }
  const std::string& path() const { return path_; }
  const std::string& name() const { return name_; }
  bool is_embedding() const { return embedding_; }
  int n_ctx_train() const;
  // Whether its positions are rotary (RoPE): a model without (a table of
  // learned positions: GPT-2, StarCoder; or ALiBi) has none past n_ctx_train.
  bool rotary_positions() const;
  int n_embd() const;
  // An embedding model's vector width (llama.cpp's n_embd_out: a projection may follow the pooling).
  int n_embd_out() const;
  // How an embedding model's vectors are pooled: its GGUF's own type when it
  // is mean, CLS or last (LLAMA_POOLING_TYPE_*), mean otherwise (a rank
  // pooling's output is a score, not a vector).
  int pooling_type() const;

  // The model's chat templates through llama.cpp's chat layer (ChatML when
  // it has none); null for an embedding model.
  const ChatTemplates* chat() const { return chat_.get(); }
  StatusOr<std::vector<int32_t>> Tokenize(const std::string& text, bool add_special) const;
  // Whether `token` is the vocabulary's end or separator token (BERT's
  // [SEP], an EOS some embedding models pool at): one Tokenize(...,
  // add_special) may end an input with.
  bool IsEndToken(int32_t token) const;
  // Returns the tokens when every id is in the vocabulary.
  StatusOr<std::vector<int32_t>> CheckTokens(std::vector<int32_t> tokens) const;
  // A token's text; `special`: control tokens as their text too (a chat
  // format's preserved tokens, logprobs), otherwise as nothing.
  std::string TokenPiece(int32_t token, bool special = false) const;
  bool IsEndOfGeneration(int32_t token) const;
  // Every end-of-generation token, found once at load (a scan of the whole
  // vocabulary, which ran on the decode thread for each request that bans
  // them, ignore_eos, before).
  const std::vector<int32_t>& end_of_generation_tokens() const { return eog_tokens_; }

  const Fingerprint& fingerprint() const { return fingerprint_; }
  const SamplerSettings& sampler_defaults() const { return sampler_defaults_; }
  nlohmann::json Describe() const;

 private:
  Model() = default;
  Status ComputeFingerprint();

  llama_model* model_ = nullptr;
  const llama_vocab* vocab_ = nullptr;
  std::vector<ggml_backend_device*> devices_;  // accelerators used; empty for CPU
  std::string path_, name_, chat_template_;
  bool embedding_ = false;
  int pooling_ = 0;  // the GGUF's <arch>.pooling_type (0: none)
  SamplerSettings sampler_defaults_;
  Fingerprint fingerprint_;
  std::unique_ptr<ChatTemplates> chat_;
  std::vector<int32_t> eog_tokens_;
};

}  // namespace spillway::worker
