// The start gate (Gateway::StartGate) for placements on the CPU: judged
// against the host's memory (a simulated host, $SPILLWAY_SIM_HOST_MEMINFO,
// whose available memory the test sets), with the starts let through
// moments ago counted at their whole prediction until their process shows
// what it took. A real Gateway and Journal, fake workers, a stepped clock.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/clock.h"
#include "config/config.h"
#include "fake_workers.h"
#include "gateway/gateway.h"
#include "gateway/placement_admission.h"
#include "journal/journal.h"

namespace spillway::gateway {
namespace {

std::string Config() {
  const char* m = std::getenv("SPILLWAY_MODELS");
  const std::string model = std::string(m ? m : "build/models") + "/tiny-chat.gguf";
  // (The host's headroom set to nothing: the test's numbers are the whole story.)
  std::string c = "[[device]]\nname = \"cpu\"\nheadroom_mib = 0\nheadroom_pct = 0\n";
  for (const char* name : {"x", "y"}) {
    c += "[[service]]\nname = \"" + std::string(name) + "\"\nmodel = \"" + model +
         "\"\nresidency = \"on_demand\"\n[[service.placement]]\ndevice = \"cpu\"\nctx = 512\n";
  }
  return c;
}

class StartGateHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("spillway-start-gate-host-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    meminfo_ = (dir_ / "meminfo").string();
    ::setenv("SPILLWAY_SIM_HOST_MEMINFO", meminfo_.c_str(), 1);
    Host(64ull << 30, 64ull << 30);
    auto cfg = config::ParseConfig(Config(), "start-gate-host.toml");
    ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
    config_ = *cfg;
    const PlacementAdmission one = AdmitPlacement(nullptr, config_, "x.0");
    p_ = one.predicted_bytes;
    ASSERT_GT(p_, 0u) << one.reason;
    auto j = journal::Journal::Open((dir_ / "journal.db").string(), {}, clock_);
    ASSERT_TRUE(j.ok()) << j.status().ToString();
    journal_ = std::move(*j);
    for (const char* k : {"x.0", "y.0"}) {
      workers_.SetOnDemand(k);
      workers_.SetView(testing::ViewOf(k, upstream::WorkerState::kBackoff, 0));  // due to start
    }
    gateway_ = std::make_unique<Gateway>(config_, *journal_, workers_, clock_, std::map<std::string, PlacementAdmission>{});
  }
  void TearDown() override {
    if (gateway_) gateway_->Shutdown();
    ::unsetenv("SPILLWAY_SIM_HOST_MEMINFO");
    std::filesystem::remove_all(dir_);
  }
  // The simulated host: `total` bytes, `available` of them free.
  void Host(uint64_t total, uint64_t available) {
    std::ofstream(meminfo_) << "MemTotal:       " << total / 1024 << " kB\n"
                            << "MemFree:        " << available / 1024 << " kB\n"
                            << "MemAvailable:   " << available / 1024 << " kB\n";
  }
  Status Gate(const std::string& key) { return gateway_->StartGate(key, nullptr); }

  std::filesystem::path dir_;
  std::string meminfo_;
  FakeClock clock_;
  config::GatewayConfig config_;
  std::unique_ptr<journal::Journal> journal_;
  testing::FakeWorkers workers_;
  std::unique_ptr<Gateway> gateway_;
  uint64_t p_ = 0;  // one start's predicted bytes
};

// The host has less available than the model needs: the start is refused
// for memory, saying what it needs and what there is, instead of loading
// into an allocation failure (or the OOM killer).
TEST_F(StartGateHostTest, AStartTheHostHasNoRoomForIsRefused) {
  Host(64ull << 30, p_ / 2);
  const Status st = Gate("x.0");
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
  EXPECT_EQ(st.reason(), kNoRoom) << st.ToString();
  Host(64ull << 30, 4 * p_);
  const Status later = Gate("x.0");
  EXPECT_TRUE(later.ok()) << "refused with room on the host: " << later.ToString();
}

// Two CPU starts that each fit alone but not together: the first one let
// through counts at its whole prediction until its process is seen (the
// host's reading shows nothing of it yet), so the second waits.
TEST_F(StartGateHostTest, TwoStartsThatFitOnlyOneAtATimeAreLetThroughOneAtATime) {
  Host(64ull << 30, p_ + p_ / 2);
  ASSERT_TRUE(Gate("x.0").ok());
  const Status second = Gate("y.0");
  EXPECT_EQ(second.reason(), kNoRoom) << "two starts let through on the host memory of one: " << second.ToString();
  // x's worker loading now: it counts at its whole prediction, as the host's
  // reading shows only part of it (here: none yet).
  workers_.SetView(testing::ViewOf("x.0", upstream::WorkerState::kStarting, ::getpid(), clock_.NowMs(), 1));
  const Status beside = Gate("y.0");
  EXPECT_EQ(beside.reason(), kNoRoom) << "a start beside a CPU worker still loading counted on its memory: "
                                      << beside.ToString();
  // x gone again (its load failed and freed its memory): y fits.
  workers_.SetView(testing::ViewOf("x.0", upstream::WorkerState::kBackoff, 0, 0, 1));
  const Status after = Gate("y.0");
  EXPECT_TRUE(after.ok()) << after.ToString();
}

}  // namespace
}  // namespace spillway::gateway
