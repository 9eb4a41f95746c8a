// How long until a placement's KV pool can take a request, from the requests
// running on it and the placement's measured throughput: admission's `delay`
// estimate, the Retry-After of a `reject`, and the estimated start a waiting
// client is told (GET /v1/requests/{id}, X-Spillway-Estimated-Delay).
//
// Each running request is expected to end when its prompt and its max_tokens
// have been processed at the measured rates (an upper bound: generation often
// stops earlier); one that is already past that is expected any moment. The
// pool frees their cells (and slots) in that order; the estimate is the first
// moment enough is free for the requests ahead in line and then this one.
//
// Pure: a function of its inputs.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace spillway::admission {

struct RunningRequest {
  uint32_t cells = 0;          // reserved in the pool
  uint32_t prompt_tokens = 0;
  uint32_t max_tokens = 0;
  double elapsed_s = 0;        // since it was admitted
};

struct PoolNow {
  std::vector<RunningRequest> running;
  uint64_t cells_free = 0;
  uint32_t slots_free = 0;     // requests it may still start (0 when every slot is taken)
  double prompt_tps = 0;       // measured (0: not measured yet)
  double gen_tps = 0;
  // A pool of per-slot cells (kv_unified = false): each request takes a
  // whole slot of this many whatever it asks, so what frees is slots, and a
  // request fits once one is free (and never when it needs more). 0: one
  // pool shared by the slots.
  uint32_t per_slot_cells = 0;
};

// A request that is already overdue is expected within this long.
inline constexpr double kOverdueS = 0.1;

// Seconds until `need` cells and a slot are free after `ahead_cells` more
// have been handed to requests ahead in line (0 when they are free now);
// nullopt while the throughput is not measured yet or when the pool can
// never hold that much.
std::optional<double> EstimateWaitS(const PoolNow& pool, uint64_t need, uint64_t ahead_cells = 0, uint32_t ahead_requests = 0);

// How long one request is expected to run at the measured rates (nullopt when not measured).
std::optional<double> ExpectedRunS(uint32_t prompt_tokens, uint32_t max_tokens, double prompt_tps, double gen_tps);

}  // namespace spillway::admission
