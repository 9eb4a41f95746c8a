// The CPU path's rules (admission/cpu_path.h), with a real line
// (scheduler::CpuQueue) on a stepped clock to produce their inputs.
#include "admission/cpu_path.h"

#include <gtest/gtest.h>

#include "common/clock.h"

namespace spillway::admission {
namespace {

using Kind = CpuPathVerdict::Kind;

CpuPathLimits Limits() {
  CpuPathLimits l;
  l.service = "chat";
  l.max_prompt_tokens = 1000;
  l.max_tokens = 64;
  l.concurrency = 1;
  l.max_queue = 2;
  l.budget_bytes = 100ull << 20;
  l.host_headroom_bytes = 512ull << 20;
  return l;
}

// A request that joins `q` (and asks to start when its replica is up), as the gateway does.
CpuPathState Join(scheduler::CpuQueue& q, const std::string& id, uint64_t bytes, bool ready,
                  uint64_t host = scheduler::CpuQueue::kUnknown) {
  CpuPathState s;
  s.request_bytes = bytes;
  s.join = q.Join(id, bytes);
  s.replica_ready = ready;
  s.host_available = host;
  if (NeedsStart(s.join, ready)) s.start = q.TryStart(id, host);
  s.line = q.stats();
  s.position = q.Position(id);
  s.replica = "cpu";
  s.readiness = "loads on demand, about 3 s";
  s.readiness_expected_s = 3;
  s.cells_free = 4096;
  s.gen_tps = 10;  // 10 tokens a second: 10 prompt + 40 generated = 5 s a request
  return s;
}

TEST(CpuPathTest, ALongPromptIsRefusedAndMaxTokensCapped) {
  const auto refused = CapForCpuPath(1001, 10, Limits());
  EXPECT_TRUE(refused.refused);
  EXPECT_EQ(refused.retry_after_s, 30);
  EXPECT_NE(refused.reason.find("prompts of up to 1000 tokens (this one has 1001)"), std::string::npos) << refused.reason;
  const auto capped = CapForCpuPath(1000, 500, Limits());
  EXPECT_FALSE(capped.refused);
  EXPECT_EQ(capped.max_tokens, 64u);
  EXPECT_EQ(capped.limits, "max_tokens=64 (CPU path)");
  const auto untouched = CapForCpuPath(10, 64, Limits());
  EXPECT_EQ(untouched.max_tokens, 64u);
  EXPECT_TRUE(untouched.limits.empty());
}

TEST(CpuPathTest, TheFirstGoesTheNextWaitWithTheirPlaceAndAnEstimate) {
  FakeClock clock;
  scheduler::CpuQueue q({2, 1, 100ull << 20}, clock);
  EXPECT_EQ(JudgeCpuPath(10, 40, Join(q, "a", 1 << 20, true), Limits()).kind, Kind::kGo);
  const auto b = JudgeCpuPath(10, 40, Join(q, "b", 1 << 20, true), Limits());
  EXPECT_EQ(b.kind, Kind::kWait);
  EXPECT_EQ(b.est_wait_s, 5);  // behind the one running: one request's time at the measured rate
  EXPECT_EQ(b.why, "waiting for the CPU path: position 1 of 1, 1 running, about 5 s");
  const auto c = JudgeCpuPath(10, 40, Join(q, "c", 1 << 20, true), Limits());
  EXPECT_EQ(c.est_wait_s, 10);
  // The line holds two waiting: the next is refused, told to come back when they are through.
  const auto d = JudgeCpuPath(10, 40, Join(q, "d", 1 << 20, true), Limits());
  EXPECT_EQ(d.kind, Kind::kReject);
  EXPECT_EQ(d.retry_after_s, 15);  // 2 waiting + 1 running, 5 s each, one at a time
  EXPECT_EQ(d.why, "the CPU path of 'chat' is full: 1 running, 2 waiting (max_queue 2)");
}

TEST(CpuPathTest, AStoppedReplicaIsStartedAndWaitedFor) {
  FakeClock clock;
  scheduler::CpuQueue q({2, 1, 100ull << 20}, clock);
  const auto s = Join(q, "a", 1 << 20, false);
  EXPECT_FALSE(s.start.has_value());  // not started on a replica that is not up
  const auto v = JudgeCpuPath(10, 40, s, Limits());
  EXPECT_EQ(v.kind, Kind::kWait);
  EXPECT_TRUE(v.demand_replica);
  EXPECT_EQ(v.est_wait_s, 3);
  EXPECT_EQ(v.why, "loading the CPU replica cpu (loads on demand, about 3 s)");
}

// Two CPU replicas of one service: the budget was checked only against the
// loaded ones, so a request for the stopped one loaded it beside the other,
// past the budget (its requests then refused, the host short of memory).
TEST(CpuPathTest, AReplicaIsStartedOnlyWhereItFitsTheBudgetBesideTheLoadedOnes) {
  FakeClock clock;
  scheduler::CpuQueue q({2, 1, 100ull << 20}, clock);
  q.SetResident("chat.1", 60ull << 20);  // the other replica, loaded
  auto s = Join(q, "a", 1ull << 20, false);
  s.replica_bytes = 50ull << 20;
  const auto v = JudgeCpuPath(10, 40, s, Limits());
  EXPECT_EQ(v.kind, Kind::kReject);
  EXPECT_FALSE(v.demand_replica);
  EXPECT_EQ(v.retry_after_s, 30);
  EXPECT_EQ(v.why, "loading the CPU replica cpu (50 MiB) for a request of 1 MiB beside the loaded ones and their "
                   "running requests (60 MiB) would pass the CPU path's host-RAM budget of 100 MiB");
  s.replica_bytes = 39ull << 20;  // fits: 60 + 39 + 1
  EXPECT_TRUE(JudgeCpuPath(10, 40, s, Limits()).demand_replica);
  // The requests running on the loaded replica count too: 60 + 2 running + 39 + 1 does not fit.
  s.line.running_bytes = 2ull << 20;
  EXPECT_EQ(JudgeCpuPath(10, 40, s, Limits()).kind, Kind::kReject);
  s.line.running_bytes = 0;
  // While it starts, its own share is counted once.
  q.SetResident("chat.0", 39ull << 20);
  s = Join(q, "a", 1ull << 20, false);
  s.replica_bytes = s.replica_counted_bytes = 39ull << 20;
  EXPECT_EQ(JudgeCpuPath(10, 40, s, Limits()).kind, Kind::kWait);
}

TEST(CpuPathTest, TheFirstInLineWaitsForKvCells) {
  FakeClock clock;
  scheduler::CpuQueue q({2, 1, 100ull << 20}, clock);
  auto s = Join(q, "a", 1 << 20, true);
  s.cells_free = 49;
  const auto v = JudgeCpuPath(10, 40, s, Limits());
  EXPECT_EQ(v.kind, Kind::kWait);
  EXPECT_EQ(v.why, "first in line for the CPU path, waiting for 50 KV cells (49 free for one request)");
  s.cells_free = 50;
  EXPECT_EQ(JudgeCpuPath(10, 40, s, Limits()).kind, Kind::kGo);
}

TEST(CpuPathTest, OverTheRamBudgetOrTheHostsMemoryIsRefused) {
  FakeClock clock;
  scheduler::CpuQueue q({2, 1, 100ull << 20}, clock);
  q.SetResident("cpu", 90ull << 20);
  const auto budget = JudgeCpuPath(10, 40, Join(q, "a", 20ull << 20, true), Limits());
  EXPECT_EQ(budget.kind, Kind::kReject);
  EXPECT_EQ(budget.retry_after_s, 30);
  EXPECT_EQ(budget.why, "the request needs 20 MiB of host RAM; the CPU path's budget of 100 MiB holds 90 MiB of replicas");
  const auto host = JudgeCpuPath(10, 40, Join(q, "b", 5ull << 20, true, 4ull << 20), Limits());
  EXPECT_EQ(host.kind, Kind::kReject);
  EXPECT_EQ(host.retry_after_s, 5);
  EXPECT_EQ(host.why, "the host has 4 MiB available above its headroom of 512 MiB; the CPU path would need 5 MiB");
  EXPECT_EQ(q.Position("b"), 0u);  // refused: out of the line
}

// An embedding's inputs are not counted on this path (0 tokens): each
// ahead of it counts a second, not nothing ("about 0 s" at any position).
TEST(CpuPathTest, ARequestOfNoKnownSizeCountsASecond) {
  FakeClock clock;
  scheduler::CpuQueue q({2, 1, 100ull << 20}, clock);
  EXPECT_EQ(JudgeCpuPath(0, 0, Join(q, "a", 1 << 20, true), Limits()).kind, Kind::kGo);
  const auto b = JudgeCpuPath(0, 0, Join(q, "b", 1 << 20, true), Limits());
  EXPECT_EQ(b.kind, Kind::kWait);
  EXPECT_EQ(b.est_wait_s, 1) << b.why;
  (void)Join(q, "c", 1 << 20, true);
  EXPECT_EQ(JudgeCpuPath(0, 0, Join(q, "d", 1 << 20, true), Limits()).retry_after_s, 3) << "3 ahead, a second each";
}

TEST(CpuPathTest, UnmeasuredSpeedCountsTenSecondsARequest) {
  FakeClock clock;
  scheduler::CpuQueue q({2, 1, 0}, clock);
  (void)Join(q, "a", 1, true);
  auto s = Join(q, "b", 1, true);
  s.gen_tps = 0;
  EXPECT_EQ(JudgeCpuPath(10, 40, s, Limits()).est_wait_s, 10);
}

}  // namespace
}  // namespace spillway::admission
