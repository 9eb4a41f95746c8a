#include "devices/sim_ledger.h"

#include <gtest/gtest.h>

#include "scoped_sim_dir.h"
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <thread>

namespace spillway::devices {
namespace {

constexpr uint64_t kMiB = 1 << 20;

struct FakeProcs {
  std::set<int32_t> alive;
  AliveFn fn() {
    return [this](int32_t pid, uint64_t) { return alive.count(pid) > 0; };
  }
};

TEST(LedgerTest, ReserveRespectsCapacityAcrossProcesses) {
  LedgerData d;
  LedgerInit(&d, 100 * kMiB);
  EXPECT_TRUE(LedgerReserve(&d, 1, 0, LedgerKind::kAlloc, "alloc", 60 * kMiB, 0));
  EXPECT_FALSE(LedgerReserve(&d, 2, 0, LedgerKind::kAlloc, "alloc", 41 * kMiB, 0));
  EXPECT_TRUE(LedgerReserve(&d, 2, 0, LedgerKind::kAlloc, "alloc", 40 * kMiB, 0));
  EXPECT_EQ(LedgerUsed(d), 100 * kMiB);
  EXPECT_FALSE(LedgerReserve(&d, 1, 0, LedgerKind::kAlloc, "alloc", 1, 0));
  LedgerRelease(&d, 1, LedgerKind::kAlloc, "alloc", 60 * kMiB);
  EXPECT_EQ(LedgerUsed(d), 40 * kMiB);
  EXPECT_EQ(d.n_entries, 1u);  // an entry at zero is removed
}

TEST(LedgerTest, HugeRequestsDoNotOverflow) {
  LedgerData d;
  LedgerInit(&d, 100);
  EXPECT_TRUE(LedgerReserve(&d, 1, 0, LedgerKind::kAlloc, "a", 50, 0));
  EXPECT_FALSE(LedgerReserve(&d, 1, 0, LedgerKind::kAlloc, "a", UINT64_MAX - 10, 0));
  EXPECT_FALSE(LedgerReserve(&d, 1, 0, LedgerKind::kAlloc, "a", UINT64_MAX, 0));
  EXPECT_EQ(LedgerUsed(d), 50u);
  LedgerRelease(&d, 1, LedgerKind::kAlloc, "a", UINT64_MAX);  // releasing more than held clamps at zero
  EXPECT_EQ(LedgerUsed(d), 0u);
}

TEST(LedgerTest, DeadProcessesAndExpiredHoldsAreReaped) {
  LedgerData d;
  LedgerInit(&d, 100);
  FakeProcs p;
  p.alive = {1, 2, 3};
  ASSERT_TRUE(LedgerReserve(&d, 1, 0, LedgerKind::kAlloc, "alloc", 30, 0));
  ASSERT_TRUE(LedgerReserve(&d, 2, 0, LedgerKind::kHold, "hold", 30, /*expires_ms=*/5000));
  ASSERT_TRUE(LedgerReserve(&d, 3, 0, LedgerKind::kHold, "hold", 30, 0));
  EXPECT_EQ(LedgerReap(&d, p.fn(), 1000), 0u);
  p.alive.erase(3);  // killed -9
  EXPECT_EQ(LedgerReap(&d, p.fn(), 1000), 30u);
  EXPECT_EQ(LedgerReap(&d, p.fn(), 5000), 30u);  // the hold expired
  EXPECT_EQ(LedgerUsed(d), 30u);
}

TEST(LedgerTest, TableFullRefusesNewEntries) {
  LedgerData d;
  LedgerInit(&d, UINT64_MAX / 2);
  for (uint32_t i = 0; i < kLedgerMaxEntries; ++i) {
    ASSERT_TRUE(LedgerReserve(&d, static_cast<int32_t>(i + 1), 0, LedgerKind::kAlloc, "a", 1, 0));
  }
  EXPECT_FALSE(LedgerReserve(&d, 100000, 0, LedgerKind::kAlloc, "a", 1, 0));
  EXPECT_TRUE(LedgerReserve(&d, 1, 0, LedgerKind::kAlloc, "a", 1, 0));  // an existing entry still grows
}

TEST(LedgerTest, PidReuseIsDetectedByStartTime) {
  const int32_t me = getpid();
  const uint64_t start = ProcessStartTime(me);
  ASSERT_GT(start, 0u);
  EXPECT_TRUE(ProcessAlive(me, start));
  EXPECT_TRUE(ProcessAlive(me, 0));
  EXPECT_FALSE(ProcessAlive(me, start + 1));
  EXPECT_FALSE(ProcessAlive(0, 0));
}

TEST(LedgerTest, AReapedProcessIsNeitherAliveNorStarted) {
  const pid_t pid = fork();
  if (pid == 0) {
    pause();
    _exit(0);
  }
  ASSERT_GT(pid, 0);
  const uint64_t start = ProcessStartTime(pid);
  EXPECT_GT(start, 0u);
  EXPECT_TRUE(ProcessAlive(pid, start));
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  EXPECT_FALSE(ProcessAlive(pid, start));
  EXPECT_FALSE(ProcessAlive(pid, 0));
  EXPECT_EQ(ProcessStartTime(pid), 0u);
}

// A process reaped between the opening of its /proc/<pid>/stat and the read
// fails the read with ESRCH; that used to escape as an exception and end the
// chaos harness (CI) or whichever gateway thread asked. Races a reader against
// the reaping, a few hundred times (about one in five lands in the window).
TEST(LedgerTest, AProcessReapedWhileItIsReadNeverThrows) {
  int thrown = 0;
  for (int i = 0; i < 300; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      pause();
      _exit(0);
    }
    ASSERT_GT(pid, 0);
    std::atomic<bool> done{false};
    std::thread reader([&] {
      while (!done) {
        try {
          ProcessAlive(pid, 0);
          ProcessStartTime(pid);
        } catch (...) {
          ++thrown;
        }
      }
    });
    usleep(200);
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    usleep(200);
    done = true;
    reader.join();
  }
  EXPECT_EQ(thrown, 0);
}

class SimLedgerFileTest : public ::testing::Test {
 protected:
  void SetUp() override { sim_ = std::make_unique<spillway::testing::ScopedSimDir>("ledger"); dir_ = sim_->path(); }
  void TearDown() override { sim_.reset(); }
  std::unique_ptr<spillway::testing::ScopedSimDir> sim_;
  std::filesystem::path dir_;
};

TEST_F(SimLedgerFileTest, CreateOpenListAndShare) {
  EXPECT_EQ(SimLedger::Open(3).status().code(), StatusCode::kNotFound);
  auto a = SimLedger::Create(3, 64 * kMiB);
  ASSERT_TRUE(a.ok());
  auto b = SimLedger::Open(3);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(SimLedger::List(), std::vector<int>{3});
  EXPECT_TRUE((*a)->Reserve(LedgerKind::kAlloc, "alloc", 10 * kMiB));
  auto snap = (*b)->Snapshot();
  EXPECT_EQ(snap.used, 10 * kMiB);
  EXPECT_EQ(snap.free(), 54 * kMiB);
  (*b)->Release(LedgerKind::kAlloc, "alloc", 10 * kMiB);
  EXPECT_EQ((*a)->Snapshot().used, 0u);
  // Changing the capacity keeps the entries.
  ASSERT_TRUE((*a)->Reserve(LedgerKind::kHold, "hold", kMiB));
  auto c = SimLedger::Create(3, 128 * kMiB);
  EXPECT_EQ((*c)->Snapshot().capacity, 128 * kMiB);
  EXPECT_EQ((*c)->Snapshot().used, kMiB);
  EXPECT_TRUE(SimLedger::Remove(3).ok());
  EXPECT_FALSE(SimLedger::Remove(3).ok());
}

TEST_F(SimLedgerFileTest, KilledHolderDoesNotLeak) {
  auto l = SimLedger::Create(0, 64 * kMiB);
  ASSERT_TRUE(l.ok());
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = fork();
  if (child == 0) {
    auto mine = SimLedger::Open(0);
    bool ok = mine.ok() && (*mine)->Reserve(LedgerKind::kHold, "hold", 20 * kMiB);
    char c = ok ? 'y' : 'n';
    (void)!write(ready[1], &c, 1);
    pause();
    _exit(0);
  }
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  EXPECT_EQ((*l)->Snapshot().used, 20 * kMiB);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_EQ((*l)->Snapshot().used, 0u);
  close(ready[0]);
  close(ready[1]);
}

TEST_F(SimLedgerFileTest, ForeignFileIsRejected) {
  { std::FILE* f = std::fopen((dir_ / "spillway-sim-5.ledger").c_str(), "w"); std::fputs("hello", f); std::fclose(f); }
  EXPECT_FALSE(SimLedger::Open(5).ok());
}

// A file of a ledger's size whose bytes are not a ledger (a stray dd, a
// future layout) is refused, and `sim create` makes it one again: the reap
// trusted its entry count and read far past the mapping (SIGSEGV in the
// gateway, every sim worker and `sim create` itself).
TEST_F(SimLedgerFileTest, AForeignFileOfALedgersSizeIsRefusedNotReadPastItsEnd) {
  std::string junk(sizeof(LedgerData), '\0');
  for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<char>(0x5A ^ (i * 131));
  std::memset(junk.data(), 'X', 8);  // not the magic
  const uint32_t huge = 0x7FFFFFF0;
  std::memcpy(junk.data() + offsetof(LedgerData, n_entries), &huge, sizeof huge);
  const int32_t gone = 0;  // entry 0's pid: taken for gone, so the reap removed "the last" entry
  std::memcpy(junk.data() + offsetof(LedgerData, entries) + offsetof(LedgerEntry, pid), &gone, sizeof gone);
  { std::FILE* f = std::fopen((dir_ / "spillway-sim-6.ledger").c_str(), "w"); std::fwrite(junk.data(), 1, junk.size(), f); std::fclose(f); }
  EXPECT_FALSE(SimLedger::Open(6).ok());
  auto made = SimLedger::Create(6, 1 << 20);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  EXPECT_EQ((*made)->Snapshot().capacity, 1u << 20);
  EXPECT_TRUE((*made)->Snapshot().entries.empty());
}

// A ledger cut short from outside while mapped reads as no ledger: every
// access touched the pages past its end (SIGBUS, the gateway and each sim
// worker killed). `sim create` makes it whole again.
TEST_F(SimLedgerFileTest, ALedgerCutShortWhileMappedReadsAsNoLedger) {
  auto l = SimLedger::Create(7, 64 * kMiB);
  ASSERT_TRUE(l.ok());
  ASSERT_TRUE((*l)->Reserve(LedgerKind::kAlloc, "alloc", kMiB));
  ASSERT_EQ(::truncate((dir_ / "spillway-sim-7.ledger").c_str(), 0), 0);
  EXPECT_EQ((*l)->Snapshot().capacity, 0u);
  EXPECT_FALSE((*l)->Reserve(LedgerKind::kAlloc, "alloc", kMiB));
  (*l)->Release(LedgerKind::kAlloc, "alloc", kMiB);
  EXPECT_FALSE(SimLedger::Open(7).ok());
  auto again = SimLedger::Create(7, 64 * kMiB);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*l)->Snapshot().capacity, 64 * kMiB);
  EXPECT_TRUE((*l)->Reserve(LedgerKind::kAlloc, "alloc", kMiB));
}

}  // namespace
}  // namespace spillway::devices
