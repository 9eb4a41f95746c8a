// The pass rule of `spillway chaos`, computed from what a scenario recorded
// (pure: no processes, no clock).
//
// A scenario passes when: no accepted request is lost (acknowledged to its
// client or known to the journal, with no terminal result after the run
// settled); no request failed once an attempt of it had run (a refusal
// before any attempt is not; a stream ended resumable with its checkpoint
// is by design);
// every request that was retried finished exactly once under its own id; no tool ran twice for one
// request (duplicate side effects); every deterministic request that
// completed produced the reference output; the CPU path never held more
// host RAM than its budget, by the gateway's accounting and by its workers'
// measured RSS; at least one of its faults took effect (was injected, and an
// armed one went off); the accelerator placement was serving again at
// the end; and the unrelated service never failed. competing_services adds
// the rules under VerdictOptions::pressure_ms. Unknown outcomes (never
// acknowledged, unknown to the journal) are counted apart, as in Jepsen.
#pragma once

#include <random>
#include <vector>

#include "chaos/record.h"
#include "chaos/schedule.h"

namespace spillway::chaos {

struct VerdictOptions {
  std::string primary_placement = "sim:0/99";  // requests served elsewhere are degraded
  bool journal = true;        // false for targets without one (llama-server): outcomes from the client only
  bool expect_restored = true;
  // competing_services: the slices of batch traffic, [from, to) in ms since
  // the start (empty: not such a scenario). A slice lasts until the last
  // batch request sent in it (service batch_service) is answered. The
  // interactive service's requests that overlap no slice are "alone", those
  // that overlap one are "under pressure"; the p95 under pressure must stay
  // within max_interactive_ratio of the p95 alone. At least one eviction must
  // happen in a slice, each followed by its unload; batch and on-demand
  // requests served off their primary must be told; and pinned_service (when
  // set) is never evicted.
  std::vector<Window> pressure_ms;
  std::string batch_service = "embed";
  double max_interactive_ratio = 1.25;  // by the ratio's lower bound at interactive_confidence
  double interactive_confidence = 0.9;
  std::string interactive_service = "chat";
  std::string pinned_service;
};

Verdict Judge(const ScenarioResult& r, const VerdictOptions& opts);

// Sets `fired` of every armed fault (FaultEvent::fired_before >= 0) from the
// samples taken between it and the next fault (or the end): true when its
// worker's count of fired faults rose above the count before the arming, or
// the accelerator placement ran another worker or none (the fault ended its
// worker: a lost device, a watchdog's kill); false otherwise. Samples of a
// gateway that did not answer tell nothing.
void MarkFired(std::vector<FaultEvent>& faults, const std::vector<Sample>& samples);

// Whether a journal state ("completed", "failed", ...) is a request's end.
bool IsTerminalState(const std::string& journal_state);

// Percentile (0..100) of `values` by nearest rank; 0 when empty.
double Percentile(std::vector<double> values, double p);

// How low the ratio Percentile(num, p) / Percentile(den, p) can plausibly
// be: both samples resampled with replacement `rounds` times (a bootstrap),
// the (1 - confidence) quantile of the resampled ratios. A p95 of some
// dozens of requests moves by a third between identical runs on a busy
// host; a verdict that fails only when even this bound is above its limit
// fails on a shift of the whole distribution, not on one slow request.
// `rng` makes it repeatable (the scenario's seed). Denominators below 1 count as 1.
double PercentileRatioLowerBound(const std::vector<double>& num, const std::vector<double>& den, double p,
                                 double confidence, std::mt19937_64& rng, int rounds = 2000);

}  // namespace spillway::chaos
