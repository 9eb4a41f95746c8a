#include "gateway/placement_admission.h"

#include <memory>

#include "devices/telemetry.h"
#include "gateway/gateway.h"
#include "gguf/gguf_reader.h"
#include "memory/estimator.h"
#include "memory/ledger.h"

namespace spillway::gateway {

namespace {

std::map<std::string, PlacementAdmission> Admit(const config::GatewayConfig& cfg, const std::string* only) {
  std::map<std::string, PlacementAdmission> out;
  std::map<std::string, std::unique_ptr<memory::DeviceLedger>> ledgers;
  auto ledger_for = [&](const std::string& device) -> memory::DeviceLedger* {
    auto it = ledgers.find(device);
    if (it != ledgers.end()) return it->second.get();
    std::optional<uint64_t> capacity, free;
    if (device == "cpu") {
      if (auto h = devices::HostTelemetry().Read(); h.ok()) {
        capacity = h->total;
        free = h->effective_available();
      }
    } else if (auto t = devices::OpenDeviceTelemetry(device); t.ok()) {
      if (auto r = (*t)->Read(); r.ok()) {
        capacity = r->total;
        free = r->free;
      }
    }
    if (!capacity) return nullptr;
    const auto dc = cfg.Device(device);
    auto l = std::make_unique<memory::DeviceLedger>(
        device, *capacity, memory::Headroom{static_cast<uint64_t>(dc.headroom_mib * 1024 * 1024), dc.headroom_pct});
    l->Observe(*free, 1);
    return (ledgers[device] = std::move(l)).get();
  };
  for (const auto& s : cfg.services) {
    auto meta = gguf::ReadGgufFile(s.model);
    auto shape = meta.ok() ? memory::ShapeFromMetadata(*meta) : StatusOr<memory::ModelShape>(meta.status());
    for (size_t i = 0; i < s.placements.size(); ++i) {
      if (only && WorkerKey(s, i) != *only) continue;
      const auto& p = s.placements[i];
      PlacementAdmission a;
      a.device = p.device;
      if (!shape.ok()) {
        // Not a model the estimator understands: let llama.cpp be the judge.
        a.admitted = true;
        a.reason = "no estimate (" + shape.status().message() + ")";
        out[WorkerKey(s, i)] = a;
        continue;
      }
      memory::PlacementSpec spec;
      spec.accelerator = p.device != "cpu";
      spec.gpu_layers = p.gpu_layers;
      spec.ctx = static_cast<uint32_t>(p.ctx);
      spec.slots = static_cast<uint32_t>(p.slots);
      spec.batch = static_cast<uint32_t>(p.batch);
      const auto est = memory::EstimatePlacement(*shape, spec);
      a.predicted_bytes = spec.accelerator ? est.accelerator.total() : est.host.total();
      memory::DeviceLedger* l = ledger_for(p.device);
      if (!l) {
        a.admitted = true;
        a.reason = "device memory unknown; admitted without a check";
      } else if (Status st = l->Reserve(WorkerKey(s, i), a.predicted_bytes, 1); st.ok()) {
        a.admitted = true;
        a.reason = "fits: " + std::to_string(a.predicted_bytes >> 20) + " MiB predicted";
      } else {
        a.reason = st.message();
      }
      out[WorkerKey(s, i)] = a;
    }
  }
  return out;
}

}  // namespace

std::map<std::string, PlacementAdmission> AdmitPlacements(const config::GatewayConfig& cfg) {
  return Admit(cfg, nullptr);
}

PlacementAdmission AdmitPlacement(const config::GatewayConfig& cfg, const std::string& key) {
  auto all = Admit(cfg, &key);
  auto it = all.find(key);
  return it == all.end() ? PlacementAdmission{true, "", 0, "unknown placement"} : it->second;
}

}  // namespace spillway::gateway
