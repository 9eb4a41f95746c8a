// Group commit: concurrent writes share transactions, each keeps its own
// result, and none is acknowledged before the fsync of its commit.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "journal/journal.h"
#include "journal_fixture.h"

namespace spillway::journal {
namespace {

using namespace std::chrono_literals;

class GroupCommitTest : public FaultyJournalFixture {};

// Appended, not "r" + ...: GCC 12 warns (wrongly, -Wrestrict) about the latter.
std::string Id(int thread, int i) {
  return std::string("r").append(std::to_string(thread)).append("-").append(std::to_string(i));
}

TEST_F(GroupCommitTest, ConcurrentRequestsAllLandOnceInFewerCommits) {
  // A slow disk: while one commit syncs, the other callers queue behind it.
  faults_->StallSyncs(2ms);
  constexpr int kThreads = 32, kEach = 10, kRequests = kThreads * kEach;
  const JournalStats before = j_->stats();
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        const std::string id = Id(t, i);
        auto a = j_->Accept(Rec(id));
        if (Outcome(a) != "new" || a->existing.id != id) ++wrong;
        if (!j_->StartAttempt(id, "cpu").ok()) ++wrong;
        if (!j_->Finish(id, State::kCompleted, 200, "application/json", id).ok()) ++wrong;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  // Each request landed exactly once, with its own answer and one attempt.
  EXPECT_EQ(j_->CountByState(State::kCompleted), kRequests);
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kEach; ++i) {
      const std::string id = Id(t, i);
      auto r = j_->Get(id);
      ASSERT_TRUE(r.ok()) << id;
      EXPECT_EQ(r->result_body, id);
      EXPECT_EQ(r->attempts, 1);
      EXPECT_EQ(j_->Attempts(id)->size(), 1u);
    }
  }
  const JournalStats after = j_->stats();
  const int64_t writes = after.writes - before.writes, commits = after.commits - before.commits;
  EXPECT_EQ(writes, 3 * kRequests);
  EXPECT_LT(2 * commits, writes) << "commits " << commits << " for " << writes << " writes";
  EXPECT_GT(after.largest_batch, 1);
  EXPECT_EQ(after.failed_commits, 0);
}

TEST_F(GroupCommitTest, EachCommitIsOneFsync) {
  const int64_t syncs = faults_->syncs(), commits = j_->stats().commits;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(j_->Accept(Rec(Id(0, i))).ok());
  EXPECT_EQ(j_->stats().commits - commits, 5);
  EXPECT_EQ(faults_->syncs() - syncs, 5);
}

TEST_F(GroupCommitTest, AFailingWriteInABatchFailsOnlyItself) {
  CallHeldAtSync([&] { EXPECT_EQ(Outcome(j_->Accept(Rec("first"))), "new"); });
  // One batch, in this order: two new requests around three that fail.
  Call([&] { EXPECT_EQ(Outcome(j_->Accept(Rec("a"))), "new"); });
  Call([&] { EXPECT_EQ(Outcome(j_->Accept(Rec("first"))), "conflict"); });
  Call([&] { EXPECT_EQ(j_->StartAttempt("missing", "cpu").code(), StatusCode::kNotFound); });
  Call([&] { EXPECT_EQ(Outcome(j_->Accept(Rec("a"))), "conflict"); });
  Call([&] { EXPECT_TRUE(j_->StartAttempt("a", "cpu").ok()); });
  const int64_t commits = j_->stats().commits;
  faults_->Unblock();
  JoinCallers();
  EXPECT_EQ(j_->stats().commits - commits, 2);  // the held one, then the batch of five
  EXPECT_EQ(j_->stats().largest_batch, 5);
  EXPECT_EQ(j_->Get("first")->state, State::kQueued);
  EXPECT_EQ(j_->Get("a")->state, State::kRunning);
  EXPECT_EQ(j_->Attempts("a")->size(), 1u);
  EXPECT_EQ(j_->CountByState(State::kQueued) + j_->CountByState(State::kRunning), 2);
}

TEST_F(GroupCommitTest, AWriteThatFailsHalfwayIsUndoneWhole) {
  ASSERT_TRUE(j_->Accept(Rec("a")).ok());
  // A stray attempt row: StartAttempt("a") updates the request, then its
  // second statement collides with this row.
  RawExec("INSERT INTO attempts(request_id, n, placement, started_ms) VALUES('a', 1, 'stray', 0);");
  CallHeldAtSync([&] { EXPECT_TRUE(j_->Accept(Rec("lead")).ok()); });
  Call([&] { EXPECT_EQ(Outcome(j_->Accept(Rec("b"))), "new"); });
  Call([&] { EXPECT_EQ(j_->StartAttempt("a", "cpu").code(), StatusCode::kInternal); });
  Call([&] { EXPECT_TRUE(j_->StartAttempt("b", "cpu").ok()); });
  faults_->Unblock();
  JoinCallers();
  EXPECT_EQ(j_->stats().largest_batch, 3);
  EXPECT_EQ(j_->Get("a")->state, State::kQueued);  // its first statement undone too
  EXPECT_EQ(j_->Get("a")->attempts, 0);
  EXPECT_EQ(j_->Get("b")->state, State::kRunning);
}

TEST_F(GroupCommitTest, SameKeyInOneBatchIsNewThenInFlight) {
  CallHeldAtSync([&] { EXPECT_TRUE(j_->Accept(Rec("lead")).ok()); });
  StatusOr<AcceptResult> one = Status::Internal("not run"), two = Status::Internal("not run");
  Call([&] { one = j_->Accept(Rec("k-1", "key", "h1")); });
  Call([&] { two = j_->Accept(Rec("k-2", "key", "h1")); });
  faults_->Unblock();
  JoinCallers();
  EXPECT_EQ(j_->stats().largest_batch, 2);
  EXPECT_EQ(Outcome(one), "new");
  ASSERT_EQ(Outcome(two), "in_flight");
  EXPECT_EQ(two->existing.id, "k-1");
  EXPECT_FALSE(j_->Get("k-2").ok());
}

TEST_F(GroupCommitTest, AStalledFsyncHoldsEveryCallerOfItsBatch) {
  std::atomic<bool> lead_done{false};
  std::atomic<int> done{0};
  CallHeldAtSync([&] {
    EXPECT_TRUE(j_->Accept(Rec("lead")).ok());
    lead_done = true;
  });
  for (const char* id : {"a", "b", "c"}) {
    Call([&, id] {
      EXPECT_TRUE(j_->Accept(Rec(id)).ok());
      ++done;
    });
  }
  // Let the first commit's fsync through; the batch of three reaches its own.
  faults_->PassSyncs(1);
  ASSERT_TRUE(faults_->WaitForHeldSyncs(++held_, kPatience));
  const auto deadline = std::chrono::steady_clock::now() + kPatience;
  while (!lead_done && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  EXPECT_TRUE(lead_done);
  // The batch's rows are in the WAL, its fsync has not returned: nobody of it
  // may have been answered. (A caller answered too early needs a moment to
  // show: give it 100 ms to, which a correct journal never uses.)
  const auto grace = std::chrono::steady_clock::now() + 100ms;
  while (done == 0 && std::chrono::steady_clock::now() < grace) std::this_thread::yield();
  EXPECT_EQ(done.load(), 0);
  EXPECT_EQ(j_->stats().queued, 3);
  faults_->Unblock();
  JoinCallers();
  EXPECT_EQ(done.load(), 3);
  EXPECT_EQ(j_->stats().largest_batch, 3);
}

TEST_F(GroupCommitTest, GroupingCanBeTurnedOff) {
  JournalOptions o = Options();
  o.max_batch = 1;
  Reopen(o);
  CallHeldAtSync([&] { EXPECT_TRUE(j_->Accept(Rec("lead")).ok()); });
  for (const char* id : {"a", "b", "c"}) Call([&, id] { EXPECT_TRUE(j_->Accept(Rec(id)).ok()); });
  const int64_t commits = j_->stats().commits;
  faults_->Unblock();
  JoinCallers();
  EXPECT_EQ(j_->stats().commits - commits, 4);
  EXPECT_EQ(j_->stats().largest_batch, 1);
}

}  // namespace
}  // namespace spillway::journal
