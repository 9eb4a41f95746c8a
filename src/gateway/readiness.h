// How a service's CPU fallback replica is kept ready (FailoverConfig::readiness):
//
//   warm       loaded at start (weights, KV pool, compute buffers): ready now,
//              holds its RAM all the time;
//   mmap       the worker starts with the weights mapped; its context (KV
//              pool, compute buffers) is created on the first request and
//              freed after idle_unload_s: ready in the time of a context;
//   on-demand  no process until a request needs it, stopped after
//              idle_unload_s: ready in the time of a whole load;
//   auto       the lightest of on-demand, mmap, warm whose expected
//              readiness time fits recovery_budget_s.
//
// Expected times come from the model's bytes (GGUF metadata) at conservative
// rates; the measured ones are reported next to them in /v1/status.
#pragma once

#include <string>

#include "config/config.h"

namespace spillway::gateway {

struct Readiness {
  std::string policy;       // warm | mmap | on-demand
  double expected_s = 0;    // from idle to ready
  std::string reason;
};

// Rates behind the expectations (bytes per second), conservative for a
// cold page cache on a SATA SSD and for first-touch memory.
inline constexpr double kLoadBytesPerS = 400e6;
inline constexpr double kContextBytesPerS = 2e9;
inline constexpr double kProcessStartS = 0.3;

// Placement `i` of `s`: only CPU-path placements (see ServiceConfig::OnCpuPath)
// follow the service's policy; every other placement is warm.
// A model the metadata cannot size is sized by `worker_binary`'s dry run
// (placement_admission.h: kept, so the gateway's callers agree).
Readiness ResolveReadiness(const config::ServiceConfig& s, size_t i, const std::string& worker_binary = "");

}  // namespace spillway::gateway
