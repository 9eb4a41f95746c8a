// The CPU path's own queue, one per service: the fallback CPU replica is slow
// and shares the host with everything else, so it gets a bounded line of its
// own, fewer requests at once than the accelerator, and a host-RAM budget.
//
//   Join      a request routed to the CPU path takes a place in line
//             (refused when the line is full, unless it is a failover of
//             a request already taken on, or when it could never fit the
//             budget even alone);
//   TryStart  the first in line starts when fewer than `concurrency` run and
//             the replicas' resident bytes + the running requests' bytes +
//             its own stay within the budget, and the host's observed
//             available memory holds its bytes (else: kHostLow);
//   Leave     when it ends, is cancelled or goes elsewhere (idempotent).
//
// Strict FIFO: nobody overtakes the first in line, so a large request is not
// starved by small ones. Pure: time from the Clock. Not thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <string>

#include "common/clock.h"

namespace spillway::scheduler {

struct CpuQueueOptions {
  size_t max_waiting = 16;
  int concurrency = 1;
  uint64_t ram_budget_bytes = 0;  // 0: no budget
};

struct CpuQueueStats {
  size_t waiting = 0, running = 0;
  uint64_t resident_bytes = 0;  // loaded CPU replicas
  uint64_t running_bytes = 0;   // requests running on them
  uint64_t peak_bytes = 0;      // highest resident + running so far
  int64_t oldest_wait_ms = 0;   // age of the first in line (0: none waiting)
  uint64_t rejected_full = 0, rejected_budget = 0, rejected_host = 0, started = 0;
};

class CpuQueue {
 public:
  enum class JoinResult { kQueued, kFull, kOverBudget };
  enum class StartResult { kStart, kWait, kHostLow };
  static constexpr uint64_t kUnknown = std::numeric_limits<uint64_t>::max();

  CpuQueue(CpuQueueOptions opts, const Clock& clock) : opts_(opts), clock_(&clock) {}

  // Bytes a loaded CPU replica holds (weights, KV pool, compute); 0 when unloaded.
  void SetResident(const std::string& replica, uint64_t bytes);
  uint64_t Resident(const std::string& replica) const;
  // Idempotent: joining again keeps the place in line, unless the replicas
  // grew since so that it could never start (kOverBudget: it leaves).
  // `past_bound`: a request the gateway took on already, whose attempt
  // elsewhere failed (a failover), joins a full line too: the bound refuses
  // new load, not accepted work (there are at most as many as the other
  // placements ran at once). The RAM budget still holds.
  JoinResult Join(const std::string& id, uint64_t bytes, bool past_bound = false);
  // `host_available`: the host's observed available memory minus its
  // headroom (kUnknown: not known). A started request counts as running.
  StartResult TryStart(const std::string& id, uint64_t host_available = kUnknown);
  // Whether `id` is running, or would start now given the host memory: the
  // head of the line, with a lane and its bytes within the RAM budget free.
  // (The host's memory is read only then: not per waiter per round.)
  bool MayStart(const std::string& id) const;
  bool Leave(const std::string& id);  // whether it held a place

  bool Waiting(const std::string& id) const;
  bool Running(const std::string& id) const { return running_.count(id) > 0; }
  // 1-based place among the waiting (0: not waiting).
  size_t Position(const std::string& id) const;
  // Seconds until `id` may start, if each running or earlier request takes
  // `per_request_s` and `concurrency` run side by side.
  double EstimatedWaitS(const std::string& id, double per_request_s) const;
  // The same for the waiter at `position` (1-based; 0: not waiting) behind `running`.
  static double WaitS(size_t running, size_t position, int concurrency, double per_request_s);
  CpuQueueStats stats() const;
  const CpuQueueOptions& options() const { return opts_; }

 private:
  struct Waiter {
    std::string id;
    uint64_t bytes;
    int64_t since_ms;
  };
  uint64_t Resident() const;
  uint64_t RunningBytes() const;
  // Counts `id`'s refusal once: a request refused while it waits for the
  // accelerator asks again every round (100 ms), and each ask was counted,
  // thousands of refusals for requests served on the accelerator in the end.
  void CountRefusal(const std::string& id, uint64_t* counter);

  CpuQueueOptions opts_;
  const Clock* clock_;
  std::deque<Waiter> waiting_;
  std::map<std::string, uint64_t> running_;
  std::map<std::string, uint64_t> resident_;
  uint64_t peak_ = 0;
  uint64_t rejected_full_ = 0, rejected_budget_ = 0, rejected_host_ = 0, started_ = 0;
  std::set<std::string> refused_;  // ids whose refusal was counted (forgotten past kMaxRefusedIds)
  static constexpr size_t kMaxRefusedIds = 4096;
};

}  // namespace spillway::scheduler
