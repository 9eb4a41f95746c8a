#include "memory/exact_plan.h"

#include <nlohmann/json.hpp>

#include <sstream>

#include "common/run_capture.h"

namespace spillway::memory {

using nlohmann::json;

std::vector<std::string> DryRunCommand(const std::string& worker_binary, const DryRunArgs& a) {
  std::vector<std::string> argv = {worker_binary, "--model", a.model, "--device", a.device,
                                   "--gpu-layers", std::to_string(a.gpu_layers), "--ctx", std::to_string(a.ctx),
                                   "--slots", std::to_string(a.slots), "--batch", std::to_string(a.batch),
                                   "--kv-type", a.kv_type, "--dry-run"};
  if (a.kv_unified) argv.push_back("--kv-unified");
  return argv;
}

StatusOr<ExactPlan> ParseDryRun(const std::string& out) {
  const json j = json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("buffers") || !j["buffers"].is_array()) {
    return Status::Internal("spillway-worker --dry-run printed no plan");
  }
  ExactPlan plan;
  for (const auto& b : j["buffers"]) {
    if (!b.is_object() || !b.contains("name") || !b["name"].is_string()) {
      return Status::Internal("spillway-worker --dry-run printed a buffer without a name");
    }
    auto bytes = [&](const char* field) -> StatusOr<uint64_t> {
      if (!b.contains(field) || !b[field].is_number_unsigned()) {
        return Status::Internal(std::string("spillway-worker --dry-run printed a buffer without its ") + field + " bytes");
      }
      return b[field].get<uint64_t>();
    };
    auto model = bytes("model"), context = bytes("context"), compute = bytes("compute");
    for (const auto* v : {&model, &context, &compute}) {
      if (!v->ok()) return v->status();
    }
    const std::string name = b["name"].get<std::string>();
    DeviceBytes& d = name.rfind("CPU", 0) == 0 ? plan.host : plan.accelerator;
    d.weights += *model;
    d.kv += *context;
    d.compute += *compute;
  }
  return plan;
}

StatusOr<ExactPlan> RunDryRun(const std::string& worker_binary, const DryRunArgs& a) {
  auto run = RunCapture(DryRunCommand(worker_binary, a));
  if (!run.ok()) return run.status();
  if (run->exit_code == 0) return ParseDryRun(run->out);
  // Its reason: the worker's fatal line ({"fatal": true, "message": ...}), the last one written.
  std::string reason;
  std::istringstream lines(run->err);
  for (std::string line; std::getline(lines, line);) {
    const json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.value("fatal", false) && j.contains("message") && j["message"].is_string()) {
      reason = j["message"].get<std::string>();
    }
  }
  const std::string exit = run->exit_code < 0 ? "ended by a signal" : "exit " + std::to_string(run->exit_code);
  return Status::InvalidArgument("llama.cpp cannot plan " + a.model + " on " + a.device + " (spillway-worker --dry-run, " +
                                 exit + ")" + (reason.empty() ? "" : ": " + reason));
}

}  // namespace spillway::memory
