// llama.cpp's own plan of a placement: `spillway-worker --dry-run` opens the
// model with no_alloc (its header and tensor table, never its weights) on the
// placement's device and reports every buffer llama.cpp would allocate.
// Exact for every architecture llama.cpp runs, for the price of a process
// start and a model open (a fraction of a second). The gateway plans so the
// models whose metadata cannot size them (ExactPlanReason, memory/estimator.h)
// and keeps each plan; `spillway plan --exact` compares it with the estimate.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "memory/estimator.h"

namespace spillway::memory {

// A placement as the worker takes it on its command line.
struct DryRunArgs {
  std::string model;
  std::string device = "cpu";
  int gpu_layers = 0;
  int ctx = 4096;
  int slots = 1;
  int batch = 512;
  std::string kv_type = "f16";
  bool kv_unified = false;
};

struct ExactPlan {
  DeviceBytes accelerator;  // zero for a CPU placement
  DeviceBytes host;
};

std::vector<std::string> DryRunCommand(const std::string& worker_binary, const DryRunArgs& a);

// The worker's report (stdout) as bytes per device: buffers named "CPU..."
// are the host's, every other one the accelerator's.
StatusOr<ExactPlan> ParseDryRun(const std::string& out);

// Runs the dry run. A model llama.cpp cannot open fails with the worker's own
// reason (its fatal line on stderr).
StatusOr<ExactPlan> RunDryRun(const std::string& worker_binary, const DryRunArgs& a);

}  // namespace spillway::memory
