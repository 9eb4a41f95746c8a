// A circuit breaker for one placement (or device), Envoy outlier-detection
// style: `failures` consecutive failures (allocation failures, crashes,
// device loss, failed health or progress checks) open it; while open, traffic
// goes elsewhere; after the ejection time it lets traffic through again
// (half-open) and the next result closes it or opens it again for longer.
// Half-open lets one request through at a time (resilience4j's permitted
// calls in the half-open state, here 1; Envoy lets all traffic back at once):
// the request that takes it (BeginProbe) is the probe, and until its result
// (OnSuccess, OnFailure) or its end without one (EndProbe) the breaker is
// not usable for others, for at most probe_hold_ms each. A device that
// still fails thus fails one request (one per probe_hold_ms), not every
// request that arrived since the ejection ended.
// Ejection time = base x times ejected, capped; as in Envoy, the count comes
// down again while it stays closed: one ejection forgiven per base ejection
// time closed, so a placement that crashed a few times in its life is not
// ejected for the maximum at its next crash.
//
// Pure: time from the Clock. Not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/clock.h"

namespace spillway::failover {

struct BreakerOptions {
  int failures = 3;
  int64_t base_ejection_ms = 30000;
  int64_t max_ejection_ms = 300000;
  // How long a probe holds a half-open breaker without a result; then the
  // next request probes too. A long answer (a non-streamed one has no first
  // event) keeps the others out for this long, not for all of it.
  int64_t probe_hold_ms = 5000;
};

enum class BreakerState { kClosed, kOpen, kHalfOpen };
const char* BreakerStateName(BreakerState s);

class Breaker {
 public:
  Breaker(BreakerOptions opts, const Clock& clock) : opts_(opts), clock_(&clock) {}

  // Whether traffic may go here now (an open breaker whose ejection has
  // elapsed becomes half-open; a half-open one whose probe is out is not).
  bool Usable();
  // Request `id` goes here: when half-open, it is the probe (those before
  // it, held past probe_hold_ms, are still probes: their results and first
  // events count). Call it only when Usable() said yes.
  void BeginProbe(const std::string& id);
  // Request `id` ended here without a result (cancelled, released, a busy
  // worker): when it was the latest probe, the next request probes instead.
  void EndProbe(const std::string& id);
  bool Probing(const std::string& id) const;
  // The request whose probe holds it now; empty when none does (the next request may probe).
  std::string probe() const { return ProbeFree() ? std::string() : probes_.back(); }
  void OnSuccess();
  // Counts towards opening it; while it is open, only the reason changes
  // (attempts in flight when it opened fail with the same incident).
  void OnFailure(const std::string& reason);
  // Opens at once (device lost, worker crashed); while already open, only
  // the reason changes (one incident reported twice is one ejection).
  void Trip(const std::string& reason);
  // A new process for this placement passed its readiness check (Envoy's
  // successful_active_health_check_uneject_host): a breaker open for its
  // first ejection becomes half-open and requests probe it. That ejection,
  // begun with the crash of the process now gone, had every request wait
  // out 30 s though its replacement was ready in one (the only placement)
  // or go to the fallback for as long. A probe that fails opens it again,
  // for longer, and a breaker ejected more than once (a worker that crashes
  // at its first requests: a crash loop) waits out its ejection whatever
  // restarts meanwhile.
  void Uneject();

  // As a request would find it: open past its ejection time is half-open
  // (the next request probes), whether or not one has asked since. (Status,
  // metrics and incidents said "open" for hours after a night-time crash.)
  BreakerState state() const {
    return state_ == BreakerState::kOpen && clock_->NowMs() >= open_until_ms_ ? BreakerState::kHalfOpen : state_;
  }
  int ejections() const { return ejections_; }
  int64_t open_until_ms() const { return open_until_ms_; }
  const std::string& last_reason() const { return last_reason_; }

 private:
  void Open(const std::string& reason);
  bool ProbeFree() const { return probes_.empty() || clock_->NowMs() - probe_since_ms_ >= opts_.probe_hold_ms; }

  BreakerOptions opts_;
  const Clock* clock_;
  BreakerState state_ = BreakerState::kClosed;
  int consecutive_ = 0;
  int ejections_ = 0;
  int64_t open_until_ms_ = 0;
  int64_t closed_since_ms_ = -1;  // when it last closed after a probe (-1: never opened, or not closed since)
  std::string last_reason_;
  // The requests probing a half-open breaker, in order (the latest holds it
  // until probe_hold_ms after probe_since_ms_); a few at most: one per hold.
  std::vector<std::string> probes_;
  int64_t probe_since_ms_ = 0;
};

}  // namespace spillway::failover
