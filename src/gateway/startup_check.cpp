#include "gateway/startup_check.h"

#include <filesystem>
#include <map>

#include "common/names.h"
#include "devices/sim_ledger.h"
#include "devices/telemetry.h"
#include "gateway/gateway.h"
#include "gguf/gguf_reader.h"
#include "memory/estimator.h"

namespace spillway::gateway {
namespace {

// Reads the header once per file: several placements share one model.
std::string ModelProblem(const std::string& path, std::map<std::string, std::string>* seen) {
  if (auto it = seen->find(path); it != seen->end()) return it->second;
  return (*seen)[path] = ModelFileProblem(path);
}

}  // namespace

std::string ModelFileProblem(const std::string& path) {
  std::string problem;
  auto meta = gguf::ReadGgufFile(path);
  if (!meta.ok()) {
    problem = meta.status().message();
  } else if (auto shape = memory::ShapeFromMetadata(*meta); !shape.ok()) {
    problem = "architecture '" + meta->architecture() + "' is not one Spillway can run: " + shape.status().message();
  }
  return problem;
}

std::string DeviceProblem(const std::string& device, const std::string& backend_dir) {
  const auto d = ParseDeviceName(device);
  if (!d || d->kind == "cpu") return "";
  if (d->kind == "sim") {
    auto ledger = devices::SimLedger::Open(d->index);
    if (!ledger.ok()) return "no simulated device " + device + " (create it with `spillway sim create " + device + "`): " +
                             ledger.status().message();
    return "";
  }
  // cuda:N: the backend module must be there, and the device must exist.
  const std::string module = backend_dir + "/libggml-cuda.so";
  std::error_code ec;
  if (!std::filesystem::exists(module, ec)) {
    return "no CUDA backend module at " + module + " (build with SPILLWAY_CUDA=1 scripts/llama.sh)";
  }
  auto telemetry = devices::OpenDeviceTelemetry(device);
  if (!telemetry.ok()) return "cannot read " + device + ": " + telemetry.status().message();
  auto reading = (*telemetry)->Read();
  if (!reading.ok()) return "no usable " + device + ": " + reading.status().message();
  return "";
}

std::vector<StartupProblem> CheckStartup(const config::GatewayConfig& config, const std::string& backend_dir) {
  std::vector<StartupProblem> out;
  std::map<std::string, std::string> models;
  for (size_t si = 0; si < config.services.size(); ++si) {
    const auto& s = config.services[si];
    for (size_t pi = 0; pi < s.placements.size(); ++pi) {
      const auto& p = s.placements[pi];
      const std::string prefix = "service[" + std::to_string(si) + "]";
      const std::string at = "service '" + s.name + "' placement " + std::to_string(pi) + " (" + p.Name() + "), key ";
      const std::string path = p.ModelOr(s.model);
      if (std::string m = ModelProblem(path, &models); !m.empty()) {
        const std::string key = p.model.empty() ? prefix + ".model" : prefix + ".placement[" + std::to_string(pi) + "].model";
        out.push_back({WorkerKey(s, pi), at + key, m});  // the reader names the file
      }
      if (std::string d = DeviceProblem(p.device, backend_dir); !d.empty()) {
        out.push_back({WorkerKey(s, pi), at + prefix + ".placement[" + std::to_string(pi) + "].device", d});
      }
    }
  }
  return out;
}

}  // namespace spillway::gateway
