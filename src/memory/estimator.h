// Memory estimates from GGUF metadata alone (no model load), for a placement
// (weights, KV cache, compute buffers per device) and for a request (KV
// growth for prompt + max_tokens).
//
// The placement rule is llama.cpp's: with N GPU layers over L repeating
// layers the last N-1 repeating layers and the output layer go to the
// accelerator (N = L + 1 puts everything there); the token embeddings stay on
// the host; each layer's KV cache lives with the layer. Weights and KV are
// exact from the tensor table (KV cells padded as llama.cpp pads them:
// memory/compute_model.h's KvCells); compute buffers replay llama.cpp's graph
// through ggml's scheduler and allocator (memory/compute_model.h) and are
// corrected per (model, device) by Calibration once a worker reports its real
// breakdown.
//
// Pure: no I/O, no clock.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "common/status.h"
#include "gguf/gguf_reader.h"

namespace spillway::memory {

struct ModelShape {
  std::string architecture;
  uint32_t n_layer = 0, n_embd = 0, n_head = 0, n_head_kv = 0, head_dim_k = 0, head_dim_v = 0;
  uint32_t n_vocab = 0, n_ctx_train = 0, n_ff = 0;
  bool tied_output = false;       // no output.weight: the output reuses token_embd
  // <arch>.pooling_type is set and not none (0): the worker serves it as an embedding model
  // (worker/model.cpp), with the settings AsWorkerRuns describes.
  bool embedding = false;
  uint64_t token_embd_bytes = 0;  // always on the host
  uint64_t output_bytes = 0;      // output.weight (or the tied copy) + output_norm
  std::vector<uint64_t> layer_bytes;
  uint64_t kv_bytes_per_cell_per_layer(uint32_t type_k_bytes_x32, uint32_t type_v_bytes_x32) const;
};

// Why the metadata alone cannot size this model, or "" when it can. Hybrid
// and recurrent models (LFM2, Granite 4.0-H, Jamba, Nemotron-H, Qwen3-Next,
// Mamba, RWKV...) keep a recurrent state per sequence beside (or instead of)
// a KV cache, and heads or widths given per layer or attention over a
// sliding window change what each layer holds. Their memory is llama.cpp's
// own plan (memory/exact_plan.h), which knows every architecture it runs.
std::string ExactPlanReason(const gguf::Metadata& m);
// Why no model loads from the file whatever its placement (it holds no
// tensors: a vocabulary-only GGUF, or a damaged one), or "" when none is
// known. A file of no weights planned as fitting in 0 MiB, and its worker
// failed at every start.
std::string NoWeightsReason(const gguf::Metadata& m);

// Fails (with ExactPlanReason) for a model the metadata cannot size.
StatusOr<ModelShape> ShapeFromMetadata(const gguf::Metadata& m);

struct PlacementSpec {
  bool accelerator = false;  // false: everything on the host (CPU placement)
  int gpu_layers = 0;        // -1 = all
  uint32_t ctx = 4096;       // KV cells in all
  uint32_t slots = 1;
  // false (the worker's default): ctx/slots cells per slot and no flash
  // attention, so attention scores over one slot's cells are materialised;
  // true: one pool of ctx cells, flash attention.
  bool kv_unified = false;
  uint32_t batch = 512;      // llama.cpp's n_batch
  uint32_t ubatch = 512;     // n_ubatch cap: one micro-batch is min(batch, ubatch, ctx) tokens
  // KV cache types as bytes per 32 values: f16 = 64, q8_0 = 34, f32 = 128.
  uint32_t kv_k_x32 = 64, kv_v_x32 = 64;
};

struct DeviceBytes {
  uint64_t weights = 0, kv = 0, compute = 0;
  uint64_t total() const { return weights + kv + compute; }
};

struct PlacementEstimate {
  DeviceBytes accelerator;  // zero for a CPU placement
  DeviceBytes host;
  int layers_on_accelerator = 0;
  bool output_on_accelerator = false;
  uint32_t ctx_padded = 0;
};

// The settings the worker really runs `shape` with (worker/engine.cpp,
// ContextParams): an embedding model gets one unified pool (with llama.cpp's
// automatic flash attention) and the whole context as one micro-batch
// (batch = ubatch = ctx), whatever `spec` asked for; any other model runs
// `spec` as given.
PlacementSpec AsWorkerRuns(const ModelShape& shape, PlacementSpec spec);

// Estimates the placement as the worker runs it (AsWorkerRuns(shape, spec)).
PlacementEstimate EstimatePlacement(const ModelShape& shape, const PlacementSpec& spec);

// Host bytes one generation request holds beyond its placement's buffers
// (for the CPU path's RAM budget): its logits row and the sampler's candidate
// array (n_vocab x 16 bytes), its token ids and text (tokens x 32 bytes) and
// the HTTP and JSON buffers of the exchange (256 KiB).
inline uint64_t RequestHostBytes(uint32_t n_vocab, uint64_t tokens) {
  return uint64_t{n_vocab} * 16 + tokens * 32 + (uint64_t{256} << 10);
}

// KV bytes that `cells` more cache cells take across all layers.
uint64_t KvBytesForCells(const ModelShape& shape, const PlacementSpec& spec, uint64_t cells);

// Per (model, device) correction from observed breakdowns: observed/predicted
// per component, applied to later predictions.
class Calibration {
 public:
  void Observe(const std::string& model_device, const DeviceBytes& predicted, const DeviceBytes& observed);
  DeviceBytes Apply(const std::string& model_device, const DeviceBytes& predicted) const;

 private:
  struct Factors {
    double weights = 1, kv = 1, compute = 1;
  };
  std::map<std::string, Factors> factors_;
};

}  // namespace spillway::memory
