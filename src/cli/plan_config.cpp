#include "cli/plan_config.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "devices/telemetry.h"
#include "gateway/gateway.h"
#include "gateway/placement_admission.h"
#include "gateway/placement_board.h"
#include "gateway/readiness.h"
#include "memory/ledger.h"

namespace spillway::cli {

namespace {

constexpr uint64_t kMiB = 1 << 20;

DevicePlan& PlanFor(std::vector<DevicePlan>& plans, const std::string& device) {
  for (auto& p : plans) {
    if (p.device == device) return p;
  }
  plans.emplace_back().device = device;
  return plans.back();
}

// When a service may be on its device at all (its windows, the interactive-idle rule); "" for always.
std::string WindowsOf(const config::ResidencyConfig& r) {
  std::string w;
  for (const auto& x : r.windows) w += (w.empty() ? "" : ", ") + x;
  std::string out = w.empty() ? "" : "on the device only in " + w;
  if (r.interactive_idle_s > 0) {
    out += (out.empty() ? "on the device only " : ", ") + std::string("once interactive work is quiet for ") +
           std::to_string(static_cast<long long>(r.interactive_idle_s)) + " s";
  }
  return out;
}

// Appended to a holder's shape, once the shape is known.
std::string WithWindows(std::string shape, const config::ResidencyConfig& r) {
  const std::string w = WindowsOf(r);
  return w.empty() ? shape : shape + "; " + w;
}

Holder HolderOf(const std::string& key, const std::string& service, const config::ResidencyConfig& r) {
  Holder h;
  h.key = key;
  h.service = service;
  h.mode = r.mode;
  h.priority = r.priority;
  h.rank = r.PriorityRank();
  h.evict_cost = r.evict_cost;
  return h;
}

std::string Shape(const config::PlacementConfig& p, size_t i) {
  const std::string role = p.role.empty() ? (i == 0 ? "primary" : "placement") : p.role;
  return role + ", ctx " + std::to_string(p.ctx) + ", " + std::to_string(p.slots) + " slot" + (p.slots == 1 ? "" : "s") +
         ", " + (p.gpu_layers < 0 ? std::string("all") : std::to_string(p.gpu_layers)) + " GPU layers";
}

uint64_t Sum(const std::vector<const Holder*>& hs) {
  return std::accumulate(hs.begin(), hs.end(), uint64_t{0}, [](uint64_t s, const Holder* h) { return s + h->bytes; });
}

// The largest sets of `cands` that fit in `room` (none of them can take one more).
std::vector<std::vector<size_t>> Maximal(const std::vector<const Holder*>& cands, uint64_t room) {
  std::vector<std::vector<size_t>> out;
  const size_t n = cands.size();
  for (uint32_t mask = 0; mask < (1u << n); ++mask) {
    uint64_t used = 0;
    for (size_t j = 0; j < n; ++j) used += (mask >> j & 1) ? cands[j]->bytes : 0;
    if (used > room) continue;
    bool maximal = true;
    for (size_t j = 0; j < n && maximal; ++j) maximal = (mask >> j & 1) || used + cands[j]->bytes > room;
    if (!maximal) continue;
    auto& set = out.emplace_back();
    for (size_t j = 0; j < n; ++j) {
      if (mask >> j & 1) set.push_back(j);
    }
  }
  return out;
}

// The device as full as it gets without `self`: the pinned holders, then the
// keep_alive ones (loaded at start), then the on_demand ones, higher priority
// first, in config order, each while it fits.
std::vector<const Holder*> FullWithout(const DevicePlan& plan, const Holder& self) {
  std::vector<const Holder*> order;
  for (const auto& h : plan.holders) {
    if (&h != &self) order.push_back(&h);
  }
  std::stable_sort(order.begin(), order.end(), [](const Holder* a, const Holder* b) {
    auto weight = [](const Holder* h) { return h->Pinned() ? 0 : h->mode == "keep_alive" ? 1 : 2; };
    return std::make_pair(weight(a), a->Pinned() ? 0 : a->rank) < std::make_pair(weight(b), b->Pinned() ? 0 : b->rank);
  });
  std::vector<const Holder*> resident;
  uint64_t used = 0;
  for (const Holder* h : order) {
    if (h->Pinned() || used + h->bytes <= *plan.budget) {
      resident.push_back(h);
      used += h->bytes;
    }
  }
  return resident;
}

}  // namespace

std::vector<DevicePlan> CollectDevices(const config::GatewayConfig& cfg) {
  std::vector<DevicePlan> plans;
  for (const auto& s : cfg.services) {
    for (size_t i = 0; i < s.placements.size(); ++i) {
      const auto& p = s.placements[i];
      if (p.device == "cpu") continue;
      Holder h = HolderOf(gateway::WorkerKey(s, i), s.name, s.residency);
      h.shape = WithWindows(Shape(p, i), s.residency);
      if (auto bytes = gateway::PredictPlacementBytes(s, i, cfg.worker_binary); bytes.ok()) {
        h.bytes = *bytes;
      } else {
        h.note = "no estimate (" + bytes.status().message() + "): not counted";
      }
      PlanFor(plans, p.device).holders.push_back(std::move(h));
    }
  }
  for (const auto& e : cfg.externals) {
    if (e.device == "cpu") continue;
    Holder h = HolderOf(gateway::ExternalKey(e), e.name, e.residency);
    h.external = true;
    // Resident, plus one request's transient peak: at least one request must be able to run.
    h.bytes = e.resident_mib > 0 ? static_cast<uint64_t>((e.resident_mib + e.transient_mib) * kMiB) : 0;
    h.shape = "external, resident_mib " + std::to_string(static_cast<long long>(e.resident_mib));
    if (e.transient_mib > 0) {
      h.shape += " + transient_mib " + std::to_string(static_cast<long long>(e.transient_mib)) + " (one request)";
    }
    h.shape = WithWindows(h.shape, e.residency);
    if (!e.Started()) h.note = "runs outside Spillway (url): held as pinned";
    if (e.resident_mib <= 0) h.note = "no resident_mib declared: not counted";
    PlanFor(plans, e.device).holders.push_back(std::move(h));
  }
  for (auto& plan : plans) {
    plan.exclusive = cfg.Device(plan.device).exclusive;
    for (auto& h : plan.holders) {
      h.reload_s = gateway::kProcessStartS + static_cast<double>(h.bytes) / gateway::kLoadBytesPerS;
    }
    auto t = devices::OpenDeviceTelemetry(plan.device);
    auto r = t.ok() ? (*t)->Read() : StatusOr<devices::DeviceReading>(t.status());
    if (!r.ok()) {
      plan.telemetry_note = r.status().message();
      continue;
    }
    plan.capacity = r->total;
    plan.free = r->free;
    const auto dc = cfg.Device(plan.device);
    plan.headroom = memory::Headroom{static_cast<uint64_t>(dc.headroom_mib * kMiB), dc.headroom_pct}.For(r->total);
    plan.budget = r->total - plan.headroom;
  }
  return plans;
}

void PlanDevice(DevicePlan& plan) {
  std::vector<const Holder*> pinned, others;
  for (const auto& h : plan.holders) (h.Pinned() ? pinned : others).push_back(&h);
  plan.pinned_bytes = Sum(pinned);
  plan.total_bytes = plan.pinned_bytes + Sum(others);
  plan.start_bytes = plan.pinned_bytes;
  for (const Holder* h : others) plan.start_bytes += h->mode == "keep_alive" ? h->bytes : 0;
  if (!plan.budget) return;
  const uint64_t budget = *plan.budget;
  // Exclusive: never together, whatever the sum, once two could be loaded there.
  std::set<std::string> other_services;
  for (const Holder* h : others) other_services.insert(h->service);
  plan.all_fit = plan.total_bytes <= budget && (!plan.exclusive || other_services.size() <= 1);
  plan.pinned_fit = plan.pinned_bytes <= budget;
  plan.start_fit = plan.start_bytes <= budget;
  if (!plan.pinned_fit) return;
  const uint64_t room = budget - plan.pinned_bytes;

  std::vector<const Holder*> cands;
  for (const Holder* h : others) {
    (h->bytes <= room ? plan.beside_pinned : plan.never_beside_pinned).push_back(h->key);
    if (h->bytes <= room) cands.push_back(h);
  }
  auto combination = [&](const std::vector<const Holder*>& set) {
    Combination c;
    c.bytes = plan.pinned_bytes + Sum(set);
    for (const Holder* h : set) c.keys.push_back(h->key);
    return c;
  };
  if (cands.size() <= kMaxEnumerated) {
    for (const auto& idx : Maximal(cands, room)) {
      std::vector<const Holder*> set;
      for (size_t j : idx) set.push_back(cands[j]);
      plan.largest.push_back(combination(set));
    }
    std::stable_sort(plan.largest.begin(), plan.largest.end(), [](const Combination& a, const Combination& b) {
      return std::make_pair(a.keys.size(), a.bytes) > std::make_pair(b.keys.size(), b.bytes);
    });
  } else {
    plan.greedy = true;
    std::vector<const Holder*> order = cands, set;
    std::stable_sort(order.begin(), order.end(), [](const Holder* a, const Holder* b) {
      return std::make_pair(a->rank, a->bytes) < std::make_pair(b->rank, b->bytes);
    });
    uint64_t used = 0;
    for (const Holder* h : order) {
      if (used + h->bytes > room) continue;
      set.push_back(h);
      used += h->bytes;
    }
    plan.largest.push_back(combination(set));
  }
  if (plan.all_fit) return;

  for (const Holder* self : others) {
    EvictionCase c;
    c.key = self->key;
    std::vector<admission::Resident> residents;
    uint64_t used = 0;
    for (const Holder* h : FullWithout(plan, *self)) {
      c.resident.push_back(h->key);
      used += h->bytes;
      residents.push_back({h->key, h->service, h->rank, h->Pinned(), h->bytes, 0, h->reload_s, 0, h->evict_cost});
    }
    c.available = used < budget ? budget - used : 0;
    c.plan = admission::PlanEviction(self->bytes, c.available, self->rank, self->key, residents, plan.exclusive);
    plan.evictions.push_back(std::move(c));
  }
}

int PlanExitCode(const std::vector<DevicePlan>& plans) {
  int code = 0;
  auto worse = [&](int c) {
    static constexpr int kSeverity[] = {0, 1, 3, 2};  // by exit code: 2 beats 3 beats 1 beats 0
    if (kSeverity[c] > kSeverity[code]) code = c;
  };
  for (const auto& p : plans) {
    if (p.holders.empty()) continue;
    if (!p.budget) worse(3);
    else if (!p.pinned_fit) worse(2);
    else if (!p.all_fit) worse(1);
  }
  return code;
}

}  // namespace spillway::cli
