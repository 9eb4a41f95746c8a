// The gateway's start gate (Gateway::RoomFor) on a simulated device. An
// exclusive device (llama-swap's one service at a time): loads wait for one
// still loading, take turns in the order they asked, count a start the gate
// let through that has no process yet, and do not wait for ever on a load
// that hangs. A shared device: what a resident still loading will take is
// not free. A real Gateway and Journal, fake workers, a stepped clock, a
// simulated device's ledger.
#include <gtest/gtest.h>

#include <unistd.h>

#include <ctime>
#include <filesystem>

#include "admission/eviction.h"
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

constexpr const char* kConfig = R"(
[[device]]
name = "sim:0"
exclusive = true
headroom_mib = 0
headroom_pct = 0
[[service]]
name = "a"
model = "/nonexistent/a.gguf"
residency = "on_demand"
[[service.placement]]
device = "sim:0"
[[service]]
name = "b"
model = "/nonexistent/b.gguf"
residency = "on_demand"
[[service.placement]]
device = "sim:0"
[[service]]
name = "c"
model = "/nonexistent/c.gguf"
residency = "on_demand"
[[service.placement]]
device = "sim:0"
)";

class ExclusiveDeviceTest : public ::testing::Test {
 protected:
  virtual const char* Config() const { return kConfig; }
  virtual std::map<std::string, PlacementAdmission> Admissions() const { return {}; }
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("spillway-exclusive-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    ASSERT_TRUE(devices::SimLedger::Create(0, 1ull << 30).ok());
    auto cfg = config::ParseConfig(Config(), "start-gate.toml");
    ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
    config_ = *cfg;
    auto j = journal::Journal::Open((dir_ / "journal.db").string(), {}, clock_);
    ASSERT_TRUE(j.ok()) << j.status().ToString();
    journal_ = std::move(*j);
    for (const char* k : {"a.0", "b.0", "c.0"}) workers_.SetOnDemand(k);
    gateway_ = std::make_unique<Gateway>(config_, *journal_, workers_, clock_, Admissions());
  }
  void TearDown() override {
    gateway_->Shutdown();
    std::filesystem::remove_all(dir_);
  }
  Status Room(const std::string& key, const std::set<std::string>& starting = {}) {
    return gateway_->RoomFor(key, 10u << 20, starting);
  }

  testing::ScopedSimDir sim_{"exclusive-device"};
  std::filesystem::path dir_;
  FakeClock clock_;
  config::GatewayConfig config_;
  std::unique_ptr<journal::Journal> journal_;
  testing::FakeWorkers workers_;
  std::unique_ptr<Gateway> gateway_;
};

TEST_F(ExclusiveDeviceTest, LoadsWaitForOneInProgressAndTakeTurnsInTheOrderTheyAsked) {
  const int64_t t0 = clock_.NowMs();
  workers_.SetView(testing::ViewOf("c.0", upstream::WorkerState::kStarting, ::getpid(), t0));
  workers_.SetView(testing::ViewOf("a.0", upstream::WorkerState::kBackoff, 0, 0));
  workers_.SetView(testing::ViewOf("b.0", upstream::WorkerState::kBackoff, 0, 0));
  // c is loading: a waits (asked again next round), and b, asking later, waits behind a.
  Status st = Room("a.0");
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("c is still loading"), std::string::npos) << st.message();
  clock_.Advance(10);
  st = Room("b.0");
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  // c is gone: a, first in line, loads; b still waits its turn.
  workers_.SetView(testing::ViewOf("c.0", upstream::WorkerState::kStopped, 0, 0));
  st = Room("b.0");
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("a.0 asked first"), std::string::npos) << st.message();
  EXPECT_TRUE(Room("a.0").ok());
  gateway_->RoomGranted("a.0", 0, 0);
  // Let through in this round, no process yet: b does not load beside it.
  st = Room("b.0", {"a.0"});
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("a is still loading"), std::string::npos) << st.message();
}

TEST_F(ExclusiveDeviceTest, ALoadThatHangsDoesNotHoldTheDeviceForEver) {
  workers_.SetView(testing::ViewOf("c.0", upstream::WorkerState::kStarting, ::getpid(), clock_.NowMs()));
  workers_.SetView(testing::ViewOf("a.0", upstream::WorkerState::kBackoff, 0, 0));
  EXPECT_EQ(Room("a.0").code(), StatusCode::kUnavailable);
  clock_.Advance(admission::kExclusiveStartWaitMs);
  const Status st = Room("a.0");
  EXPECT_NE(st.code(), StatusCode::kUnavailable) << "still waiting on a load that never ends: " << st.ToString();
}

// The minute of day (local time) of `ms`, as "HH:MM".
std::string LocalHhMm(int64_t ms) {
  const std::time_t t = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  localtime_r(&t, &tm);
  char text[8];
  std::snprintf(text, sizeof text, "%02d:%02d", tm.tm_hour, tm.tm_min);
  return text;
}

// A waiter that falls outside its window gives up its turn: it held the
// exclusive device's line for every later load until its window opened
// again (a batch service waiting at 05:59 on a window of 01:00-06:00 kept
// an interactive one off the device until 01:00 the next day).
TEST_F(ExclusiveDeviceTest, AWaiterOutsideItsWindowKeepsNoOneWaitingBehindIt) {
  const int64_t t0 = clock_.NowMs();
  config_.services[0].residency.priority = "batch";  // (read per call) a, from now for ten minutes
  config_.services[0].residency.windows = {LocalHhMm(t0) + "-" + LocalHhMm(t0 + 10 * 60'000)};
  workers_.SetView(testing::ViewOf("c.0", upstream::WorkerState::kStarting, ::getpid(), t0));
  workers_.SetView(testing::ViewOf("a.0", upstream::WorkerState::kBackoff, 0, 0));
  workers_.SetView(testing::ViewOf("b.0", upstream::WorkerState::kBackoff, 0, 0));
  EXPECT_EQ(Room("a.0").code(), StatusCode::kUnavailable);  // behind c's load, first in line
  clock_.Advance(20 * 60'000);
  const Status outside = Room("a.0");
  EXPECT_EQ(outside.code(), StatusCode::kResourceExhausted) << outside.ToString();
  EXPECT_NE(outside.message().find("outside its accelerator window"), std::string::npos) << outside.message();
  workers_.SetView(testing::ViewOf("c.0", upstream::WorkerState::kStopped, 0, 0));
  const Status st = Room("b.0");
  EXPECT_TRUE(st.ok()) << "b waits behind a load that cannot happen: " << st.ToString();
}

// Two exclusive devices keep two lines: a gate on one left the other's
// waiters in it (it wiped them as "not wanting this device").
constexpr const char* kTwoDevices = R"(
[[device]]
name = "sim:0"
exclusive = true
headroom_mib = 0
headroom_pct = 0
[[device]]
name = "sim:1"
exclusive = true
headroom_mib = 0
headroom_pct = 0
[[service]]
name = "a"
model = "/nonexistent/a.gguf"
residency = "on_demand"
[[service.placement]]
device = "sim:0"
[[service]]
name = "b"
model = "/nonexistent/b.gguf"
residency = "on_demand"
[[service.placement]]
device = "sim:1"
[[service]]
name = "c"
model = "/nonexistent/c.gguf"
residency = "on_demand"
[[service.placement]]
device = "sim:1"
[[service]]
name = "d"
model = "/nonexistent/d.gguf"
residency = "on_demand"
[[service.placement]]
device = "sim:1"
)";

class TwoExclusiveDevicesTest : public ExclusiveDeviceTest {
 protected:
  const char* Config() const override { return kTwoDevices; }
  void SetUp() override {
    ExclusiveDeviceTest::SetUp();
    ASSERT_TRUE(devices::SimLedger::Create(1, 1ull << 30).ok());
    workers_.SetOnDemand("d.0");
  }
};

TEST_F(TwoExclusiveDevicesTest, EachDeviceKeepsItsOwnLine) {
  const int64_t t0 = clock_.NowMs();
  workers_.SetView(testing::ViewOf("d.0", upstream::WorkerState::kStarting, ::getpid(), t0));  // loading on sim:1
  workers_.SetView(testing::ViewOf("b.0", upstream::WorkerState::kBackoff, 0, 0));
  workers_.SetView(testing::ViewOf("c.0", upstream::WorkerState::kBackoff, 0, 0));
  workers_.SetView(testing::ViewOf("a.0", upstream::WorkerState::kBackoff, 0, 0));
  EXPECT_EQ(Room("b.0").code(), StatusCode::kUnavailable);  // first in sim:1's line
  clock_.Advance(10);
  EXPECT_EQ(Room("c.0").code(), StatusCode::kUnavailable);  // behind b
  EXPECT_TRUE(Room("a.0").ok());                            // sim:0: nobody else there
  workers_.SetView(testing::ViewOf("d.0", upstream::WorkerState::kStopped, 0, 0));
  const Status st = Room("c.0");
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << "c went before b, who asked first: " << st.ToString();
  EXPECT_NE(st.message().find("b.0 asked first"), std::string::npos) << st.message();
  EXPECT_TRUE(Room("b.0").ok());
}

// A 1 GiB device shared by a pinned chat model that predicts 800 MiB and an
// external server of 400 MiB.
constexpr const char* kSharedConfig = R"(
[[device]]
name = "sim:0"
headroom_mib = 0
headroom_pct = 0
[[service]]
name = "big"
model = "/nonexistent/big.gguf"
residency = "pinned"
[[service.placement]]
device = "sim:0"
[[service]]
name = "ext"
kind = "external"
command = "server --port ${PORT}"
routes = { "/v1/rerank" = "/v1/rerank" }
device = "sim:0"
resident_mib = 400
residency = "on_demand"
)";

class SharedDeviceStartTest : public ExclusiveDeviceTest {
 protected:
  const char* Config() const override { return kSharedConfig; }
  std::map<std::string, PlacementAdmission> Admissions() const override {
    return {{"big.0", PlacementAdmission{true, "sim:0", 800ull << 20, 0, ""}}};
  }
};

// The chat model is loading and holds nothing on the device yet: an
// external server's start beside it must not count on the memory the model
// is about to take (it did: the gate read only what the device showed free).
TEST_F(SharedDeviceStartTest, AResidentStillLoadingKeepsWhatItWillTake) {
  workers_.SetView(testing::ViewOf("big.0", upstream::WorkerState::kStarting, ::getpid(), clock_.NowMs()));
  const Status loading = gateway_->RoomFor("ext.ext", 400ull << 20);
  EXPECT_EQ(loading.code(), StatusCode::kResourceExhausted) << loading.ToString();
  // Loaded (ready, not starting): what it holds is what the device shows; here nothing, so there is room.
  workers_.SetView(testing::ViewOf("big.0", upstream::WorkerState::kReady, ::getpid(), clock_.NowMs()));
  EXPECT_TRUE(gateway_->RoomFor("ext.ext", 400ull << 20).ok());
  // A start the gate let through without a process yet counts too.
  workers_.SetView(testing::ViewOf("big.0", upstream::WorkerState::kBackoff, 0, 0));
  EXPECT_EQ(gateway_->RoomFor("ext.ext", 400ull << 20, {"big.0"}).code(), StatusCode::kResourceExhausted);
}

// Windows hold an external server off the accelerator as they do a llama
// service's placements: outside its window its start finds no room (it was
// started, and unloaded again once idle, for every burst of requests).
TEST_F(SharedDeviceStartTest, AnExternalServerOutsideItsWindowIsNotStarted) {
  workers_.SetView(testing::ViewOf("big.0", upstream::WorkerState::kReady, ::getpid(), clock_.NowMs()));
  ASSERT_TRUE(gateway_->RoomFor("ext.ext", 400ull << 20).ok());
  const int64_t later = clock_.NowMs() + 3 * 3600'000;
  config_.externals[0].residency.priority = "batch";  // (read per call) a window three hours from now
  config_.externals[0].residency.windows = {LocalHhMm(later) + "-" + LocalHhMm(later + 3600'000)};
  const Status st = gateway_->RoomFor("ext.ext", 400ull << 20);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
  EXPECT_NE(st.message().find("outside its accelerator window"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace spillway::gateway
