#include <gtest/gtest.h>

#include "chaos/schedule.h"
#include "chaos/verdict.h"

namespace spillway::chaos {
namespace {

TEST(ScheduleTest, ASeedFixesTheWholeScheduleAndAnotherSeedChangesIt) {
  const Scenario& s = *FindScenario("driver_reset");
  const Schedule a = MakeSchedule(s, 7, 20000, 5), b = MakeSchedule(s, 7, 20000, 5), c = MakeSchedule(s, 8, 20000, 5);
  ASSERT_EQ(a.requests.size(), b.requests.size());
  for (size_t i = 0; i < a.requests.size(); ++i) {
    EXPECT_EQ(a.requests[i].id, b.requests[i].id);
    EXPECT_EQ(a.requests[i].at_ms, b.requests[i].at_ms);
    EXPECT_EQ(a.requests[i].kind, b.requests[i].kind);
    EXPECT_EQ(a.requests[i].stream, b.requests[i].stream);
    EXPECT_EQ(a.requests[i].seed, b.requests[i].seed);
  }
  ASSERT_EQ(a.faults.size(), 5u);
  for (size_t i = 0; i < a.faults.size(); ++i) {
    EXPECT_EQ(a.faults[i].at_ms, b.faults[i].at_ms);
    EXPECT_EQ(a.faults[i].kind, b.faults[i].kind);
  }
  bool differs = a.requests.size() != c.requests.size();
  for (size_t i = 0; !differs && i < a.requests.size(); ++i) differs = a.requests[i].at_ms != c.requests[i].at_ms;
  EXPECT_TRUE(differs);
  EXPECT_EQ(PromptText(3, 5), PromptText(3, 5));
}

TEST(ScheduleTest, FaultsAreSpreadInsideTheWindowAndRequestsMixStreamingAndKinds) {
  const Scenario& s = *FindScenario("unrelated_traffic");
  const Schedule sch = MakeSchedule(s, 1, 60000, 40);
  ASSERT_EQ(sch.faults.size(), 40u);
  for (size_t i = 0; i < sch.faults.size(); ++i) {
    EXPECT_GE(sch.faults[i].at_ms, 5900);
    EXPECT_LE(sch.faults[i].at_ms, 45100);
    if (i > 0) {
      EXPECT_GE(sch.faults[i].at_ms, sch.faults[i - 1].at_ms);
    }
  }
  int streams = 0, embeds = 0;
  for (const auto& r : sch.requests) {
    streams += r.stream;
    embeds += r.kind == "embedding";
    EXPECT_LE(r.at_ms, 60000 * 0.85);
  }
  EXPECT_GT(streams, 0);
  EXPECT_LT(streams, static_cast<int>(sch.requests.size()));
  EXPECT_GT(embeds, 0);
  // Scenarios without faults get none, whatever is asked.
  EXPECT_TRUE(MakeSchedule(*FindScenario("routing_before_admission"), 1, 10000, 9).faults.empty());
}

RequestRecord Ok(const std::string& id, const std::string& placement = "sim:0/99") {
  RequestRecord r;
  r.id = id;
  r.service = "chat";
  r.acknowledged = true;
  r.http_status = 200;
  r.connection_survived = true;
  r.journal_state = "completed";
  r.attempts = 1;
  r.attempt_placements = {placement};
  r.placement = placement;
  r.latency_ms = 100;
  return r;
}

ScenarioResult Healthy() {
  ScenarioResult r;
  r.duration_ms = 60000;
  Sample s;
  s.primary_state = "ready";
  s.primary_breaker = "closed";
  s.cpu_path_budget_bytes = 100;
  s.cpu_path_ram_bytes = 50;
  r.samples = {s};
  return r;
}

TEST(VerdictTest, AHealthyRunPassesAndCountsGoodputAndPercentiles) {
  ScenarioResult r = Healthy();
  for (int i = 0; i < 20; ++i) {
    auto q = Ok("r" + std::to_string(i));
    q.latency_ms = 10 * (i + 1);
    r.requests.push_back(q);
  }
  const Verdict v = Judge(r, {});
  EXPECT_TRUE(v.passed) << ::testing::PrintToString(v.failures);
  EXPECT_EQ(v.succeeded, 20);
  EXPECT_DOUBLE_EQ(v.success_rate, 1.0);
  EXPECT_DOUBLE_EQ(v.goodput_per_min, 20.0);
  EXPECT_DOUBLE_EQ(v.p50_ms, 100);
  EXPECT_DOUBLE_EQ(v.p95_ms, 190);
}

TEST(VerdictTest, AnAcknowledgedRequestWithoutATerminalStateIsLostAnUnacknowledgedOneIsUnknown) {
  ScenarioResult r = Healthy();
  auto lost = Ok("lost");
  lost.journal_state = "running";
  auto unknown = Ok("unknown");
  unknown.acknowledged = false;
  unknown.http_status = 0;
  unknown.journal_state = "";
  r.requests = {lost, unknown, Ok("fine")};
  const Verdict v = Judge(r, {});
  EXPECT_EQ(v.lost, 1);
  EXPECT_EQ(v.unknown, 1);
  EXPECT_FALSE(v.passed);
  ASSERT_EQ(v.failures.size(), 1u);
  EXPECT_NE(v.failures[0].find("lost: lost"), std::string::npos);
}

TEST(VerdictTest, DuplicatesInequivalenceRamAndASilentSpillFail) {
  ScenarioResult r = Healthy();
  auto dup = Ok("dup");
  dup.tool_executions = 2;
  auto diff = Ok("diff");
  diff.equivalent = false;
  auto same = Ok("same");
  same.equivalent = true;
  auto silent = Ok("silent", "cpu");  // served by the fallback without telling the client
  auto told = Ok("told", "cpu");
  told.degraded_signal = true;
  auto retried = Ok("retried", "cpu");
  retried.degraded_signal = true;
  retried.attempts = 2;
  retried.attempt_placements = {"sim:0/99", "cpu"};
  r.requests = {dup, diff, same, silent, told, retried};
  r.samples.back().cpu_path_ram_bytes = 150;  // over the budget of 100
  const Verdict v = Judge(r, {});
  EXPECT_FALSE(v.passed);
  EXPECT_EQ(v.duplicates, 1);
  EXPECT_EQ(v.deterministic_compared, 2);
  EXPECT_EQ(v.deterministic_equal, 1);
  EXPECT_EQ(v.degraded_served, 3);
  EXPECT_EQ(v.degraded_signalled, 2);
  EXPECT_EQ(v.retried, 1);
  EXPECT_EQ(v.retried_not_exactly_once, 0);
  EXPECT_EQ(v.failures.size(), 4u) << ::testing::PrintToString(v.failures);
}

TEST(VerdictTest, TheAcceleratorMustServeAgainAndUnrelatedTrafficMustNotFail) {
  ScenarioResult r = Healthy();
  r.samples.back().primary_breaker = "open";
  auto embed = Ok("embed", "cpu");
  embed.service = "embed";
  embed.http_status = 503;
  embed.journal_state = "failed";
  r.requests = {embed};
  const Verdict v = Judge(r, {});
  EXPECT_FALSE(v.gpu_restored);
  EXPECT_EQ(v.unrelated_failed, 1);
  EXPECT_EQ(v.failures.size(), 2u) << ::testing::PrintToString(v.failures);
  // A target without a journal judges from what the client saw.
  ScenarioResult l = Healthy();
  auto cut = Ok("cut");
  cut.journal_state = "";
  cut.connection_survived = false;
  l.requests = {cut};
  VerdictOptions no_journal;
  no_journal.journal = false;
  EXPECT_EQ(Judge(l, no_journal).lost, 1);
}

TEST(VerdictTest, RecoveryComesFromTheFaults) {
  ScenarioResult r = Healthy();
  r.faults = {{1000, "kill", 1800}, {5000, "kill", 5400}, {9000, "hang", -1}};
  const Verdict v = Judge(r, {});
  EXPECT_DOUBLE_EQ(v.recovery_max_ms, 800);
  EXPECT_DOUBLE_EQ(v.recovery_median_ms, 400);  // nearest rank of {400, 800}
}

}  // namespace
}  // namespace spillway::chaos
