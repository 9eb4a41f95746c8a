#include "memory/exact_plan.h"

#include <nlohmann/json.hpp>

#include <sstream>

#include "common/run_capture.h"
#include "protocol/worker_protocol.h"

namespace spillway::memory {

using nlohmann::json;

DryRunArgs DryRunArgsFor(const std::string& model, const std::string& device, const PlacementSpec& spec,
                         const std::string& kv_type) {
  DryRunArgs a;
  a.model = model;
  a.device = device;
  a.gpu_layers = spec.accelerator ? spec.gpu_layers : 0;
  a.ctx = static_cast<int>(spec.ctx);
  a.slots = static_cast<int>(spec.slots);
  a.batch = static_cast<int>(spec.batch);
  a.kv_type = kv_type;
  a.kv_unified = spec.kv_unified;
  return a;
}

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
    DeviceBytes& d = protocol::IsHostBuffer(b) ? plan.host : plan.accelerator;
    d.weights += *model;
    d.kv += *context;
    d.compute += *compute;
  }
  return plan;
}

StatusOr<ExactPlan> RunDryRun(const std::string& worker_binary, const DryRunArgs& a) {
  RunOptions options;
  options.timeout_ms = kDryRunTimeoutMs;  // (a hung driver does not hold a start forever)
  options.env = HelperEnvironment();
  auto run = RunCapture(DryRunCommand(worker_binary, a), options);
  const std::string what = "llama.cpp cannot plan " + a.model + " on " + a.device + " (spillway-worker --dry-run";
  if (!run.ok()) return Status(run.status().code(), what + "): " + run.status().message());
  if (run->exit_code == 0) {
    auto plan = ParseDryRun(run->out);
    if (!plan.ok()) return Status(plan.status().code(), what + "): " + plan.status().message());
    return plan;
  }
  // Its reason: the worker's fatal line ({"fatal": true, "code": ..., "message": ...}), the last one written.
  std::string reason, code;
  std::istringstream lines(run->err);
  for (std::string line; std::getline(lines, line);) {
    const json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.value("fatal", false) && j.contains("message") && j["message"].is_string()) {
      reason = j["message"].get<std::string>();
      code = j.contains("code") && j["code"].is_string() ? j["code"].get<std::string>() : "";
    }
  }
  const std::string exit = run->exit_code < 0 ? "ended by a signal" : "exit " + std::to_string(run->exit_code);
  const std::string message = what + ", " + exit + ")" + (reason.empty() ? "" : ": " + reason);
  // A refusal the worker explained, of the file or the placement, is final for
  // that file; no explanation, a signal, or a lack of resources (a device
  // busy or full now) may pass.
  const bool transient = reason.empty() || run->exit_code < 0 || code == "resource_exhausted" || code == "unavailable" ||
                         code == "internal" || code == "deadline_exceeded";
  return transient ? Status::Unavailable(message) : Status::InvalidArgument(message);
}

}  // namespace spillway::memory
