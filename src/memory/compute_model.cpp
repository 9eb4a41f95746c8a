#include "memory/compute_model.h"

#include <algorithm>

namespace spillway::memory {

namespace {
constexpr uint64_t kCtxPad = 256;
uint64_t RoundUp(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }
}  // namespace

ComputeBytes EstimateCompute(const ModelShape& s, const PlacementSpec& spec, int layers_on_accelerator,
                             bool output_on_accelerator) {
  ComputeBytes c;
  const int layers_on_host = static_cast<int>(s.n_layer) - layers_on_accelerator;
  // llama.cpp caps the batch at the requested context before padding it.
  const uint64_t ub = std::min<uint64_t>({std::max<uint32_t>(spec.batch, 1), 512, std::max<uint32_t>(spec.ctx, 1)});
  const uint64_t act = ub * s.n_embd * 4;
  const uint64_t logits = uint64_t{s.n_vocab} * ub * 4;
  const uint64_t ffn = ub * s.n_ff * 4;
  const uint64_t kv_heads = 2 * act * s.n_head_kv / std::max<uint32_t>(s.n_head, 1);  // this layer's K and V
  const uint64_t small = 14336;                                                        // positions, ids
  // Cells one micro-batch attends over: the whole pool, or one slot's stream.
  const uint64_t ctx = RoundUp(std::max<uint32_t>(spec.ctx, 1), kCtxPad);
  const uint64_t n_kv = spec.kv_unified ? ctx : RoundUp(std::max<uint64_t>(ctx / std::max<uint32_t>(spec.slots, 1), 1), kCtxPad);
  uint64_t mask, attention;
  if (spec.kv_unified) {  // flash attention: an f16 mask, no score matrix
    mask = n_kv * ub * 2;
    attention = mask + 4 * act + kv_heads;
  } else {  // f32 scores per head and an f32 mask
    mask = n_kv * ub * 4;
    attention = n_kv * ub * s.n_head * 4 + mask + 5 * act + kv_heads;
  }
  const uint64_t ffn_phase = 3 * ffn + 2 * act;
  // Below the logits: one activation when the FFN's holes take the layer's
  // output, the FFN's own footprint when it is too narrow for that.
  const uint64_t tail = 2 * uint64_t{s.n_ff} >= 3 * uint64_t{s.n_embd} ? 3 * act : 4 * ffn;
  if (!output_on_accelerator) {  // everything on the host
    c.host = std::max({attention, ffn_phase, logits + tail});
  } else if (layers_on_host == 0) {  // every layer on the accelerator; the host prepares inputs
    c.accelerator = std::max({attention, ffn_phase, logits + (spec.kv_unified ? tail : act)});
    c.host = mask + (spec.kv_unified ? 2 : 3) * act + small;
  } else {  // a split graph: the accelerator holds copies of the host's inputs
    c.accelerator = std::max(logits + 5 * act, layers_on_accelerator > 0 ? std::max(attention, ffn_phase + mask) : 0);
    c.host = std::max(attention, ffn_phase + mask);
  }
  return c;
}

}  // namespace spillway::memory
