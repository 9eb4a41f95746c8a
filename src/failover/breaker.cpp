#include "failover/breaker.h"

#include <algorithm>

namespace spillway::failover {

const char* BreakerStateName(BreakerState s) {
  switch (s) {
    case BreakerState::kClosed: return "closed";
    case BreakerState::kOpen: return "open";
    case BreakerState::kHalfOpen: return "half_open";
  }
  return "closed";
}

bool Breaker::Usable() {
  if (state_ == BreakerState::kOpen && clock_->NowMs() >= open_until_ms_) state_ = BreakerState::kHalfOpen;
  if (state_ == BreakerState::kHalfOpen) return ProbeFree();
  return state_ != BreakerState::kOpen;
}

void Breaker::BeginProbe(const std::string& id) {
  if (state_ != BreakerState::kHalfOpen || !ProbeFree()) return;
  constexpr size_t kMaxProbes = 16;  // (a stuck one past its hold is forgotten first)
  if (probes_.size() >= kMaxProbes) probes_.erase(probes_.begin());
  probes_.push_back(id);
  probe_since_ms_ = clock_->NowMs();
}

bool Breaker::Probing(const std::string& id) const {
  return std::find(probes_.begin(), probes_.end(), id) != probes_.end();
}

void Breaker::EndProbe(const std::string& id) {
  auto it = std::find(probes_.begin(), probes_.end(), id);
  if (it == probes_.end()) return;
  // The latest one ended without a result: the next request probes now
  // (the earlier ones' holds are over already).
  if (std::next(it) == probes_.end()) probe_since_ms_ = clock_->NowMs() - opts_.probe_hold_ms;
  probes_.erase(it);
}

void Breaker::OnSuccess() {
  consecutive_ = 0;
  probes_.clear();
  if (state_ == BreakerState::kHalfOpen) {
    state_ = BreakerState::kClosed;
    closed_since_ms_ = clock_->NowMs();
  }
}

void Breaker::OnFailure(const std::string& reason) {
  last_reason_ = reason;
  // Attempts that began before it opened fail with the incident that opened
  // it: they neither count nor open it again (an open breaker with six
  // requests in flight was ejected twice, for twice as long).
  if (state_ == BreakerState::kOpen) return;
  if (state_ == BreakerState::kHalfOpen) return Open(reason);  // the probe failed
  if (++consecutive_ >= opts_.failures) Open(reason);
}

void Breaker::Trip(const std::string& reason) {
  last_reason_ = reason;
  // One incident seen twice (the failed request and the worker's exit) is one ejection.
  if (state_ == BreakerState::kOpen && clock_->NowMs() < open_until_ms_) return;
  Open(reason);
}

void Breaker::Uneject() {
  if (state_ == BreakerState::kOpen && ejections_ <= 1) state_ = BreakerState::kHalfOpen;
}

void Breaker::Open(const std::string& reason) {
  last_reason_ = reason;
  if (state_ == BreakerState::kClosed && closed_since_ms_ >= 0 && opts_.base_ejection_ms > 0) {
    const int64_t forgiven = (clock_->NowMs() - closed_since_ms_) / opts_.base_ejection_ms;
    ejections_ = static_cast<int>(std::max<int64_t>(0, ejections_ - forgiven));
  }
  closed_since_ms_ = -1;
  probes_.clear();
  ++ejections_;
  consecutive_ = 0;
  state_ = BreakerState::kOpen;
  open_until_ms_ = clock_->NowMs() + std::min(opts_.max_ejection_ms, opts_.base_ejection_ms * ejections_);
}

}  // namespace spillway::failover
