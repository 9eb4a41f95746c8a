// The compute buffers llama.cpp (v0.4.0) reserves for a placement, from the
// model's shape alone.
//
// llama.cpp reserves the worst-case graph of one micro-batch (ubatch =
// min(batch, 512, ctx) tokens, every token an output) and ggml's graph
// allocator packs it per device: each buffer is the peak of what is live at
// once there, plus the holes its best-fit placement leaves. A device's peak is
// one of its phases:
//   - attention of a layer it holds: the scores of a micro-batch over one
//     stream's cells and the mask (no flash attention), or the mask and a few
//     activations (flash attention);
//   - the FFN of a layer it holds: gate, up and their product;
//   - the output: the logits, placed above whatever the last layer left live
//     (one activation when all runs on one device, more when the graph splits
//     or the FFN is narrow: holes the logits cannot reuse).
// When the graph is split, the accelerator also holds copies of the host's
// inputs (the mask, the layer input) for the whole of its part.
//
// Pure: no I/O, no clock.
#pragma once

#include <cstdint>

#include "memory/estimator.h"

namespace spillway::memory {

struct ComputeBytes {
  uint64_t accelerator = 0, host = 0;
};

// KV cells llama.cpp allocates for `spec` (the context padded as it pads it).
uint32_t KvCells(const PlacementSpec& spec);

ComputeBytes EstimateCompute(const ModelShape& shape, const PlacementSpec& spec, int layers_on_accelerator,
                             bool output_on_accelerator);

}  // namespace spillway::memory
