#include "journal/journal.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "journal_fixture.h"

namespace spillway::journal {
namespace {

class JournalTest : public JournalFixture {};

TEST_F(JournalTest, LifecycleIsRecordedWithAttempts) {
  auto a = j_->Accept(Rec("r1"));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->outcome, AcceptOutcome::kNew);
  EXPECT_EQ(j_->Get("r1")->state, State::kQueued);
  ASSERT_TRUE(j_->StartAttempt("r1", "cpu").ok());
  ASSERT_TRUE(j_->Requeue("r1", "worker died").ok());
  ASSERT_TRUE(j_->StartAttempt("r1", "cpu").ok());
  clock_.Advance(1500);
  ASSERT_TRUE(j_->Finish("r1", State::kCompleted, 200, "application/json", R"({"ok":true})").ok());
  auto r = j_->Get("r1");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->state, State::kCompleted);
  EXPECT_EQ(r->attempts, 2);
  EXPECT_EQ(r->placement, "cpu");
  EXPECT_EQ(r->result_body, R"({"ok":true})");
  EXPECT_EQ(r->updated_ms - r->created_ms, 1500);
  // Exactly one terminal state: a second Finish is refused and changes nothing.
  EXPECT_EQ(j_->Finish("r1", State::kCancelled, 499, "", "").code(), StatusCode::kConflict);
  EXPECT_EQ(j_->Get("r1")->state, State::kCompleted);
  EXPECT_FALSE(j_->StartAttempt("r1", "cpu").ok());
  EXPECT_EQ(j_->Get("nope").status().code(), StatusCode::kNotFound);
}

// An attempt whose requeue could not be recorded (a lagging disk) was left
// open beside the next one: a crash then interrupted both, and the poison rule
// counted two restarts for one. The next attempt ends it.
TEST_F(JournalTest, AnAttemptLeftOpenEndsWhenTheNextOneStarts) {
  ASSERT_TRUE(j_->Accept(Rec("r-open")).ok());
  ASSERT_TRUE(j_->StartAttempt("r-open", "sim:0/99").ok());
  ASSERT_TRUE(j_->StartAttempt("r-open", "cpu").ok());  // (no Requeue between: it was not recorded)
  auto attempts = j_->Attempts("r-open");
  ASSERT_TRUE(attempts.ok());
  ASSERT_EQ(attempts->size(), 2u);
  EXPECT_EQ((*attempts)[0].outcome, "failed");
  EXPECT_NE((*attempts)[0].ended_ms, 0);
  EXPECT_EQ((*attempts)[1].outcome, "running");
  Reopen();  // a crash
  ASSERT_TRUE(j_->Recover().ok());
  attempts = j_->Attempts("r-open");
  ASSERT_TRUE(attempts.ok());
  EXPECT_EQ(std::count_if(attempts->begin(), attempts->end(), [](const auto& a) { return a.outcome == "interrupted"; }), 1)
      << "one crash counted as two";
}

// A request running at every restart may be what stops the gateway: after
// kMaxInterruptedRuns it is failed, not run again at each start for good.
TEST_F(JournalTest, ARequestCutByEveryRestartIsNotRunForever) {
  ASSERT_TRUE(j_->Accept(Rec("poison")).ok());
  ASSERT_TRUE(j_->Accept(Rec("waiting")).ok());
  for (int run = 1; run <= Journal::kMaxInterruptedRuns; ++run) {
    ASSERT_TRUE(j_->StartAttempt("poison", "cpu").ok());
    Reopen();  // the gateway stopped while it ran
    auto rec = j_->Recover();
    ASSERT_TRUE(rec.ok()) << rec.status().ToString();
    const bool again = std::any_of(rec->begin(), rec->end(), [](const auto& r) { return r.id == "poison"; });
    EXPECT_EQ(again, run < Journal::kMaxInterruptedRuns) << "run " << run;
    EXPECT_EQ(rec->back().id, "waiting") << "a request that never ran is run again, however often";
  }
  const auto r = j_->Get("poison");
  EXPECT_EQ(r->state, State::kFailed);
  EXPECT_EQ(r->result_status, 503);
  const auto body = nlohmann::json::parse(r->result_body, nullptr, false);
  EXPECT_NE(body["error"]["message"].get<std::string>().find("3 times the gateway crashed"), std::string::npos)
      << r->result_body;
  // Clean stops (SIGTERM) are not crashes: however many, it is run again.
  ASSERT_TRUE(j_->Accept(Rec("restarted")).ok());
  for (int run = 1; run <= Journal::kMaxInterruptedRuns + 1; ++run) {
    ASSERT_TRUE(j_->StartAttempt("restarted", "cpu").ok());
    ASSERT_TRUE(j_->AttemptsStopped().ok());
    Reopen();
    auto rec = j_->Recover();
    ASSERT_TRUE(rec.ok());
    EXPECT_TRUE(std::any_of(rec->begin(), rec->end(), [](const auto& r) { return r.id == "restarted"; })) << "stop " << run;
  }
}

TEST_F(JournalTest, IdempotencyKeysReplayConflictOrMismatch) {
  ASSERT_EQ(j_->Accept(Rec("a", "k1", "h1"))->outcome, AcceptOutcome::kNew);
  auto again = j_->Accept(Rec("b", "k1", "h1"));
  EXPECT_EQ(again->outcome, AcceptOutcome::kInFlight);
  EXPECT_EQ(again->existing.id, "a");
  EXPECT_EQ(j_->Accept(Rec("c", "k1", "h2"))->outcome, AcceptOutcome::kMismatch);
  ASSERT_TRUE(j_->Finish("a", State::kCompleted, 200, "application/json", "body").ok());
  auto replay = j_->Accept(Rec("d", "k1", "h1"));
  EXPECT_EQ(replay->outcome, AcceptOutcome::kReplay);
  EXPECT_EQ(replay->existing.result_body, "body");
  // Keys are scoped per client.
  auto other = Rec("e", "k1", "h1");
  other.client = "key:other";
  EXPECT_EQ(j_->Accept(other)->outcome, AcceptOutcome::kNew);
  // The same request id twice is a conflict.
  EXPECT_EQ(j_->Accept(Rec("a")).status().code(), StatusCode::kConflict);
}

// A key binds a result only once its request ran: one cancelled while it
// waited (its client timed out) or refused before any attempt leaves the key
// free for the retry (it replayed the 499 or the 503 for a day).
TEST_F(JournalTest, AKeyIsBoundOnlyOnceItsRequestRan) {
  ASSERT_TRUE(j_->Accept(Rec("waited", "k-wait", "h")).ok());
  ASSERT_TRUE(j_->Finish("waited", State::kCancelled, 499, "application/json", "{}").ok());
  EXPECT_EQ(j_->Accept(Rec("retry", "k-wait", "h"))->outcome, AcceptOutcome::kNew);
  ASSERT_TRUE(j_->Accept(Rec("refused", "k-ref", "h")).ok());
  ASSERT_TRUE(j_->Finish("refused", State::kFailed, 503, "application/json", "{}").ok());
  EXPECT_EQ(j_->Accept(Rec("retry2", "k-ref", "h"))->outcome, AcceptOutcome::kNew);
  // Once an attempt ran, its end is what the key replays, a failure too.
  ASSERT_TRUE(j_->Accept(Rec("ran", "k-ran", "h")).ok());
  ASSERT_TRUE(j_->StartAttempt("ran", "cpu").ok());
  ASSERT_TRUE(j_->Finish("ran", State::kFailed, 502, "application/json", "{}").ok());
  EXPECT_EQ(j_->Accept(Rec("retry3", "k-ran", "h"))->outcome, AcceptOutcome::kReplay);
  EXPECT_EQ(j_->Get("waited")->state, State::kCancelled) << "the row itself stays, for GET";
  // A worker that refused it as invalid (400, 413: its schema, its
  // logit_bias, a prompt past the context) did not run it: the corrected
  // request may take the key (it heard "used with a different body" for a
  // day). A 422 is the engine's sampling failing as it generated: it ran.
  for (int status : {400, 413}) {
    const std::string id = "invalid-" + std::to_string(status), key = "k-" + id;
    ASSERT_TRUE(j_->Accept(Rec(id, key, "h")).ok());
    ASSERT_TRUE(j_->StartAttempt(id, "cpu").ok());
    ASSERT_TRUE(j_->Finish(id, State::kFailed, status, "application/json", "{}").ok());
    EXPECT_EQ(j_->Accept(Rec("fixed-" + id, key, "other body"))->outcome, AcceptOutcome::kNew) << status;
  }
  ASSERT_TRUE(j_->Accept(Rec("sampled", "k-sampled", "h")).ok());
  ASSERT_TRUE(j_->StartAttempt("sampled", "cpu").ok());
  ASSERT_TRUE(j_->Finish("sampled", State::kFailed, 422, "application/json", "{}").ok());
  EXPECT_EQ(j_->Accept(Rec("retry4", "k-sampled", "h"))->outcome, AcceptOutcome::kReplay);
}

// A request recovered after a crash, and a start that stopped before it ran
// again (its port taken, a start-up check failed): the next start still
// knows it may have reached its server. It came back as only queued, and a
// non-idempotent external server was sent it again.
TEST_F(JournalTest, RecoverRemembersAnInterruptedAttemptAcrossStarts) {
  ASSERT_TRUE(j_->Accept(Rec("sent")).ok());
  ASSERT_TRUE(j_->StartAttempt("sent", "cpu").ok());
  ASSERT_TRUE(j_->Accept(Rec("waiting")).ok());
  for (int start = 1; start <= 2; ++start) {
    Reopen();  // as after a crash, then a start that gave up
    auto rec = j_->Recover();
    ASSERT_TRUE(rec.ok());
    ASSERT_EQ(rec->size(), 2u);
    for (const auto& r : *rec) EXPECT_EQ(r.interrupted, r.id == "sent") << r.id << ", start " << start;
  }
}

TEST_F(JournalTest, RecoverRequeuesSafeRequestsAndFailsOpenStreams) {
  ASSERT_TRUE(j_->Accept(Rec("queued")).ok());
  ASSERT_TRUE(j_->Accept(Rec("running")).ok());
  ASSERT_TRUE(j_->StartAttempt("running", "cpu").ok());
  ASSERT_TRUE(j_->Accept(Rec("stream", "", "h", true)).ok());
  ASSERT_TRUE(j_->StartAttempt("stream", "cpu").ok());
  ASSERT_TRUE(j_->Accept(Rec("done")).ok());
  ASSERT_TRUE(j_->Finish("done", State::kCompleted, 200, "application/json", "x").ok());
  Reopen();  // as after a crash
  auto rec = j_->Recover();
  ASSERT_TRUE(rec.ok());
  ASSERT_EQ(rec->size(), 2u);
  for (const auto& r : *rec) {  // each returned queued, saying whether it ran when the gateway stopped
    EXPECT_EQ(r.state, State::kQueued) << r.id;
    EXPECT_EQ(r.interrupted, r.id == "running") << r.id;
  }
  EXPECT_EQ(j_->Get("queued")->state, State::kQueued);
  EXPECT_EQ(j_->Get("running")->state, State::kQueued);
  EXPECT_EQ(j_->Get("stream")->state, State::kFailedResumable);
  // Its answer says why (it was an empty 503 body, for GET and a key's replay).
  const auto body = nlohmann::json::parse(j_->Get("stream")->result_body, nullptr, false);
  EXPECT_EQ(body["error"]["code"], "gateway_restarted") << j_->Get("stream")->result_body;
  EXPECT_EQ(body["error"]["request_id"], "stream");
  EXPECT_EQ(j_->Get("done")->state, State::kCompleted);
  // Re-queued requests run again and end.
  for (const auto& r : *rec) {
    ASSERT_TRUE(j_->StartAttempt(r.id, "cpu").ok());
    ASSERT_TRUE(j_->Finish(r.id, State::kCompleted, 200, "application/json", "y").ok());
  }
  EXPECT_EQ(j_->Get("running")->attempts, 2);
  EXPECT_EQ(j_->CountByState(State::kQueued) + j_->CountByState(State::kRunning), 0);
}

TEST_F(JournalTest, PruneDropsExpiredKeysThenOldRows) {
  JournalOptions o;
  o.idempotency_ms = 1000;
  o.retention_ms = 5000;
  Reopen(o);
  ASSERT_TRUE(j_->Accept(Rec("a", "k")).ok());
  ASSERT_TRUE(j_->Finish("a", State::kCompleted, 200, "application/json", "x").ok());
  ASSERT_TRUE(j_->Accept(Rec("live")).ok());  // non-terminal rows are never pruned
  clock_.Advance(2000);
  EXPECT_EQ(*j_->Prune(), 0);
  EXPECT_EQ(j_->Accept(Rec("b", "k"))->outcome, AcceptOutcome::kNew);  // the key expired
  clock_.Advance(4000);
  EXPECT_EQ(*j_->Prune(), 1);
  EXPECT_FALSE(j_->Get("a").ok());
  EXPECT_TRUE(j_->Get("live").ok());
}

// A key lives idempotency_ms after its request ended, not after it began: a
// request that ran (or waited through an outage) longer than that lost its
// key as it ended, and a retry with the key ran it again.
TEST_F(JournalTest, AKeyLivesItsTimeAfterItsRequestEnded) {
  JournalOptions o;
  o.idempotency_ms = 1000;
  o.retention_ms = 50000;
  Reopen(o);
  ASSERT_TRUE(j_->Accept(Rec("slow", "k2")).ok());
  clock_.Advance(5000);  // it ran long
  ASSERT_TRUE(j_->Finish("slow", State::kCompleted, 200, "application/json", "x").ok());
  EXPECT_EQ(*j_->Prune(), 0);
  EXPECT_EQ(j_->Accept(Rec("retry", "k2"))->outcome, AcceptOutcome::kReplay) << "the key was dropped as it ended";
  clock_.Advance(1500);
  EXPECT_EQ(*j_->Prune(), 0);
  EXPECT_EQ(j_->Accept(Rec("later", "k2"))->outcome, AcceptOutcome::kNew);
}

// A row is kept while its key lives, past its retention: counted from its
// creation, a long request's row (and its key) went with the first prune
// after it ended, and a retry ran it again.
TEST_F(JournalTest, ARowWithALiveKeyOutlivesItsRetention) {
  JournalOptions o;
  o.idempotency_ms = 1000;
  o.retention_ms = 1000;  // (retention_hours = idempotency_hours passes validation)
  Reopen(o);
  ASSERT_TRUE(j_->Accept(Rec("long", "k3")).ok());
  clock_.Advance(5000);  // it ran long
  ASSERT_TRUE(j_->Finish("long", State::kCompleted, 200, "application/json", "x").ok());
  clock_.Advance(500);
  EXPECT_EQ(*j_->Prune(), 0);
  EXPECT_EQ(j_->Accept(Rec("retry", "k3"))->outcome, AcceptOutcome::kReplay);
  clock_.Advance(600);  // its key expired: the row goes with it
  EXPECT_EQ(*j_->Prune(), 1);
  EXPECT_FALSE(j_->Get("long").ok());
}

TEST_F(JournalTest, DurabilitySettingIsApplied) {
  EXPECT_EQ(j_->synchronous_mode(), "full");
  JournalOptions o;
  o.synchronous_full = false;
  Reopen(o);
  EXPECT_EQ(j_->synchronous_mode(), "normal");
}

TEST_F(JournalTest, UnwritableLocationIsAnError) {
  EXPECT_FALSE(Journal::Open("/proc/spillway/journal.db", {}, clock_).ok());
}

}  // namespace
}  // namespace spillway::journal
