#include "failover/retry_policy.h"

namespace spillway::failover {

const char* ActionName(Action a) {
  switch (a) {
    case Action::kDeliver: return "deliver";
    case Action::kWaitAndResend: return "wait_and_resend";
    case Action::kRetryElsewhere: return "retry_elsewhere";
    case Action::kContinueElsewhere: return "continue_elsewhere";
    case Action::kGiveUp: return "give_up";
    case Action::kCancelled: return "cancelled";
    case Action::kDeadline: return "deadline";
  }
  return "unknown";
}

const char* FailureName(FailurePhase phase) {
  return phase == FailurePhase::kNone ? "crash" : FailurePhaseName(phase);
}

RetryDecision NextStep(const AttemptOutcome& o, RetryState* s, const RetryBudget& b, int64_t now_ms) {
  using Kind = AttemptOutcome::Kind;
  if (o.kind == Kind::kAnswered) return {Action::kDeliver, false, "answered"};
  const bool failed = o.kind == Kind::kFailed;
  if (failed) ++s->failures;
  if (s->deadline_ms && now_ms >= s->deadline_ms) return {Action::kDeadline, failed, "past the request's deadline"};
  if (o.kind == Kind::kCancelled) return {Action::kCancelled, false, "cancelled"};
  if (o.kind == Kind::kBusy) {
    if (s->busy_since_ms == 0) s->busy_since_ms = now_ms;
    if (now_ms - s->busy_since_ms < b.busy_wait_ms) return {Action::kWaitAndResend, false, "the worker is full"};
    return {Action::kDeliver, false, "the worker stayed full"};
  }
  s->busy_since_ms = 0;  // this attempt ran
  const std::string what = std::string(FailureName(o.phase)) + " failure " + std::to_string(s->failures) + " of " +
                           std::to_string(b.max_attempts);
  if (b.fail_fast) return {Action::kGiveUp, true, what + "; fail_fast: no other placement"};
  if (s->failures >= b.max_attempts) return {Action::kGiveUp, true, what + ": no attempt left"};
  if (!o.delivered) return {Action::kRetryElsewhere, true, what + ": run again elsewhere"};
  if (o.continuable) return {Action::kContinueElsewhere, true, what + ": continue the stream elsewhere"};
  return {Action::kGiveUp, true, what + ": what was delivered cannot be reproduced (a tool call, or no token ids)"};
}

}  // namespace spillway::failover
