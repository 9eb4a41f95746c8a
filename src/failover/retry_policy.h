// What to do after an attempt: the gateway's retry and failover policy, pure.
//
// An attempt ends in one of four ways (AttemptOutcome::Kind). The policy
// turns that, the request's retry state and the clock into one action:
//
//   outcome                       condition                                   action
//   ----------------------------  ------------------------------------------  ------------------
//   any but kAnswered             past the request's deadline                 kDeadline
//   kCancelled                    -                                           kCancelled
//   kBusy (nothing ran)           busy for less than busy_wait_ms             kWaitAndResend
//   kBusy                         busy longer                                 kDeliver (its 503)
//   kFailed                       fail_fast ("the accelerator or an error")   kGiveUp
//   kFailed                       failures reach max_attempts                 kGiveUp
//   kFailed, nothing delivered    -                                           kRetryElsewhere
//   kFailed, part of a stream     continuable (no tool call delivered,        kContinueElsewhere
//                                 token ids known)
//   kFailed, part of a stream     not continuable                             kGiveUp (resumable)
//   kAnswered                     -                                           kDeliver
//
// kFailed counts against the placement (its breaker, and the request stays
// away from it); kBusy does not (the worker is healthy, only full). A retry
// re-runs the request from scratch with the same id and pinned seed; a
// continuation replays the delivered tokens (docs/DESIGN.md invariant 2: never
// past a delivered tool call).
//
// Pure: the clock is a parameter. Not thread-safe (one per request).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace spillway::failover {

struct AttemptOutcome {
  enum class Kind {
    kAnswered,   // the worker answered: success, or an error that is the request's own (400, a cancelled 499...)
    kBusy,       // every slot or KV cell of the worker was taken: nothing ran
    kFailed,     // an allocation failure or a lost device (phase), or a worker that died or could not be reached
    kCancelled,  // the request was cancelled while the attempt ran
  };
  Kind kind = Kind::kAnswered;
  FailurePhase phase = FailurePhase::kNone;  // kFailed: kNone is a crash or an unreachable worker
  bool delivered = false;    // the client already has part of a stream
  bool continuable = true;   // what was delivered can be reproduced elsewhere
};

struct RetryBudget {
  int max_attempts = 3;          // failed attempts per request
  bool fail_fast = false;        // never leave the first placement
  int64_t busy_wait_ms = 60000;  // how long a full worker is waited for
};

struct RetryState {
  int failures = 0;
  // When its attempts began to find the worker full, since the last attempt
  // that ran (clock ms; 0: not now). The busy wait counts from there, not
  // from the request's arrival: a request admitted after a long delay, or a
  // stream that ran a minute before it failed over, still waits for a slot.
  int64_t busy_since_ms = 0;
  int64_t deadline_ms = 0;  // 0: none
};

enum class Action { kDeliver, kWaitAndResend, kRetryElsewhere, kContinueElsewhere, kGiveUp, kCancelled, kDeadline };
const char* ActionName(Action a);

struct RetryDecision {
  Action action = Action::kDeliver;
  bool count_failure = false;  // against the placement: breaker, and excluded for this request
  std::string reason;
};

// Decides, and counts a failure in *state when the outcome is one.
RetryDecision NextStep(const AttemptOutcome& outcome, RetryState* state, const RetryBudget& budget, int64_t now_ms);

// The phase as the breakers and the journal name it: "crash" for kNone.
const char* FailureName(FailurePhase phase);

}  // namespace spillway::failover
