// The supervisor's start gate (Gateway::StartGate) on a simulated shared
// device: four services of the tiny chat model (a pinned, b and c
// keep_alive, d on demand), each predicted P bytes. A start it let through counts on the
// device until its spawn is seen, and no longer; a start beside one still
// loading counts only the rest of that load; a pinned worker restarting
// keeps its memory from on-demand starts. A real Gateway and Journal, fake
// workers, a stepped clock, a simulated device's ledger that this process
// allocates on (as a loading worker would).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "common/clock.h"
#include "config/config.h"
#include "devices/sim_ledger.h"
#include "fake_workers.h"
#include "gateway/gateway.h"
#include "gateway/placement_admission.h"
#include "journal/journal.h"
#include "scoped_sim_dir.h"

namespace spillway::gateway {
namespace {

std::string Config() {
  const char* m = std::getenv("SPILLWAY_MODELS");
  const std::string model = std::string(m ? m : "build/models") + "/tiny-chat.gguf";
  std::string c = "[[device]]\nname = \"sim:0\"\nheadroom_mib = 0\nheadroom_pct = 0\n";
  // (a pinned: not unloaded to make room for b. b and c keep_alive: loaded
  // and unloaded as on-demand ones are, but not only for a request. d on
  // demand: loaded for the requests that wait for it.)
  for (const char* name : {"a", "b", "c", "d"}) {
    c += "[[service]]\nname = \"" + std::string(name) + "\"\nmodel = \"" + model + "\"\nresidency = \"" +
         (name[0] == 'a' ? "pinned" : name[0] == 'd' ? "on_demand" : "keep_alive") +
         "\"\n[[service.placement]]\ndevice = \"sim:0\"\ngpu_layers = 99\nctx = 512\n";
  }
  return c;
}

class StartGateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("spillway-start-gate-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    auto cfg = config::ParseConfig(Config(), "start-gate.toml");
    ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
    config_ = *cfg;
    // What one start needs, on a device with room for it.
    ASSERT_TRUE(devices::SimLedger::Create(0, 8ull << 30).ok());
    const PlacementAdmission one = AdmitPlacement(nullptr, config_, "a.0");
    p_ = one.predicted_bytes;
    ASSERT_GT(p_, 0u) << one.reason;
    auto j = journal::Journal::Open((dir_ / "journal.db").string(), {}, clock_);
    ASSERT_TRUE(j.ok()) << j.status().ToString();
    journal_ = std::move(*j);
    // b and c due to start; a (pinned) not wanting to start unless a test says so.
    workers_.SetView(testing::ViewOf("a.0", upstream::WorkerState::kStopped, 0));
    workers_.SetOnDemand("d.0");
    workers_.SetView(testing::ViewOf("d.0", upstream::WorkerState::kStopped, 0));
    for (const char* k : {"b.0", "c.0"}) {
      workers_.SetOnDemand(k);
      workers_.SetView(testing::ViewOf(k, upstream::WorkerState::kBackoff, 0));
    }
    gateway_ = std::make_unique<Gateway>(config_, *journal_, workers_, clock_, std::map<std::string, PlacementAdmission>{});
  }
  void TearDown() override {
    if (ledger_) ledger_->Release(devices::LedgerKind::kAlloc, "a.0", ~0ull);
    ledger_.reset();
    gateway_->Shutdown();
    std::filesystem::remove_all(dir_);
  }
  // The device holds `capacity` bytes; this process (a's worker, loading) has allocated `loaded` of them.
  void Device(uint64_t capacity, uint64_t loaded = 0) {
    ASSERT_TRUE(devices::SimLedger::Create(0, capacity).ok());
    auto l = devices::SimLedger::Open(0);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    ledger_ = std::move(*l);
    if (loaded > 0) {
      ASSERT_TRUE(ledger_->Reserve(devices::LedgerKind::kAlloc, "a.0", loaded));
    }
  }
  Status Gate(const std::string& key) { return gateway_->StartGate(key, nullptr); }

  testing::ScopedSimDir sim_{"start-gate"};
  std::filesystem::path dir_;
  FakeClock clock_;
  config::GatewayConfig config_;
  std::unique_ptr<journal::Journal> journal_;
  testing::FakeWorkers workers_;
  std::unique_ptr<Gateway> gateway_;
  std::unique_ptr<devices::SimLedger> ledger_;
  uint64_t p_ = 0;  // one start's predicted bytes
};

// Let through and not spawned yet, a start holds nothing on the device but
// will: the next start does not count on that memory.
TEST_F(StartGateTest, AStartLetThroughCountsUntilItsSpawn) {
  Device(p_ + p_ / 2);  // room for one
  ASSERT_TRUE(Gate("c.0").ok());
  const Status st = Gate("b.0");
  EXPECT_FALSE(st.ok()) << "two starts let through on the memory of one";
  EXPECT_EQ(gateway_->PendingStarts(workers_.Snapshot()), std::set<std::string>{"c.0"});
}

// A start let through whose spawn failed at once (no free port, no binary:
// tried, no process) takes nothing: the next start is not refused for it
// (for 10 s, again at every retry).
TEST_F(StartGateTest, AStartWhoseSpawnFailedAtOnceCountsNoLonger) {
  Device(p_ + p_ / 2);
  ASSERT_TRUE(Gate("c.0").ok());
  workers_.SetView(testing::ViewOf("c.0", upstream::WorkerState::kBackoff, 0, 0, 1));  // tried, failed, waiting to try again
  EXPECT_TRUE(gateway_->PendingStarts(workers_.Snapshot()).empty());
  const Status st = Gate("b.0");
  EXPECT_TRUE(st.ok()) << st.ToString();
}

// A pinned worker restarting (its process gone) keeps its memory from an
// on-demand start: b loaded into it, and a then waited for b to go idle (for
// good, when b outranked it). Not for long, nor one whose starts keep
// failing: one that cannot come back (memory another program took) kept
// every on-demand service off the device.
TEST_F(StartGateTest, APinnedWorkerRestartingKeepsItsMemoryFromAnOnDemandStartForAWhile) {
  Device(p_ + p_ / 2);  // room for one
  auto crashed = testing::ViewOf("a.0", upstream::WorkerState::kBackoff, 0, 0, 1);  // its restart due
  crashed.down_since_ms = clock_.NowMs();
  workers_.SetView(crashed);
  const Status held = Gate("b.0");
  EXPECT_FALSE(held.ok()) << "b loaded into the memory of pinned a, restarting";
  EXPECT_NE(held.message().find("held for the restart of pinned a.0"), std::string::npos)
      << "the refusal does not say why the free memory is not b's: " << held.ToString();
  clock_.Advance(60'000);
  const Status later = Gate("b.0");
  EXPECT_TRUE(later.ok()) << "a pinned worker down for a minute held the device: " << later.ToString();
  workers_.SetView(testing::ViewOf("b.0", upstream::WorkerState::kStopped, 0, 0, 1));  // (b came and went)
  crashed.down_since_ms = clock_.NowMs();
  crashed.failed_starts = 3;
  workers_.SetView(crashed);
  const Status failing = Gate("c.0");
  EXPECT_TRUE(failing.ok()) << "a pinned worker that cannot start held the device: " << failing.ToString();
}

// ... but not twice while its killed process still exits: that process's
// memory shows in use on the device, and its restart takes it back. Counted
// again, the hold refused a start that fits beside the restart.
TEST_F(StartGateTest, APinnedWorkerStillExitingIsNotHeldTwice) {
  Device(2 * p_ + p_ / 2, p_);  // a's killed process still holds p (this process stands for it)
  auto killed = testing::ViewOf("a.0", upstream::WorkerState::kBackoff, 0, 0, 1);
  killed.down_since_ms = clock_.NowMs();
  killed.exiting = true;
  workers_.SetView(killed);
  const Status st = Gate("b.0");
  EXPECT_TRUE(st.ok()) << "a's memory counted twice, in use and held for its restart: " << st.ToString();
  // (Once it has ended, its restart is held for again: APinnedWorkerRestartingKeeps... above.)
}

// An on-demand load is for the requests that wait for it. Asked again after
// they were served elsewhere (the CPU fallback), it unloads no idle service
// of its own class used as much as it is (here: neither had a request) for
// nobody (found live: it did, and that one loaded again for its own next
// request).
TEST_F(StartGateTest, AnOnDemandStartNobodyWaitsForUnloadsNoPeer) {
  Device(p_ + p_ / 2, p_);  // b, loaded and idle, holds p of it (this process stands for b's worker)
  auto b = testing::ViewOf("b.0", upstream::WorkerState::kReady, ::getpid(), 0, 1);
  b.ready_since_ms = clock_.NowMs() - 60'000;
  workers_.SetView(b);
  const Status st = Gate("d.0");
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
  EXPECT_NE(st.message().find("no request waits for this load"), std::string::npos) << st.ToString();
  EXPECT_EQ(workers_.StateOf("b.0"), upstream::WorkerState::kReady) << "b was unloaded for a load nobody waits for";
}

// A keep_alive service unloaded when idle is loaded again by its requests,
// as an on-demand one: asked again after they went elsewhere, it unloads no
// idle peer of its own class used as much (it did, as if its requests
// waited, and that peer loaded again for its own next request). Its first
// load, by its configuration, still may (TheGateWaitsForItsVictims...).
TEST_F(StartGateTest, AKeepAliveServiceUnloadedWhenIdleLoadsAgainOnlyForItsRequests) {
  Device(p_ + p_ / 2, p_);  // b, loaded and idle, holds p of it (this process stands for b's worker)
  auto b = testing::ViewOf("b.0", upstream::WorkerState::kReady, ::getpid(), 0, 1);
  b.ready_since_ms = clock_.NowMs() - 60'000;
  workers_.SetView(b);
  auto c = testing::ViewOf("c.0", upstream::WorkerState::kBackoff, 0, 0, 1);
  c.released_idle = true;  // loaded before, stopped when idle; wanted again
  c.last_exit = "released (idle)";
  workers_.SetView(c);
  for (int round = 0; round < 2; ++round) {  // (a refusal changes its last_exit, not what it is)
    const Status st = Gate("c.0");
    EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
    EXPECT_NE(st.message().find("no request waits for this load"), std::string::npos) << st.ToString();
    EXPECT_EQ(workers_.StateOf("b.0"), upstream::WorkerState::kReady) << "b was unloaded for a load nobody waits for";
    c.last_exit = "not admitted: " + st.message();
    workers_.SetView(c);
  }
}

// A start that unloads an idle service waits for that one's process to end
// (its memory to be free) without the device's check held: an external
// server's requests there need it for their own room checks, and waited up
// to 2 s a victim. It is then judged again, on the memory given back.
TEST_F(StartGateTest, TheGateWaitsForItsVictimsWithoutHoldingTheDevice) {
  Device(p_ + p_ / 2, p_);  // b, loaded and idle, holds p of it (this process stands for b's worker)
  auto b = testing::ViewOf("b.0", upstream::WorkerState::kReady, ::getpid(), 0, 1);
  b.ready_since_ms = clock_.NowMs() - 60'000;
  workers_.SetView(b);
  Status beside = Status::Ok();
  int waits = 0;
  workers_.SetWaitReleased([&](const std::string& key) {
    ++waits;
    EXPECT_EQ(key, "b.0");
    // Another check of the device meanwhile (here another start's): not
    // kept waiting behind this one.
    beside = Gate("d.0");
    ledger_->Release(devices::LedgerKind::kAlloc, "a.0", ~0ull);  // b's process ended: its memory is free
    return true;
  });
  const Status st = Gate("c.0");
  EXPECT_EQ(waits, 1);
  EXPECT_EQ(beside.message().find("room check is under way"), std::string::npos)
      << "the device's check was held while b unloaded: " << beside.ToString();
  EXPECT_TRUE(st.ok()) << "not judged again once b had given its room: " << st.ToString();
  EXPECT_EQ(workers_.StateOf("b.0"), upstream::WorkerState::kStopped);
}

// A start let through whose round spawned nothing (a later gate call
// failed), refused when asked again: no longer about to load.
TEST_F(StartGateTest, AStartRefusedAfterItWasLetThroughCountsNoLonger) {
  Device(p_ + p_ / 2);
  ASSERT_TRUE(Gate("c.0").ok());
  Device(p_ / 2);  // another program took the device meanwhile: c is refused when asked again
  EXPECT_FALSE(Gate("c.0").ok());
  EXPECT_TRUE(gateway_->PendingStarts(workers_.Snapshot()).empty());
}

// One still loading holds part of its memory already: a start beside it
// counts the rest of that load, not the whole of it again (loads that
// fitted together were let through one at a time).
TEST_F(StartGateTest, AStartBesideOneStillLoadingCountsOnlyTheRestOfThatLoad) {
  Device(2 * p_ + p_ / 4);  // room for both, loaded or not
  ASSERT_TRUE(Gate("a.0").ok());
  Device(2 * p_ + p_ / 4, p_ / 2);  // a is loading: half of it is on the device
  workers_.SetView(testing::ViewOf("a.0", upstream::WorkerState::kStarting, ::getpid(), 0, 1));
  const Status st = Gate("b.0");
  EXPECT_TRUE(st.ok()) << st.ToString();
}

// ... and not on memory it is about to take: with room for one and a half,
// b waits for a's load.
TEST_F(StartGateTest, AStartBesideOneStillLoadingDoesNotTakeWhatThatOneWillLoad) {
  Device(p_ + p_ / 2);
  ASSERT_TRUE(Gate("a.0").ok());
  Device(p_ + p_ / 2, p_ / 2);
  workers_.SetView(testing::ViewOf("a.0", upstream::WorkerState::kStarting, ::getpid(), 0, 1));
  EXPECT_FALSE(Gate("b.0").ok());
}

}  // namespace
}  // namespace spillway::gateway
