// The pass rule of `spillway chaos`, computed from what a scenario recorded
// (pure: no processes, no clock).
//
// A scenario passes when: no acknowledged request is lost (acknowledged,
// with no terminal result after the run settled); every request that was
// retried finished exactly once under its own id; no tool ran twice for one
// request (duplicate side effects); every deterministic request that
// completed produced the reference output; the CPU path never held more
// host RAM than its budget; the accelerator placement was serving again at
// the end; and the unrelated service never failed. competing_services adds
// the rules under VerdictOptions::batch_from_ms. Unknown outcomes (never
// acknowledged, unknown to the journal) are counted apart, as in Jepsen.
#pragma once

#include "chaos/record.h"

namespace spillway::chaos {

struct VerdictOptions {
  std::string primary_placement = "sim:0/99";  // requests served elsewhere are degraded
  bool journal = true;        // false for targets without one (llama-server): outcomes from the client only
  bool expect_restored = true;
  // competing_services: batch traffic started at this time (ms since the
  // start; < 0: not such a scenario). The interactive service's p95 while it
  // ran must stay within max_interactive_ratio of its p95 before; at least
  // one eviction must have happened, each followed by its unload; batch and
  // on-demand requests served off their primary must be told; and
  // pinned_service (when set) is never evicted.
  int64_t batch_from_ms = -1;
  double max_interactive_ratio = 1.25;
  std::string interactive_service = "chat";
  std::string pinned_service;
};

Verdict Judge(const ScenarioResult& r, const VerdictOptions& opts);

// Percentile (0..100) of `values` by nearest rank; 0 when empty.
double Percentile(std::vector<double> values, double p);

}  // namespace spillway::chaos
