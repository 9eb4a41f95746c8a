// The journal's asynchronous writes: call order is commit order, where each
// commits (never on the caller's thread; at NORMAL a logged write is durable
// there), Flush, and checkpoints kept out of commits.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "journal/journal.h"
#include "journal_fixture.h"

namespace spillway::journal {
namespace {

class AsyncWriteTest : public JournalFixture {
 protected:
  // Collects the results of asynchronous calls, and the threads they came on.
  struct Results {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<Status> got;
    std::vector<std::thread::id> threads;
    Journal::OnCommit Add() {
      return [this](Status st) {
        std::lock_guard<std::mutex> lk(mu);
        got.push_back(std::move(st));
        threads.push_back(std::this_thread::get_id());
        cv.notify_all();
      };
    }
    void WaitFor(size_t n) {
      std::unique_lock<std::mutex> lk(mu);
      ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(10), [&] { return got.size() >= n; }));
    }
  };
  // An Accept, then a decision and a requeue each awaited: three results in `r`.
  void AcceptDecideRequeue(const std::string& id, Results* r) {
    j_->AcceptAsync(Rec(id), [add = r->Add()](StatusOr<AcceptResult> a) { add(a.status()); });
    r->WaitFor(1);
    j_->SetDecisionAsync(id, R"({"decision":"delay"})", r->Add());
    r->WaitFor(2);
    j_->RequeueAsync(id, "worker busy", r->Add());
    r->WaitFor(3);
  }
  static JournalOptions Mode(bool full) {
    JournalOptions o;
    o.synchronous_full = full;
    return o;
  }
};

// An Accept and the StartAttempt after it, queued back to back without waiting: the attempt finds its request.
TEST_F(AsyncWriteTest, CallOrderIsCommitOrder) {
  for (bool full : {false, true}) {
    Reopen(Mode(full));
    Results r;
    for (int i = 0; i < 20; ++i) {
      const std::string id = (full ? "full-" : "normal-") + std::to_string(i);
      j_->AcceptAsync(Rec(id), [add = r.Add()](StatusOr<AcceptResult> a) { add(a.status()); });
      j_->StartAttemptAsync(id, "gpu", "", r.Add());
      j_->FinishAsync(id, State::kCompleted, 200, "application/json", "{}", "", r.Add());
    }
    r.WaitFor(60);
    for (const auto& st : r.got) EXPECT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(j_->CountByState(State::kCompleted), full ? 40 : 20);
    auto att = j_->Attempts(full ? "full-7" : "normal-7");
    ASSERT_TRUE(att.ok());
    ASSERT_EQ(att->size(), 1u);
    EXPECT_EQ((*att)[0].outcome, "completed");
  }
}

// A StartAttempt queued before its request's Accept fails alone, as it must.
TEST_F(AsyncWriteTest, AnAttemptBeforeItsAcceptFails) {
  Results r;
  j_->StartAttemptAsync("ghost", "gpu", "", r.Add());
  r.WaitFor(1);
  EXPECT_EQ(r.got[0].code(), StatusCode::kNotFound);
}

// An Accept overlaps with what its caller does next: it commits on the
// journal's thread. A Finish is awaited at once: at NORMAL an idle journal
// commits it on the caller's thread (no hop); at FULL the journal's thread
// does, so no fsync runs on the caller's.
TEST_F(AsyncWriteTest, WhereACommitRuns) {
  for (bool full : {false, true}) {
    Reopen(Mode(full));
    Results r;
    const std::string id = full ? "f" : "n";
    j_->AcceptAsync(Rec(id), [add = r.Add()](StatusOr<AcceptResult> a) { add(a.status()); });
    r.WaitFor(1);
    j_->FinishAsync(id, State::kCompleted, 200, "application/json", "{}", "", r.Add());
    r.WaitFor(2);
    ASSERT_TRUE(r.got[0].ok() && r.got[1].ok());
    EXPECT_NE(r.threads[0], std::this_thread::get_id()) << "an Accept committed on its caller's thread";
    if (full) {
      EXPECT_NE(r.threads[1], std::this_thread::get_id()) << "an fsync ran on the caller's thread";
    } else {
      EXPECT_EQ(r.threads[1], std::this_thread::get_id()) << "an idle NORMAL journal hopped threads";
    }
  }
}

// A write awaited at once (a decision, a requeue) is committed by the
// journal's thread at NORMAL too. Committed on an idle journal's caller (an
// I/O thread), it took along the queued rows of other requests and ran the
// observer, which reads the journal, there.
TEST_F(AsyncWriteTest, NoTransactionRunsOnAnAsynchronousCallersThread) {
  Reopen(Mode(false));
  std::mutex mu;
  std::vector<std::thread::id> told;
  j_->SetObserver([&](const Transition&) {
    std::lock_guard<std::mutex> lk(mu);
    told.push_back(std::this_thread::get_id());
  });
  Results r;
  AcceptDecideRequeue("d", &r);
  for (const auto& st : r.got) ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_NE(r.threads[1], std::this_thread::get_id()) << "a decision committed on its caller's thread";
  EXPECT_NE(r.threads[2], std::this_thread::get_id()) << "a requeue committed on its caller's thread";
  std::lock_guard<std::mutex> lk(mu);
  for (const auto& t : told) EXPECT_NE(t, std::this_thread::get_id()) << "the observer ran on the caller's thread";
}

// An observer that throws (gateway code, run on the journal's thread) is
// survived: every writer still learns its result and the journal goes on.
// The throw ended the process (std::terminate on the journal's thread).
TEST_F(AsyncWriteTest, AnObserverThatThrowsIsSurvived) {
  Reopen(Mode(false));
  std::atomic<int> told{0};
  j_->SetObserver([&](const Transition&) {
    ++told;
    throw std::runtime_error("observer failed");
  });
  Results r;
  AcceptDecideRequeue("t", &r);
  for (const auto& st : r.got) EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_GT(told.load(), 0);
}

// Flush returns after everything queued before it.
TEST_F(AsyncWriteTest, FlushWaitsForWhatWasQueued) {
  Reopen(Mode(true));
  Results r;
  for (int i = 0; i < 50; ++i) {
    j_->AcceptAsync(Rec("q" + std::to_string(i)), [add = r.Add()](StatusOr<AcceptResult> a) { add(a.status()); });
  }
  j_->Flush();
  std::lock_guard<std::mutex> lk(r.mu);
  EXPECT_EQ(r.got.size(), 50u);
  EXPECT_EQ(j_->stats().queued, 0);
}

// Checkpoints run on the journal's thread: the WAL is copied back and reused
// rather than growing with every commit (without them: 4 KiB a page, more
// than 20 MB here).
TEST_F(AsyncWriteTest, TheWalIsCheckpointedOutsideCommits) {
  Reopen(Mode(false));
  const std::string body(4000, 'x');
  for (int i = 0; i < 6000; ++i) {
    RequestRecord rec = Rec("w" + std::to_string(i));
    rec.body = body;
    ASSERT_TRUE(j_->Accept(rec).ok());
  }
  j_->Flush();
  const auto wal = std::filesystem::file_size(dir_ / "journal.db-wal");
  EXPECT_LT(wal, 12u << 20) << "the WAL grew to " << wal << " bytes: no checkpoint ran";
}

}  // namespace
}  // namespace spillway::journal
