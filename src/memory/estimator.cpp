#include "memory/estimator.h"

#include <algorithm>

namespace spillway::memory {

namespace {
constexpr uint32_t kCtxPad = 256;
uint64_t RoundUp(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }
}  // namespace

uint64_t ModelShape::kv_bytes_per_cell_per_layer(uint32_t k_x32, uint32_t v_x32) const {
  const uint64_t k = static_cast<uint64_t>(head_dim_k) * n_head_kv;
  const uint64_t v = static_cast<uint64_t>(head_dim_v) * n_head_kv;
  return (k * k_x32 + v * v_x32) / 32;
}

StatusOr<ModelShape> ShapeFromMetadata(const gguf::Metadata& m) {
  ModelShape s;
  s.architecture = m.architecture();
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
  s.n_head_kv = static_cast<uint32_t>(m.ArchUint("attention.head_count_kv").value_or(s.n_head));
  if (s.n_head_kv == 0 || s.n_head_kv > s.n_head) return Status::InvalidArgument("GGUF has an invalid head_count_kv");
  s.head_dim_k = static_cast<uint32_t>(m.ArchUint("attention.key_length").value_or(s.n_embd / s.n_head));
  s.head_dim_v = static_cast<uint32_t>(m.ArchUint("attention.value_length").value_or(s.n_embd / s.n_head));
  s.n_ctx_train = static_cast<uint32_t>(m.ArchUint("context_length").value_or(0));
  s.n_ff = static_cast<uint32_t>(m.ArchUint("feed_forward_length").value_or(4ull * s.n_embd));
  if (auto it = m.kv.find("tokenizer.ggml.tokens"); it != m.kv.end()) s.n_vocab = static_cast<uint32_t>(it->second.array_len);
  if (auto v = m.ArchUint("vocab_size")) s.n_vocab = static_cast<uint32_t>(*v);
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
  return s;
}

PlacementEstimate EstimatePlacement(const ModelShape& s, const PlacementSpec& spec) {
  PlacementEstimate e;
  const int L = static_cast<int>(s.n_layer);
  int n_gpu = !spec.accelerator ? 0 : spec.gpu_layers < 0 ? L + 1 : std::min(spec.gpu_layers, L + 1);
  const int start = L + 1 - n_gpu;  // first layer index on the accelerator; L = the output layer
  e.output_on_accelerator = n_gpu >= 1;
  e.ctx_padded = static_cast<uint32_t>(RoundUp(std::max<uint32_t>(spec.ctx, 1), kCtxPad));
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

  // Compute buffers: llama.cpp reserves the worst-case graph of one
  // micro-batch; the graph allocator reuses memory, so each device's buffer
  // is the peak of what is live at once there (fitted to llama.cpp v0.4.0's
  // reservations; Calibration corrects the rest per model and device).
  const uint64_t ub = std::min<uint32_t>(std::max<uint32_t>(spec.batch, 1), 512);
  const uint64_t act = ub * s.n_embd * 4;
  const uint64_t logits = static_cast<uint64_t>(s.n_vocab) * ub * 4;
  const uint64_t small = 14336;
  const int layers_on_host = L - e.layers_on_accelerator;
  if (spec.kv_unified) {
    // Flash attention: no score matrix; the logits dominate.
    if (!e.output_on_accelerator) {
      // Everything on the host: the logits dominate and the rest overlaps them.
      e.host.compute += logits + 2 * act + small;
    } else {
      e.accelerator.compute += logits + act;
      const uint64_t mask = static_cast<uint64_t>(e.ctx_padded) * ub * 2;  // KQ mask, f16, on the host
      e.host.compute += mask + (layers_on_host > 0 ? ub * 4 * (4ull * s.n_embd + 3ull * s.n_ff) : 2 * act + small);
    }
    return e;
  }
  // Per-slot streams without flash attention: the scores of one micro-batch
  // over one slot's cells (f32, per head) and an f32 mask are materialised;
  // the peak is the larger of them and the logits.
  const uint64_t n_kv = RoundUp(std::max<uint32_t>(spec.ctx / std::max<uint32_t>(spec.slots, 1), 1), kCtxPad);
  const uint64_t mask = n_kv * ub * 4;
  const uint64_t scores = n_kv * ub * s.n_head * 4 + mask;
  if (!e.output_on_accelerator) {
    e.host.compute += std::max(logits + 2 * act + small, scores + 6 * act);
  } else {
    e.accelerator.compute += std::max(logits + act, scores + 5 * act);
    e.host.compute += mask + (layers_on_host > 0 ? ub * 4 * (4ull * s.n_embd + 3ull * s.n_ff) : 3 * act + small);
  }
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
