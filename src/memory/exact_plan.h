// llama.cpp's own plan of a placement: `spillway-worker --dry-run` opens the
// model with no_alloc (its header, tensor table and vocabulary, never its
// weights, which it does not hash either) on the placement's device and
// reports every buffer llama.cpp would allocate, each marked as host memory
// or not. Exact for every architecture llama.cpp runs, for the price of a
// process start, the device backend's start (on CUDA that may create a
// context on the GPU for that moment) and a model open: a fraction of a
// second on the CPU and sim:N. The gateway plans so the models whose metadata
// cannot size them (ExactPlanReason, memory/estimator.h) and keeps each plan;
// `spillway plan --exact` compares it with the estimate of any other model.
#pragma once

#include <cstdint>
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

// A placement's arguments (the accelerator's layers on an accelerator only).
DryRunArgs DryRunArgsFor(const std::string& model, const std::string& device, const PlacementSpec& spec,
                         const std::string& kv_type = "f16");

struct ExactPlan {
  DeviceBytes accelerator;  // zero for a CPU placement
  DeviceBytes host;
};

std::vector<std::string> DryRunCommand(const std::string& worker_binary, const DryRunArgs& a);

// The worker's report (stdout) as bytes per device: the buffers in host
// memory (its "host" flag: CPU, CPU_Mapped, CUDA_Host's pinned memory...)
// are the host's, every other one the accelerator's.
StatusOr<ExactPlan> ParseDryRun(const std::string& out);

// Runs the dry run (in the helper environment, killed after kDryRunTimeoutMs).
// A model llama.cpp cannot open fails with the worker's own reason (its
// fatal line on stderr): kInvalidArgument when that refusal is final for the
// file and placement, kUnavailable when it may pass (no reason given, a
// signal, a device busy or full now); the run's own failures keep their code
// (a worker that could not be started: kUnavailable; one that ran too long:
// kDeadlineExceeded).
inline constexpr int64_t kDryRunTimeoutMs = 120'000;
StatusOr<ExactPlan> RunDryRun(const std::string& worker_binary, const DryRunArgs& a);

}  // namespace spillway::memory
