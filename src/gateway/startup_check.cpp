#include "gateway/startup_check.h"

#include <filesystem>
#include <map>

#include "common/names.h"
#include "devices/sim_ledger.h"
#include "devices/telemetry.h"
#include "gateway/gateway.h"
#include "gateway/placement_admission.h"
#include "gguf/gguf_reader.h"
#include "memory/estimator.h"

namespace spillway::gateway {
namespace {

struct ModelFacts {
  std::string problem;  // empty: the worker can load it
  bool embedding = false;
  bool exact = false;  // the metadata cannot size it: llama.cpp's dry run plans each placement
};

// What the file's header says, read once.
ModelFacts ReadModelFacts(const std::string& path) {
  ModelFacts f;
  auto meta = gguf::ReadGgufFile(path);
  if (!meta.ok()) {
    f.problem = meta.status().message();
  } else if (std::string none = memory::NoWeightsReason(*meta); !none.empty()) {
    f.problem = path + ": " + none;
  } else if (!memory::ExactPlanReason(*meta).empty()) {
    // (Whether llama.cpp can run it is its dry run's to say, per placement.)
    f.exact = true;
    f.embedding = meta->PoolsEmbeddings();
  } else if (auto shape = memory::ShapeFromMetadata(*meta); !shape.ok()) {
    f.problem = "architecture '" + meta->architecture() + "' is not one Spillway can run: " + shape.status().message();
  } else {
    f.embedding = shape->embedding;
  }
  return f;
}

// Once per file: several placements share one model.
const ModelFacts& ReadModel(const std::string& path, std::map<std::string, ModelFacts>* seen) {
  if (auto it = seen->find(path); it != seen->end()) return it->second;
  return (*seen)[path] = ReadModelFacts(path);
}

// llama.cpp pads an embedding batch to a multiple of the slots and then
// aborts in its pooling: the worker refuses it at start.
std::string ShapeProblem(const ModelFacts& m, const config::PlacementConfig& p) {
  if (!m.problem.empty() || !m.embedding || p.slots <= 1 || p.ctx % p.slots == 0) return "";
  return "an embedding model needs ctx (" + std::to_string(p.ctx) + ") to be a multiple of slots (" +
         std::to_string(p.slots) + ")";
}

}  // namespace

std::string PlacementShapeProblem(const config::ServiceConfig& s, size_t pi) {
  const auto& p = s.placements.at(pi);
  return ShapeProblem(ReadModelFacts(p.ModelOr(s.model)), p);
}

std::string ModelFileProblem(const std::string& path) { return ReadModelFacts(path).problem; }

std::string DeviceProblem(const std::string& device, const std::string& backend_dir, bool needs_backend) {
  const auto d = ParseDeviceName(device);
  if (!d || d->kind == "cpu") return "";
  if (d->kind == "sim") {
    auto ledger = devices::SimLedger::Open(d->index);
    if (!ledger.ok()) return "no simulated device " + device + " (create it with `spillway sim create " + device + " --capacity-mib N`): " +
                             ledger.status().message();
    return "";
  }
  // cuda:N: the backend module must be there (for spillway-worker), and the device must exist.
  const std::string module = backend_dir + "/libggml-cuda.so";
  std::error_code ec;
  if (needs_backend && !std::filesystem::exists(module, ec)) {
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
  std::map<std::string, ModelFacts> models;
  for (size_t si = 0; si < config.services.size(); ++si) {
    const auto& s = config.services[si];
    for (size_t pi = 0; pi < s.placements.size(); ++pi) {
      const auto& p = s.placements[pi];
      const std::string prefix = "service[" + std::to_string(si) + "]";
      const std::string at = "service '" + s.name + "' placement " + std::to_string(pi) + " (" + p.Name() + "), key ";
      const std::string path = p.ModelOr(s.model);
      const ModelFacts& m = ReadModel(path, &models);
      if (!m.problem.empty()) {
        const std::string key = p.model.empty() ? prefix + ".model" : prefix + ".placement[" + std::to_string(pi) + "].model";
        out.push_back({WorkerKey(s, pi), at + key, m.problem});  // the reader names the file
      } else if (std::string shape = ShapeProblem(m, p); !shape.empty()) {
        out.push_back({WorkerKey(s, pi), at + prefix + ".placement[" + std::to_string(pi) + "].ctx", shape});
      }
      const std::string device_problem = DeviceProblem(p.device, backend_dir);
      if (!device_problem.empty()) {
        out.push_back({WorkerKey(s, pi), at + prefix + ".placement[" + std::to_string(pi) + "].device", device_problem});
      } else if (m.problem.empty() && m.exact && !config.worker_binary.empty()) {
        // Planned now (and kept): llama.cpp refuses here what its worker would refuse at load.
        if (auto plan = PredictPlacementBytes(s, pi, config.worker_binary); !plan.ok()) {
          const std::string key = p.model.empty() ? prefix + ".model" : prefix + ".placement[" + std::to_string(pi) + "].model";
          out.push_back({WorkerKey(s, pi), at + key, plan.status().message()});
        }
      }
    }
  }
  // An external server's device is where its memory is accounted: one that
  // does not exist would leave it unaccounted.
  for (size_t ei = 0; ei < config.externals.size(); ++ei) {
    const auto& e = config.externals[ei];
    // (Its own binary drives the device: spillway-worker's backend module is not needed.)
    if (std::string d = DeviceProblem(e.device, backend_dir, /*needs_backend=*/false); !d.empty()) {
      out.push_back({ExternalKey(e), "service '" + e.name + "' (external), key service.device", d});
    }
  }
  return out;
}

}  // namespace spillway::gateway
