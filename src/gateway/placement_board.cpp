#include "gateway/placement_board.h"

#include <algorithm>
#include <cmath>

#include "admission/wait_estimate.h"
#include "gateway/readiness.h"

namespace spillway::gateway {

namespace {

// A breaker as /v1/status shows it; an open one says when traffic is let
// through again (retry_in_ms: 0 once its ejection has elapsed).
nlohmann::json BreakerJson(const failover::Breaker& b, int64_t now_ms) {
  nlohmann::json j = {{"state", failover::BreakerStateName(b.state())},
                      {"ejections", b.ejections()},
                      {"last_reason", b.last_reason()}};
  if (b.state() == failover::BreakerState::kOpen) j["retry_in_ms"] = std::max<int64_t>(0, b.open_until_ms() - now_ms);
  // Half-open: one request probes it ("probe", its id, is left out of the
  // views of callers who may not see that request).
  j["probing"] = !b.probe().empty();
  if (!b.probe().empty()) j["probe"] = b.probe();
  return j;
}

failover::BreakerOptions BreakerOf(const config::ServiceConfig& s) {
  return {s.failover.breaker_failures, static_cast<int64_t>(s.failover.ejection_s * 1000),
          static_cast<int64_t>(s.failover.max_ejection_s * 1000), static_cast<int64_t>(s.failover.probe_hold_s * 1000)};
}

// A placement's wait estimate before its throughput is measured.
constexpr double kUnmeasuredWaitS = 1;

}  // namespace

std::string WorkerKey(const config::ServiceConfig& s, size_t n) { return s.name + "." + std::to_string(n); }

PlacementBoard::PlacementBoard(const config::GatewayConfig& config,
                               const std::map<std::string, PlacementAdmission>& admissions, const Clock& clock)
    : clock_(clock) {
  for (const auto& s : config.services) {
    auto& v = placements_[s.name];
    for (size_t i = 0; i < s.placements.size(); ++i) {
      const std::string key = WorkerKey(s, i);
      auto it = admissions.find(key);
      const PlacementAdmission a =
          it != admissions.end() ? it->second : PlacementAdmission{true, s.placements[i].device, 0, 0, ""};
      v.push_back(std::make_unique<Placement>(key, s.placements[i], a, failover::Breaker(BreakerOf(s), clock_)));
      v.back()->cpu_path = s.OnCpuPath(i);
      const Readiness r = ResolveReadiness(s, i, config.worker_binary);
      v.back()->readiness = r.policy;
      v.back()->readiness_reason = r.reason;
      v.back()->readiness_expected_s = r.expected_s;
      // The device's own breaker, with the first service's settings on it.
      const auto& p = s.placements[i];
      if (p.device != "cpu" && !device_breakers_.count(p.device)) {
        device_breakers_.emplace(p.device, failover::Breaker(BreakerOf(s), clock_));
      }
    }
    cpu_budgets_[s.name] = CpuPathBudgetBytes(s);
    cpu_lines_[s.name] = std::make_unique<scheduler::CpuQueue>(
        scheduler::CpuQueueOptions{static_cast<size_t>(s.cpu_path.max_queue), s.cpu_path.concurrency, cpu_budgets_[s.name]},
        clock_);
  }
}

const PlacementBoard::Placement& PlacementBoard::placement(const std::string& service, size_t index) const {
  return *placements_.at(service).at(index);
}

bool PlacementBoard::Allows(const std::string& service, size_t index) {
  std::lock_guard<std::mutex> lk(mu_);
  return BreakersAllow(*placements_.at(service).at(index));
}

bool PlacementBoard::BreakersAllow(Placement& st) {
  auto it = device_breakers_.find(st.cfg.device);
  const bool device_ok = it == device_breakers_.end() || it->second.Usable();
  return st.breaker.Usable() && device_ok;
}

void PlacementBoard::BeginProbes(Placement& st, const std::string& id) {
  st.breaker.BeginProbe(id);
  if (auto it = device_breakers_.find(st.cfg.device); it != device_breakers_.end()) it->second.BeginProbe(id);
}

PlacementBoard::Closed PlacementBoard::EndProbes(Placement& st, const std::string& id) {
  // (Said only of the probe that holds it: an older one past its hold held nothing back.)
  Closed ended = Closed::kNone;
  if (st.breaker.probe() == id) ended = Closed::kPlacement;
  st.breaker.EndProbe(id);
  if (auto it = device_breakers_.find(st.cfg.device); it != device_breakers_.end()) {
    if (it->second.probe() == id) ended = Closed::kDevice;
    it->second.EndProbe(id);
  }
  return ended;
}

std::string PlacementBoard::ProbeOut(const std::string& service, size_t index) {
  std::lock_guard<std::mutex> lk(mu_);
  return ProbeBlocking(*placements_.at(service).at(index));
}

std::string PlacementBoard::ProbeBlocking(Placement& st) {
  auto it = device_breakers_.find(st.cfg.device);
  failover::Breaker* device = it == device_breakers_.end() ? nullptr : &it->second;
  const bool own_ok = st.breaker.Usable(), device_ok = !device || device->Usable();
  if (own_ok && device_ok) return "";
  // Held back by a probe alone: each breaker that stops it is half-open with one out.
  if ((!own_ok && st.breaker.probe().empty()) || (!device_ok && device->probe().empty())) return "";
  return !own_ok ? st.breaker.probe() : device->probe();
}

std::optional<double> PlacementBoard::LineWaitS(const std::string& service, uint32_t ahead, uint64_t need,
                                                const std::function<bool(size_t)>& serving) {
  std::lock_guard<std::mutex> lk(mu_);
  const auto& states = placements_.at(service);
  // Not where the service's line is served: the CPU path (a line of its
  // own, idle while the accelerator serves: its free slot said "0 s" to
  // every request waiting for the accelerator), or a placement whose
  // breaker takes nothing, or one not serving (loading, stopped), or one
  // whose pace is not measured yet.
  std::vector<bool> serves_line(states.size());
  need = std::max<uint64_t>(1, need);
  // One whose pool can never hold `need` is no way in while another can
  // (its free slot in 1 s said nothing of the 30 s the request would wait
  // for the one that takes it); when none can, each is counted whole.
  bool one_holds_it = false;
  for (size_t k = 0; k < states.size(); ++k) {
    auto& st = *states[k];
    serves_line[k] = st.admission.admitted && !st.cpu_path && BreakersAllow(st) && serving(k) && st.gen_tps > 0;
    one_holds_it |= serves_line[k] && st.pool.request_capacity() >= need;
  }
  std::optional<double> best;
  for (size_t k = 0; k < states.size(); ++k) {
    if (!serves_line[k]) continue;
    const auto& st = states[k];
    const uint64_t capacity = std::max<uint64_t>(1, st->pool.request_capacity());
    if (one_holds_it && capacity < need) continue;
    const uint64_t wanted = std::min(need, capacity);
    // The first slot (and cells) to free, then the ones ahead served in
    // turn, as many at a time as its slots and its pool hold such requests,
    // each for as long as the requests running now take on average.
    auto est = EstimatedWaitS(*st, wanted);
    if (!est) continue;
    double sum = 0;
    int n = 0;
    for (const auto& [id, r] : st->running) {
      if (auto run = admission::ExpectedRunS(r.prompt_tokens, r.max_tokens, st->prompt_tps, st->gen_tps)) sum += *run, ++n;
    }
    const uint64_t at_once = std::max<uint64_t>(1, std::min<uint64_t>(std::max(1, st->cfg.slots), capacity / wanted));
    if (n > 0) *est += static_cast<double>(ahead / at_once) * (sum / n);
    if (!best || *est < *best) best = est;
  }
  return best;
}

std::optional<double> PlacementBoard::EstimatedWaitS(const Placement& st, uint64_t need) const {
  admission::PoolNow pool;
  pool.cells_free = st.pool.free_for_request();
  // (Attempts holding a slot: those with cells and those without, TakeSlot's.)
  pool.slots_free = static_cast<uint32_t>(std::max<int64_t>(0, st.cfg.slots - static_cast<int64_t>(st.active)));
  pool.prompt_tps = st.prompt_tps;
  pool.gen_tps = st.gen_tps;
  pool.per_slot_cells = st.cfg.kv_unified ? 0 : st.pool.request_capacity();
  const int64_t now = clock_.NowMs();
  for (const auto& [id, r] : st.running) {
    pool.running.push_back({r.cells, r.prompt_tokens, r.max_tokens, (now - r.since_ms) / 1000.0});
  }
  return admission::EstimateWaitS(pool, need);
}

std::vector<admission::PlacementView> PlacementBoard::Views(const config::ServiceConfig& svc,
                                                            const std::vector<bool>& excluded, uint64_t need,
                                                            const std::function<bool(size_t)>& startable) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& states = placements_.at(svc.name);
  auto is_excluded = [&](size_t k) { return k < excluded.size() && excluded[k]; };
  // Each placement's availability, asked once (a breaker's answer and the worker's port can change between asks).
  std::vector<bool> available(states.size()), can_start(states.size());
  bool others = false;  // is any placement usable that has not failed this request?
  for (size_t k = 0; k < states.size(); ++k) {
    can_start[k] = startable(k);
    available[k] = states[k]->admission.admitted && BreakersAllow(*states[k]) && can_start[k];
    others |= !is_excluded(k) && available[k];
  }
  std::vector<admission::PlacementView> views;
  for (size_t k = 0; k < states.size(); ++k) {
    auto& st = *states[k];
    admission::PlacementView v;
    v.name = st.cfg.Name();
    const bool ex = others && is_excluded(k);
    v.usable = !ex && available[k];
    v.hybrid = st.cfg.role == "hybrid";
    v.fallback = st.cfg.role == "fallback";
    v.cells_total = st.pool.request_capacity();
    v.cells_free = st.pool.free_for_request();
    v.slots_free = static_cast<uint32_t>(std::max<int64_t>(0, st.cfg.slots - static_cast<int64_t>(st.active)));
    v.per_slot = !st.cfg.kv_unified;
    if (svc.OnCpuPath(k)) {
      // The CPU path has a line of its own: a busy CPU replica is waited
      // for there (bounded, in order, visible), not in admission's delay.
      v.cells_free = v.cells_total;
      v.slots_free = std::max<uint32_t>(1, static_cast<uint32_t>(st.cfg.slots));
      v.own_line = true;
      if (svc.cpu_path.max_tokens > 0) v.max_tokens_cap = static_cast<uint32_t>(svc.cpu_path.max_tokens);
    }
    // When its pool frees enough, from what runs there and its measured
    // throughput; for a request larger than the pool, when the whole pool is
    // free (all it can give it, shrunk: it "never fit", and was told 1 s).
    v.est_wait_s = EstimatedWaitS(st, std::min<uint64_t>(need, v.cells_total)).value_or(kUnmeasuredWaitS);
    // Admitted to run but not usable now: its worker is starting or restarting, or its breaker will probe.
    v.comes_back = !v.usable && !ex && st.admission.admitted;
    v.probing = v.comes_back && can_start[k] && !ProbeBlocking(st).empty();
    v.prompt_tps = st.prompt_tps;
    v.gen_tps = st.gen_tps;
    views.push_back(v);
  }
  return views;
}

bool PlacementBoard::Reserve(const std::string& service, size_t index, const std::string& id, uint32_t cells,
                             uint32_t prompt_tokens, uint32_t max_tokens, const std::function<bool()>& up,
                             uint64_t* generation) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& st = *placements_.at(service).at(index);
  // A free slot too: a shared pool's cells alone let two requests decided on
  // one snapshot (one slot free) both in, and the worker answered one busy.
  if (st.active >= std::max(1, st.cfg.slots)) return false;
  if (!BreakersAllow(st)) return false;  // opened since the snapshot, or another request probes it
  if (up && !up()) return false;  // released since its port was read
  if (!st.pool.Reserve(id, cells)) return false;
  st.running[id] = {cells, prompt_tokens, max_tokens, clock_.NowMs()};
  ++st.active;
  BeginProbes(st, id);
  if (generation) *generation = st.generation;
  return true;
}

bool PlacementBoard::TakeSlot(const std::string& service, size_t index, const std::string& id, uint32_t max_tokens,
                              const std::function<bool()>& up, uint64_t* generation) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& st = *placements_.at(service).at(index);
  if (st.active >= std::max(1, st.cfg.slots)) return false;
  if (!BreakersAllow(st)) return false;  // opened since it was asked, or another request probes it
  if (up && !up()) return false;  // released since its port was read
  // Running, for the wait estimates (when its slot frees, at the measured pace).
  st.running[id] = {0, 0, max_tokens, clock_.NowMs()};
  ++st.active;
  BeginProbes(st, id);
  if (generation) *generation = st.generation;
  return true;
}

PlacementBoard::Closed PlacementBoard::Release(const std::string& service, size_t index, const std::string& id,
                                               bool cells, bool slot, bool keep_cpu_turn) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& st = *placements_.at(service).at(index);
  if (cells) st.pool.Release(id);
  st.running.erase(id);
  // (One that ended without a result, cancelled or refused as busy: the next request probes.)
  const Closed ended = EndProbes(st, id);
  if (slot) {
    --st.active;
    st.last_used_ms = clock_.NowMs();
  }
  if (auto it = cpu_lines_.find(service); it != cpu_lines_.end() && !keep_cpu_turn) it->second->Leave(id);
  return ended;
}

bool PlacementBoard::LeaveCpuLine(const std::string& service, const std::string& id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = cpu_lines_.find(service);
  return it != cpu_lines_.end() && it->second->Leave(id);
}

int PlacementBoard::Active(const std::string& service, size_t index) const {
  std::lock_guard<std::mutex> lk(mu_);
  return placements_.at(service).at(index)->active;
}

void PlacementBoard::Touch(const std::string& service, size_t index) {
  std::lock_guard<std::mutex> lk(mu_);
  placements_.at(service).at(index)->last_used_ms = clock_.NowMs();
}

void PlacementBoard::AttemptFailed(const std::string& service, size_t index, const std::string& phase,
                                   const std::string& why, std::optional<uint64_t> generation) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& st = *placements_.at(service).at(index);
  // A lost device or a dead worker cannot serve the next request either.
  if (generation && *generation != st.generation) {
    // (From a process replaced since: not its replacement's failure.)
  } else if (phase == "device" || phase == "crash") {
    st.breaker.Trip(why);
  } else {
    st.breaker.OnFailure(why);
  }
  // A lost device is lost for every placement on it.
  if (auto it = device_breakers_.find(st.cfg.device); it != device_breakers_.end()) {
    if (phase == "device") it->second.Trip(why);
    else if (phase == "kv" || phase == "compute" || phase == "load") it->second.OnFailure(why);
  }
}

PlacementBoard::Closed PlacementBoard::AttemptSucceeded(const std::string& service, size_t index,
                                                        std::optional<uint64_t> generation) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& st = *placements_.at(service).at(index);
  // Whether `b` closes now (a half-open one: an open one's ejection is not over).
  auto closes = [](failover::Breaker& b) {
    const bool was = b.state() != failover::BreakerState::kClosed;
    b.OnSuccess();
    return was && b.state() == failover::BreakerState::kClosed;
  };
  Closed closed = Closed::kNone;
  if ((!generation || *generation == st.generation) && closes(st.breaker)) closed = Closed::kPlacement;
  if (auto it = device_breakers_.find(st.cfg.device); it != device_breakers_.end() && closes(it->second)) {
    closed = Closed::kDevice;
  }
  return closed;
}

PlacementBoard::Closed PlacementBoard::Answering(const std::string& service, size_t index, const std::string& id,
                                                 uint64_t generation) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& st = *placements_.at(service).at(index);
  Closed closed = Closed::kNone;
  if (generation == st.generation && st.breaker.Probing(id)) {
    st.breaker.OnSuccess();
    closed = Closed::kPlacement;
  }
  if (auto it = device_breakers_.find(st.cfg.device); it != device_breakers_.end() && it->second.Probing(id)) {
    it->second.OnSuccess();
    closed = Closed::kDevice;
  }
  return closed;
}

void PlacementBoard::WorkerExited(const std::string& key, const std::string& why, bool device_lost) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [service, states] : placements_) {
    for (auto& st : states) {
      if (st->key != key) continue;
      ++st->generation;  // (its next process: attempts sent to this one are from an older one now)
      st->breaker.Trip("worker " + why);
      if (device_lost) {
        if (auto it = device_breakers_.find(st->cfg.device); it != device_breakers_.end()) it->second.Trip("worker " + why);
      }
    }
  }
}

void PlacementBoard::WorkerReady(const std::string& key) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [service, states] : placements_) {
    for (auto& st : states) {
      if (st->key == key) st->breaker.Uneject();
    }
  }
}

void PlacementBoard::RecordThroughput(const std::string& service, size_t index, double pms, double pt, double gms,
                                      double gt) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& st = *placements_.at(service).at(index);
  auto ewma = [](double old, double sample) { return old == 0 ? sample : 0.7 * old + 0.3 * sample; };
  if (pms > 0 && pt > 0) {
    const double keep = std::pow(0.7, pt / 512.0);
    st.prompt_tokens_seen = keep * st.prompt_tokens_seen + pt;
    st.prompt_ms_seen = keep * st.prompt_ms_seen + pms;
    st.prompt_tps = st.prompt_tokens_seen / (st.prompt_ms_seen / 1000.0);
  }
  if (gms > 0 && gt > 1) st.gen_tps = ewma(st.gen_tps, (gt - 1) / (gms / 1000.0));
}

bool PlacementBoard::ReleaseIfIdle(const std::string& key,
                                   const std::function<int64_t(const std::string& service)>& idle_ms,
                                   const std::function<void()>& release) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [service, states] : placements_) {
    for (auto& st : states) {
      if (st->key != key) continue;
      if (st->active > 0 || st->pool.active() > 0) return false;
      if (st->last_used_ms == 0) st->last_used_ms = clock_.NowMs();  // ready, never used: idle from now
      if (clock_.NowMs() - st->last_used_ms < idle_ms(service)) return false;
      cpu_lines_.at(service)->SetResident(key, 0);
      release();
      return true;  // the next request starts it again
    }
  }
  return false;
}

nlohmann::json PlacementBoard::PlacementJson(const std::string& service, size_t index, uint64_t typical_need) const {
  std::lock_guard<std::mutex> lk(mu_);
  const auto& st = *placements_.at(service).at(index);
  // The same estimate admission acts on (delay or reject, Retry-After).
  const auto wait = EstimatedWaitS(st, typical_need);
  auto device = device_breakers_.find(st.cfg.device);
  nlohmann::json out = {{"admitted", st.admission.admitted},
          {"est_wait_s", wait ? nlohmann::json(*wait) : nlohmann::json(nullptr)},
          {"admission", st.admission.reason},
          {"predicted_bytes", st.admission.predicted_bytes},
          {"kv_cells", {{"total", st.pool.total()}, {"reserved", st.pool.reserved()}, {"requests", st.active},
                        {"per_request", st.pool.request_capacity()}, {"unified", st.cfg.kv_unified}}},
          {"throughput", {{"prompt_tokens_per_s", st.prompt_tps}, {"generated_tokens_per_s", st.gen_tps}}},
          {"breaker", BreakerJson(st.breaker, clock_.NowMs())},
          {"readiness", {{"policy", st.readiness}, {"reason", st.readiness_reason},
                         {"expected_s", st.readiness_expected_s}, {"active_requests", st.active}}}};
  // Its device's breaker: open, it stops this placement as its own would.
  out["device_breaker"] = device == device_breakers_.end() ? nlohmann::json(nullptr) : BreakerJson(device->second, clock_.NowMs());
  return out;
}

nlohmann::json PlacementBoard::DevicesJson() const {
  std::lock_guard<std::mutex> lk(mu_);
  nlohmann::json devices = nlohmann::json::array();
  for (const auto& [name, b] : device_breakers_) {
    devices.push_back({{"name", name},
                       {"breaker", BreakerJson(b, clock_.NowMs())}});
  }
  return devices;
}

void PlacementBoard::Gauges(std::vector<std::tuple<std::string, std::string, double>>* g) const {
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& [service, q] : cpu_lines_) {
    const auto st = q->stats();
    const std::string l = "service=\"" + service + "\"";
    g->emplace_back("spillway_cpu_queue_waiting", l, static_cast<double>(st.waiting));
    g->emplace_back("spillway_cpu_queue_running", l, static_cast<double>(st.running));
    g->emplace_back("spillway_cpu_queue_oldest_age_seconds", l, st.oldest_wait_ms / 1000.0);
    g->emplace_back("spillway_cpu_path_ram_bytes", l, static_cast<double>(st.resident_bytes + st.running_bytes));
    g->emplace_back("spillway_cpu_path_ram_budget_bytes", l, static_cast<double>(cpu_budgets_.at(service)));
    g->emplace_back("spillway_cpu_path_rejected_total", l + ",reason=\"queue_full\"", static_cast<double>(st.rejected_full));
    g->emplace_back("spillway_cpu_path_rejected_total", l + ",reason=\"ram_budget\"", static_cast<double>(st.rejected_budget));
    g->emplace_back("spillway_cpu_path_rejected_total", l + ",reason=\"host_low\"", static_cast<double>(st.rejected_host));
  }
  for (const auto& [name, b] : device_breakers_) {
    g->emplace_back("spillway_device_breaker_open", "device=\"" + name + "\"", b.state() == failover::BreakerState::kOpen ? 1 : 0);
  }
  for (const auto& [service, states] : placements_) {
    for (const auto& st : states) {
      // (With its key: two CPU placements of one service share the name "cpu",
      // and two series with the same labels are one to Prometheus.)
      g->emplace_back("spillway_breaker_open",
                      "service=\"" + service + "\",key=\"" + st->key + "\",placement=\"" + st->cfg.Name() + "\"",
                      st->breaker.state() == failover::BreakerState::kOpen ? 1 : 0);
    }
  }
}

}  // namespace spillway::gateway
