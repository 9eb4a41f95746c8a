// The CPU path's rules, applied once admission::Decide has chosen a placement
// on it (a CPU replica of the primary's model, or a declared CPU fallback):
//
//   CapForCpuPath  the path's limits: a prompt longer than its
//                  max_prompt_tokens is refused (503: the accelerator may
//                  take it later); max_tokens is lowered to its cap, and the
//                  answer says so
//   JudgeCpuPath   from what the path's line (scheduler::CpuQueue) answered
//                  when the request joined it and, with its replica up, asked
//                  to start; the replica's state and its free KV cells: go,
//                  wait (why, and for about how long), or refuse (503 with a
//                  Retry-After from the line's length and measured speed;
//                  or where loading its replica beside the loaded ones
//                  would pass the RAM budget)
//
// Between the two the gateway commits the request to the line, under the
// placement board's lock (gateway_cpu_path.cpp): the line's own rules (its
// bound, the RAM budget, first in first out) live in scheduler::CpuQueue.
// Pure: functions of their inputs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "scheduler/cpu_queue.h"

namespace spillway::admission {

struct CpuPathLimits {
  std::string service;
  uint32_t max_prompt_tokens = 0;   // 0: any prompt the replica's context holds
  uint32_t max_tokens = 0;          // the path's cap on max_tokens
  int concurrency = 1;              // requests running at once on the path
  size_t max_queue = 16;            // waiting requests
  uint64_t budget_bytes = 0;        // host RAM for the path's replicas and requests
  uint64_t host_headroom_bytes = 0; // what the host keeps available above the path
};

struct CpuPathCap {
  bool refused = false;   // the prompt is longer than the path takes
  int retry_after_s = 0;
  std::string reason;     // when refused
  uint32_t max_tokens = 0;
  std::string limits;     // "max_tokens=N (CPU path)" when lowered, for the answer
};

CpuPathCap CapForCpuPath(uint32_t prompt_tokens, uint32_t max_tokens, const CpuPathLimits& limits);

// What the path looks like to the request once it has joined the line.
struct CpuPathState {
  scheduler::CpuQueue::JoinResult join = scheduler::CpuQueue::JoinResult::kQueued;
  // Asked only when the request is in line and its replica is up (NeedsStart).
  std::optional<scheduler::CpuQueue::StartResult> start;
  scheduler::CpuQueueStats line;  // after the join and the start
  size_t position = 0;            // 1-based among the waiting (0: not waiting)
  uint64_t request_bytes = 0;     // host bytes the request holds while it runs
  uint64_t host_available = scheduler::CpuQueue::kUnknown;  // above the headroom
  bool replica_ready = false;
  // What the replica holds once loaded (its prediction), and its share of
  // line.resident_bytes now (while it starts; 0 while it is stopped): a
  // stopped replica is started only where it and the request fit the budget
  // beside the replicas already loaded.
  uint64_t replica_bytes = 0, replica_counted_bytes = 0;
  std::string replica;            // its placement's name
  std::string readiness;          // how it becomes ready ("loads on demand, ...")
  double readiness_expected_s = 0;
  uint64_t cells_free = 0;        // its KV cells free for one request
  double prompt_tps = 0, gen_tps = 0;  // its measured throughput (0: not measured)
};

// Whether to ask the line to start the request (it is in line and its replica is up).
bool NeedsStart(scheduler::CpuQueue::JoinResult join, bool replica_ready);

struct CpuPathVerdict {
  enum class Kind { kGo, kWait, kReject };
  Kind kind = Kind::kWait;
  bool demand_replica = false;  // start the replica (it loads on demand)
  std::string why;              // kWait: what it waits for; kReject: the refusal
  double est_wait_s = 0;        // kWait
  int retry_after_s = 0;        // kReject
};

CpuPathVerdict JudgeCpuPath(uint32_t prompt_tokens, uint32_t max_tokens, const CpuPathState& state,
                            const CpuPathLimits& limits);

}  // namespace spillway::admission
