#include "gateway/placement_admission.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>

#include "devices/telemetry.h"
#include "gateway/gateway.h"
#include "gateway/readiness.h"
#include "gguf/gguf_reader.h"
#include "memory/estimator.h"
#include "memory/exact_plan.h"
#include "memory/ledger.h"

namespace spillway::gateway {

namespace {

std::string CalKey(const config::ServiceConfig& s, const config::PlacementConfig& p) {
  return p.ModelOr(s.model) + "|" + p.device;
}

memory::PlacementSpec SpecOf(const config::PlacementConfig& p) {
  memory::PlacementSpec spec;
  spec.accelerator = p.device != "cpu";
  spec.gpu_layers = p.gpu_layers;
  spec.ctx = static_cast<uint32_t>(p.ctx);
  spec.slots = static_cast<uint32_t>(p.slots);
  spec.kv_unified = p.kv_unified;
  spec.batch = static_cast<uint32_t>(p.batch);
  return spec;
}

// A placement's uncalibrated estimate on its device and its model's vocabulary.
struct Estimate {
  memory::DeviceBytes part;
  uint32_t n_vocab = 0;
  bool exact = false;  // llama.cpp's dry run planned it (the metadata cannot size the model)
};

// llama.cpp's own plan of a model the metadata cannot size (a hybrid, a
// recurrent model...): spillway-worker's dry run of the placement.
StatusOr<Estimate> ExactEstimate(const std::string& worker_binary, const std::string& path,
                                 const config::PlacementConfig& p, const gguf::Metadata& meta, const std::string& why) {
  if (worker_binary.empty()) return Status::Unavailable(path + ": the metadata cannot size it (" + why + ")");
  auto plan = memory::RunDryRun(worker_binary, memory::DryRunArgsFor(path, p.device, SpecOf(p)));
  if (!plan.ok()) return plan.status();
  uint64_t n_vocab = 0;
  if (auto it = meta.kv.find("tokenizer.ggml.tokens"); it != meta.kv.end()) n_vocab = it->second.array_len;
  return Estimate{p.device != "cpu" ? plan->accelerator : plan->host,
                  static_cast<uint32_t>(std::min<uint64_t>(n_vocab, UINT32_MAX)), /*exact=*/true};
}

// Reading a GGUF's metadata (its whole vocabulary) and replaying its compute
// graph takes milliseconds (a dry run, a fraction of a second), and a start
// gate asks for the same placement again and again while a service waits for
// room: the estimate is kept per model file (path, device and inode, size,
// modification and change times: a file replaced under its name, even with
// its old mtime, is estimated again) and placement. Errors are not kept,
// except a dry run's final refusal (kInvalidArgument: the same file fails the
// same way, so not a process start at every ask); one that may pass (a
// device busy or full, a worker that could not start or ran too long) is
// asked again.
StatusOr<Estimate> EstimateOf(const std::string& worker_binary, const std::string& path,
                              const config::PlacementConfig& p) {
  static std::mutex mu;
  static std::map<std::string, StatusOr<Estimate>> memo;
  const memory::PlacementSpec spec = SpecOf(p);
  struct stat st {};
  std::string key;
  if (::stat(path.c_str(), &st) == 0) {
    char k[256];
    std::snprintf(k, sizeof k, "|%llu:%llu|%lld|%lld.%09ld|%lld.%09ld|%d|%d|%u|%u|%d|%u|%u|%u|%u|",
                  static_cast<unsigned long long>(st.st_dev), static_cast<unsigned long long>(st.st_ino),
                  static_cast<long long>(st.st_size), static_cast<long long>(st.st_mtim.tv_sec), st.st_mtim.tv_nsec,
                  static_cast<long long>(st.st_ctim.tv_sec), st.st_ctim.tv_nsec, spec.accelerator, spec.gpu_layers,
                  spec.ctx, spec.slots, spec.kv_unified, spec.batch, spec.ubatch, spec.kv_k_x32, spec.kv_v_x32);
    key = path + k + p.device + "|" + worker_binary;
    std::lock_guard<std::mutex> lk(mu);
    if (auto it = memo.find(key); it != memo.end()) return it->second;
  }
  auto meta = gguf::ReadGgufFile(path);
  if (!meta.ok()) return meta.status();  // (it names the file)
  if (std::string none = memory::NoWeightsReason(*meta); !none.empty()) return Status::InvalidArgument(path + ": " + none);
  StatusOr<Estimate> e = Status::Internal("no estimate");
  const std::string why = memory::ExactPlanReason(*meta);
  if (!why.empty()) {
    e = ExactEstimate(worker_binary, path, p, *meta, why);
    if (!e.ok() && e.status().code() != StatusCode::kInvalidArgument) return e.status();
  } else {
    auto shape = memory::ShapeFromMetadata(*meta);
    if (!shape.ok()) return Status(shape.status().code(), path + ": " + shape.status().message());
    const auto est = memory::EstimatePlacement(*shape, spec);
    e = Estimate{spec.accelerator ? est.accelerator : est.host, shape->n_vocab};
  }
  if (!key.empty()) {
    std::lock_guard<std::mutex> lk(mu);
    if (memo.size() >= 256) memo.clear();  // configs hold a few placements; a bound, not a policy
    memo.insert_or_assign(key, e);
  }
  return e;
}

// A placement's predicted bytes on its device (calibrated), or why there is no estimate.
StatusOr<uint64_t> Predict(const std::string& worker_binary, const config::ServiceConfig& s,
                           const config::PlacementConfig& p, uint32_t* n_vocab, PlacementCalibration* cal,
                           bool* exact = nullptr) {
  auto e = EstimateOf(worker_binary, p.ModelOr(s.model), p);
  if (!e.ok()) return e.status();
  memory::DeviceBytes part = e->part;
  if (cal) part = cal->Apply(CalKey(s, p), part);
  if (n_vocab) *n_vocab = e->n_vocab;
  if (exact) *exact = e->exact;
  return part.total();
}

std::map<std::string, PlacementAdmission> Admit(PlacementCalibration* cal, const config::GatewayConfig& cfg,
                                                const std::string* only,
                                                const std::set<std::string>& running,
                                                const std::set<std::string>& starting = {}) {
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
        device, *capacity, HeadroomOf(dc));
    l->Observe(*free, 1);
    return (ledgers[device] = std::move(l)).get();
  };
  // Workers that are starting hold nothing on their device yet, but will:
  // their predictions are reserved first, so that two starts at once (after a
  // device loss) cannot both count on the same free memory.
  for (const auto& s : cfg.services) {
    for (size_t i = 0; i < s.placements.size(); ++i) {
      const std::string key = WorkerKey(s, i);
      if (!starting.count(key) || (only && key == *only)) continue;
      auto bytes = Predict(cfg.worker_binary, s, s.placements[i], nullptr, cal);
      memory::DeviceLedger* l = bytes.ok() ? ledger_for(s.placements[i].device) : nullptr;
      // One that does not fit is loading into what is left: it holds that
      // (reserving nothing, it left the whole free memory to the next start).
      if (l && !l->Reserve(key, *bytes, 1).ok()) (void)l->Reserve(key, l->Available(), 1);
    }
  }
  // At start, the pinned external servers Spillway starts load beside the
  // pinned placements, with no start gate of their own: their declared
  // resident memory is held first, so that no placement counts on it (the
  // two loaded together past the device). One that does not fit holds what
  // is left, as a starting worker does.
  for (const auto& e : cfg.externals) {
    if (only || !e.Started() || e.residency.mode != "pinned" || e.device == "cpu" || e.resident_mib <= 0) continue;
    if (memory::DeviceLedger* l = ledger_for(e.device)) {
      const auto bytes = static_cast<uint64_t>(e.resident_mib * 1024 * 1024);
      if (!l->Reserve(ExternalKey(e), bytes, 1).ok()) (void)l->Reserve(ExternalKey(e), l->Available(), 1);
    }
  }
  // At start, placements that load on demand (their service's residency is
  // not pinned) come last and reserve nothing: each must fit beside the
  // pinned ones when it loads, not beside every other on-demand one (the
  // start gate makes room for it then, see gateway_residency.cpp).
  auto movable = [](const config::ServiceConfig& s, size_t i) {
    return s.placements[i].device != "cpu" && s.residency.mode != "pinned";
  };
  std::vector<std::pair<const config::ServiceConfig*, size_t>> order;
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& s : cfg.services) {
      for (size_t i = 0; i < s.placements.size(); ++i) {
        if (movable(s, i) == (pass == 1)) order.emplace_back(&s, i);
      }
    }
  }
  // At start, what the adopted workers of movable placements hold on each
  // device: the start gate may unload an idle one to load another, so a
  // movable placement is checked beside the pinned ones, not beside them (an
  // on-demand service that did not fit beside one adopted after a restart was
  // refused for good, each of its requests a 503).
  std::map<std::string, uint64_t> evictable;
  for (const auto& [sp, i] : order) {
    if (only || !movable(*sp, i) || !running.count(WorkerKey(*sp, i))) continue;
    if (auto bytes = Predict(cfg.worker_binary, *sp, sp->placements[i], nullptr, cal); bytes.ok()) {
      evictable[sp->placements[i].device] += *bytes;
    }
  }
  // Per service, what its warm CPU replicas admitted so far hold: loaded at
  // start together, they are held to the CPU path's budget together (each
  // was held to it alone, and two of 0.6 of it both loaded, past it; the
  // line then refused every request for good).
  std::map<std::string, uint64_t> warm_cpu;
  for (const auto& [sp, i] : order) {
    {
      const config::ServiceConfig& s = *sp;
      if (only && WorkerKey(s, i) != *only) continue;
      const auto& p = s.placements[i];
      PlacementAdmission a;
      a.device = p.device;
      bool exact = false;
      auto predicted = Predict(cfg.worker_binary, s, p, &a.n_vocab, cal, &exact);
      if (!predicted.ok()) {
        // Not a model the estimator understands: let llama.cpp be the judge.
        a.admitted = true;
        a.reason = "no estimate (" + predicted.status().message() + ")";
        out[WorkerKey(s, i)] = a;
        continue;
      }
      a.predicted_bytes = *predicted;
      memory::DeviceLedger* l = ledger_for(p.device);
      const uint64_t budget = s.OnCpuPath(i) ? CpuPathBudgetBytes(s) : 0;
      const bool warm = budget && ResolveReadiness(s, i, cfg.worker_binary).policy == "warm";  // (loads at start)
      if (!s.admission.enabled) {
        a.admitted = true;
        a.reason = "admission disabled: started without a memory check";
      } else if (budget && a.predicted_bytes > budget) {
        a.reason = "the CPU replica needs " + std::to_string(a.predicted_bytes >> 20) +
                   " MiB, beyond the CPU path's RAM budget of " + std::to_string(budget >> 20) + " MiB";
      } else if (warm && warm_cpu[s.name] + a.predicted_bytes > budget) {
        a.reason = "the CPU replica needs " + std::to_string(a.predicted_bytes >> 20) + " MiB, and beside the " +
                   std::to_string(warm_cpu[s.name] >> 20) + " MiB of the service's other warm CPU replicas that " +
                   "passes the CPU path's RAM budget of " + std::to_string(budget >> 20) +
                   " MiB (make it on-demand or mmap, or raise ram_budget_mib)";
      } else if (running.count(WorkerKey(s, i))) {
        a.admitted = true;
        a.reason = "running already (adopted from the previous gateway): its " +
                   std::to_string(a.predicted_bytes >> 20) + " MiB predicted are in use";
      } else if (!l) {
        a.admitted = true;
        a.reason = "device memory unknown; admitted without a check";
      } else if (Status st = l->Reserve(WorkerKey(s, i), a.predicted_bytes, 1); st.ok()) {
        a.admitted = true;
        a.reason = "fits: " + std::to_string(a.predicted_bytes >> 20) + " MiB " +
                   (exact ? "planned by llama.cpp's dry run" : "predicted");
        if (!only && movable(s, i)) {
          l->Release(WorkerKey(s, i));  // loads when needed; holds nothing at start
          a.reason += " (loads on demand, beside the pinned services)";
        }
      } else if (!only && movable(s, i) && a.predicted_bytes <= l->Available() + evictable[p.device]) {
        a.admitted = true;
        a.reason = "fits: " + std::to_string(a.predicted_bytes >> 20) + " MiB " +
                   (exact ? "planned by llama.cpp's dry run" : "predicted") +
                   " (loads on demand, once an idle on-demand service adopted from the previous gateway unloads)";
      } else {
        a.reason = st.message();
      }
      if (a.admitted && warm) warm_cpu[s.name] += a.predicted_bytes;
      out[WorkerKey(s, i)] = a;
    }
  }
  return out;
}

}  // namespace

bool FindPlacement(const config::GatewayConfig& cfg, const std::string& key, const config::ServiceConfig** s,
                   size_t* i) {
  for (const auto& svc : cfg.services) {
    for (size_t k = 0; k < svc.placements.size(); ++k) {
      if (WorkerKey(svc, k) == key) {
        *s = &svc;
        *i = k;
        return true;
      }
    }
  }
  return false;
}

uint64_t CpuPathBudgetBytes(const config::ServiceConfig& s) {
  if (s.cpu_path.ram_budget_mib > 0) return static_cast<uint64_t>(s.cpu_path.ram_budget_mib * 1024 * 1024);
  auto h = devices::HostTelemetry().Read();
  return h.ok() ? h->total / 2 : 0;
}

memory::DeviceBytes PlacementCalibration::Apply(const std::string& key, const memory::DeviceBytes& predicted) {
  std::lock_guard<std::mutex> lk(mu_);
  return calibration_.Apply(key, predicted);
}

void PlacementCalibration::Observe(const std::string& key, const memory::DeviceBytes& predicted,
                                   const memory::DeviceBytes& observed) {
  std::lock_guard<std::mutex> lk(mu_);
  calibration_.Observe(key, predicted, observed);
}

StatusOr<uint64_t> PredictPlacementBytes(const config::ServiceConfig& s, size_t i, const std::string& worker_binary) {
  return Predict(worker_binary, s, s.placements[i], nullptr, nullptr);
}

StatusOr<memory::DeviceBytes> PlacementDeviceBytes(const config::ServiceConfig& s, size_t i,
                                                   const std::string& worker_binary) {
  auto e = EstimateOf(worker_binary, s.placements[i].ModelOr(s.model), s.placements[i]);
  if (!e.ok()) return e.status();
  return e->part;
}

void RecordObserved(PlacementCalibration& cal, const config::GatewayConfig& cfg, const std::string& key,
                    uint64_t observed_bytes) {
  const config::ServiceConfig* s = nullptr;
  size_t i = 0;
  if (!FindPlacement(cfg, key, &s, &i) || observed_bytes == 0) return;
  auto e = EstimateOf(cfg.worker_binary, s->placements[i].ModelOr(s->model), s->placements[i]);
  if (!e.ok()) return;
  const memory::DeviceBytes predicted = e->part;
  // One factor on the total, carried by the compute term (weights and KV are exact).
  memory::DeviceBytes observed = predicted;
  const int64_t delta = static_cast<int64_t>(observed_bytes) - static_cast<int64_t>(predicted.total());
  observed.compute = static_cast<uint64_t>(std::max<int64_t>(0, static_cast<int64_t>(predicted.compute) + delta));
  cal.Observe(CalKey(*s, s->placements[i]), predicted, observed);
}

std::map<std::string, PlacementAdmission> AdmitPlacements(PlacementCalibration* cal, const config::GatewayConfig& cfg,
                                                          const std::set<std::string>& running) {
  return Admit(cal, cfg, nullptr, running);
}

PlacementAdmission AdmitPlacement(PlacementCalibration* cal, const config::GatewayConfig& cfg, const std::string& key,
                                  const std::set<std::string>& starting) {
  auto all = Admit(cal, cfg, &key, {}, starting);
  auto it = all.find(key);
  return it == all.end() ? PlacementAdmission{true, "", 0, 0, "unknown placement"} : it->second;
}

}  // namespace spillway::gateway
