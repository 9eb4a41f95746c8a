#include "failover/retry_policy.h"

#include <gtest/gtest.h>

#include "common/clock.h"

namespace spillway::failover {
namespace {

using Kind = AttemptOutcome::Kind;

// Time is stepped, never slept.
class RetryPolicyTest : public ::testing::Test {
 protected:
  RetryDecision Step(AttemptOutcome o) { return NextStep(o, &state_, budget_, clock_.NowMs()); }
  AttemptOutcome Failed(FailurePhase p = FailurePhase::kKv, bool delivered = false, bool continuable = true) {
    return {Kind::kFailed, p, delivered, continuable};
  }
  FakeClock clock_{1000};
  RetryBudget budget_;
  RetryState state_{0, 0, 0};
};

TEST_F(RetryPolicyTest, AnAnswerIsDelivered) {
  EXPECT_EQ(Step({Kind::kAnswered}).action, Action::kDeliver);
  EXPECT_EQ(state_.failures, 0);
}

TEST_F(RetryPolicyTest, ABusyWorkerIsWaitedForUntilTheBusyWaitEndsAndNeverCountedAgainstIt) {
  for (int i = 0; i < 59; ++i) {
    const auto d = Step({Kind::kBusy});
    EXPECT_EQ(d.action, Action::kWaitAndResend) << i;
    EXPECT_FALSE(d.count_failure);
    clock_.Advance(1000);
  }
  clock_.Advance(1000);  // 60 s since the first busy answer
  EXPECT_EQ(Step({Kind::kBusy}).action, Action::kDeliver);
  EXPECT_EQ(state_.failures, 0);
}

// The busy wait counts from the first busy answer since an attempt last
// ran, not from the request's arrival: a stream that ran 70 s and then
// fails over to a full CPU worker waits for it (it was refused at once).
TEST_F(RetryPolicyTest, TheBusyWaitCountsFromTheFirstBusyAnswerSinceAnAttemptRan) {
  clock_.Advance(70'000);  // ran (or waited for admission) that long first
  EXPECT_EQ(Step({Kind::kBusy}).action, Action::kWaitAndResend);
  clock_.Advance(30'000);
  EXPECT_EQ(Step({Kind::kBusy}).action, Action::kWaitAndResend);
  EXPECT_EQ(Step(Failed(FailurePhase::kKv, /*delivered=*/true)).action, Action::kContinueElsewhere);  // one ran
  clock_.Advance(50'000);
  EXPECT_EQ(Step({Kind::kBusy}).action, Action::kWaitAndResend) << "a new busy spell";
  clock_.Advance(60'000);
  EXPECT_EQ(Step({Kind::kBusy}).action, Action::kDeliver);
}

TEST_F(RetryPolicyTest, FailuresBeforeTheFirstTokenRunAgainElsewhereUpToTheAttemptBudget) {
  auto d = Step(Failed(FailurePhase::kKv));
  EXPECT_EQ(d.action, Action::kRetryElsewhere);
  EXPECT_TRUE(d.count_failure);
  EXPECT_EQ(Step(Failed(FailurePhase::kNone)).action, Action::kRetryElsewhere);  // a crash
  d = Step(Failed(FailurePhase::kDevice));
  EXPECT_EQ(d.action, Action::kGiveUp);  // the third failure of three
  EXPECT_TRUE(d.count_failure);
  EXPECT_NE(d.reason.find("device failure 3 of 3"), std::string::npos) << d.reason;
}

TEST_F(RetryPolicyTest, FailFastNeverLeavesThePlacement) {
  budget_.fail_fast = true;
  const auto d = Step(Failed(FailurePhase::kCompute));
  EXPECT_EQ(d.action, Action::kGiveUp);
  EXPECT_TRUE(d.count_failure);  // its breaker still hears of it
}

TEST_F(RetryPolicyTest, ACutStreamIsContinuedOnlyWhenWhatWasDeliveredCanBeReproduced) {
  EXPECT_EQ(Step(Failed(FailurePhase::kDevice, /*delivered=*/true, /*continuable=*/true)).action,
            Action::kContinueElsewhere);
  const auto d = Step(Failed(FailurePhase::kDevice, /*delivered=*/true, /*continuable=*/false));
  EXPECT_EQ(d.action, Action::kGiveUp);  // a delivered tool call is never replayed
  EXPECT_NE(d.reason.find("cannot be reproduced"), std::string::npos);
}

TEST_F(RetryPolicyTest, TheDeadlineAndCancellationEndTheRequest) {
  state_.deadline_ms = 5000;
  EXPECT_EQ(Step(Failed()).action, Action::kRetryElsewhere);
  clock_.Advance(4000);  // now 5000
  auto d = Step(Failed());
  EXPECT_EQ(d.action, Action::kDeadline);
  EXPECT_TRUE(d.count_failure);  // the failure still counts against its placement
  EXPECT_EQ(Step({Kind::kBusy}).action, Action::kDeadline);
  state_.deadline_ms = 0;
  EXPECT_EQ(Step({Kind::kCancelled}).action, Action::kCancelled);
}

}  // namespace
}  // namespace spillway::failover
