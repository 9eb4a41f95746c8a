// A journal on a fresh file in a temporary directory, for the journal tests.
#pragma once

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "journal/journal.h"

namespace spillway::journal {

class JournalFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           ("spillway-journal-" + std::to_string(getpid()) + "-" + info->test_suite_name() + "-" + info->name());
    std::filesystem::remove_all(dir_);
    Reopen();
  }
  void TearDown() override {
    j_.reset();
    std::filesystem::remove_all(dir_);
  }
  void Reopen(JournalOptions o = {}) {
    j_.reset();
    auto j = Journal::Open((dir_ / "journal.db").string(), std::move(o), clock_);
    ASSERT_TRUE(j.ok()) << j.status().ToString();
    j_ = std::move(*j);
  }
  static RequestRecord Rec(const std::string& id, const std::string& key = "", const std::string& hash = "h1",
                           bool stream = false) {
    RequestRecord r;
    r.id = id;
    r.idempotency_key = key;
    r.payload_hash = hash;
    r.service = "chat";
    r.endpoint = "chat";
    r.stream = stream;
    r.body = "{}";
    return r;
  }
  // What an Accept came to: "new", "in_flight"..., or the error's code.
  static std::string Outcome(const StatusOr<AcceptResult>& a) {
    if (!a.ok()) return StatusCodeName(a.status().code());
    switch (a->outcome) {
      case AcceptOutcome::kNew: return "new";
      case AcceptOutcome::kReplay: return "replay";
      case AcceptOutcome::kInFlight: return "in_flight";
      case AcceptOutcome::kMismatch: return "mismatch";
    }
    return "?";
  }
  // SQL on the journal's file through a connection of its own, as a stray
  // writer would.
  void RawExec(const std::string& sql) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir_ / "journal.db").string().c_str(), &db), SQLITE_OK);
    EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
    sqlite3_close(db);
  }
  std::filesystem::path dir_;
  FakeClock clock_;
  std::unique_ptr<Journal> j_;
};

// The same on the fault-injecting VFS, with callers on their own threads.
class FaultyJournalFixture : public JournalFixture {
 protected:
  static constexpr std::chrono::seconds kPatience{10};

  void SetUp() override {
    faults_ = StorageFaults::Create();
    ASSERT_NE(faults_, nullptr);
    JournalFixture::SetUp();
    Reopen(Options());
  }
  void TearDown() override {
    faults_->Clear();  // lets every held sync go, so every caller returns
    for (auto& t : callers_) t.join();
    JournalFixture::TearDown();
  }
  JournalOptions Options() {
    JournalOptions o;
    o.faults = faults_;
    return o;
  }
  // Runs `call` on its own thread and returns once it is queued in the
  // journal: calls started one after the other queue in that order.
  void Call(std::function<void()> call) {
    const int64_t before = j_->stats().queued;
    callers_.emplace_back(std::move(call));
    const auto deadline = std::chrono::steady_clock::now() + kPatience;
    while (j_->stats().queued <= before) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the call never queued";
      std::this_thread::yield();
    }
  }
  // Runs `call` as the leader of a commit and holds that commit at its fsync
  // (until PassSyncs or Unblock): whoever queues meanwhile forms the next batch.
  void CallHeldAtSync(std::function<void()> call) {
    faults_->BlockSyncs();
    Call(std::move(call));
    ASSERT_TRUE(faults_->WaitForHeldSyncs(++held_, kPatience)) << "the commit never reached its fsync";
  }
  void JoinCallers() {
    for (auto& t : callers_) t.join();
    callers_.clear();
  }

  std::shared_ptr<StorageFaults> faults_;
  std::vector<std::thread> callers_;
  int64_t held_ = 0;
};

}  // namespace spillway::journal
