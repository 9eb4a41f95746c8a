// A journal that cannot write (disk full, I/O error, failed fsync) refuses new
// requests with the reason, keeps what it acknowledged, and recovers.
#include <gtest/gtest.h>

#include <future>
#include <string>

#include "gateway/gateway_internal.h"
#include "journal/journal.h"
#include "journal_fixture.h"

namespace spillway::journal {
namespace {

class JournalHealthTest : public FaultyJournalFixture {
 protected:
  const int64_t retry_ms_ = JournalOptions{}.unwritable_retry_ms;
};

bool Says(const Status& st, const std::string& what) { return st.message().find(what) != std::string::npos; }

TEST_F(JournalHealthTest, DiskFullRefusesNewRequestsKeepsTheAcknowledgedAndRecovers) {
  ASSERT_TRUE(j_->Accept(Rec("done")).ok());
  ASSERT_TRUE(j_->StartAttempt("done", "cpu").ok());
  ASSERT_TRUE(j_->Finish("done", State::kCompleted, 200, "application/json", "answer").ok());
  ASSERT_TRUE(j_->Accept(Rec("waiting", "key")).ok());
  EXPECT_TRUE(j_->Health().ok());

  faults_->SetDiskFull(true);
  auto first = j_->Accept(Rec("x"));
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Says(first.status(), "the request journal cannot write: disk full (")) << first.status().ToString();
  EXPECT_GT(first.status().retry_after_s(), 0);
  // From now on refused at once, without a write.
  const int64_t writes = j_->stats().writes;
  auto second = j_->Accept(Rec("y"));
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(second.status().message(), first.status().message());
  EXPECT_GT(second.status().retry_after_s(), 0);
  EXPECT_EQ(j_->stats().writes, writes);
  const Status health = j_->Health();
  EXPECT_EQ(health.code(), StatusCode::kUnavailable);
  EXPECT_EQ(health.message(), first.status().message());

  // What the gateway answers the client.
  const auto res = gateway::internal::ErrorResponse(second.status(), 11);
  EXPECT_EQ(res.result_int(), 503u);
  EXPECT_EQ(res[boost::beast::http::field::retry_after], std::to_string(second.status().retry_after_s()));
  EXPECT_NE(res.body().find("cannot write: disk full"), std::string::npos) << res.body();

  // An accepted request's state change still tries the disk, and says it failed.
  EXPECT_EQ(j_->Finish("waiting", State::kCompleted, 200, "application/json", "lost").code(), StatusCode::kUnavailable);
  EXPECT_EQ(j_->Get("waiting")->state, State::kQueued);

  faults_->SetDiskFull(false);
  EXPECT_EQ(j_->Accept(Rec("z")).status().code(), StatusCode::kUnavailable);  // not before the retry time
  clock_.Advance(retry_ms_);
  auto z = j_->Accept(Rec("z"));
  ASSERT_TRUE(z.ok()) << z.status().ToString();
  EXPECT_TRUE(j_->Health().ok());
  EXPECT_TRUE(j_->Accept(Rec("after")).ok());

  // The file as another process finds it: everything acknowledged as it was,
  // nothing that was refused.
  Reopen();
  EXPECT_EQ(j_->Get("done")->state, State::kCompleted);
  EXPECT_EQ(j_->Get("done")->result_body, "answer");
  EXPECT_EQ(j_->Attempts("done")->size(), 1u);
  EXPECT_EQ(j_->Get("waiting")->state, State::kQueued);
  EXPECT_EQ(Outcome(j_->Accept(Rec("again", "key"))), "in_flight");
  EXPECT_FALSE(j_->Get("x").ok());
  EXPECT_FALSE(j_->Get("y").ok());
  EXPECT_TRUE(j_->Get("z").ok());
  EXPECT_TRUE(j_->Get("after").ok());
  EXPECT_EQ(j_->CountByState(State::kQueued), 3);
}

TEST_F(JournalHealthTest, AProbeFindsRoomAgainWithoutRequests) {
  faults_->SetDiskFull(true);
  ASSERT_FALSE(j_->Accept(Rec("x")).ok());
  clock_.Advance(retry_ms_);
  EXPECT_TRUE(Says(j_->Health(), "disk full"));  // probed: still full
  faults_->SetDiskFull(false);
  EXPECT_FALSE(j_->Health().ok());  // the next probe is not due yet
  clock_.Advance(retry_ms_);
  EXPECT_TRUE(j_->Health().ok());
  EXPECT_TRUE(j_->Accept(Rec("y")).ok());
}

TEST_F(JournalHealthTest, AFailedWriteOrFsyncIsTheReason) {
  faults_->FailWrites(1);
  auto a = j_->Accept(Rec("a"));
  EXPECT_EQ(a.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Says(a.status(), "cannot write: I/O error (")) << a.status().ToString();
  clock_.Advance(retry_ms_);
  ASSERT_TRUE(j_->Accept(Rec("b")).ok());

  faults_->FailSyncs(1);
  auto c = j_->Accept(Rec("c"));
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Says(c.status(), "cannot write: fsync failed (")) << c.status().ToString();
  EXPECT_TRUE(Says(j_->Health(), "fsync failed"));
  clock_.Advance(retry_ms_);
  ASSERT_TRUE(j_->Accept(Rec("d")).ok());
  EXPECT_TRUE(j_->Health().ok());
  Reopen();
  EXPECT_FALSE(j_->Get("a").ok());
  EXPECT_TRUE(j_->Get("b").ok());
  EXPECT_TRUE(j_->Get("d").ok());
}

// A commit log that could not cut off a failed record takes no more records
// until a restart: the journal stays unhealthy and refuses new requests with
// that reason. Its probe (a SQLite row) succeeded, so /readyz said ready
// and every request let in failed at its first record.
TEST_F(JournalHealthTest, ACommitLogThatTakesNoMoreRecordsKeepsTheJournalUnhealthy) {
  auto logged = [&](const std::string& id) {
    std::promise<Status> p;
    auto f = p.get_future();
    j_->AcceptAndStartAsync(Rec(id), "cpu", "", [&p](Status st) { p.set_value(std::move(st)); });
    return f.get();
  };
  ASSERT_TRUE(logged("before").ok());
  faults_->FailSyncs(2);  // the record's sync, then its cut's
  EXPECT_EQ(logged("failed").code(), StatusCode::kUnavailable);
  clock_.Advance(retry_ms_);
  const Status health = j_->Health();
  EXPECT_EQ(health.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Says(health, "restart spillway")) << health.ToString();
  clock_.Advance(retry_ms_);
  const Status refused = logged("after");
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Says(refused, "restart spillway")) << refused.ToString();
  EXPECT_TRUE(Says(j_->Health(), "restart spillway"));
}

TEST_F(JournalHealthTest, AFailedBatchFailsEachOfItsCallers) {
  CallHeldAtSync([&] { EXPECT_TRUE(j_->Accept(Rec("lead")).ok()); });
  for (const char* id : {"a", "b", "c"}) {
    Call([&, id] { EXPECT_TRUE(Says(j_->Accept(Rec(id)).status(), "cannot write: disk full")); });
  }
  faults_->SetDiskFull(true);
  faults_->Unblock();
  JoinCallers();
  EXPECT_EQ(j_->stats().failed_commits, 1);
  faults_->SetDiskFull(false);
  Reopen();
  EXPECT_TRUE(j_->Get("lead").ok());
  for (const char* id : {"a", "b", "c"}) EXPECT_FALSE(j_->Get(id).ok()) << id;
}

}  // namespace
}  // namespace spillway::journal
