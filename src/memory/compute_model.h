// The compute buffers llama.cpp (v0.4.0) reserves for a placement, from the
// model's shape alone.
//
// Not a fitted model: llama.cpp sizes each device's compute buffer by laying
// out its worst-case graph with ggml's graph allocator, so this builds the
// same graph, splits it across the devices as ggml's scheduler does
// (memory/compute_graph.h) and replays the allocator over it
// (memory/graph_alloc.h). On the simulated device this matches llama.cpp's
// dry run to the byte (estimate_property_test). What it does not follow: other
// architectures than llama's graph, and backend-specific behaviour of real
// accelerators (CUDA's padded allocation sizes for quantized matrix products,
// its op offload of large batches, pipeline parallelism over several GPUs),
// which Calibration corrects once a worker reports its real breakdown.
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
