// The commit log: the request path's hot writes are durable once their record
// is in it, their rows follow, and nothing in it is lost to a crash between
// the two, a torn write or a failed apply.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "journal/commit_log.h"
#include "journal/storage_faults.h"
#include "journal_fixture.h"

namespace spillway::journal {
namespace {

namespace fs = std::filesystem;

class CommitLogTest : public JournalFixture {
 protected:
  std::string LogPath() const { return (dir_ / "plain-log").string(); }
  std::unique_ptr<CommitLog> OpenLog(std::vector<std::string>* leftover) {
    auto log = CommitLog::Open(LogPath(), /*sync=*/false, nullptr, leftover);
    EXPECT_TRUE(log.ok()) << log.status().ToString();
    return log.ok() ? std::move(*log) : nullptr;
  }
  // Appends and returns the record's sequence number (0: it failed).
  static int64_t Append(CommitLog& log, const std::string& payload) {
    int64_t seq = 0;
    int rc = -1;
    log.Append(payload, [&](int64_t s) { seq = s; }, [&](int r, const std::string&) { rc = r; });
    return rc == SQLITE_OK ? seq : 0;
  }
};

TEST_F(CommitLogTest, RecordsNotYetAppliedAreWhatTheNextOpenFinds) {
  std::vector<std::string> left;
  {
    auto log = OpenLog(&left);
    ASSERT_TRUE(left.empty());
    EXPECT_EQ(Append(*log, "one"), 1);
    EXPECT_EQ(Append(*log, std::string("two\0with a zero", 15)), 2);
    EXPECT_EQ(Append(*log, ""), 3);
    log->Applied(2);  // not all: the file keeps every record
  }
  auto log = OpenLog(&left);
  EXPECT_EQ(left, (std::vector<std::string>{"one", std::string("two\0with a zero", 15), ""}));
}

TEST_F(CommitLogTest, OnceEveryRecordIsAppliedTheFileIsEmptied) {
  std::vector<std::string> left;
  auto log = OpenLog(&left);
  ASSERT_EQ(Append(*log, "one"), 1);
  ASSERT_EQ(Append(*log, "two"), 2);
  log->Applied(1);
  log->EmptyIfApplied();
  EXPECT_GT(fs::file_size(LogPath()), 0u) << "emptied with a record not applied";
  log->Applied(2);
  EXPECT_GT(fs::file_size(LogPath()), 0u) << "a small file is emptied only once the journal is idle";
  log->EmptyIfApplied();
  EXPECT_EQ(fs::file_size(LogPath()), 0u);
  EXPECT_EQ(Append(*log, "three"), 3);  // appends go on after it
  log.reset();
  OpenLog(&left);
  EXPECT_EQ(left, std::vector<std::string>{"three"});
  // 64 KiB and more of applied records: emptied at once, without waiting for idleness.
  log = OpenLog(&left);
  for (int i = 0; i < 70; ++i) ASSERT_GT(Append(*log, std::string(1000, 'x')), 0);
  log->Applied(log->last_seq());
  EXPECT_EQ(fs::file_size(LogPath()), 0u);
}

// Under a steady load the file may never be all applied at once: past 8 MiB
// it is set aside and deleted once its records are applied, instead of growing on.
TEST_F(CommitLogTest, AFileThatIsNeverAllAppliedIsSetAsideAndDroppedOnceItsRecordsAre) {
  std::vector<std::string> left;
  std::vector<std::string> written;
  {
    auto log = OpenLog(&left);
    for (int i = 0; i < 10; ++i) {
      written.emplace_back();
      written.back().assign(size_t{1} << 20, static_cast<char>('a' + i));
      ASSERT_EQ(Append(*log, written.back()), i + 1);
    }
    ASSERT_TRUE(fs::exists(LogPath() + ".old")) << "no rotation past 8 MiB";
    EXPECT_LT(fs::file_size(LogPath()), 4u << 20);
  }
  // A crash now: both files' records, oldest first.
  auto log = OpenLog(&left);
  EXPECT_EQ(left, written);
  // The next process applied them: both files go.
  log->DropLeftovers();
  EXPECT_FALSE(fs::exists(LogPath() + ".old"));
  EXPECT_EQ(fs::file_size(LogPath()), 0u);
  // Its own life: once the records of the file set aside are applied it
  // goes, while the newer ones stay.
  for (int i = 0; i < 10; ++i) ASSERT_EQ(Append(*log, written[static_cast<size_t>(i)]), i + 1);
  ASSERT_TRUE(fs::exists(LogPath() + ".old"));
  log->Applied(7);
  EXPECT_TRUE(fs::exists(LogPath() + ".old")) << "deleted with a record in it not applied";
  log->Applied(8);
  EXPECT_FALSE(fs::exists(LogPath() + ".old"));
  EXPECT_GT(fs::file_size(LogPath()), 0u);
  log->Applied(10);
  EXPECT_EQ(fs::file_size(LogPath()), 0u);
}

TEST_F(CommitLogTest, ATornOrDamagedRecordEndsTheReplayAtIt) {
  std::vector<std::string> left;
  {
    auto log = OpenLog(&left);
    for (const char* p : {"first", "second", "third"}) ASSERT_GT(Append(*log, p), 0);
  }
  // A crash in mid-write: the last record lacks its end.
  fs::resize_file(LogPath(), fs::file_size(LogPath()) - 2);
  OpenLog(&left);
  EXPECT_EQ(left, (std::vector<std::string>{"first", "second"}));
  // A flipped byte in the second record's payload: its CRC no longer matches.
  {
    std::fstream f(LogPath(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8 + 5 + 8 + 1);
    f.put('X');
  }
  left.clear();
  OpenLog(&left);
  EXPECT_EQ(left, std::vector<std::string>{"first"});
}

// The tear is cut off when the log is opened: records written after it are
// not hidden behind it at the next replay.
TEST_F(CommitLogTest, RecordsWrittenAfterATornOneAreFoundAgain) {
  std::vector<std::string> left;
  {
    auto log = OpenLog(&left);
    ASSERT_GT(Append(*log, "before"), 0);
  }
  {
    std::ofstream f(LogPath(), std::ios::app | std::ios::binary);
    f << std::string("\x40\x00\x00\x00half", 8);  // a header promising 64 bytes, and a few of them
  }
  {
    auto log = OpenLog(&left);
    EXPECT_EQ(left, std::vector<std::string>{"before"});
    ASSERT_GT(Append(*log, "after"), 0);
  }
  OpenLog(&left);
  EXPECT_EQ(left, (std::vector<std::string>{"before", "after"}));
}

// Records whose rows never commit (a journal stuck behind a failing apply)
// must not fill the disk: past the log's bound an append fails as a full disk
// does, and records that fit again (once applied) are taken again.
TEST_F(CommitLogTest, PastItsBoundTheLogRefusesRecordsAsAFullDiskDoes) {
  std::vector<std::string> left;
  auto log = OpenLog(&left);
  log->set_max_bytes(3 * (1000 + 8));
  const std::string kb(1000, 'x');
  ASSERT_EQ(Append(*log, kb), 1);
  ASSERT_EQ(Append(*log, kb), 2);
  ASSERT_EQ(Append(*log, kb), 3);
  int rc = SQLITE_OK;
  std::string what;
  log->Append(kb, [](int64_t) { ADD_FAILURE() << "a refused record reached the journal"; },
              [&](int r, const std::string& w) { rc = r, what = w; });
  EXPECT_EQ(rc, SQLITE_FULL);
  EXPECT_NE(what.find("have not committed"), std::string::npos) << what;
  log->Applied(3);
  log->EmptyIfApplied();  // emptied: room again
  EXPECT_EQ(Append(*log, kb), 4);
}

// A record whose sync failed was answered "failed": no replay may apply it,
// even when records after it synced fine.
TEST_F(CommitLogTest, ARecordWhoseSyncFailedIsNeverReplayed) {
  auto faults = StorageFaults::Create();
  ASSERT_NE(faults, nullptr);
  auto append = [](CommitLog& log, const std::string& payload) {
    std::promise<int> rc;
    log.Append(payload, [](int64_t) {}, [&](int r, const std::string&) { rc.set_value(r); });
    return rc.get_future().get();
  };
  std::vector<std::string> left;
  {
    auto log = CommitLog::Open(LogPath(), /*sync=*/true, faults, &left);
    ASSERT_TRUE(log.ok()) << log.status().ToString();
    ASSERT_EQ(append(**log, "synced"), SQLITE_OK);
    faults->FailSyncs(1);
    ASSERT_EQ(append(**log, "failed"), SQLITE_IOERR_FSYNC);
    ASSERT_EQ(append(**log, "after"), SQLITE_OK);
    (*log)->Drain();  // (the sync thread books the round after telling its callers)
    int64_t last = 0;
    EXPECT_EQ((*log)->ReadAll(&last), (std::vector<std::string>{"synced", "after"}));
  }
  auto log = CommitLog::Open(LogPath(), /*sync=*/true, faults, &left);
  ASSERT_TRUE(log.ok());
  EXPECT_EQ(left, (std::vector<std::string>{"synced", "after"}));
}

// A failed record whose cut cannot be synced either: the log takes nothing
// more, and says that a restart is what brings it back.
TEST_F(CommitLogTest, ALogThatCannotCutAFailedRecordSaysARestartIsNeeded) {
  auto faults = StorageFaults::Create();
  ASSERT_NE(faults, nullptr);
  auto append = [](CommitLog& log, const std::string& payload, std::string* what = nullptr) {
    std::promise<int> rc;
    log.Append(payload, [](int64_t) {}, [&](int r, const std::string& w) {
      if (what) *what = w;
      rc.set_value(r);
    });
    return rc.get_future().get();
  };
  std::vector<std::string> left;
  {
    auto log = CommitLog::Open(LogPath(), /*sync=*/true, faults, &left);
    ASSERT_TRUE(log.ok()) << log.status().ToString();
    ASSERT_EQ(append(**log, "synced"), SQLITE_OK);
    faults->FailSyncs(2);  // the record's sync, then the cut's
    ASSERT_EQ(append(**log, "failed"), SQLITE_IOERR_FSYNC);
    (*log)->Drain();
    std::string what;
    EXPECT_EQ(append(**log, "refused", &what), SQLITE_IOERR_WRITE);
    EXPECT_NE(what.find("restart spillway"), std::string::npos) << what;
  }
  auto log = CommitLog::Open(LogPath(), /*sync=*/true, faults, &left);
  ASSERT_TRUE(log.ok());
  EXPECT_EQ(left, std::vector<std::string>{"synced"});
  EXPECT_EQ(append(**log, "after the restart"), SQLITE_OK);
}

// An append after the sync thread stopped (teardown) fails at once instead
// of waiting forever for a sync that never comes.
TEST_F(CommitLogTest, AnAppendAfterStopFailsAtOnce) {
  std::vector<std::string> left;
  auto log = CommitLog::Open(LogPath(), /*sync=*/true, nullptr, &left);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  (*log)->Stop();
  std::promise<int> rc;
  (*log)->Append("late", [](int64_t) {}, [&](int r, const std::string&) { rc.set_value(r); });
  auto f = rc.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(5)), std::future_status::ready) << "the append hung";
  EXPECT_EQ(f.get(), SQLITE_MISUSE);
}

TEST_F(CommitLogTest, AFieldReaderNeverReadsPastItsRecord) {
  RecordWriter w;
  w.U8(7).I64(-5).Str("text");
  const std::string rec = w.out();
  uint8_t u = 0;
  int64_t i = 0;
  std::string s;
  RecordReader r(rec);
  ASSERT_TRUE(r.U8(&u) && r.I64(&i) && r.Str(&s));
  EXPECT_EQ(u, 7);
  EXPECT_EQ(i, -5);
  EXPECT_EQ(s, "text");
  EXPECT_TRUE(r.done());
  EXPECT_FALSE(r.U8(&u));
  for (size_t cut = 0; cut < rec.size(); ++cut) {  // every truncation is refused somewhere
    const std::string part = rec.substr(0, cut);
    RecordReader p(part);
    EXPECT_FALSE(p.U8(&u) && p.I64(&i) && p.Str(&s)) << cut;
  }
  const std::string lying = std::string("\xff\xff\xff\x7f", 4) + "ab";  // a length past the end
  RecordReader l(lying);
  EXPECT_FALSE(l.Str(&s));
}

// The journal's side: logged writes on the fault-injecting VFS.
class LoggedWritesTest : public FaultyJournalFixture {
 protected:
  JournalOptions Slow(bool full) {
    JournalOptions o = Options();
    o.synchronous_full = full;
    o.log_apply_delay_ms = 3'600'000;  // rows wait until something takes them along
    return o;
  }
  // A logged write's result, once it is durable.
  static Status Durable(const std::function<void(Journal::OnCommit)>& start) {
    std::promise<Status> p;
    auto f = p.get_future();
    start([&p](Status st) { p.set_value(st); });
    return f.get();
  }
  Status NewRunning(const std::string& id) {
    return Durable([&](auto done) { j_->AcceptAndStartAsync(Rec(id), "cpu", "", std::move(done)); });
  }
  Status End(const std::string& id, const std::string& answer) {
    return Durable([&](auto done) {
      j_->FinishAsync(id, State::kCompleted, 200, "application/json", answer, "", std::move(done));
    });
  }
  static bool Eventually(const std::function<bool()>& f) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      if (f()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return f();
  }
};

TEST_F(LoggedWritesTest, WhatWasToldDurableIsReadBackAtOnceAndTheObserverHearsOfItOnceCommitted) {
  for (bool full : {true, false}) {
    Reopen(Slow(full));
    // Shared with the observer, which may outlive this scope when an assertion fails.
    struct Told {
      std::mutex m;
      std::vector<Transition::Kind> kinds;
    };
    auto heard = std::make_shared<Told>();
    auto& told = heard->kinds;
    auto& m = heard->m;
    j_->SetObserver([heard](const Transition& t) {
      std::lock_guard<std::mutex> lk(heard->m);
      heard->kinds.push_back(t.kind);
    });
    const std::string id = full ? "full" : "normal";
    const int64_t commits = j_->stats().commits;
    ASSERT_TRUE(NewRunning(id).ok());
    ASSERT_TRUE(End(id, "the answer").ok());
    EXPECT_EQ(j_->stats().commits, commits) << "nothing waited for a transaction";
    {
      std::lock_guard<std::mutex> lk(m);
      EXPECT_TRUE(told.empty()) << "told before the rows were committed";
    }
    auto rec = j_->Get(id);  // waits for the rows
    ASSERT_TRUE(rec.ok()) << rec.status().ToString();
    EXPECT_EQ(rec->state, State::kCompleted);
    EXPECT_EQ(rec->result_body, "the answer");
    ASSERT_EQ(j_->Attempts(id)->size(), 1u);
    EXPECT_EQ((*j_->Attempts(id))[0].outcome, "completed");
    std::lock_guard<std::mutex> lk(m);
    EXPECT_EQ(told, (std::vector<Transition::Kind>{Transition::Kind::kAttempt, Transition::Kind::kFinished}));
  }
}

// A process that dies after the records are durable and before their rows
// are committed: the files as it left them, opened by the next one.
TEST_F(LoggedWritesTest, RecordsWhoseRowsNeverCommittedAreAppliedByTheNextOpen) {
  Reopen(Slow(true));
  ASSERT_TRUE(NewRunning("done").ok());
  ASSERT_TRUE(End("done", "answer").ok());
  ASSERT_TRUE(NewRunning("running").ok());
  const fs::path crashed = dir_ / "crashed";
  fs::create_directories(crashed);
  for (const char* f : {"journal.db", "journal.db-wal", "journal.db-log"}) {
    if (fs::exists(dir_ / f)) fs::copy_file(dir_ / f, crashed / f);
  }
  ASSERT_GT(fs::file_size(crashed / "journal.db-log"), 0u);
  auto j = Journal::Open((crashed / "journal.db").string(), {}, clock_);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  auto done = (*j)->Get("done");
  ASSERT_TRUE(done.ok()) << "a request acknowledged as finished is missing";
  EXPECT_EQ(done->state, State::kCompleted);
  EXPECT_EQ(done->result_body, "answer");
  ASSERT_TRUE((*j)->Get("running").ok()) << "a request acknowledged as running is missing";
  EXPECT_EQ((*j)->Get("running")->state, State::kRunning);
  EXPECT_EQ((*j)->Attempts("running")->size(), 1u);
  EXPECT_EQ(fs::file_size(crashed / "journal.db-log"), 0u) << "applied records are not kept";
  // And a restart's recovery sees the running one.
  auto recovered = (*j)->Recover();
  ASSERT_TRUE(recovered.ok());
  ASSERT_EQ(recovered->size(), 1u);
  EXPECT_EQ((*recovered)[0].id, "running");
}

// Rows that fail to commit (the disk filled after the record was written)
// are applied again from the log once the storage takes writes.
TEST_F(LoggedWritesTest, RowsThatFailedToCommitAreAppliedAgainWhenTheStorageRecovers) {
  Reopen(Slow(false));
  ASSERT_TRUE(NewRunning("r").ok());
  faults_->SetDiskFull(true);
  j_->Flush();  // the rows' transaction fails
  EXPECT_FALSE(j_->Get("r").ok());
  EXPECT_GT(fs::file_size(dir_ / "journal.db-log"), 0u) << "the record was dropped with its failed rows";
  faults_->SetDiskFull(false);
  clock_.Advance(JournalOptions{}.unwritable_retry_ms);
  ASSERT_TRUE(j_->Accept(Rec("next")).ok());  // a commit: the storage writes again
  EXPECT_TRUE(Eventually([&] { return j_->Get("r").ok(); })) << "the failed rows were never applied again";
  EXPECT_EQ(j_->Get("r")->state, State::kRunning);
  EXPECT_TRUE(Eventually([&] { return fs::file_size(dir_ / "journal.db-log") == 0; }));
}

}  // namespace
}  // namespace spillway::journal
