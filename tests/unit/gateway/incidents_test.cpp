// Incidents from status snapshots and from the journal's transitions.
#include <gtest/gtest.h>

#include <algorithm>

#include "gateway/incidents.h"

namespace spillway::gateway {
namespace {

using nlohmann::json;
using journal::State;
using journal::Transition;

json Status(const std::string& breaker, const std::string& worker, int restarts, const std::string& device_breaker,
            const json& degraded = nullptr) {
  return {{"services",
           {{{"name", "chat"},
             {"state", degraded.is_null() ? "ready" : "degraded"},
             {"serving", {{"summary", degraded.is_null() ? "served by its primary" : "served by cpu"}}},
             {"degraded", degraded},
             {"placements",
              {{{"key", "chat.0"}, {"placement", "sim:0/99"}, {"device", "sim:0"}, {"state", worker},
                {"restarts", restarts}, {"last_exit", "signal 9"}, {"last_error", "device lost"},
                {"breaker", {{"state", breaker}, {"ejections", breaker == "open" ? 1 : 0}, {"last_reason", "phase device"}}}}}}}}},
          {"devices", {{{"name", "sim:0"}, {"breaker", {{"state", device_breaker}, {"ejections", 0}, {"last_reason", "lost"}}}}}}};
}

Transition T(Transition::Kind kind, std::string id, std::string placement, int64_t attempt, State state,
             std::string error) {
  Transition t;
  t.kind = kind;
  t.id = std::move(id);
  t.placement = std::move(placement);
  t.attempt = attempt;
  t.state = state;
  t.error = std::move(error);
  return t;
}

std::vector<std::string> Kinds(const std::vector<Incident>& v) {
  std::vector<std::string> k;
  for (const auto& i : v) k.push_back(i.kind);
  return k;
}

TEST(DiffStatusTest, NothingFromTheFirstSnapshotOrAnUnchangedOne) {
  const json s = Status("closed", "ready", 0, "closed");
  EXPECT_TRUE(DiffStatus(nullptr, s, 1).empty());
  EXPECT_TRUE(DiffStatus(s, s, 1).empty());
}

TEST(DiffStatusTest, ATrippedBreakerALostDeviceAndADegradedServiceAreIncidentsWithTheirReasons) {
  const auto found = DiffStatus(Status("closed", "ready", 0, "closed"),
                                Status("open", "backoff", 0, "open", "the primary placement sim:0/99 is unavailable"), 42);
  EXPECT_EQ(Kinds(found), (std::vector<std::string>{"breaker", "worker", "device", "degraded"}));
  EXPECT_EQ(found[0].time_ms, 42);
  EXPECT_EQ(found[0].service, "chat");
  EXPECT_EQ(found[0].placement, "sim:0/99");
  EXPECT_NE(found[0].reason.find("phase device"), std::string::npos) << found[0].reason;
  EXPECT_NE(found[1].reason.find("signal 9: device lost"), std::string::npos) << found[1].reason;
  EXPECT_NE(found[2].reason.find("lost"), std::string::npos);
  EXPECT_NE(found[3].reason.find("unavailable"), std::string::npos);
  EXPECT_EQ(found[3].reason, "degraded: served by cpu (the primary placement sim:0/99 is unavailable)");
}

TEST(DiffStatusTest, AFirstLoadIsNoRecovery) {
  json loading = Status("closed", "starting", 0, "closed");
  loading["services"][0]["state"] = "loading";
  const auto found = DiffStatus(loading, Status("closed", "ready", 0, "closed"), 1);
  EXPECT_EQ(Kinds(found), (std::vector<std::string>{"loaded"}));
}

TEST(DiffStatusTest, RecoveryAndARestartBetweenTwoSnapshots) {
  auto found = DiffStatus(Status("open", "backoff", 0, "open", "x"), Status("closed", "ready", 1, "closed"), 1);
  EXPECT_EQ(Kinds(found), (std::vector<std::string>{"recovered", "restart", "recovered", "recovered"}));
  // An exit and a restart both between two snapshots: still told.
  found = DiffStatus(Status("closed", "ready", 0, "closed"), Status("closed", "ready", 1, "closed"), 1);
  EXPECT_EQ(Kinds(found), (std::vector<std::string>{"worker", "restart"}));
}

TEST(DiffStatusTest, AnIdleUnloadIsNotAFailure) {
  auto found = DiffStatus(Status("closed", "ready", 0, "closed"), Status("closed", "stopped", 0, "closed"), 1);
  EXPECT_EQ(Kinds(found), (std::vector<std::string>{"unloaded"}));
  // As the status shows an unloaded on-demand primary: "evicted" (it was an "unavailable" incident).
  json unloaded = Status("closed", "stopped", 0, "closed");
  unloaded["services"][0]["state"] = "evicted";
  found = DiffStatus(Status("closed", "ready", 0, "closed"), unloaded, 1);
  EXPECT_EQ(Kinds(found), (std::vector<std::string>{"unloaded"}));
  const auto loaded = Kinds(DiffStatus(unloaded, Status("closed", "ready", 0, "closed"), 2));
  EXPECT_EQ(std::count(loaded.begin(), loaded.end(), "recovered"), 0)
      << "loaded again: no recovery from an outage that was none";
}

TEST(RequestIncidentsTest, AnAttemptOnAnotherPlacementIsAFailoverWithTheRequeueReason) {
  RequestIncidents r;
  EXPECT_TRUE(r.Observe(T(Transition::Kind::kAttempt, "req_1", "sim:0/99", 1, State::kRunning, ""), 5).empty());
  EXPECT_TRUE(r.Observe(T(Transition::Kind::kRequeued, "req_1", "", 0, State::kQueued,
                         R"(phase device: {"error":{"code":"unavailable","message":"lost"}} (run again))"), 6).empty());
  const auto found = r.Observe(T(Transition::Kind::kAttempt, "req_1", "cpu", 2, State::kRunning, ""), 7);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].kind, "failover");
  EXPECT_EQ(found[0].request_id, "req_1");
  EXPECT_EQ(found[0].placement, "cpu");
  // The worker's error body is told by its message.
  EXPECT_EQ(found[0].reason, "moved from sim:0/99 to cpu (attempt 2): phase device: lost (run again)");
  // A busy worker retried on the same placement is no incident.
  EXPECT_TRUE(r.Observe(T(Transition::Kind::kAttempt, "req_1", "cpu", 3, State::kRunning, ""), 8).empty());
  EXPECT_TRUE(r.Observe(T(Transition::Kind::kFinished, "req_1", "", 0, State::kCompleted, ""), 9).empty());
}

TEST(RequestIncidentsTest, CancelledAndFailedEndsAreIncidents) {
  RequestIncidents r;
  auto c = r.Observe(T(Transition::Kind::kFinished, "req_2", "", 0, State::kCancelled, "cancelled while queued"), 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].kind, "cancelled");
  EXPECT_EQ(c[0].reason, "cancelled: cancelled while queued");
  r.Observe(T(Transition::Kind::kAttempt, "req_3", "cpu", 1, State::kRunning, ""), 1);
  auto f = r.Observe(T(Transition::Kind::kFinished, "req_3", "", 0, State::kFailedResumable, "the stream failed"), 2);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].kind, "failed");
  EXPECT_EQ(f[0].placement, "cpu");
  EXPECT_EQ(f[0].reason, "failed_resumable: the stream failed");
  // A client's own mistake (a prompt past the context, a worker's 400) is no incident; a 503 is.
  Transition mistake = T(Transition::Kind::kFinished, "req_4", "", 0, State::kFailed, "prompt past the context");
  mistake.status = 400;
  EXPECT_TRUE(r.Observe(mistake, 3).empty());
  Transition down = T(Transition::Kind::kFinished, "req_5", "", 0, State::kFailed, "no placement could be started");
  down.status = 503;
  EXPECT_EQ(r.Observe(down, 4).size(), 1u);
}

TEST(IncidentLogTest, KeepsTheNewestInOrderWithIncreasingNumbers) {
  IncidentLog log(3);
  for (int i = 0; i < 5; ++i) log.Add({0, i, "worker", "", "", "", "", "", std::to_string(i), ""});
  const auto recent = log.Recent(10);
  ASSERT_EQ(recent.size(), 3u);
  EXPECT_EQ(recent.front().reason, "2");
  EXPECT_EQ(recent.back().seq, 5u);
  EXPECT_EQ(log.Since(4).size(), 1u);
  EXPECT_EQ(log.last_seq(), 5u);
  EXPECT_EQ(log.Recent(1).back().reason, "4");
}

}  // namespace
}  // namespace spillway::gateway
