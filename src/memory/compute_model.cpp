#include "memory/compute_model.h"

#include "memory/compute_graph.h"
#include "memory/graph_alloc.h"

namespace spillway::memory {

namespace {
// Buffer alignments: 128 bytes on the accelerator (CUDA's and the simulated
// device's), 32 on the host (ggml's CPU buffer, TENSOR_ALIGNMENT).
constexpr uint64_t kAcceleratorAlignment = 128, kHostAlignment = 32;
}  // namespace

ComputeBytes EstimateCompute(const ModelShape& s, const PlacementSpec& spec, int layers_on_accelerator,
                             bool output_on_accelerator) {
  const ScheduledGraph g = BuildScheduledGraph(s, spec, layers_on_accelerator, output_on_accelerator);
  const auto sizes = AllocateGraph(g, {kAcceleratorAlignment, kHostAlignment});
  ComputeBytes c;
  c.accelerator = sizes[kAcceleratorBackend];
  c.host = sizes[kHostBackend];
  return c;
}

}  // namespace spillway::memory
