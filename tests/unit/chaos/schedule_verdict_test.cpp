#include <gtest/gtest.h>

#include <random>

#include <functional>

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

TEST(ScheduleTest, CompetingServicesPlanInteractiveTrafficAndABatchBacklog) {
  const Scenario& s = *FindScenario("competing_services");
  ASSERT_TRUE(s.Competing());
  EXPECT_GT(s.batch_clients, 0);
  const Schedule sch = MakeSchedule(s, 1, 30000, 3);
  EXPECT_TRUE(sch.faults.empty());
  int search = 0, chat = 0;
  for (const auto& r : sch.requests) {
    EXPECT_NE(r.kind, "embedding") << "the batch backlog is sent by its own clients, not at planned times";
    search += r.kind == "search";
    chat += r.kind == "chat" || r.kind == "completion";
  }
  EXPECT_GT(search, 0);
  EXPECT_GT(chat, 5 * search);
  const PlannedRequest a = BatchRequest(s, 1, 7), b = BatchRequest(s, 1, 7), c = BatchRequest(s, 1, 8);
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.prompt_words, b.prompt_words);
  EXPECT_NE(a.id, c.id);
  EXPECT_EQ(a.kind, "embedding");
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

// The gateway killed at `at_ms` (and serving again at `back_ms`; -1: not seen).
FaultEvent KillGateway(int64_t at_ms, int64_t back_ms = -1) {
  FaultEvent f;
  f.at_ms = at_ms;
  f.kind = "kill-gateway";
  f.back_ms = back_ms;
  f.recovered_ms = at_ms;  // (its accelerator placement seen ready at once: not when the gateway was back)
  return f;
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
    auto q = Ok(std::string("r").append(std::to_string(i)));  // (GCC 12 warns falsely on "r" + ...)
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
  r.faults = {KillGateway(50)};  // (unknown: sent into the kill, never journaled)
  Verdict v = Judge(r, {});
  EXPECT_EQ(v.lost, 1);
  EXPECT_EQ(v.unknown, 1);
  EXPECT_FALSE(v.passed);
  ASSERT_EQ(v.failures.size(), 1u);
  EXPECT_NE(v.failures[0].find("lost: lost"), std::string::npos);
  // With the gateway up throughout, an answer neither given nor journaled
  // is a request it dropped before recording it: it passed as "unknown".
  r.requests = {unknown, Ok("fine")};
  r.faults.clear();
  v = Judge(r, {});
  EXPECT_EQ(v.unknown, 1);
  ASSERT_EQ(v.failures.size(), 1u);
  EXPECT_EQ(v.failures[0], "no answer and no journal record, the gateway up throughout: unknown");
  // One sent after the gateway was serving again is not covered by its kill.
  r.faults = {KillGateway(50, 80)};
  r.requests[0].sent_ms = 90;
  EXPECT_FALSE(Judge(r, {}).passed);
  r.requests[0].sent_ms = 70;  // sent while it was down
  EXPECT_TRUE(Judge(r, {}).passed) << ::testing::PrintToString(Judge(r, {}).failures);
  // Refused before the journal took it (a 429 without the id echoed): answered, not unknown.
  r.faults.clear();
  r.requests[0].http_status = 429;
  EXPECT_TRUE(Judge(r, {}).passed) << ::testing::PrintToString(Judge(r, {}).failures);
}

// Faults whose targets were never ready (a worker still restarting from
// the last one) were counted as injected, and the scenario passed having
// tested nothing.
TEST(VerdictTest, AScenarioNoneOfWhoseFaultsWasInjectedFails) {
  ScenarioResult r = Healthy();
  FaultEvent f;
  f.at_ms = 100;
  f.kind = "hang (not injected: its target was not ready)";
  f.injected = false;
  r.faults = {f, f};
  Verdict v = Judge(r, {});
  EXPECT_FALSE(v.passed);
  ASSERT_FALSE(v.failures.empty());
  EXPECT_NE(v.failures.back().find("none of its 2 faults was injected"), std::string::npos) << v.failures.back();
  r.faults[1].injected = true;  // one was
  v = Judge(r, {});
  EXPECT_TRUE(v.passed) << ::testing::PrintToString(v.failures);
}

// A fault armed in the GPU worker goes off only when a request reaches it
// (a compute, an allocation, the k-th token): one armed before no request
// came was counted as a fault the scenario survived.
TEST(VerdictTest, ArmedFaultsGoOffWhenTheirWorkerCountsThemOrIsReplaced) {
  auto sample = [](int64_t t, int pid, int64_t fired, std::string state = "ready") {
    Sample s;
    s.t_ms = t;
    s.primary_pid = pid;
    s.primary_faults_fired = fired;
    s.primary_state = std::move(state);
    s.primary_breaker = "closed";
    return s;
  };
  auto armed = [](int64_t at, int pid, int64_t before) {
    FaultEvent f;
    f.at_ms = at;
    f.kind = "compute-error";
    f.worker_pid = pid;
    f.fired_before = before;
    return f;
  };
  FaultEvent kill;
  kill.at_ms = 4000;
  kill.kind = "kill -9 GPU worker";
  std::vector<FaultEvent> faults = {armed(1000, 7, 2), armed(2000, 7, 3), armed(3000, 7, 3), kill, armed(5000, 9, 0)};
  const std::vector<Sample> samples = {
      sample(900, 7, 2), sample(1100, 7, 2), sample(1500, 7, 3),  // the first went off
      sample(2100, 7, 3), sample(2900, 7, 3),                     // the second did not, before the third was armed
      sample(3100, 7, 3), sample(3500, 0, -1, "backoff"),         // the third ended its worker
      sample(5100, 9, 0), sample(5200, 9, 5, "gateway down"),     // the last: nothing seen (a down gateway tells nothing)
      sample(9000, 9, 0)};
  MarkFired(faults, samples);
  EXPECT_EQ(faults[0].fired, std::optional<bool>(true));
  EXPECT_EQ(faults[1].fired, std::optional<bool>(false));
  EXPECT_EQ(faults[2].fired, std::optional<bool>(true));
  EXPECT_EQ(faults[3].fired, std::nullopt);  // a kill acts at once
  EXPECT_EQ(faults[4].fired, std::optional<bool>(false));

  // The verdict: faults that were armed and went off, counted; a scenario whose every fault was armed and none went off fails.
  ScenarioResult r = Healthy();
  r.faults = faults;
  Verdict v = Judge(r, {});
  EXPECT_EQ(v.faults_armed, 4);
  EXPECT_EQ(v.faults_fired, 2);
  EXPECT_TRUE(v.passed) << ::testing::PrintToString(v.failures);
  r.faults = {faults[1], faults[4]};
  v = Judge(r, {});
  EXPECT_FALSE(v.passed);
  ASSERT_EQ(v.failures.size(), 1u);
  EXPECT_NE(v.failures[0].find("none of its 2 armed faults went off"), std::string::npos) << v.failures[0];
  r.faults.push_back(kill);  // a kill took effect: the scenario tested something
  v = Judge(r, {});
  EXPECT_TRUE(v.passed) << ::testing::PrintToString(v.failures);
}

// The CPU path's RAM rule read only the gateway's own accounting: workers
// holding more than it counted passed.
TEST(VerdictTest, TheCpuPathsMeasuredRssIsHeldToItsBudget) {
  ScenarioResult r = Healthy();  // accounted 50 of a budget of 100
  r.samples.back().cpu_path_rss_bytes = 100;
  Verdict v = Judge(r, {});
  EXPECT_TRUE(v.passed) << ::testing::PrintToString(v.failures);
  r.samples.back().cpu_path_rss_bytes = 101;
  v = Judge(r, {});
  EXPECT_FALSE(v.passed);
  EXPECT_EQ(v.host_ram_measured_peak_bytes, 101u);
  ASSERT_EQ(v.failures.size(), 1u);
  EXPECT_NE(v.failures[0].find("the CPU path's workers held"), std::string::npos) << v.failures[0];
}

// A non-streamed request is acknowledged only by its answer: one the journal
// accepted and a gateway's crash then cut (no answer) is lost when it never
// ends; it was counted unknown, and its scenario passed.
TEST(VerdictTest, AJournaledRequestCutBeforeItsAnswerIsLostIfItNeverEnds) {
  ScenarioResult r = Healthy();
  auto cut = Ok("cut");
  cut.acknowledged = false;
  cut.http_status = 0;
  cut.connection_survived = false;
  cut.journal_state = "queued";
  auto ended = cut;
  ended.id = "ended";
  ended.journal_state = "completed";  // re-run after the restart: its result waits in the journal
  r.requests = {cut, ended, Ok("fine")};
  r.faults = {KillGateway(50)};
  const Verdict v = Judge(r, {});
  EXPECT_EQ(v.lost, 1);
  EXPECT_EQ(v.unknown, 0);
  EXPECT_FALSE(v.passed);
  ASSERT_FALSE(v.failures.empty());
  EXPECT_NE(v.failures[0].find("lost: cut was journaled"), std::string::npos) << v.failures[0];
}

// An answer the harness could not read (a 200 of another shape) fails its
// scenario: it was swallowed as a controlled failure.
// Endings that passed whatever had happened: a journal's "cancelled" its
// client never asked for (it gave up at 120 s, a request stuck in a line),
// a journal's "completed" its client did not get whole over a connection
// that survived, a resumable end without a tool call or a gateway restart
// behind it (a continuation that never works), an outcome nobody could
// read, and a scenario that served nothing.
TEST(VerdictTest, EndingsTheClientDidNotSeeOrAskForFail) {
  auto judged = [](RequestRecord q, bool killed = false) {
    ScenarioResult r = Healthy();
    r.requests = {q, Ok("fine")};
    if (killed) r.faults = {KillGateway(50)};
    return Judge(r, {});
  };
  auto gave_up = Ok("gave-up");
  gave_up.journal_state = "cancelled";
  gave_up.http_status = 0;
  gave_up.first_error = "timed out";
  Verdict v = judged(gave_up);
  ASSERT_EQ(v.failures.size(), 1u);
  EXPECT_EQ(v.failures[0], "cancelled, though its client did not cancel it: gave-up (its client: timed out)");
  gave_up.cancelled_by_client = true;
  EXPECT_TRUE(judged(gave_up).passed) << "cancelled by its client: as asked";

  auto cut = Ok("cut");
  cut.stream = true;
  cut.first_error = "an error event";
  v = judged(cut);
  ASSERT_EQ(v.failures.size(), 1u);
  EXPECT_EQ(v.failures[0], "completed in the journal, but its client got an error event: cut");
  cut.connection_survived = false;  // the gateway killed: read by id, the journal's completion stands
  EXPECT_TRUE(judged(cut, true).passed) << ::testing::PrintToString(judged(cut, true).failures);
  // Cut with the gateway up (a client's timeout, a reset): not delivered.
  // It passed, whatever cut it, for the kill's sake.
  v = judged(cut);
  ASSERT_EQ(v.failures.size(), 1u);
  EXPECT_EQ(v.failures[0], "completed in the journal, but its client got an error event: cut");

  auto resumable = Ok("resumable");
  resumable.stream = true;
  resumable.journal_state = "failed_resumable";
  resumable.journal_error = "the continuation was refused";
  EXPECT_FALSE(judged(resumable).passed);
  resumable.journal_error = "the gateway restarted while the stream was open; resubmit to continue";
  EXPECT_TRUE(judged(resumable).passed) << ::testing::PrintToString(judged(resumable).failures);
  resumable.stream = false;
  EXPECT_FALSE(judged(resumable).passed) << "a non-streamed request has no checkpoint to resume from";

  auto unknown = Ok("unknown");
  unknown.acknowledged = false;
  unknown.journal_state.clear();
  unknown.http_status = 0;
  unknown.journal_unanswered = true;
  v = judged(unknown);
  ASSERT_EQ(v.failures.size(), 1u);
  EXPECT_EQ(v.failures[0], "outcome unknown: the gateway did not answer GET /v1/requests/unknown");
  unknown.journal_unanswered = false;  // 404: never accepted (sent into the gateway's kill)
  EXPECT_TRUE(judged(unknown, true).passed);

  ScenarioResult none = Healthy();
  auto refused = Ok("refused");
  refused.journal_state = "failed";
  refused.attempts = 0;
  refused.http_status = 503;
  none.requests = {refused};
  v = Judge(none, {});
  ASSERT_EQ(v.failures.size(), 1u);
  EXPECT_EQ(v.failures[0], "none of its 1 chat requests succeeded");

  // Equivalence compared on nothing (every reference refused) proved nothing.
  ScenarioResult unchecked = Healthy();
  auto seeded = Ok("seeded");
  seeded.deterministic = true;
  unchecked.requests = {seeded};
  v = Judge(unchecked, {});
  ASSERT_EQ(v.failures.size(), 1u);
  EXPECT_EQ(v.failures[0], "none of its 1 deterministic answers could be compared: no reference answer was given");
  unchecked.requests[0].equivalent = true;
  EXPECT_TRUE(Judge(unchecked, {}).passed);
  // A comparison whose reference could not be had is said, not skipped.
  unchecked.requests.push_back(seeded);
  unchecked.requests[1].id = "unreferenced";
  unchecked.requests[1].reference_error = "HTTP 503: busy";
  v = Judge(unchecked, {});
  ASSERT_EQ(v.failures.size(), 1u);
  EXPECT_EQ(v.failures[0], "not compared: unreferenced's reference answer could not be had (HTTP 503: busy)");
}

TEST(VerdictTest, AnUnreadableAnswerFails) {
  ScenarioResult r = Healthy();
  auto q = Ok("odd");
  q.unreadable = true;
  q.first_error = "harness: [json.exception.type_error.302] type must be string, but is null";
  r.requests = {q, Ok("fine")};
  const Verdict v = Judge(r, {});
  EXPECT_FALSE(v.passed);
  ASSERT_FALSE(v.failures.empty());
  EXPECT_NE(v.failures[0].find("unreadable answer"), std::string::npos) << v.failures[0];
}

// A failover that ended requests with their 5xx instead of moving them
// passed: a failure the journal recorded counted as "controlled" whatever
// had happened. One that failed once an attempt of it ran now fails the
// scenario (a 400 from the placement admission chose, too: the harness sends
// only requests some placement can serve); a refusal before any attempt and
// a stream ended resumable (its checkpoint past a delivered tool call) do
// not.
TEST(VerdictTest, ARequestThatFailedOnceItRanFailsARefusalDoesNot) {
  ScenarioResult r = Healthy();
  auto given_up = Ok("given-up");
  given_up.journal_state = "failed";
  given_up.http_status = 503;
  given_up.first_error = "alloc failure 1 of 3";
  given_up.attempt_placements = {"sim:0/99"};
  auto refused = given_up;
  refused.id = "refused";
  refused.attempts = 0;
  refused.attempt_placements.clear();
  auto too_long = refused;
  too_long.id = "too-long";
  too_long.http_status = 400;  // refused at intake: longer than any placement's context
  auto resumable = given_up;
  resumable.id = "tool-call";
  resumable.journal_state = "failed_resumable";
  resumable.stream = true;
  resumable.tool_executions = 1;  // its client ran the tool call it was given
  r.requests = {refused, too_long, resumable, Ok("fine")};
  Verdict v = Judge(r, {});
  EXPECT_TRUE(v.passed) << ::testing::PrintToString(v.failures);
  EXPECT_EQ(v.failed_controlled, 3);
  EXPECT_EQ(v.failed_after_start, 0);
  r.requests.push_back(given_up);
  v = Judge(r, {});
  EXPECT_FALSE(v.passed);
  EXPECT_EQ(v.failed_after_start, 1);
  ASSERT_EQ(v.failures.size(), 1u);
  EXPECT_EQ(v.failures[0], "failed after it started: given-up (1 attempt on sim:0/99; HTTP 503: alloc failure 1 of 3)");
  auto misrouted = given_up;  // sent where it could not fit
  misrouted.id = "misrouted";
  misrouted.http_status = 400;
  r.requests.back() = misrouted;
  EXPECT_EQ(Judge(r, {}).failed_after_start, 1);
  VerdictOptions no_journal;  // a baseline without one: what the client saw only
  no_journal.journal = false;
  EXPECT_EQ(Judge(r, no_journal).failed_after_start, 0);
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
  // An armed fault that never went off recovered from nothing: not a 0 ms recovery.
  FaultEvent unfired{12000, "compute-error", 12000};
  unfired.fired = false;
  r.faults.push_back(unfired);
  unfired.at_ms = unfired.recovered_ms = 13000;
  r.faults.push_back(unfired);
  EXPECT_DOUBLE_EQ(Judge(r, {}).recovery_median_ms, 400);  // (of {0, 0, 400, 800}: 0)
}

// Services competing: ten chat requests alone (100 ms each, from 0 ms), ten
// while batch traffic runs (from 5000 ms, `pressure_latency_ms(i)` each), and
// one eviction of the batch service, followed by its unload.
ScenarioResult Competing(const std::function<int64_t(int)>& pressure_latency_ms) {
  ScenarioResult r = Healthy();
  for (int i = 0; i < 10; ++i) {
    auto q = Ok("alone" + std::to_string(i));
    q.sent_ms = 100 * i;
    r.requests.push_back(q);
    auto p = Ok("pressure" + std::to_string(i));
    p.sent_ms = 5000 + 100 * i;
    p.latency_ms = pressure_latency_ms(i);
    r.requests.push_back(p);
  }
  r.events = {{5200, "evict", "embed", "embed.0", "gives its room to search", "search"},
              {5300, "unload", "embed", "embed.0", "evicted", ""}};
  return r;
}

TEST(VerdictTest, CompetingServicesComparesInteractiveP95AloneAndUnderPressureAndChecksEvictions) {
  ScenarioResult r = Competing([](int) { return 120; });  // 1.2x
  auto batch = Ok("batch", "cpu");
  batch.service = "embed";
  batch.sent_ms = 5900;
  batch.degraded_signal = true;
  r.requests.push_back(batch);
  VerdictOptions o;
  o.pressure_ms = {{4000, 5950}};  // lasts until the batch request sent in it is answered (6000 + its latency)
  o.pinned_service = "chat";
  Verdict v = Judge(r, o);
  EXPECT_TRUE(v.passed) << ::testing::PrintToString(v.failures);
  EXPECT_DOUBLE_EQ(v.interactive_p95_alone_ms, 100);
  EXPECT_DOUBLE_EQ(v.interactive_p95_pressure_ms, 120);
  EXPECT_EQ(v.interactive_alone, 10);
  EXPECT_EQ(v.evictions, 1);
  EXPECT_EQ(v.evictions_completed, 1);

  // Slower under pressure than 1.25x, a batch request moved to the CPU
  // silently, an eviction never followed by its unload, the pinned service evicted.
  ScenarioResult bad = r;
  for (auto& q : bad.requests) {
    if (q.id.rfind("pressure", 0) == 0) q.latency_ms = 130;
    if (q.id == "batch") q.degraded_signal = false;
  }
  bad.events = {{5200, "evict", "embed", "embed.0", "gives its room to search", "search"},
                {5400, "evict", "chat", "chat.0", "gives its room to search", "search"},
                {5500, "unload", "chat", "chat.0", "evicted", ""}};
  v = Judge(bad, o);
  EXPECT_FALSE(v.passed);
  const std::string all = ::testing::PrintToString(v.failures);
  EXPECT_NE(all.find("1.30x"), std::string::npos) << all;
  EXPECT_NE(all.find("degraded without a signal: batch"), std::string::npos) << all;
  EXPECT_NE(all.find("evicted without an unload after it: embed.0"), std::string::npos) << all;
  EXPECT_NE(all.find("the pinned service chat was evicted"), std::string::npos) << all;
  // No eviction at all, or only before the batch traffic began: the scenario proved nothing.
  ScenarioResult none = r;
  none.events.clear();
  v = Judge(none, o);
  EXPECT_NE(::testing::PrintToString(v.failures).find("no service was evicted under batch pressure"), std::string::npos);
  ScenarioResult early = r;
  for (auto& e : early.events) e.at_ms -= 2000;
  v = Judge(early, o);
  EXPECT_NE(::testing::PrintToString(v.failures).find("no service was evicted under batch pressure"), std::string::npos);
  // A request sent while the traffic was alone but still running when a slice began counts as under pressure;
  // one sent after every slice (and its last batch answer) ended counts as alone again.
  ScenarioResult straddle = r;
  auto late = Ok("straddles");
  late.sent_ms = 3950;
  late.latency_ms = 200;  // slower than 1.25x the alone p95: must land on the pressure side and fail the run
  straddle.requests.push_back(late);
  auto after = Ok("after");
  after.sent_ms = 6500;
  straddle.requests.push_back(after);
  v = Judge(straddle, o);
  EXPECT_EQ(v.interactive_alone, 11);
  EXPECT_EQ(v.interactive_pressure, 11);
  EXPECT_DOUBLE_EQ(v.interactive_p95_pressure_ms, 200);  // it is the slowest under pressure
  EXPECT_NE(::testing::PrintToString(v.failures).find("2.00x"), std::string::npos) << ::testing::PrintToString(v.failures);
}

// One slow request among dozens moves a p95 by a third between identical
// runs; the verdict fails on a shift of the whole distribution, not on that.
TEST(VerdictTest, CompetingServicesFailOnAShiftedDistributionNotOnOneSlowRequest) {
  std::mt19937_64 noise(7);
  std::uniform_real_distribution<double> spread(60, 160);  // chat on this machine: 60-160 ms
  std::vector<double> alone, pressure;
  for (int i = 0; i < 65; ++i) alone.push_back(spread(noise));
  for (int i = 0; i < 70; ++i) pressure.push_back(spread(noise));
  const double p95_alone = Percentile(alone, 95);
  std::vector<double> outliers = pressure;  // four requests caught behind a model load
  outliers[3] = outliers[40] = 2 * p95_alone;
  outliers[60] = 1.6 * p95_alone;
  outliers[66] = 1.5 * p95_alone;
  std::vector<double> shifted = pressure;  // everything under pressure 1.6x slower
  for (auto& x : shifted) x *= 1.6;
  std::mt19937_64 rng(1);
  const double loose = PercentileRatioLowerBound(outliers, alone, 95, 0.9, rng);
  EXPECT_GT(Percentile(outliers, 95) / p95_alone, 1.25) << "the point estimate alone would fail the run";
  EXPECT_LE(loose, 1.25);
  EXPECT_GT(PercentileRatioLowerBound(shifted, alone, 95, 0.9, rng), 1.25);
  // Repeatable for one seed, and equal to the ratio when nothing varies.
  std::mt19937_64 again(1);
  EXPECT_DOUBLE_EQ(PercentileRatioLowerBound(outliers, alone, 95, 0.9, again), loose);
  EXPECT_DOUBLE_EQ(PercentileRatioLowerBound({130, 130, 130}, {100, 100}, 95, 0.9, rng), 1.3);
  EXPECT_EQ(PercentileRatioLowerBound({}, {100}, 95, 0.9, rng), 0);
}

TEST(VerdictTest, CompetingServicesLeaveOutRequestsThatOverlappedAHostStall) {
  // The last one under pressure is caught in a stall of the whole machine.
  ScenarioResult r = Competing([](int i) { return i == 9 ? 2000 : 100; });
  VerdictOptions o;
  o.pressure_ms = {{4000, 6000}};
  EXPECT_FALSE(Judge(r, o).passed) << "without the stall on record it counts (10 a side: the point ratio)";
  r.stalls = {{6500, 7500}};
  const Verdict v = Judge(r, o);
  EXPECT_TRUE(v.passed) << ::testing::PrintToString(v.failures);
  EXPECT_EQ(v.interactive_in_stalls_pressure, 1);
  EXPECT_EQ(v.interactive_in_stalls, 0);
  EXPECT_EQ(v.interactive_pressure, 9);
  // More than one in ten of a side in stalls: the comparison proves nothing, and says so.
  r.stalls = {{0, 250}};  // alone0..alone2 overlap it
  const Verdict busy = Judge(r, o);
  EXPECT_EQ(busy.interactive_in_stalls, 3);
  EXPECT_FALSE(busy.passed);
  EXPECT_NE(::testing::PrintToString(busy.failures).find("inconclusive: 3 of 10 chat requests alone"), std::string::npos)
      << ::testing::PrintToString(busy.failures);
}

TEST(ScheduleTest, CompetingServicesAlternateAloneAndPressureSlices) {
  const Scenario& s = *FindScenario("competing_services");
  const std::vector<Window> w = PressureWindows(s, 20000);
  ASSERT_EQ(static_cast<int>(w.size()), s.batch_phases);
  ASSERT_GE(w.size(), 2u) << "one slice each way would let drift in the host's load decide the comparison";
  const int64_t slice = 20000 * 85 / 100 / (2 * s.batch_phases);
  EXPECT_NEAR(w.front().from_ms, slice, 1) << "the traffic starts alone";
  for (size_t i = 0; i < w.size(); ++i) {
    EXPECT_NEAR(w[i].to_ms - w[i].from_ms, slice, 1);
    if (i > 0) {
      EXPECT_NEAR(w[i].from_ms - w[i - 1].to_ms, slice, 1) << "an alone slice between two pressure slices";
    }
  }
  EXPECT_NEAR(w.back().to_ms, 17000, 1);
  EXPECT_TRUE(PressureWindows(*FindScenario("short_prompts"), 20000).empty());
}

}  // namespace
}  // namespace spillway::chaos
