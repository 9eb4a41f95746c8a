#include "memory/estimator.h"

#include "memory/compute_model.h"

#include <algorithm>
#include <cstring>
#include <string_view>

namespace spillway::memory {

namespace {
constexpr uint32_t kCtxPad = 256;
constexpr uint64_t kMaxLayers = 4096;      // (the deepest models have a few hundred)
constexpr uint64_t kMaxHeadDim = 1 << 16;  // (256 is large)
constexpr uint64_t kMaxKvWidth = 1 << 20;  // KV elements of one cell in one layer: with ctx <= 2^22 and 4096 layers, no overflow
constexpr uint64_t kMaxWidth = 1 << 24;    // feed-forward width, vocabulary (a few hundred thousand at most)
uint64_t RoundUp(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }
}  // namespace

uint64_t ModelShape::kv_bytes_per_cell_per_layer(uint32_t k_x32, uint32_t v_x32) const {
  const uint64_t k = static_cast<uint64_t>(head_dim_k) * n_head_kv;
  const uint64_t v = static_cast<uint64_t>(head_dim_v) * n_head_kv;
  return (k * k_x32 + v * v_x32) / 32;
}

std::string ExactPlanReason(const gguf::Metadata& m) {
  const std::string arch = m.architecture();
  if (arch.empty()) return "";
  const std::string prefix = arch + ".";
  // Given per layer (a hybrid's recurrent layers have no heads; DeciLM and
  // OpenELM vary them): the same count for every layer made a hybrid's KV
  // tens of times too large.
  for (const char* key : {"attention.head_count", "attention.head_count_kv", "feed_forward_length",
                          "attention.key_length", "attention.value_length"}) {
    if (auto it = m.kv.find(prefix + key); it != m.kv.end() && it->second.kind == gguf::Value::Kind::kArray) {
      return "it gives " + prefix + key + " per layer";
    }
  }
  // A recurrent state (Mamba's SSM, RWKV's WKV, LFM2's short convolution,
  // Kimi's KDA), or layers that are not all attention.
  static constexpr const char* kSections[] = {"ssm.", "wkv.", "shortconv.", "kda."};
  static constexpr const char* kKeys[] = {"full_attention_interval", "attention.recurrent_layers", "token_shift_count",
                                          "time_mix_extra_dim"};
  for (auto it = m.kv.lower_bound(prefix); it != m.kv.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
    const std::string_view rest = std::string_view(it->first).substr(prefix.size());
    for (const char* section : kSections) {
      if (rest.substr(0, std::strlen(section)) == section) return "it keeps a recurrent state (" + it->first + ")";
    }
    for (const char* key : kKeys) {
      if (rest == key) return "not all of its layers are attention (" + it->first + ")";
    }
  }
  // A window (Gemma 2 and 3, Phi-3 mini...; written as 0 by converters of
  // models without one, Phi-4's), or attention compressed into a latent
  // (DeepSeek's MLA): what a layer keeps per token is not its heads' width.
  // (Present as anything but a plain 0, an array or a float too: llama.cpp's to judge.)
  auto set = [&](const char* key) { return m.kv.count(prefix + key) && m.ArchUint(key).value_or(1) != 0; };
  if (set("attention.sliding_window")) {
    return "some of its layers attend over a sliding window (" + prefix + "attention.sliding_window)";
  }
  if (set("attention.kv_lora_rank")) return "its attention keeps a compressed latent (" + prefix + "attention.kv_lora_rank)";
  return "";
}

std::string NoWeightsReason(const gguf::Metadata& m) {
  return m.tensors.empty() ? "it holds no tensors (no weights: a vocabulary-only GGUF?), so no model loads from it" : "";
}

StatusOr<ModelShape> ShapeFromMetadata(const gguf::Metadata& m) {
  ModelShape s;
  s.architecture = m.architecture();
  if (std::string why = ExactPlanReason(m); !why.empty()) {
    return Status::InvalidArgument("the metadata cannot size " + s.architecture + "'s memory: " + why);
  }
  auto need = [&](const char* key, uint32_t* out) -> Status {
    auto v = m.ArchUint(key);
    if (!v || *v == 0 || *v > (1u << 24)) return Status::InvalidArgument("GGUF lacks a valid " + s.architecture + "." + key);
    *out = static_cast<uint32_t>(*v);
    return Status::Ok();
  };
  if (s.architecture.empty()) return Status::InvalidArgument("GGUF lacks general.architecture");
  SPILLWAY_RETURN_IF_ERROR(need("block_count", &s.n_layer));
  SPILLWAY_RETURN_IF_ERROR(need("embedding_length", &s.n_embd));
  SPILLWAY_RETURN_IF_ERROR(need("attention.head_count", &s.n_head));
  // Values no model has (checked before anything is sized by them: a
  // header of a few hundred bytes could ask the estimate for millions of
  // layers, or divide by a head of no size).
  auto at_most = [&](const char* key, uint64_t value, uint64_t limit) -> Status {
    if (value > limit) {
      return Status::InvalidArgument("GGUF has " + s.architecture + "." + key + " = " + std::to_string(value) +
                                     ", more than any model has (" + std::to_string(limit) + ")");
    }
    return Status::Ok();
  };
  SPILLWAY_RETURN_IF_ERROR(at_most("block_count", s.n_layer, kMaxLayers));
  const uint64_t n_head_kv = m.ArchUint("attention.head_count_kv").value_or(s.n_head);
  if (n_head_kv == 0 || n_head_kv > s.n_head) return Status::InvalidArgument("GGUF has an invalid head_count_kv");
  s.n_head_kv = static_cast<uint32_t>(n_head_kv);
  const uint64_t head_dim_k = m.ArchUint("attention.key_length").value_or(s.n_embd / s.n_head);
  const uint64_t head_dim_v = m.ArchUint("attention.value_length").value_or(s.n_embd / s.n_head);
  if (head_dim_k == 0 || head_dim_v == 0) {
    return Status::InvalidArgument("GGUF gives " + s.architecture + "'s attention heads no size (embedding_length " +
                                   std::to_string(s.n_embd) + " over head_count " + std::to_string(s.n_head) +
                                   ", and no key_length/value_length)");
  }
  SPILLWAY_RETURN_IF_ERROR(at_most("attention.key_length", head_dim_k, kMaxHeadDim));
  SPILLWAY_RETURN_IF_ERROR(at_most("attention.value_length", head_dim_v, kMaxHeadDim));
  // Each bound alone let their product (a cell's KV width per layer) reach
  // 2^40: the KV estimate wrapped in 64 bits, and a header of a few hundred
  // bytes was planned as a small model that fits. (The largest have tens of
  // thousands: 128 heads of 192.)
  SPILLWAY_RETURN_IF_ERROR(
      at_most("attention.head_count_kv x key/value_length", n_head_kv * std::max(head_dim_k, head_dim_v), kMaxKvWidth));
  s.head_dim_k = static_cast<uint32_t>(head_dim_k);
  s.head_dim_v = static_cast<uint32_t>(head_dim_v);
  s.n_ctx_train = static_cast<uint32_t>(std::min<uint64_t>(m.ArchUint("context_length").value_or(0), UINT32_MAX));
  const uint64_t n_ff = m.ArchUint("feed_forward_length").value_or(4ull * s.n_embd);
  SPILLWAY_RETURN_IF_ERROR(at_most("feed_forward_length", n_ff, kMaxWidth));
  s.n_ff = static_cast<uint32_t>(n_ff);
  uint64_t n_vocab = 0;
  if (auto it = m.kv.find("tokenizer.ggml.tokens"); it != m.kv.end()) n_vocab = it->second.array_len;
  if (auto v = m.ArchUint("vocab_size")) n_vocab = *v;
  SPILLWAY_RETURN_IF_ERROR(at_most("vocab_size", n_vocab, kMaxWidth));
  s.n_vocab = static_cast<uint32_t>(n_vocab);
  // With its tensors listed, no more blocks than they have.
  int64_t last_block = -1;
  for (const auto& t : m.tensors) last_block = std::max<int64_t>(last_block, t.layer);
  // (Not for a split file's first part, which has the blocks of its own part only.)
  const bool split = m.Uint("split.count").value_or(1) > 1;
  if (!split && last_block >= 0 && s.n_layer > last_block + 1) {
    return Status::InvalidArgument("GGUF says " + s.architecture + ".block_count = " + std::to_string(s.n_layer) +
                                   " but its tensors have " + std::to_string(last_block + 1) + " blocks");
  }
  s.layer_bytes.assign(s.n_layer, 0);
  bool has_output = false;
  for (const auto& t : m.tensors) {
    if (t.layer >= 0) {
      if (static_cast<uint32_t>(t.layer) < s.n_layer) s.layer_bytes[static_cast<size_t>(t.layer)] += t.bytes;
    } else if (t.name == "token_embd.weight") {
      s.token_embd_bytes = t.bytes;
    } else if (t.name == "output.weight") {
      s.output_bytes += t.bytes;
      has_output = true;
    } else {
      s.output_bytes += t.bytes;  // output_norm and the like travel with the output layer
    }
  }
  s.tied_output = !has_output;
  // The worker's test (worker/model.cpp) and model_info's: a pooling type
  // other than none (0, LLAMA_POOLING_TYPE_NONE).
  s.embedding = m.PoolsEmbeddings();
  return s;
}

uint32_t KvCells(const PlacementSpec& spec) {
  // llama.cpp pads the context to 256 cells; with a stream per slot it pads
  // each slot's share to 256 again, so the pool is slots x that share.
  const uint64_t ctx = RoundUp(std::max<uint32_t>(spec.ctx, 1), kCtxPad);
  if (spec.kv_unified) return static_cast<uint32_t>(ctx);
  const uint32_t slots = std::max<uint32_t>(spec.slots, 1);
  return static_cast<uint32_t>(slots * RoundUp(std::max<uint64_t>(ctx / slots, 1), kCtxPad));
}

PlacementSpec AsWorkerRuns(const ModelShape& s, PlacementSpec spec) {
  if (!s.embedding) return spec;
  spec.kv_unified = true;
  spec.batch = spec.ubatch = std::max<uint32_t>(spec.ctx, 1);
  return spec;
}

PlacementEstimate EstimatePlacement(const ModelShape& s, const PlacementSpec& asked) {
  const PlacementSpec spec = AsWorkerRuns(s, asked);
  PlacementEstimate e;
  const int L = static_cast<int>(s.n_layer);
  int n_gpu = !spec.accelerator ? 0 : spec.gpu_layers < 0 ? L + 1 : std::min(spec.gpu_layers, L + 1);
  const int start = L + 1 - n_gpu;  // first layer index on the accelerator; L = the output layer
  e.output_on_accelerator = n_gpu >= 1;
  e.ctx_padded = KvCells(spec);
  const uint64_t kv_layer = static_cast<uint64_t>(e.ctx_padded) * s.kv_bytes_per_cell_per_layer(spec.kv_k_x32, spec.kv_v_x32);
  e.host.weights += s.token_embd_bytes;
  for (int i = 0; i < L; ++i) {
    DeviceBytes& d = i >= start ? e.accelerator : e.host;
    d.weights += s.layer_bytes[static_cast<size_t>(i)];
    d.kv += kv_layer;
    e.layers_on_accelerator += i >= start;
  }
  DeviceBytes& out = e.output_on_accelerator ? e.accelerator : e.host;
  out.weights += s.output_bytes;
  // A tied output on the accelerator needs its own copy of the embeddings there.
  if (s.tied_output && e.output_on_accelerator) out.weights += s.token_embd_bytes;
  const ComputeBytes c = EstimateCompute(s, spec, e.layers_on_accelerator, e.output_on_accelerator);
  e.accelerator.compute = c.accelerator;
  e.host.compute = c.host;
  return e;
}

uint64_t KvBytesForCells(const ModelShape& s, const PlacementSpec& spec, uint64_t cells) {
  return cells * s.n_layer * s.kv_bytes_per_cell_per_layer(spec.kv_k_x32, spec.kv_v_x32);
}

void Calibration::Observe(const std::string& key, const DeviceBytes& p, const DeviceBytes& o) {
  auto ratio = [](uint64_t obs, uint64_t pred) { return pred == 0 ? 1.0 : static_cast<double>(obs) / pred; };
  factors_[key] = {ratio(o.weights, p.weights), ratio(o.kv, p.kv), ratio(o.compute, p.compute)};
}

DeviceBytes Calibration::Apply(const std::string& key, const DeviceBytes& p) const {
  auto it = factors_.find(key);
  if (it == factors_.end()) return p;
  const auto& f = it->second;
  return {static_cast<uint64_t>(p.weights * f.weights + 0.5), static_cast<uint64_t>(p.kv * f.kv + 0.5),
          static_cast<uint64_t>(p.compute * f.compute + 0.5)};
}

}  // namespace spillway::memory
