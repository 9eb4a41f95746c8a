// Admission decisions: where (and whether) a request runs, before anything is
// allocated, from the KV cells it needs and the state of each placement.
//
//   admit(P)        it fits P's pool now
//   delay(P, wait)  it fits P but not now; wait for a reservation to free (bounded)
//   shrink(limits)  max_tokens lowered to what fits, when the request or policy allows; said in the answer
//   offload(P)      a planned hybrid placement (fewer GPU layers) of the same model
//   reroute(P)      the fallback placement (larger pool, or the primary is unusable)
//   reject(status)  503 + Retry-After when it could fit later; 400/413 with the numbers when never
//
// Three rules apply after the placement is chosen, in this order: a primary
// that is not usable but will be (starting, restarting) is waited for rather
// than judged, within the policy's start_wait_s; a request with a deadline
// is refused at once (503) when the chosen placement's measured throughput
// says it cannot finish in time, even behind others; and a request that came
// after others still waiting lets them go first (delay), unless the
// placement has a line of its own (the CPU path). A placement on the CPU
// path then answers to that path's own rules (its limits, its line, its RAM
// budget: admission/cpu_path.h).
//
// Pure: a function of its inputs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace spillway::admission {

enum class Kind { kAdmit, kDelay, kShrink, kOffload, kReroute, kReject };
const char* KindName(Kind k);

struct PlacementView {
  std::string name;
  bool usable = true;       // worker ready and breaker closed
  bool hybrid = false;      // a planned partial offload of the primary's model
  bool fallback = false;    // a CPU replica or declared fallback model
  uint32_t cells_total = 0; // the KV pool
  uint32_t cells_free = 0;
  uint32_t slots_free = 0;
  double est_wait_s = 0;    // when its pool frees enough (from running requests' progress)
  bool comes_back = false;  // not usable now but expected to be (its worker is starting, its breaker will probe)
  bool probing = false;     // not usable only while one request probes its half-open breaker (comes back within seconds)
  bool own_line = false;    // the CPU path: its own line orders who goes first, not the service's
  double prompt_tps = 0, gen_tps = 0;  // measured throughput (0: not measured yet)
  // Each slot a KV stream of its own (cells_total cells each, kv_unified
  // false): a request takes a slot's cells whole, so pressure (a shared
  // pool nearly full) does not apply; it is busy when its slots are taken.
  bool per_slot = false;
  // The most tokens a request is given there (the CPU path's max_tokens; 0:
  // none): it is judged by what it would hold there, capped, not by what it
  // asked (the cap itself is applied, and told, when it goes there).
  uint32_t max_tokens_cap = 0;
};

struct RequestNeed {
  uint32_t prompt_tokens = 0;
  uint32_t max_tokens = 0;
  bool allow_shrink = false;   // the request or the service allows lowering max_tokens
  uint32_t min_tokens = 16;    // never shrink below this
  double waited_s = 0;         // how long the request has waited for admission so far
  double deadline_left_s = 0;  // time left before its deadline (0: none)
  uint32_t ahead_in_line = 0;  // earlier requests of the service still waiting (first come, first served)
  // max_tokens is an upper bound, not a demand (Ollama's num_predict: its
  // runner stops where the context ends): lowered to the room beside the
  // prompt in the pool it goes to, never refused for it (FitToContext).
  bool fit_context = false;
  // Of prompt_tokens, those the worker of placement `cached_at` holds in the
  // cache of the slot a run there would take (its count said so: prefix
  // reuse): a run there computes only the rest. Elsewhere, all of them.
  uint32_t cached_tokens = 0;
  size_t cached_at = SIZE_MAX;
  // The prompt tokens a run at `placement` computes.
  uint32_t ComputedPromptTokens(size_t placement) const {
    return placement == cached_at ? prompt_tokens - std::min(prompt_tokens, cached_tokens) : prompt_tokens;
  }
};

// A fit_context request's max_tokens, lowered to the room beside its prompt
// in the first usable placement (in order) with room for at least
// min_tokens of it (or the one with the most room; with none usable, among
// all): as asked otherwise, and when no pool holds the prompt at all
// (refused as ever).
RequestNeed FitToContext(const RequestNeed& r, const std::vector<PlacementView>& ps);

struct Policy {
  bool reroute_on_pressure = true;  // prefer another placement with room over waiting
  bool fail_fast = false;           // "GPU or error": never leave the primary
  double max_delay_s = 30;
  double pressure = 0.9;            // admitting past this pool utilisation counts as pressure
  double start_wait_s = 60;         // how long a primary that comes back is waited for
  // A request the gateway took on already (a failover, one recovered after
  // a restart) waits for a pool however long (its deadline and the
  // gateway's bound on an answer end it): a busy pool is a delay, never a
  // 503, for it. (max_delay_s still sets a refusal's Retry-After.)
  bool unbounded_delay = false;
};

struct Decision {
  Kind kind = Kind::kReject;
  size_t placement = 0;        // index into the placements given
  uint32_t max_tokens = 0;     // possibly shrunk
  int http_status = 0;         // for kReject
  int retry_after_s = 0;       // for kReject 503 and kDelay
  bool behind_line = false;    // kDelay only because earlier requests wait ahead (first come, first served)
  std::string reason;
};

// placements[0] is the primary.
Decision Decide(const RequestNeed& need, const std::vector<PlacementView>& placements, const Policy& policy);

}  // namespace spillway::admission
