// The pass rule of `spillway chaos`, computed from what a scenario recorded
// (pure: no processes, no clock).
//
// A scenario passes when: no acknowledged request is lost (acknowledged,
// with no terminal result after the run settled); every request that was
// retried finished exactly once under its own id; no tool ran twice for one
// request (duplicate side effects); every deterministic request that
// completed produced the reference output; the CPU path never held more
// host RAM than its budget; the accelerator placement was serving again at
// the end; and the unrelated service never failed. Unknown outcomes (never
// acknowledged, unknown to the journal) are counted apart, as in Jepsen.
#pragma once

#include "chaos/record.h"

namespace spillway::chaos {

struct VerdictOptions {
  std::string primary_placement = "sim:0/99";  // requests served elsewhere are degraded
  bool journal = true;        // false for targets without one (llama-server): outcomes from the client only
  bool expect_restored = true;
};

Verdict Judge(const ScenarioResult& r, const VerdictOptions& opts);

// Percentile (0..100) of `values` by nearest rank; 0 when empty.
double Percentile(std::vector<double> values, double p);

}  // namespace spillway::chaos
