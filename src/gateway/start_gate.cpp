// The supervisor's start gate (Gateway::StartGate, gateway.h): every start
// of a worker or external server, restarts included, is judged against the
// device as it is now, and the starts let through moments ago that have no
// process yet (PendingStarts: one record of them, the gateway's, which the
// requests' own room checks read too).
#include <chrono>
#include <thread>

#include "gateway/gateway.h"

namespace spillway::gateway {

namespace {

// How long the gate waits for a request's room check on its device to end
// (one telemetry read) before it is asked again next round.
constexpr int kDeviceCheckWaitMs = 1000;
// A pinned worker's restart holds its memory from on-demand starts for this
// long after its process ended, and while fewer starts than this in a row
// failed: one that cannot come back (memory another program took, a model
// that does not load) does not keep every on-demand service off the device.
constexpr int64_t kPinnedHoldMs = 60'000;
constexpr int kRestartsHoldingMemory = 3;

}  // namespace

Status Gateway::StartGate(const std::string& key, PlacementCalibration* calibration) {
  // Idle services released to make room: their processes' end (their memory
  // free) is waited for here, without the device's check, which an external
  // server's requests need for their own room checks (held, they waited for
  // up to 2 s a victim). Then the start is judged again, on fresh
  // telemetry: a request may have taken some of that room meanwhile, and
  // more may be unloaded for it (waited for as well, once: then it is asked
  // again next round, with no victim of its still exiting and judged a
  // resident again).
  Status st = Status::Ok();
  for (int judgment = 0; judgment < 2; ++judgment) {
    std::vector<std::string> unloading;
    st = JudgeStart(key, calibration, &unloading);
    bool ended = true;
    for (const auto& v : unloading) ended = supervisor_.WaitReleased(v, 2000) && ended;
    if (unloading.empty() || !ended) break;  // (still exiting: asked again next round)
  }
  return st;
}

Status Gateway::JudgeStart(const std::string& key, PlacementCalibration* calibration,
                           std::vector<std::string>* unloading) {
  // Refused now, a start let through before (its round then spawned
  // nothing) is no longer about to load.
  struct Refused {
    Gateway& g;
    const std::string& key;
    bool granted = false;
    ~Refused() {
      if (granted) return;
      std::lock_guard<std::mutex> lk(g.residency_mu_);
      if (auto it = g.granted_.find(key); it != g.granted_.end()) it->second.pending = false;
    }
  } refused{*this, key};
  const auto* ext = ExternalOfKey(config_, key);
  std::string device;
  const config::ServiceConfig* s = nullptr;
  size_t k = 0;
  if (ext) device = ext->device;
  else if (FindPlacement(config_, key, &s, &k)) device = s->placements[k].device;
  const auto workers = supervisor_.Snapshot();
  const upstream::WorkerView* own = nullptr;  // its own worker, as the supervisor sees it
  for (const auto& w : workers) {
    if (w.key == key) own = &w;
  }
  std::set<std::string> starting = PendingStarts(workers);
  const int64_t now = clock_.NowMs();
  // A pinned worker restarting (its process gone: a crash, a lost device)
  // keeps its memory for its restart from the starts of movable services:
  // an on-demand one loaded into it, and the pinned one then waited until
  // that went idle (for good, when it outranked it). Not for long, nor one
  // whose starts keep failing or that crashes again and again (kPinnedHoldMs).
  // Pinned starts do not hold memory so from each other: two restarting
  // together would each have kept the other's, and neither started.
  std::string held_for;  // (named in a refusal: the memory looked free)
  if (supervisor_.OnDemand(key)) {
    for (const auto& w : workers) {
      // (Not while its killed process still exits: its memory shows in use
      // on the device, and counted again here it refused starts that fit.)
      if (w.state == upstream::WorkerState::kBackoff && w.pid <= 0 && !w.exiting && !supervisor_.OnDemand(w.key) &&
          w.down_since_ms > 0 && now - w.down_since_ms < kPinnedHoldMs && w.failed_starts < kRestartsHoldingMemory &&
          !w.crash_looping()) {
        if (starting.insert(w.key).second) held_for += (held_for.empty() ? "" : ", ") + w.key;
      }
    }
  }
  // (Added to a refusal for memory only, kNoRoom: not to a window's, nor to an exclusive device's turn.)
  auto refuse = [&](const Status& st) {
    if (held_for.empty() || st.reason() != kNoRoom) return st;
    return Status(st.code(), st.message() + " (memory held for the restart of pinned " + held_for + ", down " +
                                 "for less than " + std::to_string(kPinnedHoldMs / 1000) + " s)");
  };
  // The host's memory is not RoomFor's to judge (it judges accelerators):
  // a CPU worker still loading counts there at its whole prediction, as
  // AdmitPlacement reserves it (what it loaded so far shows as used too:
  // counted twice for a moment, not on memory it is about to take).
  for (const auto& w : workers) {
    const config::ServiceConfig* ws = nullptr;
    size_t wk = 0;
    if (w.state == upstream::WorkerState::kStarting && FindPlacement(config_, w.key, &ws, &wk) &&
        ws->placements[wk].device == "cpu") {
      starting.insert(w.key);
    }
  }
  starting.erase(key);
  // The device's memory is checked by one at a time: a request's room check
  // for an external server's peak and this load each counted on the same
  // free memory (the request sent, the load let through). Held until the
  // start is recorded as granted, which the requests' checks then count.
  struct DeviceCheck {
    ExternalLines& lines;
    std::string device, who;
    bool held = false;
    ~DeviceCheck() {
      if (held) lines.EndDeviceCheck(device, who);
    }
  } check{*external_lines_, device, "the start of " + key};
  // (Its estimate first, outside the device's check: a model the metadata
  // cannot size is planned by a dry run of up to minutes, once.)
  if (s) (void)PredictPlacementBytes(*s, k, config_.worker_binary);
  if (!device.empty() && device != "cpu") {
    for (int waited = 0; !(check.held = external_lines_->BeginDeviceCheck(device, check.who)); waited += 5) {
      if (waited >= kDeviceCheckWaitMs) {
        return Status::Unavailable("waiting on " + device + ": a request's room check is under way");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  const admission::Demand demand = LoadDemand(key, own && own->released_idle);
  uint64_t need = 0;  // what it is let start with (calibrated)
  if (ext) {
    // An external server: its resident memory (measured, else declared) must fit its device.
    need = ExternalResidentBytes(*ext);
    if (Status room = RoomFor(key, need, starting, demand, unloading); !room.ok()) return refuse(room);
  } else {
    auto a = AdmitPlacement(calibration, config_, key, starting);
    // An exclusive device (one service at a time) unloads the others even
    // when there would be room, and whatever the estimate (none: 0 bytes).
    const bool exclusive = !a.device.empty() && config_.Device(a.device).exclusive;
    // The device's own view too (RoomFor): it counts what a resident still
    // loading will take, external servers included, which AdmitPlacement
    // (llama placements only, and on an accelerator only the starts with no
    // process yet) does not see.
    if (a.predicted_bytes > 0 || exclusive) {
      // Not enough memory now: maybe another service can give room (residency, priorities).
      if (Status room = RoomFor(key, a.predicted_bytes, starting, demand, unloading); !room.ok()) return refuse(room);
      if (!a.admitted) a = AdmitPlacement(calibration, config_, key, starting);  // room there now: judged again
    }
    if (!a.admitted) return refuse(Status::ResourceExhausted(a.reason).WithReason(kNoRoom));
    need = a.predicted_bytes;
  }
  RoomGranted(key, need, own ? own->spawn_attempts : 0);
  refused.granted = true;
  return Status::Ok();
}

admission::Demand Gateway::LoadDemand(const std::string& key, bool released_idle) {
  const auto owner = OwnerOfKey(config_, key);
  if (!owner) return {};
  // An on-demand load is for the requests waiting for it. Asked again each
  // second after they went to the CPU path, it unloads a peer of its own
  // class only when that one is used less (a peer that just served would
  // load again for its own next request; an idle one would keep it on the
  // CPU for good).
  // So is a keep_alive service's once it was unloaded when idle (or for
  // another's room): requests load it again, as they do an on-demand one.
  // (At the gateway's start, or after a crash, it loads by its configuration.)
  const config::ResidencyConfig& residency = *owner->residency;
  const std::string& name = owner->service;
  admission::Demand demand;
  if (residency.mode == "on_demand" || (residency.mode == "keep_alive" && released_idle)) {
    const int64_t last = LastRequestMs(name);
    demand.awaited = AnyoneWaits(name);
    demand.requests_per_min = RequestsPerMinute(name);
    demand.recently_used = last > 0 && clock_.NowMs() - last < admission::kRecentUseMs;
  }
  // A busy peer of its priority gives way once these requests have waited a
  // turn (an external server's too: its requests are live as a model's are),
  // unless a placement of the service is serving already: its requests then
  // wait for a slot there, and it has its turn.
  bool serving = false;
  for (size_t i = 0; owner->svc && i < owner->svc->placements.size(); ++i) {
    serving |= supervisor_.ReadyPort(WorkerKey(*owner->svc, i)).has_value();
  }
  if (!serving) demand.waited_ms = OldestWaitMs(name);
  return demand;
}

}  // namespace spillway::gateway
