// A replica of ggml's graph allocator (ggml-alloc.c, ggml 0.23 as pinned by
// llama.cpp v0.4.0), run over a graph description instead of real tensors,
// so that compute buffers can be sized exactly without llama.cpp.
//
// ggml_gallocr walks the scheduled graph once: it places every input leaf
// first, then each node in order (reusing its parent's memory in place where
// ggml allows it), and frees a tensor after its last consumer. Each buffer's
// size is the high-water mark of its best-fit placements, holes included.
//
// Pure: no I/O, no clock.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace spillway::memory {

// One tensor of a graph. Leaves (weights, KV cache, inputs) come before the
// nodes that use them; `src` and `view_src` are indices into the same list.
struct GraphTensor {
  uint64_t bytes = 0;
  std::array<int64_t, 4> ne{1, 1, 1, 1};  // shape; with type_size, what in-place reuse compares
  int type_size = 4;
  bool contiguous = true;
  int backend = -1;           // buffer it is allocated in (set by the scheduler for nodes)
  bool preallocated = false;  // weights and KV cache: not the allocator's
  bool input = false, output = false;
  bool inplace_op = false;    // ggml_op_can_inplace
  bool view_op = false;       // VIEW/RESHAPE/PERMUTE/TRANSPOSE (ggml_is_view_op)
  bool dep = false;           // a scheduler dependency view (GGML_OP_NONE): counts no view
  int view_src = -1;
  std::vector<int> src;
};

struct ScheduledGraph {
  std::vector<GraphTensor> tensors;
  std::vector<int> leafs, nodes;  // allocation order, as ggml's graph_copy lists them
};

// Bytes of each buffer (index = backend) after ggml_gallocr_reserve_n.
std::vector<uint64_t> AllocateGraph(const ScheduledGraph& g, const std::vector<uint64_t>& alignment);

}  // namespace spillway::memory
