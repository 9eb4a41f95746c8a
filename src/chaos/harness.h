// Runs one scenario of `spillway chaos` against one target and records it:
// starts the target (a Spillway gateway with its workers, the same gateway as
// a plain proxy, or llama.cpp's llama-server) on a fresh simulated device,
// plays the seeded schedule (chaos/schedule.h) with concurrent clients,
// injects the faults, samples the system every 200 ms, lets the run settle,
// reads every request's outcome back from the journal, compares the
// deterministic outputs with a reference run, and judges (chaos/verdict.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "chaos/record.h"
#include "chaos/schedule.h"

namespace spillway::chaos {

struct HarnessOptions {
  std::string bin_dir;        // spillway, spillway-worker, libggml-sim.so
  std::string models_dir;     // demo-chat.gguf, demo-embed.gguf
  std::string llama_server;   // llama-server binary ("" or missing: that baseline is reported as skipped)
  std::string work_dir;       // per-run scratch (configs, state, logs, the simulated device)
  uint64_t seed = 1;
  int64_t duration_ms = 20000;
  int faults = 3;             // per scenario
  uint64_t sim_capacity_mib = 192;
  // "sim:0" (a fresh simulated device per run) or a real one ("cuda:0"): on
  // a real device only the faults that reach it from outside (kill -9 of the
  // GPU worker, of the gateway) are injected; scenarios that need the
  // simulated device's fault injection are reported as skipped, with why.
  std::string device = "sim:0";
  bool verbose = false;
  std::function<void(const std::string&)> log;  // progress lines
};

// kSwapAll: the same gateway with llama-swap's policy instead of Spillway's
// (an exclusive device: one service loaded at a time, every service on
// demand, no priorities, no CPU paths); it runs competing_services only.
enum class Target { kSpillway, kPlainProxy, kLlamaServer, kSwapAll };
const char* TargetName(Target t);

ScenarioResult RunScenario(const Scenario& s, Target target, const HarnessOptions& opts);

// Placement profiles on the same fault-free traffic: "resident" (all layers
// on the accelerator), "split" (half of them), "cpu".
ScenarioResult RunProfile(const std::string& profile, const HarnessOptions& opts);

}  // namespace spillway::chaos
