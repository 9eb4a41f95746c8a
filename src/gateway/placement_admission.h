// Placement-level admission (before any worker starts): each placement's
// predicted memory (weights + KV pool + compute on its device, from GGUF
// metadata, or llama.cpp's dry run for a model the metadata cannot size,
// with config.worker_binary) is reserved in its device's ledger against capacity - headroom
// and the device's observed free memory (other services and other programs
// included). A placement that does not fit is not started, and says why.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "config/config.h"
#include "memory/estimator.h"
#include "memory/ledger.h"

namespace spillway::gateway {

struct PlacementAdmission {
  bool admitted = false;
  std::string device;
  uint64_t predicted_bytes = 0;  // on its device
  uint32_t n_vocab = 0;          // from the GGUF (0: unknown)
  std::string reason;
};

// The host-RAM budget of a service's CPU path (ram_budget_mib, or half of
// the host's memory when unset; 0 when the host's memory is unknown).
uint64_t CpuPathBudgetBytes(const config::ServiceConfig& s);

// Calibration: what workers of a (model, device) actually allocated on their
// device (llama.cpp's breakdown in /v1/worker/info, see RecordObserved).
// Later admissions of the same (model, device) scale their prediction by
// observed / predicted. Owned by whoever admits (the gateway's serve loop), not
// a process-wide global. Thread-safe.
class PlacementCalibration {
 public:
  memory::DeviceBytes Apply(const std::string& key, const memory::DeviceBytes& predicted);
  void Observe(const std::string& key, const memory::DeviceBytes& predicted, const memory::DeviceBytes& observed);

 private:
  std::mutex mu_;
  memory::Calibration calibration_;
};

// `cal` (may be null: uncalibrated predictions) is applied to every prediction.
// Keyed by WorkerKey(service, index). `running`: placements whose worker an
// earlier gateway left serving and that will be adopted (Supervisor::StopUnadoptable):
// admitted as they are, since the memory the device reports in use is theirs.
std::map<std::string, PlacementAdmission> AdmitPlacements(PlacementCalibration* cal, const config::GatewayConfig& config,
                                                          const std::set<std::string>& running = {});

// Placement `i` of `s`: its predicted bytes on its device (weights + KV pool
// + compute from GGUF metadata), uncalibrated, as admission predicts them
// before any worker ran; the estimator's error when the model has no estimate.
// The memory kept free on a device, as its [[device]] configures it.
inline memory::Headroom HeadroomOf(const config::DeviceConfig& dc) {
  return memory::Headroom{static_cast<uint64_t>(dc.headroom_mib * 1024 * 1024), dc.headroom_pct};
}

// A model the metadata cannot size is planned by `worker_binary`'s dry run
// (none: no estimate); the plan is kept, as every estimate is.
StatusOr<uint64_t> PredictPlacementBytes(const config::ServiceConfig& s, size_t i, const std::string& worker_binary = "");
// The same, per component (weights, KV, compute) on the placement's device.
StatusOr<memory::DeviceBytes> PlacementDeviceBytes(const config::ServiceConfig& s, size_t i,
                                                   const std::string& worker_binary);

// A worker of placement `key` allocated `observed_bytes` on its device.
void RecordObserved(PlacementCalibration& cal, const config::GatewayConfig& config, const std::string& key,
                    uint64_t observed_bytes);

// One placement again (a restart): its own current use of the device is gone
// (its worker exited), everything else is as the device reports it now, less
// the predictions of the placements in `starting` (workers started but not
// loaded yet: the device does not show their memory so far); one whose
// prediction does not fit holds all that is left.
PlacementAdmission AdmitPlacement(PlacementCalibration* cal, const config::GatewayConfig& config,
                                  const std::string& key, const std::set<std::string>& starting = {});

}  // namespace spillway::gateway
