// Residency: which services hold an accelerator, who gives room to whom.
//
//   pinned      loaded at start, never unloaded (never evicted);
//   keep_alive  loaded at start, unloaded after keep_alive_s idle;
//   on_demand   loaded by its first request, unloaded after keep_alive_s
//               idle (0: only when its room is needed).
//
// Loading goes through the supervisor's start gate, which asks RoomFor:
// when the device lacks the room, admission::PlanEviction picks who unloads
// (never pinned, never a higher priority; idle, lower priority and cheap
// first). Victims take no new requests from then on (their CPU placements
// serve them, announced as degraded; an external service's requests wait)
// and unload as soon as nothing runs on them (IdleReplica); the start goes
// ahead once the room is there. A batch or background service outside its
// windows (or while interactive work is recent) is held back the same way.
// Every decision is printed, journaled as an event and shown in /v1/status.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <ctime>

#include "admission/eviction.h"
#include "gateway/gateway.h"
#include "gateway/gateway_internal.h"
#include "memory/ledger.h"

namespace spillway::gateway {

namespace {

constexpr int64_t kRateWindowMs = 10 * 60 * 1000;

// The local time's minute of the day, and seconds until `window`'s next start.
int LocalMinute(int64_t now_ms) {
  const std::time_t t = static_cast<std::time_t>(now_ms / 1000);
  std::tm tm{};
  localtime_r(&t, &tm);
  return tm.tm_hour * 60 + tm.tm_min;
}

}  // namespace

bool Gateway::CountRequest(const std::string& service) {
  const int64_t now = clock_.NowMs();
  bool interactive = false;
  if (const auto* s = config_.FindService(service)) interactive = s->residency.priority == "interactive";
  if (const auto* e = config_.FindExternal(service)) interactive = e->residency.priority == "interactive";
  if (interactive) last_interactive_ms_ = now;
  std::lock_guard<std::mutex> lk(residency_mu_);
  auto& q = request_times_[service];
  q.push_back(now);
  while (!q.empty() && (now - q.front() > kRateWindowMs || q.size() > 10000)) q.pop_front();
  return interactive;
}

double Gateway::RequestsPerMinute(const std::string& service) const {
  const int64_t now = clock_.NowMs();
  std::lock_guard<std::mutex> lk(residency_mu_);
  auto it = request_times_.find(service);
  if (it == request_times_.end()) return 0;
  const auto n = std::count_if(it->second.begin(), it->second.end(), [&](int64_t t) { return now - t <= kRateWindowMs; });
  return static_cast<double>(n) / (kRateWindowMs / 60000.0);
}

int64_t Gateway::LastRequestMs(const std::string& service) const {
  std::lock_guard<std::mutex> lk(residency_mu_);
  auto it = request_times_.find(service);
  return it == request_times_.end() || it->second.empty() ? 0 : it->second.back();
}

bool Gateway::OutsideWindow(const config::ResidencyConfig& r, std::string* why, int* opens_in_s) const {
  if (r.priority == "interactive") return false;
  const int64_t now = clock_.NowMs();
  const int64_t wall = clock_.WallMs();
  const int minute = LocalMinute(wall);  // (a time of day: the wall clock's, stepped or not)
  if (!admission::InWindow(r.windows, minute)) {
    std::string list;
    for (const auto& w : r.windows) list += (list.empty() ? "" : ", ") + w;
    if (why) *why = "outside its accelerator window (" + list + " local time)";
    if (opens_in_s) {
      int wait = 24 * 60;
      for (int m = 1; m <= 24 * 60; ++m) {
        if (admission::InWindow(r.windows, (minute + m) % (24 * 60))) {
          wait = m;
          break;
        }
      }
      *opens_in_s = wait * 60 - static_cast<int>((wall / 1000) % 60);
    }
    return true;
  }
  if (r.interactive_idle_s > 0) {
    // An interactive request still running is interactive work now, however
    // long ago it came (a long stream let batch work onto the accelerator
    // once interactive_idle_s had passed since its start).
    const bool running = interactive_running_.load() > 0;
    const int64_t last = last_interactive_ms_.load();
    const double idle_s = running ? 0 : last == 0 ? 1e18 : static_cast<double>(now - last) / 1000;
    if (idle_s < r.interactive_idle_s) {
      char text[160];
      if (running) {
        std::snprintf(text, sizeof text, "interactive work running (it waits for %.0f s of interactive idleness)",
                      r.interactive_idle_s);
      } else {
        std::snprintf(text, sizeof text, "interactive work %.0f s ago (it waits for %.0f s of interactive idleness)",
                      idle_s, r.interactive_idle_s);
      }
      if (why) *why = text;
      if (opens_in_s) *opens_in_s = static_cast<int>(r.interactive_idle_s - idle_s) + 1;
      return true;
    }
  }
  return false;
}

int64_t Gateway::KeepAliveMs(const config::ServiceConfig& svc) const {
  // The last Ollama request's keep_alive, when it gave one: that long idle (from its end).
  {
    std::lock_guard<std::mutex> lk(residency_mu_);
    if (auto it = keep_alive_idle_ms_.find(svc.name); it != keep_alive_idle_ms_.end()) return it->second;
  }
  return svc.residency.keep_alive_s <= 0 ? INT64_MAX : static_cast<int64_t>(svc.residency.keep_alive_s * 1000);
}

Gateway::Hold Gateway::HeldBack(const config::ServiceConfig& svc, size_t k, std::string* why) const {
  if (svc.placements[k].device == "cpu") return Hold::kNone;
  const std::string key = WorkerKey(svc, k);
  {
    std::lock_guard<std::mutex> lk(residency_mu_);
    if (evicting_.count(key)) {
      if (why) *why = svc.placements[k].Name() + " is unloading to give its room to another service";
      return Hold::kUnloading;
    }
    if (room_refused_.count(key)) {
      if (why) *why = svc.placements[k].Name() + " has no room on " + svc.placements[k].device + " now";
      return Hold::kNoRoom;
    }
  }
  std::string w;
  if (OutsideWindow(svc.residency, &w)) {
    if (why) *why = svc.placements[k].Name() + " is " + w;
    return Hold::kOutsideWindow;
  }
  return Hold::kNone;
}

void Gateway::KeepEvent(json detail, int64_t at_ms) {
  detail["at_ms"] = at_ms;
  std::lock_guard<std::mutex> lk(residency_mu_);
  recent_events_.push_front(std::move(detail));
  if (recent_events_.size() > kRecentEvents) recent_events_.pop_back();
}

void Gateway::NoteResidency(const std::string& kind, const std::string& service, json detail) {
  detail["kind"] = kind;
  detail["service"] = service;
  std::printf("spillway: residency: %s %s: %s\n", kind.c_str(), service.c_str(), detail.value("reason", "").c_str());
  std::fflush(stdout);
  KeepEvent(detail, clock_.NowMs());
  // Queued: the journal's thread commits it (a switch never waits on an fsync).
  journal_.RecordEventAsync(kind, service, detail.dump(-1, ' ', false, json::error_handler_t::replace), [](Status st) {
    if (!st.ok()) std::fprintf(stderr, "spillway: journal event failed: %s\n", st.ToString().c_str());
  });
}

uint64_t Gateway::ExpectedBytes(const std::string& key) const {
  const config::ServiceConfig* s = nullptr;
  size_t k = 0;
  if (FindPlacement(config_, key, &s, &k)) {
    // The calibrated need the gate let it start with (what workers really
    // allocated), not the start-up prediction, which never changes.
    {
      std::lock_guard<std::mutex> lk(residency_mu_);
      if (auto g = granted_.find(key); g != granted_.end() && g->second.bytes > 0) return g->second.bytes;
    }
    return board_.placement(s->name, k).admission.predicted_bytes;
  }
  if (const auto* e = ExternalOfKey(config_, key)) return ExternalResidentBytes(*e);
  return 0;
}

admission::Demand Gateway::TurnAmongWaiters(const std::string& key, const std::string& service, int priority,
                                            admission::Demand demand, const std::set<std::string>& wanting,
                                            const std::vector<admission::Resident>& residents, uint64_t available) {
  int64_t shortest = 0;  // the shortest turn there (no turn can be over before it)
  for (const auto& r : residents) {
    if (r.turn_ms > 0 && (shortest == 0 || r.turn_ms < shortest)) shortest = r.turn_ms;
  }
  if (!demand.awaited || shortest == 0 || demand.waited_ms < shortest) return demand;
  // A busy peer's turn goes to the service whose requests have waited
  // longest: another of this priority whose start on the device is wanted,
  // that waited longer, and that the turn would let load (one that cannot
  // fit even so keeps no one from it). Without it, the first of them in the
  // supervisor's order took every turn and the others waited out their
  // requests.
  for (const auto& other : wanting) {
    if (other == key) continue;
    const auto owner = OwnerOfKey(config_, other);
    if (!owner || owner->service == service) continue;
    const std::string& name = owner->service;
    const int rank = owner->residency->PriorityRank();
    if (rank != priority) continue;
    const int64_t theirs = OldestWaitMs(name);
    if (theirs <= demand.waited_ms) continue;
    admission::Demand d = demand;
    d.waited_ms = theirs;
    if (!admission::PlanEviction(ExpectedBytes(other), available, rank, other, residents, false, d).fits) continue;
    demand.turn_of = name;
    demand.waited_ms = 0;
    break;
  }
  return demand;
}

Status Gateway::RoomFor(const std::string& key, uint64_t need, const std::set<std::string>& starting,
                        admission::Demand demand, std::vector<std::string>* unloading) {
  // Who is asking: an accelerator placement or an external server.
  const auto owner = OwnerOfKey(config_, key);
  const std::string device = owner ? owner->device : "", service = owner ? owner->service : "";
  const config::ResidencyConfig* residency = owner ? owner->residency : nullptr;
  const int priority = residency ? residency->PriorityRank() : 0;
  if (std::string why; residency && OutsideWindow(*residency, &why)) {
    // Not waiting for a turn meanwhile: an exclusive device's older waiter
    // would keep every later load off it until the window opened.
    std::lock_guard<std::mutex> lk(residency_mu_);
    exclusive_waits_.erase(key);
    return Status::ResourceExhausted(why);
  }
  if (device.empty() || device == "cpu") return Status::Ok();
  auto telemetry = Telemetry(device);
  if (!telemetry.ok()) return Status::Ok();  // not observable: the start finds out
  auto reading = (*telemetry)->Read();
  if (!reading.ok()) return Status::Ok();
  const auto dc = config_.Device(device);
  const uint64_t headroom = HeadroomOf(dc).For(reading->total);
  uint64_t available = reading->free > headroom ? reading->free - headroom : 0;
  // What each service holds on the device now (its processes' bytes there).
  const auto workers = supervisor_.Snapshot();
  const int64_t now = clock_.NowMs();
  std::set<std::string> wanting;  // keys on this device whose start is due or waiting (backoff)
  auto held_by = [&](admission::Resident& r, pid_t* pid) {
    for (const auto& w : workers) {
      if (w.key != r.key) continue;
      if (w.state == upstream::WorkerState::kBackoff) wanting.insert(r.key);
      if (w.pid <= 0) {
        // Let start by the gate, not spawned yet: loading from now on.
        if (starting.count(r.key)) {
          *pid = -1;
          r.starting = true;
        }
        continue;
      }
      *pid = w.pid;
      r.reload_s = static_cast<double>(w.last_start_ms) / 1000;
      r.starting = w.state == upstream::WorkerState::kStarting;
      r.state_ms = r.starting ? now - w.starting_since_ms : w.ready_since_ms > 0 ? now - w.ready_since_ms : 0;
      r.bytes += reading->BytesOfGroup(w.pid);  // (each leads its group: an external server's children count)
    }
    std::lock_guard<std::mutex> lk(residency_mu_);
    r.evicting = evicting_.count(r.key) > 0;
  };
  std::vector<admission::Resident> residents;
  for (const auto& s : config_.services) {
    for (size_t k = 0; k < s.placements.size(); ++k) {
      if (s.placements[k].device != device) continue;
      admission::Resident r;
      r.key = WorkerKey(s, k);
      r.service = s.name;
      pid_t pid = 0;
      held_by(r, &pid);
      if (pid == 0) continue;
      r.waiting = waiting_by_service_.at(s.name)->load();
      r.priority = s.residency.PriorityRank();
      r.pinned = s.residency.mode == "pinned" || !supervisor_.OnDemand(r.key);
      r.running = board_.Active(s.name, k);
      r.requests_per_min = RequestsPerMinute(s.name);
      r.evict_cost = s.residency.evict_cost;
      r.turn_ms = s.residency.FairTurnMs();
      residents.push_back(r);
    }
  }
  for (const auto& e : config_.externals) {
    if (e.device != device) continue;
    admission::Resident r;
    r.key = ExternalKey(e);
    r.service = e.name;
    pid_t pid = 0;
    held_by(r, &pid);
    if (pid == 0) continue;
    r.waiting = external_lines_->Waiting(e.name);
    r.priority = e.residency.PriorityRank();
    r.pinned = e.residency.mode == "pinned" || !e.Started();
    r.running = external_lines_->Running(e.name);
    r.requests_per_min = RequestsPerMinute(e.name);
    r.evict_cost = e.residency.evict_cost;
    r.turn_ms = e.residency.FairTurnMs();
    residents.push_back(r);
  }
  if (dc.exclusive) {
    // One load at a time, in the order they asked: an older waiter for this device that still wants to start
    // goes first.
    std::lock_guard<std::mutex> lk(residency_mu_);
    const int64_t since = exclusive_waits_.emplace(key, std::make_pair(device, now)).first->second.second;
    for (auto it = exclusive_waits_.begin(); it != exclusive_waits_.end();) {
      if (it->second.first != device) {  // another device's line: not this one's to judge
        ++it;
        continue;
      }
      if (it->first != key && !wanting.count(it->first)) {
        it = exclusive_waits_.erase(it);  // started, or nobody wants it any more
        continue;
      }
      if (it->first != key && it->second.second < since) {
        return Status::Unavailable("waiting on " + device + ": exclusive device, " + it->first +
                                   " asked first and loads before " + key);
      }
      ++it;
    }
  }
  // A resident still loading holds part of what it will: the rest of its
  // expected bytes is not free, or a start beside it (an external server's,
  // which only this gate judges) could count on the same memory.
  uint64_t upcoming = 0;
  for (const auto& r : residents) {
    if (!r.starting || r.key == key) continue;
    const uint64_t expected = ExpectedBytes(r.key);
    if (expected > r.bytes) upcoming += expected - r.bytes;
  }
  // Nor is the room external requests were sent with for their peaks (they
  // may not have allocated yet): a load beside them counted on it too.
  upcoming += SentPeaksOn(device, *reading, workers);
  available = available > upcoming ? available - upcoming : 0;
  if (!dc.exclusive) demand = TurnAmongWaiters(key, service, priority, demand, wanting, residents, available);
  const admission::EvictionPlan plan =
      admission::PlanEviction(need, available, priority, key, residents, dc.exclusive, demand);
  if (!plan.fits && !plan.wait) {
    std::lock_guard<std::mutex> lk(residency_mu_);
    exclusive_waits_.erase(key);  // it cannot load even alone: it keeps no one waiting behind it
  }
  if (plan.fits && plan.evict.empty()) return Status::Ok();
  if (plan.wait) return Status::Unavailable("waiting on " + device + ": " + plan.reason);  // asked again next round
  if (!plan.fits) {
    bool first = false;
    {
      std::lock_guard<std::mutex> lk(residency_mu_);
      first = room_refused_.insert(key).second;
    }
    if (first) NoteResidency("room_refused", service, {{"key", key}, {"device", device}, {"reason", plan.reason}});
    return Status::ResourceExhausted("no room on " + device + ": " + plan.reason).WithReason(kNoRoom);
  }
  std::vector<std::string> newly;
  {
    std::lock_guard<std::mutex> lk(residency_mu_);
    for (const auto& v : plan.evict) {
      if (evicting_.insert(v).second) newly.push_back(v);
    }
  }
  for (const auto& v : newly) {
    std::string victim = v.substr(0, v.rfind('.'));
    const bool draining = std::find(plan.drain.begin(), plan.drain.end(), v) != plan.drain.end();
    NoteResidency("evict", victim,
                  {{"key", v}, {"for", service}, {"device", device}, {"draining", draining},
                   {"freed_bytes", plan.freed}, {"reason", "gives its room to " + service + ": " + plan.reason}});
  }
  for (auto& [name, signal] : signals_) signal->Notify();  // their waiters decide again without them
  // Idle victims unload now, and the start goes ahead as soon as their
  // processes have ended (a switch costs an unload and a load, not rounds of
  // polling: StartGate waits for them, then judges again); busy ones drain
  // first and unload when idle (IdleReplica).
  for (const auto& v : plan.evict) {
    if (std::find(plan.drain.begin(), plan.drain.end(), v) != plan.drain.end()) continue;
    if (!IdleReplica(v)) continue;
    supervisor_.Release(v);  // (IdleReplica released it already: idempotent)
    if (unloading) unloading->push_back(v);
  }
  return Status::ResourceExhausted("making room on " + device + ": " + plan.reason);
}

void Gateway::RoomGranted(const std::string& key, uint64_t bytes, int attempts) {
  std::lock_guard<std::mutex> lk(residency_mu_);
  room_refused_.erase(key);
  exclusive_waits_.erase(key);
  granted_[key] = {bytes, clock_.NowMs(), attempts};
}

std::set<std::string> Gateway::PendingStarts(const std::vector<upstream::WorkerView>& workers) const {
  std::set<std::string> out;
  std::lock_guard<std::mutex> lk(residency_mu_);
  const int64_t now = clock_.NowMs();
  for (const auto& w : workers) {
    auto g = granted_.find(w.key);
    if (g == granted_.end() || !g->second.pending || now - g->second.at_ms > kGrantedSpawnMs) continue;
    // Spawned since (loading, ready, or gone again: a spawn that failed at
    // once takes nothing), or no longer wanted (released, stopped): not
    // about to load.
    if (w.state == upstream::WorkerState::kBackoff && w.pid <= 0 && w.spawn_attempts == g->second.attempts) {
      out.insert(w.key);
    }
  }
  return out;
}

bool Gateway::Evicting(const std::string& key) {
  std::lock_guard<std::mutex> lk(residency_mu_);
  return evicting_.count(key) > 0;
}

bool Gateway::IdleReplica(const std::string& key) {
  bool evicting = false;
  {
    std::lock_guard<std::mutex> lk(residency_mu_);
    evicting = evicting_.count(key) > 0;
  }
  auto unloaded = [&](const std::string& service, const std::string& why) {
    {
      std::lock_guard<std::mutex> lk(residency_mu_);
      evicting_.erase(key);
    }
    NoteResidency("unload", service, {{"key", key}, {"reason", why}});
    for (auto& [name, signal] : signals_) signal->Notify();
  };
  // An external server: after keep_alive_s with nothing running or waiting (0: kept), or evicted.
  if (const auto* e = ExternalOfKey(config_, key)) {
    std::string window;
    const bool outside = OutsideWindow(e->residency, &window);
    int64_t idle_ms = evicting || outside ? 0 : static_cast<int64_t>(e->residency.keep_alive_s * 1000);
    if (!evicting && !outside && e->residency.keep_alive_s <= 0) return false;
    // Released under the line's lock: no request can start on it in between
    // (AwaitExternalTurn asks whether it is still up under the same lock).
    if (!external_lines_->ReleaseIfIdle(e->name, idle_ms, clock_.NowMs(), evicting, [&] { supervisor_.Release(key); })) {
      return false;
    }
    unloaded(e->name, evicting ? "evicted" : outside ? window : "idle past keep_alive_s");
    return true;
  }
  for (const auto& s : config_.services) {
    for (size_t k = 0; k < s.placements.size(); ++k) {
      if (WorkerKey(s, k) != key) continue;
      const bool accelerator = s.placements[k].device != "cpu";
      std::string window;
      const bool outside = accelerator && OutsideWindow(s.residency, &window);
      int64_t idle_ms = static_cast<int64_t>(s.failover.idle_unload_s * 1000);  // a CPU replica
      if (accelerator) idle_ms = evicting || outside ? 0 : KeepAliveMs(s);
      // Released under the board's lock: no request can pick its port in between.
      const bool released = board_.ReleaseIfIdle(
          key, [&](const std::string&) { return idle_ms; }, [&] { supervisor_.Release(key); });
      if (released && accelerator) {
        unloaded(s.name, evicting ? "evicted" : outside ? window : "idle past its keep-alive");
      }
      return released;
    }
  }
  return false;
}

json Gateway::ResidencyJson() {
  const auto workers = supervisor_.Snapshot();
  json services = json::array();
  auto add = [&](const std::string& name, const std::string& key, const config::ResidencyConfig& r, bool accelerator) {
    json j = {{"service", name}, {"key", key}, {"mode", r.mode}, {"priority", r.priority},
              {"keep_alive_s", r.keep_alive_s}, {"requests_per_min", RequestsPerMinute(name)}};
    if (!r.windows.empty()) j["windows"] = r.windows;
    std::string why;
    j["held_back"] = nullptr;
    if (accelerator && OutsideWindow(r, &why)) j["held_back"] = why;
    bool no_room = false;
    {
      std::lock_guard<std::mutex> lk(residency_mu_);
      if (evicting_.count(key)) j["held_back"] = "unloading: its room goes to another service";
      no_room = room_refused_.count(key) > 0;
    }
    if (no_room) j["held_back"] = "no room on its device now";
    for (const auto& w : workers) {
      if (w.key != key) continue;
      // The gate's own words for the latest refusal (a peer used as much, a pinned restart's hold...).
      if (no_room && !w.NotAdmittedWhy().empty()) {
        j["held_back"] = "no room on its device now (" + std::string(w.NotAdmittedWhy()) + ")";
      }
      j["state"] = upstream::WorkerStateName(w.state);
      j["loads"] = w.starts;  // switches onto the device
      if (w.last_start_ms > 0) j["measured_load_s"] = static_cast<double>(w.last_start_ms) / 1000;
    }
    services.push_back(j);
  };
  for (const auto& s : config_.services) {
    for (size_t k = 0; k < s.placements.size(); ++k) {
      if (s.placements[k].device != "cpu") add(s.name, WorkerKey(s, k), s.residency, true);
    }
  }
  for (const auto& e : config_.externals) {
    if (e.Started()) add(e.name, ExternalKey(e), e.residency, e.device != "cpu");
  }
  json events = json::array();
  {
    std::lock_guard<std::mutex> lk(residency_mu_);
    for (const auto& e : recent_events_) events.push_back(e);
  }
  return {{"services", services}, {"events", events}};
}

}  // namespace spillway::gateway
