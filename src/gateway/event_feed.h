// The live picture behind `GET /v1/events` (Server-Sent Events).
//
// One sampling thread (never an I/O thread) takes a status snapshot every
// `period` (or sooner after Kick(), but never within `min_gap` of the last), records the incidents DiffStatus finds
// between two snapshots in the IncidentLog, keeps a short memory history per
// device, and writes to every subscriber:
//
//   event: history    once, on subscribing: memory per device over the last minutes
//   event: snapshot   the status (as /v1/status), on subscribing, when it changed,
//                     and at least every `keepalive` (the page's clock, proxies)
//   event: incident   each incident as it is recorded (the journal's too)
//
// Each subscriber sees the snapshot and incidents through its own view (a
// caller who may not see another client's requests does not). A subscriber
// whose reader is slow (much unsent) skips snapshots and incidents instead of
// growing the gateway's memory (its next snapshot carries the recent
// incidents); one that disconnected is dropped.
//
// Thread-safe. Stop() (or the destructor) joins the thread and ends every stream.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "api/http_server.h"
#include "common/clock.h"
#include "gateway/incidents.h"

namespace spillway::gateway {

class EventFeed {
 public:
  struct Subscriber {
    std::shared_ptr<http::Exchange> ex;  // streaming already (StartStream called)
    // What this subscriber may see of a snapshot / an incident (null: nothing).
    std::function<nlohmann::json(const nlohmann::json&)> snapshot_view;
    std::function<nlohmann::json(const Incident&)> incident_view;
  };
  using Sampler = std::function<nlohmann::json()>;
  struct Options {
    std::chrono::milliseconds period{1000};
    std::chrono::milliseconds min_gap{250};  // between two samples, however often Kick() is called
    std::chrono::milliseconds keepalive{5000};
    size_t history_points = 600;    // per device (10 minutes at 1 s)
    size_t max_unsent_bytes = 1 << 20;  // a subscriber with more unsent skips snapshots
  };

  // `sample` returns the status with "devices"[].{name, used_bytes, total_bytes};
  // it runs on the feed's thread only.
  EventFeed(Sampler sample, IncidentLog& log, const Clock& clock, Options opts);
  ~EventFeed();
  EventFeed(const EventFeed&) = delete;
  EventFeed& operator=(const EventFeed&) = delete;

  void Start();
  void Stop();
  void Subscribe(Subscriber s);
  void Kick();
  // The newest snapshot (null before the first), for /v1/status callers who
  // want no extra worker round trips.
  nlohmann::json Latest() const;
  // {device: [[time_ms, used_bytes, total_bytes], ...]}
  nlohmann::json MemoryHistory() const;
  size_t subscribers() const;

  // An SSE event: "event: <name>\ndata: <json>\n\n".
  static std::string Event(const std::string& name, const nlohmann::json& data);

 private:
  void Loop();
  void Tick();

  Sampler sample_;
  IncidentLog& log_;
  const Clock& clock_;
  Options opts_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, kicked_ = false, started_ = false;
  std::vector<Subscriber> subscribers_, joining_;
  nlohmann::json latest_;
  std::string latest_text_;  // of the last snapshot sent, to tell a change
  int64_t last_sent_ms_ = 0;
  uint64_t incident_seq_ = 0;  // the last incident written
  std::map<std::string, std::deque<std::array<int64_t, 3>>> history_;
  std::thread thread_;
};

}  // namespace spillway::gateway
