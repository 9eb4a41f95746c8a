#include "admission/cpu_path.h"

#include <algorithm>
#include <cmath>

#include "admission/wait_estimate.h"

namespace spillway::admission {

namespace {

std::string Mib(uint64_t bytes) { return std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB"; }

CpuPathVerdict Wait(std::string why, double est_wait_s, bool demand = false) {
  CpuPathVerdict v;
  v.kind = CpuPathVerdict::Kind::kWait;
  v.why = std::move(why);
  v.est_wait_s = est_wait_s;
  v.demand_replica = demand;
  return v;
}

CpuPathVerdict Refuse(std::string why, int retry_after_s) {
  CpuPathVerdict v;
  v.kind = CpuPathVerdict::Kind::kReject;
  v.why = std::move(why);
  v.retry_after_s = std::max(1, retry_after_s);
  return v;
}

}  // namespace

CpuPathCap CapForCpuPath(uint32_t prompt_tokens, uint32_t max_tokens, const CpuPathLimits& limits) {
  CpuPathCap cap;
  cap.max_tokens = max_tokens;
  if (limits.max_prompt_tokens > 0 && prompt_tokens > limits.max_prompt_tokens) {
    cap.refused = true;
    cap.retry_after_s = 30;
    cap.reason = "the accelerator path of '" + limits.service + "' is unavailable and its CPU path takes prompts of up to " +
                 std::to_string(limits.max_prompt_tokens) + " tokens (this one has " + std::to_string(prompt_tokens) + ")";
    return cap;
  }
  if (limits.max_tokens > 0 && max_tokens > limits.max_tokens) {
    cap.max_tokens = limits.max_tokens;
    cap.limits = "max_tokens=" + std::to_string(limits.max_tokens) + " (CPU path)";
  }
  return cap;
}

bool NeedsStart(scheduler::CpuQueue::JoinResult join, bool replica_ready) {
  return join == scheduler::CpuQueue::JoinResult::kQueued && replica_ready;
}

CpuPathVerdict JudgeCpuPath(uint32_t prompt_tokens, uint32_t max_tokens, const CpuPathState& s,
                            const CpuPathLimits& limits) {
  using Join = scheduler::CpuQueue::JoinResult;
  using Start = scheduler::CpuQueue::StartResult;
  // Seconds one request takes there, from the measured throughput (10 s
  // until measured). One of no known size (an embedding: its inputs are
  // not counted on this path) counts a second: it was told "about 0 s" at
  // any position, and a full line's Retry-After was 1.
  double per_request_s = ExpectedRunS(prompt_tokens, max_tokens, s.prompt_tps, s.gen_tps).value_or(10.0);
  if (prompt_tokens == 0 && max_tokens == 0) per_request_s = std::max(per_request_s, 1.0);
  switch (s.join) {
    case Join::kFull: {
      const int lanes = std::max(1, limits.concurrency);
      const double wait = std::ceil(static_cast<double>(s.line.waiting + s.line.running) / lanes) * per_request_s;
      return Refuse("the CPU path of '" + limits.service + "' is full: " + std::to_string(s.line.running) + " running, " +
                        std::to_string(s.line.waiting) + " waiting (max_queue " + std::to_string(limits.max_queue) + ")",
                    static_cast<int>(std::ceil(wait)));
    }
    case Join::kOverBudget:
      return Refuse("the request needs " + Mib(s.request_bytes) + " of host RAM; the CPU path's budget of " +
                        Mib(limits.budget_bytes) + " holds " + Mib(s.line.resident_bytes) + " of replicas",
                    30);
    case Join::kQueued:
      break;
  }
  if (!s.replica_ready) {  // an on-demand replica is started now, where it fits the budget
    // The loaded replicas, and the requests running on them: the budget
    // holds both (the line's own check, resident + running + one more).
    const uint64_t others =
        s.line.resident_bytes - std::min(s.line.resident_bytes, s.replica_counted_bytes) + s.line.running_bytes;
    if (limits.budget_bytes > 0 && others + s.replica_bytes + s.request_bytes > limits.budget_bytes) {
      return Refuse("loading the CPU replica " + s.replica + " (" + Mib(s.replica_bytes) + ") for a request of " +
                        Mib(s.request_bytes) + " beside the loaded ones and their running requests (" + Mib(others) +
                        ") would pass the CPU path's host-RAM budget of " + Mib(limits.budget_bytes),
                    30);
    }
    return Wait("loading the CPU replica " + s.replica + " (" + s.readiness + ")", s.readiness_expected_s, true);
  }
  switch (s.start.value_or(Start::kWait)) {
    case Start::kStart: {
      // Its turn; the replica's KV cells are the last word (a long prompt may wait for them).
      const uint64_t cells = uint64_t{prompt_tokens} + max_tokens;
      if (cells > s.cells_free) {
        return Wait("first in line for the CPU path, waiting for " + std::to_string(cells) + " KV cells (" +
                        std::to_string(s.cells_free) + " free for one request)",
                    per_request_s);
      }
      CpuPathVerdict go;
      go.kind = CpuPathVerdict::Kind::kGo;
      return go;
    }
    case Start::kHostLow:
      return Refuse("the host has " + Mib(s.host_available) + " available above its headroom of " +
                        Mib(limits.host_headroom_bytes) + "; the CPU path would need " + Mib(s.request_bytes),
                    5);
    case Start::kWait:
      break;
  }
  const double est = scheduler::CpuQueue::WaitS(s.line.running, s.position, limits.concurrency, per_request_s);
  return Wait("waiting for the CPU path: position " + std::to_string(s.position) + " of " +
                  std::to_string(s.line.waiting) + ", " + std::to_string(s.line.running) + " running, about " +
                  std::to_string(static_cast<int>(std::ceil(est))) + " s",
              est);
}

}  // namespace spillway::admission
