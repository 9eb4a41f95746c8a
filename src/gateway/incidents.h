// What went wrong recently, for people: failovers, breaker trips, workers that
// exited or restarted, unloads, cancelled and failed requests, each with its
// time and reason. The dashboard, `GET /v1/events` and `/v1/status` show them.
//
// Two sources feed the log: request transitions the journal committed
// (RequestIncidents, below) and changes between two /v1/status snapshots
// (DiffStatus: breakers, workers, degraded services). Both are pure logic;
// the gateway calls them from its status thread and journal threads.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "journal/journal.h"

namespace spillway::gateway {

struct Incident {
  uint64_t seq = 0;       // assigned by IncidentLog::Add, increasing
  int64_t time_ms = 0;    // wall clock, unix ms
  std::string kind;       // failover | breaker | device | worker | restart | loaded | unloaded | degraded | unavailable |
                          // recovered | cancelled | failed
  std::string service, placement, device, request_id;
  std::string client;     // owner of request_id (never shown: callers who may not see it get no id)
  std::string reason;     // in words
  // What callers who may not see its request are told instead of `reason`,
  // which may hold that request's own words (an upstream's error body
  // echoing the prompt); empty: `reason` is for everyone.
  std::string others_reason;
};

// `with_owner`: adds "_client" (the owner of its request) and
// "_others_reason", for views that filter by caller and then drop them.
nlohmann::json IncidentJson(const Incident& i, bool with_owner = false);

// A bounded, thread-safe log: the newest `capacity` incidents.
class IncidentLog {
 public:
  explicit IncidentLog(size_t capacity = 200) : capacity_(capacity) {}
  uint64_t Add(Incident i);
  std::vector<Incident> Since(uint64_t seq) const;  // newer than seq, oldest first
  std::vector<Incident> Recent(size_t n) const;     // the last n, oldest first
  uint64_t last_seq() const;

 private:
  size_t capacity_;
  mutable std::mutex mu_;
  std::deque<Incident> items_;
  uint64_t seq_ = 0;
};

// Incidents found by comparing two /v1/status snapshots (`before` may be
// null: the first snapshot yields none). Stamped `now_ms`.
std::vector<Incident> DiffStatus(const nlohmann::json& before, const nlohmann::json& after, int64_t now_ms);

// Turns committed request transitions into incidents: an attempt on another
// placement than the last one is a failover (with the reason the requeue
// gave), a cancelled or failed end is one too. Thread-safe.
class RequestIncidents {
 public:
  // The incidents the transition is (none, mostly), stamped `now_ms`; the
  // caller fills in service and client (the journal's record has them).
  std::vector<Incident> Observe(const journal::Transition& t, int64_t now_ms);

 private:
  struct Track {
    std::string placement, requeue_reason;
  };
  std::mutex mu_;
  std::map<std::string, Track> tracks_;  // requests with an attempt, until they end
};

}  // namespace spillway::gateway
