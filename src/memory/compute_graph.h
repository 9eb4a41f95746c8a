// The worst-case graph llama.cpp (v0.4.0) reserves compute buffers for, for
// the llama architecture, scheduled across an accelerator and the host as
// ggml's scheduler does (ggml-backend.cpp: ggml_backend_sched_split_graph).
//
// llama.cpp reserves one micro-batch of min(batch, ubatch, ctx) tokens,
// rounded up to a multiple of the slots, every original token an output.
// The graph is llama-graph.cpp's in the order ggml_build_forward_expand lists
// it: per layer the norm, Q/V/K projections with RoPE, the KV-cache stores,
// attention (scores, softmax, weighted values per KV stream; or flash
// attention over one unified pool, with F32 caches cast to F16 and Hadamard
// rotations for quantized caches), the output projection, the residual, the
// SwiGLU FFN; then the output norm and the logits (built for embedding
// models too), and for those the mean pooling. The scheduler assigns each
// op to its weights' device, spreads the rest to neighbours, and where an op
// reads a tensor from the other device it adds a copy, allocated at the start
// of the op's split.
//
// Pure: no I/O, no clock.
#pragma once

#include "memory/estimator.h"
#include "memory/graph_alloc.h"

namespace spillway::memory {

inline constexpr int kAcceleratorBackend = 0, kHostBackend = 1;

ScheduledGraph BuildScheduledGraph(const ModelShape& shape, const PlacementSpec& spec, int layers_on_accelerator,
                                   bool output_on_accelerator);

}  // namespace spillway::memory
