#include "gateway/readiness.h"

#include <cstdio>

#include "gateway/placement_admission.h"
#include "gguf/gguf_reader.h"

namespace spillway::gateway {

namespace {

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f s", s);
  return buf;
}

}  // namespace

Readiness ResolveReadiness(const config::ServiceConfig& s, size_t i, const std::string& worker_binary) {
  if (!s.OnCpuPath(i)) return {"warm", 0, "not a CPU fallback: always loaded"};
  const auto& p = s.placements[i];
  const auto& f = s.failover;
  double weights = 0, context = 0;
  // Its bytes on the host, as admission has them (the metadata estimate, or
  // llama.cpp's dry run for a hybrid...: kept, so read once).
  if (auto planned = PlacementDeviceBytes(s, i, worker_binary); planned.ok()) {
    weights = static_cast<double>(planned->weights);
    context = static_cast<double>(planned->kv + planned->compute);
  } else if (auto meta = gguf::ReadGgufFile(p.ModelOr(s.model)); meta.ok()) {
    weights = static_cast<double>(meta->file_size);  // (no estimate: its weights are most of its file)
  }
  const double mmap_s = context / kContextBytesPerS + 0.02;
  const double on_demand_s = kProcessStartS + weights / kLoadBytesPerS + mmap_s;
  if (f.readiness == "warm") return {"warm", 0, "configured"};
  if (f.readiness == "mmap") return {"mmap", mmap_s, "configured"};
  if (f.readiness == "on-demand") return {"on-demand", on_demand_s, "configured"};
  const std::string budget = "recovery budget " + Seconds(f.recovery_budget_s);
  if (on_demand_s <= f.recovery_budget_s) {
    return {"on-demand", on_demand_s, "auto: a load is expected to take " + Seconds(on_demand_s) + ", within the " + budget};
  }
  if (mmap_s <= f.recovery_budget_s) {
    return {"mmap", mmap_s, "auto: a load (" + Seconds(on_demand_s) + ") exceeds the " + budget +
                                ", creating a context (" + Seconds(mmap_s) + ") does not"};
  }
  return {"warm", 0, "auto: even a context (" + Seconds(mmap_s) + ") exceeds the " + budget};
}

}  // namespace spillway::gateway
