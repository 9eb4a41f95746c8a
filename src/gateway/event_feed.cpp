#include "gateway/event_feed.h"

#include <cstdio>
#include <exception>

#include "common/thread_name.h"

namespace spillway::gateway {

using nlohmann::json;

namespace {

constexpr size_t kSnapshotIncidents = 30;  // the recent incidents a snapshot carries

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

std::string EventFeed::Event(const std::string& name, const json& data) {
  return "event: " + name + "\ndata: " + Dump(data) + "\n\n";
}

EventFeed::EventFeed(Sampler sample, IncidentLog& log, const Clock& clock, Options opts)
    : sample_(std::move(sample)), log_(log), clock_(clock), opts_(opts) {}

EventFeed::~EventFeed() { Stop(); }

void EventFeed::Start() {
  std::lock_guard<std::mutex> lk(mu_);
  if (started_) return;
  started_ = true;
  thread_ = std::thread([this] { Loop(); });
}

void EventFeed::Stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::vector<Subscriber> all;
  {
    std::lock_guard<std::mutex> lk(mu_);
    all.swap(subscribers_);
    for (auto& s : joining_) all.push_back(std::move(s));
    joining_.clear();
  }
  for (auto& s : all) s.ex->End();
}

void EventFeed::Subscribe(Subscriber s) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) {
      s.ex->End();
      return;
    }
    joining_.push_back(std::move(s));
    kicked_ = true;
  }
  cv_.notify_all();
}

void EventFeed::Kick() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    // Nobody is watching: the periodic sample is enough (a busy gateway
    // would otherwise pay a full status sample four times a second for no one).
    if (subscribers_.empty() && joining_.empty()) return;
    kicked_ = true;
  }
  cv_.notify_all();
}

json EventFeed::Latest() const {
  std::lock_guard<std::mutex> lk(mu_);
  return latest_;
}

json EventFeed::MemoryHistory() const {
  std::lock_guard<std::mutex> lk(mu_);
  json out = json::object();
  for (const auto& [device, points] : history_) {
    json list = json::array();
    for (const auto& p : points) list.push_back({p[0], p[1], p[2]});
    out[device] = list;
  }
  return out;
}

size_t EventFeed::subscribers() const {
  std::lock_guard<std::mutex> lk(mu_);
  return subscribers_.size() + joining_.size();
}

void EventFeed::Loop() {
  NameThisThread("sw-events");
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    lk.unlock();
    try {
      Tick();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "spillway: the event feed's snapshot failed: %s\n", e.what());
    }
    lk.lock();
    // A burst of kicks (a busy gateway's transitions) costs one sample per min_gap.
    cv_.wait_for(lk, opts_.min_gap, [this] { return stop_; });
    cv_.wait_for(lk, opts_.period - opts_.min_gap, [this] { return stop_ || kicked_; });
    kicked_ = false;
  }
}

void EventFeed::Tick() {
  json snap = sample_();
  const int64_t now = clock_.NowMs();
  json before;
  {
    std::lock_guard<std::mutex> lk(mu_);
    before = latest_;
  }
  for (auto& i : DiffStatus(before, snap, now)) log_.Add(std::move(i));
  json recent = json::array();
  // (With their owners: each subscriber's view keeps the ids of its own, ViewFor.)
  for (const auto& i : log_.Recent(kSnapshotIncidents)) recent.push_back(IncidentJson(i, /*with_owner=*/true));
  snap["incidents"] = recent;
  // What changed, apart from the time a snapshot was taken.
  json comparable = snap;
  comparable.erase("time_ms");
  std::string text = Dump(comparable);
  snap["time_ms"] = now;

  std::vector<Subscriber> current, fresh;
  bool changed = false, due = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& d : snap.value("devices", json::array())) {
      if (!d.contains("total_bytes") || !d.contains("used_bytes")) continue;
      auto& h = history_[d["name"].get<std::string>()];
      // A point per period: samples in between (every request's change
      // kicks one, up to 4 a second) update the last point, so that the
      // history's points span history_points periods (10 minutes), not
      // 150 s on a busy gateway.
      const std::array<int64_t, 3> point = {now, d["used_bytes"].get<int64_t>(), d["total_bytes"].get<int64_t>()};
      if (!h.empty() && now - h.back()[0] < opts_.period.count()) {
        h.back()[1] = point[1];
        h.back()[2] = point[2];
      } else {
        h.push_back(point);
      }
      while (h.size() > opts_.history_points) h.pop_front();
    }
    latest_ = snap;
    changed = text != latest_text_;
    due = now - last_sent_ms_ >= opts_.keepalive.count();
    if (changed || due) {
      latest_text_ = std::move(text);
      last_sent_ms_ = now;
    }
    // Only this thread changes subscribers_ (Stop joins it first).
    std::erase_if(subscribers_, [](const Subscriber& s) { return s.ex->disconnected(); });
    current = subscribers_;
    fresh.swap(joining_);
  }
  const std::vector<Incident> incidents = log_.Since(incident_seq_);
  if (!incidents.empty()) incident_seq_ = incidents.back().seq;
  for (auto& s : current) {
    // A slow reader skips incidents and snapshots alike (the next snapshot
    // carries the recent incidents): every failed request's incident was
    // written to it whatever its backlog, which grew for as long as they came.
    if (s.ex->unsent_bytes() > opts_.max_unsent_bytes) continue;
    for (const auto& i : incidents) {
      const json v = s.incident_view(i);
      if (!v.is_null()) s.ex->Write(Event("incident", v));
    }
    if (changed || due) s.ex->Write(Event("snapshot", s.snapshot_view(snap)));
  }
  if (fresh.empty()) return;
  const json history = MemoryHistory();
  for (auto& s : fresh) {
    s.ex->Write(Event("history", history));
    s.ex->Write(Event("snapshot", s.snapshot_view(snap)));
  }
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& s : fresh) subscribers_.push_back(std::move(s));
}

}  // namespace spillway::gateway
