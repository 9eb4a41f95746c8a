#include "scheduler/cpu_queue.h"

#include <gtest/gtest.h>

namespace spillway::scheduler {
namespace {

constexpr uint64_t MiB = 1 << 20;

TEST(CpuQueueTest, RunsConcurrencyAtOnceInArrivalOrder) {
  FakeClock clock;
  CpuQueue q({/*max_waiting=*/4, /*concurrency=*/2, 0}, clock);
  for (const char* id : {"a", "b", "c"}) ASSERT_EQ(q.Join(id, MiB), CpuQueue::JoinResult::kQueued);
  // Nobody overtakes the first in line.
  EXPECT_EQ(q.TryStart("b"), CpuQueue::StartResult::kWait);
  EXPECT_EQ(q.TryStart("a"), CpuQueue::StartResult::kStart);
  EXPECT_EQ(q.TryStart("b"), CpuQueue::StartResult::kStart);
  EXPECT_EQ(q.TryStart("c"), CpuQueue::StartResult::kWait);  // two run already
  EXPECT_EQ(q.Position("c"), 1u);
  q.Leave("a");
  EXPECT_EQ(q.TryStart("c"), CpuQueue::StartResult::kStart);
  EXPECT_EQ(q.stats().running, 2u);
  EXPECT_EQ(q.stats().started, 3u);
}

TEST(CpuQueueTest, AFullLineRefusesAndJoiningAgainKeepsThePlace) {
  FakeClock clock;
  CpuQueue q({2, 1, 0}, clock);
  EXPECT_EQ(q.Join("a", MiB), CpuQueue::JoinResult::kQueued);
  EXPECT_EQ(q.Join("b", MiB), CpuQueue::JoinResult::kQueued);
  EXPECT_EQ(q.Join("c", MiB), CpuQueue::JoinResult::kFull);
  // Refused, it waits for the accelerator and asks again each round: one
  // refusal of one request (each ask was counted: thousands a minute).
  q.Leave("c");
  EXPECT_EQ(q.Join("c", MiB), CpuQueue::JoinResult::kFull);
  EXPECT_EQ(q.Join("d", MiB), CpuQueue::JoinResult::kFull);
  EXPECT_EQ(q.stats().rejected_full, 2u);
  EXPECT_EQ(q.Join("a", MiB), CpuQueue::JoinResult::kQueued);  // idempotent
  EXPECT_EQ(q.Position("a"), 1u);
  EXPECT_EQ(q.Position("b"), 2u);
  // A cancelled request leaves the line wherever it stands.
  q.Leave("a");
  EXPECT_EQ(q.Position("b"), 1u);
  EXPECT_EQ(q.Join("c", MiB), CpuQueue::JoinResult::kQueued);
}

// A failover (a request the gateway took on, whose accelerator attempt
// failed) joins a full line at its end: the bound refuses new requests, not
// accepted ones (the proving suite's cancel_in_cpu_queue, seed 7: four
// accepted requests ended 503 "the CPU path is full"). The budget still holds.
TEST(CpuQueueTest, AFailoverJoinsAFullLineButNotPastTheBudget) {
  FakeClock clock;
  CpuQueue q({/*max_waiting=*/1, /*concurrency=*/1, /*ram_budget_bytes=*/8 * MiB}, clock);
  ASSERT_EQ(q.Join("a", MiB), CpuQueue::JoinResult::kQueued);
  ASSERT_EQ(q.TryStart("a"), CpuQueue::StartResult::kStart);
  ASSERT_EQ(q.Join("b", MiB), CpuQueue::JoinResult::kQueued);
  EXPECT_EQ(q.Join("new", MiB), CpuQueue::JoinResult::kFull);
  EXPECT_EQ(q.Join("failover", MiB, /*past_bound=*/true), CpuQueue::JoinResult::kQueued);
  EXPECT_EQ(q.Position("failover"), 2u) << "at the end of the line, not ahead of those waiting";
  EXPECT_EQ(q.Join("new", MiB), CpuQueue::JoinResult::kFull) << "the line is still full for new requests";
  EXPECT_EQ(q.Join("huge", 9 * MiB, /*past_bound=*/true), CpuQueue::JoinResult::kOverBudget);
  q.Leave("a");
  EXPECT_EQ(q.TryStart("b"), CpuQueue::StartResult::kStart);
  EXPECT_EQ(q.TryStart("failover"), CpuQueue::StartResult::kWait);
  q.Leave("b");
  EXPECT_EQ(q.TryStart("failover"), CpuQueue::StartResult::kStart);
}

// max_queue = 0: nobody waits, but a request that starts at once runs (it
// refused every request, the path idle or not).
TEST(CpuQueueTest, ALineOfNoWaitingPlacesStillRunsWhatStartsAtOnce) {
  FakeClock clock;
  CpuQueue q({/*max_waiting=*/0, /*concurrency=*/1, 0}, clock);
  ASSERT_EQ(q.Join("a", MiB), CpuQueue::JoinResult::kQueued);
  EXPECT_EQ(q.TryStart("a"), CpuQueue::StartResult::kStart);
  EXPECT_EQ(q.Join("b", MiB), CpuQueue::JoinResult::kFull) << "it would have to wait";
  q.Leave("a");
  EXPECT_EQ(q.Join("b", MiB), CpuQueue::JoinResult::kQueued);
}

// A waiter the replicas outgrew since it joined (a replica loaded, its RSS
// rose) can never start: asked again, it is refused and leaves, and the one
// behind it becomes the head. It held the line's head until its deadline.
TEST(CpuQueueTest, AWaiterTheReplicasOutgrewIsRefusedAndTheLineMovesOn) {
  FakeClock clock;
  CpuQueue q({8, 1, 100 * MiB}, clock);
  ASSERT_EQ(q.Join("a", 40 * MiB), CpuQueue::JoinResult::kQueued);
  ASSERT_EQ(q.Join("b", 10 * MiB), CpuQueue::JoinResult::kQueued);
  q.SetResident("chat.1", 70 * MiB);  // the replica loaded after they joined
  EXPECT_EQ(q.TryStart("a"), CpuQueue::StartResult::kWait) << "70 + 40 > 100, with nothing running";
  EXPECT_EQ(q.Join("a", 40 * MiB), CpuQueue::JoinResult::kOverBudget);
  EXPECT_EQ(q.Position("a"), 0u);
  EXPECT_EQ(q.stats().rejected_budget, 1u);
  EXPECT_EQ(q.Join("b", 10 * MiB), CpuQueue::JoinResult::kQueued) << "it still fits";
  EXPECT_EQ(q.TryStart("b"), CpuQueue::StartResult::kStart);
}

TEST(CpuQueueTest, TheRamBudgetHoldsReplicasAndRunningRequests) {
  FakeClock clock;
  CpuQueue q({8, 8, 100 * MiB}, clock);
  q.SetResident("chat.1", 70 * MiB);
  // Could never fit, even alone: refused at once.
  EXPECT_EQ(q.Join("huge", 40 * MiB), CpuQueue::JoinResult::kOverBudget);
  EXPECT_EQ(q.stats().rejected_budget, 1u);
  ASSERT_EQ(q.Join("a", 20 * MiB), CpuQueue::JoinResult::kQueued);
  ASSERT_EQ(q.Join("b", 20 * MiB), CpuQueue::JoinResult::kQueued);
  EXPECT_EQ(q.TryStart("a"), CpuQueue::StartResult::kStart);
  EXPECT_EQ(q.TryStart("b"), CpuQueue::StartResult::kWait);  // 70 + 20 + 20 > 100
  EXPECT_EQ(q.stats().peak_bytes, 90 * MiB);
  q.Leave("a");
  EXPECT_EQ(q.TryStart("b"), CpuQueue::StartResult::kStart);
  EXPECT_LE(q.stats().peak_bytes, 100 * MiB);
  // Unloading the replica frees its share.
  q.SetResident("chat.1", 0);
  EXPECT_EQ(q.stats().resident_bytes, 0u);
}

TEST(CpuQueueTest, LowObservedHostMemoryRefusesTheFirstInLine) {
  FakeClock clock;
  CpuQueue q({8, 2, 0}, clock);
  ASSERT_EQ(q.Join("a", 64 * MiB), CpuQueue::JoinResult::kQueued);
  ASSERT_EQ(q.Join("b", 1 * MiB), CpuQueue::JoinResult::kQueued);
  EXPECT_EQ(q.TryStart("a", 32 * MiB), CpuQueue::StartResult::kHostLow);
  EXPECT_FALSE(q.Waiting("a"));
  EXPECT_EQ(q.TryStart("b", 32 * MiB), CpuQueue::StartResult::kStart);
  EXPECT_EQ(q.stats().rejected_host, 1u);
}

// Only a request that would start now is worth the host memory's reading
// (procfs and cgroup files, under the board's lock): the head of the line,
// with a lane and room in the budget; not every waiter every round.
TEST(CpuQueueTest, OnlyTheRequestThatWouldStartMayStart) {
  FakeClock clock;
  CpuQueue q({8, 1, 100 * MiB}, clock);
  ASSERT_EQ(q.Join("a", 60 * MiB), CpuQueue::JoinResult::kQueued);
  ASSERT_EQ(q.Join("b", 60 * MiB), CpuQueue::JoinResult::kQueued);
  EXPECT_TRUE(q.MayStart("a"));
  EXPECT_FALSE(q.MayStart("b")) << "behind a";
  ASSERT_EQ(q.TryStart("a"), CpuQueue::StartResult::kStart);
  EXPECT_TRUE(q.MayStart("a")) << "running";
  EXPECT_FALSE(q.MayStart("b")) << "no lane free";
  q.Leave("a");
  q.SetResident("chat.1", 50 * MiB);
  EXPECT_FALSE(q.MayStart("b")) << "50 + 60 MiB over the 100 MiB budget";
  q.SetResident("chat.1", 30 * MiB);
  EXPECT_TRUE(q.MayStart("b"));
  EXPECT_FALSE(q.MayStart("nobody"));
}

TEST(CpuQueueTest, QueueAgeAndEstimatedWaitFollowTheClock) {
  FakeClock clock;
  CpuQueue q({8, 2, 0}, clock);
  for (const char* id : {"a", "b", "c", "d", "e"}) q.Join(id, MiB);
  EXPECT_EQ(q.TryStart("a"), CpuQueue::StartResult::kStart);
  EXPECT_EQ(q.TryStart("b"), CpuQueue::StartResult::kStart);
  clock.Advance(1500);
  EXPECT_EQ(q.stats().oldest_wait_ms, 1500);
  // Two lanes busy: c waits one round, d one round, e two rounds.
  EXPECT_DOUBLE_EQ(q.EstimatedWaitS("c", 4.0), 4.0);
  EXPECT_DOUBLE_EQ(q.EstimatedWaitS("d", 4.0), 4.0);
  EXPECT_DOUBLE_EQ(q.EstimatedWaitS("e", 4.0), 8.0);
  EXPECT_DOUBLE_EQ(q.EstimatedWaitS("a", 4.0), 0.0);  // running, not waiting
  q.Leave("c");
  q.Leave("d");
  q.Leave("e");
  EXPECT_EQ(q.stats().oldest_wait_ms, 0);
}

}  // namespace
}  // namespace spillway::scheduler
