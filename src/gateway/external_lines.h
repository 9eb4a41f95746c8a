// Each external service's own line: at most `concurrency` requests at once
// on it, at most `max_queue` waiting, first come first served, and what it
// has done (counts, idle time, the busiest moment it was measured at).
// One line per service, so a busy service never holds another's requests.
//
// Pure state behind one lock: the clock's time is passed in. Thread-safe.
#pragma once

#include <algorithm>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "config/config.h"

namespace spillway::gateway {

class ExternalLines {
 public:
  ExternalLines(const std::vector<config::ExternalConfig>& services, int64_t now_ms);

  // Takes a place in the service's line; false when max_queue are waiting
  // (`past_bound`: whatever max_queue says, for a request accepted before a restart).
  bool Join(const std::string& service, const std::string& id, bool past_bound = false);
  // Runs the request if a place is free for it (it is among the first as
  // many in line as there are free places) and `up` (asked
  // under the line's lock: the server was not released meanwhile) says its
  // server is still there; it then leaves the line and holds a running place
  // until Finished.
  bool TryStart(const std::string& service, const std::string& id, int64_t now_ms,
                const std::function<bool()>& up = {});
  // Leaves the line without having run (cancelled, past its deadline). A
  // request whose id is in line twice (a client's X-Request-Id sent again
  // while the first waits: the second is refused) takes its own place out,
  // the later one, not the first request's.
  void Leave(const std::string& service, const std::string& id);
  // Room checks for a request's transient peak, one at a time per device
  // (the memory they check is the device's): two checked together, of one
  // service or of two on one device, would each see the same free memory
  // and both pass. BeginRoomCheck is false while another request's check
  // runs on the service's device (wait and try again). EndRoomCheck ends it;
  // `took`: the room was found and the request is sent, its peak one that
  // later checks on the device leave room for (RoomTakers) until
  // Finished(took_room).
  bool BeginRoomCheck(const std::string& service);
  void EndRoomCheck(const std::string& service, bool took);
  // The same one-at-a-time check of `device`'s memory, by another than a
  // request (`who`: the start gate, for a load there): while it runs, no
  // request's check begins there, and it begins only when none runs (false:
  // try again). A load and a request's peak checked together each counted
  // on the same free memory.
  bool BeginDeviceCheck(const std::string& device, const std::string& who);
  void EndDeviceCheck(const std::string& device, const std::string& who);
  int RoomTakers(const std::string& service) const;
  // The services on `device` with requests sent with room for their peak,
  // and how many each (for the next check on the device).
  std::vector<std::pair<std::string, int>> RoomTakersOn(const std::string& device) const;
  // Gives back a running place (and its room, `took_room`). `outcome`:
  // completed | failed | cancelled.
  void Finished(const std::string& service, const std::string& outcome, int64_t now_ms, bool took_room = false);
  // Nothing running or waiting, and nothing ran for `idle_ms`.
  bool Idle(const std::string& service, int64_t idle_ms, int64_t now_ms) const;
  // When Idle (or, `evicted`, when nothing runs: its waiters wait for it to
  // come back), runs `release` under the line's lock, so that no request
  // starts on the server between the check and its release; whether it ran.
  bool ReleaseIfIdle(const std::string& service, int64_t idle_ms, int64_t now_ms, bool evicted,
                     const std::function<void()>& release);
  // Its position (1 = next) in line; 0 when not waiting.
  int Position(const std::string& service, const std::string& id) const;
  int Running(const std::string& service) const;
  int Waiting(const std::string& service) const;
  // What its process holds on its device now: at rest (nothing running) that
  // is its resident memory; above that while requests run, their transient
  // peaks (one request's: that over the requests sent). Measured values
  // replace the declared ones once seen.
  // Measured for the process `pid`, once it is ready (the caller's part: a
  // server still loading, part of its weights read as its resident size,
  // made the rest of them a request's "transient peak"). Another process
  // (a restart, a load) has its resident size measured again.
  void Observe(const std::string& service, int64_t pid, uint64_t device_bytes);
  // The measured {resident, transient peak}; 0 until seen.
  std::pair<uint64_t, uint64_t> Measured(const std::string& service) const;
  // What the last attempt to reach the server found: `reached` (it took
  // the connection) or not, and why not. A server Spillway does not run (a
  // `url`) has no health checks: this is how its state is known.
  void NoteReach(const std::string& service, bool reached, const std::string& why, int64_t now_ms);
  // Unreachable since when (0: reached at its last attempt, or never tried), and why.
  std::pair<int64_t, std::string> Unreachable(const std::string& service) const;
  // {"running", "waiting", "concurrency", "max_queue", "idle_s", counts by outcome}
  nlohmann::json Json(const std::string& service, int64_t now_ms) const;

 private:
  struct Line {
    int concurrency = 1;
    size_t max_queue = 0;
    int running = 0;
    std::string device;
    int room_takers = 0;  // running ones sent with room for their peak
    std::deque<std::string> waiting;
    int64_t last_used_ms = 0;
    std::map<std::string, uint64_t> outcomes;
    int64_t unreachable_since = 0;  // (NoteReach)
    std::string unreachable_why;
    uint64_t resident = 0, peak = 0;  // measured, of process `pid`
    int64_t pid = 0;
    // Running places not taken.
    size_t free_places() const { return static_cast<size_t>(std::max(0, concurrency - running)); }
  };
  // Idle (`evicted`: waiters or not); mu_ held.
  bool IdleLocked(const std::string& service, int64_t idle_ms, int64_t now_ms, bool evicted) const;
  mutable std::mutex mu_;
  std::map<std::string, std::string> checking_devices_;  // device -> who checks its room now (a request's service, or the start gate)
  std::map<std::string, Line> lines_;
};

}  // namespace spillway::gateway
