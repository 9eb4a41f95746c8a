// The placement board on its own, with a stepped clock: reservations that
// lose a race, slots, breakers (a placement's and a lost device's), and the
// line's wait estimate from measured throughput.
#include "gateway/placement_board.h"

#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "common/clock.h"
#include "config/config.h"
#include "gateway/metrics.h"

namespace spillway::gateway {
namespace {

constexpr const char* kConfig = R"(
[[service]]
name = "chat"
model = "/nonexistent/chat.gguf"
[service.failover]
breaker_failures = 2
ejection_s = 10
[[service.placement]]
device = "sim:0"
ctx = 256
slots = 2
kv_unified = true
[[service.placement]]
device = "sim:0"
ctx = 128
slots = 1
kv_unified = true
)";

class PlacementBoardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cfg = config::ParseConfig(kConfig, "board.toml");
    ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
    config_ = *cfg;
    board_ = std::make_unique<PlacementBoard>(config_, std::map<std::string, PlacementAdmission>{}, clock_);
  }
  std::vector<admission::PlacementView> Views(std::vector<bool> excluded = {}) {
    return board_->Views(config_.services[0], excluded, 16, [](size_t) { return true; });
  }
  FakeClock clock_;
  config::GatewayConfig config_;
  std::unique_ptr<PlacementBoard> board_;
};

// Two placements with the same name (two on one device with the same
// layers, two CPU ones) are two series: with the same labels Prometheus
// keeps one of them, and a breaker's state was lost.
TEST_F(PlacementBoardTest, EachPlacementsBreakerIsASeriesOfItsOwn) {
  ASSERT_EQ(config_.services[0].placements[0].Name(), config_.services[0].placements[1].Name());
  std::vector<std::tuple<std::string, std::string, double>> gauges;
  board_->Gauges(&gauges);
  std::set<std::string> labels;
  for (const auto& [name, l, value] : gauges) {
    if (name == "spillway_breaker_open") labels.insert(l);
  }
  EXPECT_EQ(labels.size(), 2u);
}

// So are their requests: spillway_requests_total merged the two CPU
// placements' counts into one series.
TEST(MetricsTest, RequestsOfTwoPlacementsOfOneNameAreTwoSeries) {
  Metrics m;
  m.RequestFinished("chat", "completed", "cpu", "chat.1", 0.1);
  m.RequestFinished("chat", "completed", "cpu", "chat.2", 0.1);
  m.RequestFinished("chat", "completed", "cpu", "chat.2", 0.1);
  const std::string text = m.Render({});
  EXPECT_NE(text.find("spillway_requests_total{service=\"chat\",outcome=\"completed\",placement=\"cpu\",key=\"chat.1\"} 1\n"),
            std::string::npos) << text;
  EXPECT_NE(text.find("spillway_requests_total{service=\"chat\",outcome=\"completed\",placement=\"cpu\",key=\"chat.2\"} 2\n"),
            std::string::npos) << text;
}

TEST_F(PlacementBoardTest, AReservationThatLostTheRaceIsRefusedAndAReleaseGivesTheCellsBack) {
  ASSERT_EQ(Views()[0].cells_free, 256u);
  ASSERT_EQ(Views()[0].slots_free, 2u);
  // Two requests decided on the same snapshot: the second finds the cells taken.
  EXPECT_FALSE(board_->Reserve("chat", 0, "a", 200, 100, 100, [] { return false; })) << "released: nothing taken";
  EXPECT_TRUE(board_->Reserve("chat", 0, "a", 200, 100, 100));
  EXPECT_FALSE(board_->Reserve("chat", 0, "b", 200, 100, 100)) << "over-committed the pool";
  EXPECT_EQ(Views()[0].cells_free, 56u);
  EXPECT_EQ(Views()[0].slots_free, 1u);
  EXPECT_EQ(board_->Active("chat", 0), 1);
  board_->Release("chat", 0, "a", /*cells=*/true, /*slot=*/true);
  EXPECT_EQ(Views()[0].cells_free, 256u);
  EXPECT_EQ(board_->Active("chat", 0), 0);
  EXPECT_TRUE(board_->Reserve("chat", 0, "b", 200, 100, 100));
}

// A shared pool with cells to spare still has only its slots: a reservation
// beyond them is refused (two requests decided on one snapshot with one
// slot free both got in, and the worker answered one of them busy).
TEST_F(PlacementBoardTest, AReservationNeedsAFreeSlotAsWellAsCells) {
  EXPECT_TRUE(board_->Reserve("chat", 0, "a", 10, 5, 5));
  EXPECT_TRUE(board_->Reserve("chat", 0, "b", 10, 5, 5));
  EXPECT_FALSE(board_->Reserve("chat", 0, "c", 10, 5, 5)) << "a third request on two slots";
  EXPECT_EQ(board_->Active("chat", 0), 2);
  board_->Release("chat", 0, "a", /*cells=*/true, /*slot=*/true);
  EXPECT_TRUE(board_->Reserve("chat", 0, "c", 10, 5, 5));
}

TEST_F(PlacementBoardTest, SlotsWithoutCellsAreBoundedByTheWorkersSlots) {
  EXPECT_FALSE(board_->TakeSlot("chat", 1, "s1", 64, [] { return false; })) << "its worker was released since its port was read";
  EXPECT_TRUE(board_->TakeSlot("chat", 1, "s1", 64, [] { return true; }));
  EXPECT_FALSE(board_->TakeSlot("chat", 1, "s2", 64)) << "one slot, taken twice";
  board_->Release("chat", 1, "s1", /*cells=*/false, /*slot=*/true);
  EXPECT_TRUE(board_->TakeSlot("chat", 1, "s3", 64));
}

TEST_F(PlacementBoardTest, APlacementsBreakerOpensAfterItsFailuresAndComesBackAfterItsEjection) {
  // (A worker that died: its placement's own failure. A compute failure
  // would count against the device too.)
  board_->AttemptFailed("chat", 0, "none", "unreachable");
  EXPECT_TRUE(Views()[0].usable) << "one failure of two";
  board_->AttemptFailed("chat", 0, "none", "unreachable");
  EXPECT_FALSE(Views()[0].usable);
  EXPECT_TRUE(Views()[0].comes_back) << "an ejection ends";
  EXPECT_TRUE(Views()[1].usable) << "the other placement is not ejected with it";
  clock_.Advance(10'000);
  EXPECT_TRUE(Views()[0].usable) << "still ejected after its ejection time";
}

TEST_F(PlacementBoardTest, ALostDeviceTakesEveryPlacementOnItOut) {
  board_->WorkerExited("chat.0", "device lost", /*device_lost=*/true);
  EXPECT_FALSE(Views()[0].usable);
  EXPECT_FALSE(Views()[1].usable) << "another placement on the lost device still taken";
}

// An attempt sent to a worker process that crashed reports its failure
// late, after the replacement is ready and its breaker half-open: it is the
// old process's failure (already counted by its exit), not the new one's.
// It reopened the breaker for a second, longer ejection (20 s here).
TEST_F(PlacementBoardTest, AFailureOfAReplacedProcessDoesNotCountAgainstItsReplacement) {
  uint64_t old_process = 0, new_process = 0;
  ASSERT_TRUE(board_->Reserve("chat", 0, "a", 10, 5, 5, [] { return true; }, &old_process));
  board_->WorkerExited("chat.0", "crashed (signal 9)", /*device_lost=*/false);
  EXPECT_FALSE(Views()[0].usable);
  board_->WorkerReady("chat.0");  // the replacement: half-open, probed by the next request
  EXPECT_TRUE(Views()[0].usable);
  board_->AttemptFailed("chat", 0, "none", "connection reset", old_process);
  board_->Release("chat", 0, "a", /*cells=*/true, /*slot=*/true);
  EXPECT_TRUE(Views()[0].usable) << "the old process's failure ejected its replacement";
  ASSERT_TRUE(board_->TakeSlot("chat", 0, "b", 5, [] { return true; }, &new_process));
  EXPECT_NE(new_process, old_process);
  board_->AttemptFailed("chat", 0, "none", "connection reset", new_process);
  EXPECT_FALSE(Views()[0].usable) << "the replacement's own probe failed";
}

// A half-open placement takes one request, its probe; the next goes
// elsewhere (or waits) until the probe's result: its first streamed event,
// its success or failure, or its release without one.
TEST_F(PlacementBoardTest, AHalfOpenPlacementTakesOneProbeAtATime) {
  board_->WorkerExited("chat.0", "crashed (signal 9)", /*device_lost=*/false);
  board_->WorkerReady("chat.0");
  ASSERT_TRUE(Views()[0].usable);
  uint64_t gen = 0;
  ASSERT_TRUE(board_->Reserve("chat", 0, "a", 10, 5, 5, [] { return true; }, &gen));
  EXPECT_FALSE(Views()[0].usable) << "a second request while the probe runs";
  EXPECT_TRUE(Views()[0].comes_back);
  EXPECT_FALSE(board_->Reserve("chat", 0, "b", 10, 5, 5)) << "decided on a snapshot from before the probe";
  EXPECT_FALSE(board_->TakeSlot("chat", 0, "b", 5));
  EXPECT_EQ(board_->PlacementJson("chat", 0, 16)["breaker"]["probe"], "a");
  EXPECT_EQ(board_->Release("chat", 0, "a", /*cells=*/true, /*slot=*/true),  // cancelled: no result
            PlacementBoard::Closed::kPlacement)
      << "what its probe held back is said, for the service's waiters";
  ASSERT_TRUE(Views()[0].usable) << "the next request probes";
  ASSERT_TRUE(board_->TakeSlot("chat", 0, "b", 5, [] { return true; }, &gen));
  EXPECT_EQ(board_->Answering("chat", 0, "x", gen), PlacementBoard::Closed::kNone) << "not the probe";
  EXPECT_FALSE(Views()[0].usable);
  EXPECT_TRUE(Views()[0].probing);
  EXPECT_EQ(board_->ProbeOut("chat", 0), "b");
  EXPECT_EQ(board_->Answering("chat", 0, "b", gen), PlacementBoard::Closed::kPlacement) << "its stream's first event";
  EXPECT_TRUE(Views()[0].usable);
  EXPECT_EQ(board_->PlacementJson("chat", 0, 16)["breaker"]["state"], "closed");
  EXPECT_TRUE(board_->Reserve("chat", 0, "c", 10, 5, 5)) << "closed: beside the stream still running";
  EXPECT_EQ(board_->Release("chat", 0, "c", true, true), PlacementBoard::Closed::kNone) << "no probe";
}

// What a probe's end lets through is said, so that the gateway wakes whoever
// waits for it: a device's breaker covers every service's placements on it.
TEST_F(PlacementBoardTest, AProbesResultOrReleaseSaysWhichBreakerItLetsThrough) {
  board_->AttemptFailed("chat", 0, "device", "device lost");
  clock_.Advance(10'000);
  ASSERT_TRUE(board_->Reserve("chat", 1, "old", 10, 5, 5));
  clock_.Advance(5'000);  // past its hold: the next request probes too
  ASSERT_TRUE(board_->Reserve("chat", 0, "a", 10, 5, 5));
  EXPECT_EQ(board_->Release("chat", 1, "old", true, true), PlacementBoard::Closed::kNone)
      << "a probe past its hold held nothing back";
  EXPECT_EQ(board_->Release("chat", 0, "a", true, true), PlacementBoard::Closed::kDevice)
      << "a device's probe released without a result: any service's request may probe it now";
  ASSERT_TRUE(board_->Reserve("chat", 1, "b", 10, 5, 5));
  EXPECT_EQ(board_->AttemptSucceeded("chat", 1), PlacementBoard::Closed::kDevice) << "its answer closes it";
  EXPECT_EQ(board_->DevicesJson()[0]["breaker"]["state"], "closed");
  EXPECT_EQ(board_->AttemptSucceeded("chat", 1), PlacementBoard::Closed::kNone) << "closed already";
  board_->WorkerExited("chat.1", "crashed (signal 9)", /*device_lost=*/false);
  board_->WorkerReady("chat.1");
  EXPECT_EQ(board_->AttemptSucceeded("chat", 1, /*generation=*/0), PlacementBoard::Closed::kNone)
      << "an answer of the process replaced since says nothing of its replacement";
  EXPECT_EQ(board_->AttemptSucceeded("chat", 1, /*generation=*/1), PlacementBoard::Closed::kPlacement);
  board_->WorkerExited("chat.1", "crashed (signal 9)", /*device_lost=*/false);
  EXPECT_EQ(board_->AttemptSucceeded("chat", 1, 2), PlacementBoard::Closed::kNone)
      << "open, its ejection not over: a late success does not close it";
}

// `probe_hold_s`: how long a probe without a result holds a half-open breaker.
TEST(PlacementBoardProbeTest, AProbeHoldsItsBreakerForTheConfiguredTime) {
  auto with_hold = [](const std::string& line) {
    std::string text = kConfig;
    text.replace(text.find("ejection_s = 10\n"), 16, "ejection_s = 10\n" + line + "\n");
    return config::ParseConfig(text, "board.toml");
  };
  auto cfg = with_hold("probe_hold_s = 30");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  FakeClock clock;
  PlacementBoard board(*cfg, {}, clock);
  auto usable = [&] { return board.Views(cfg->services[0], {}, 16, [](size_t) { return true; })[0].usable; };
  board.WorkerExited("chat.0", "crashed (signal 9)", false);
  board.WorkerReady("chat.0");
  ASSERT_TRUE(board.Reserve("chat", 0, "a", 10, 5, 5));
  clock.Advance(29'000);
  EXPECT_FALSE(usable()) << "held for 30 s, not the default 5 s";
  clock.Advance(1'000);
  EXPECT_TRUE(usable());
  auto bad = with_hold("probe_hold_s = 0");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("probe_hold_s"), std::string::npos) << bad.status().ToString();
}

// A lost device's breaker probes the same way, across its placements.
TEST_F(PlacementBoardTest, AHalfOpenDeviceTakesOneProbeAcrossItsPlacements) {
  board_->AttemptFailed("chat", 0, "device", "device lost");
  EXPECT_FALSE(Views()[1].usable);
  clock_.Advance(10'000);
  ASSERT_TRUE(Views()[0].usable && Views()[1].usable);
  ASSERT_TRUE(board_->Reserve("chat", 1, "a", 10, 5, 5));
  EXPECT_FALSE(Views()[0].usable) << "the device is probed by the request on the other placement";
  EXPECT_EQ(board_->ProbeOut("chat", 0), "a") << "the device's probe, not the placement's own (none)";
  clock_.Advance(5'000);  // the device's probe held past its hold: the next request probes too
  ASSERT_TRUE(Views()[0].usable);
  ASSERT_TRUE(board_->Reserve("chat", 0, "b", 10, 5, 5));
  EXPECT_EQ(board_->ProbeOut("chat", 1), "b");
  EXPECT_EQ(board_->Answering("chat", 1, "a", 0), PlacementBoard::Closed::kDevice)
      << "the first probe's late first event still closes the device's breaker";
  EXPECT_TRUE(Views()[1].usable);
  EXPECT_EQ(board_->DevicesJson()[0]["breaker"]["state"], "closed");
  EXPECT_FALSE(Views()[0].usable) << "its own breaker (tripped by the lost device too) is probed by b";
  EXPECT_EQ(board_->ProbeOut("chat", 0), "b");
}

bool All(size_t) { return true; }

TEST_F(PlacementBoardTest, TheLinesWaitEstimateGrowsWithTheRequestsAhead) {
  EXPECT_FALSE(board_->LineWaitS("chat", 0, 1, All).has_value()) << "a slot is free, but no pace measured yet";
  ASSERT_TRUE(board_->Reserve("chat", 0, "a", 100, 50, 50));
  ASSERT_TRUE(board_->Reserve("chat", 0, "b", 100, 50, 50));
  ASSERT_TRUE(board_->Reserve("chat", 1, "c", 100, 50, 50));
  EXPECT_FALSE(board_->LineWaitS("chat", 0, 1, All).has_value()) << "every slot taken, no throughput measured yet";
  // 100 tokens/s each way: a request of 50 + 50 runs 1 s.
  board_->RecordThroughput("chat", 0, 500, 50, 500, 51);  // (the first token is counted with the prompt)
  board_->RecordThroughput("chat", 1, 500, 50, 500, 51);
  const auto head = board_->LineWaitS("chat", 0, 1, All);
  ASSERT_TRUE(head.has_value());
  EXPECT_NEAR(*head, 1.0, 0.01) << "the first slot frees when a running request ends";
  const auto fourth = board_->LineWaitS("chat", 4, 1, All);
  ASSERT_TRUE(fourth.has_value());
  EXPECT_NEAR(*fourth, 3.0, 0.01) << "four ahead on two slots: two more rounds of 1 s";
  clock_.Advance(600);
  EXPECT_NEAR(*board_->LineWaitS("chat", 0, 1, All), 0.4, 0.01) << "time passed counts";
}

// The prompt's pace is weighed by tokens: a chat's next turns, a few tokens
// each (the rest found in the worker's cache) and mostly a decode step's
// fixed cost, do not drag the pace a prefill of thousands measured down to
// theirs (which, divided into a long prompt, refused requests past their
// deadlines). Prompts that are all short are measured as they run.
TEST_F(PlacementBoardTest, ThePromptsPaceIsWeighedByItsTokens) {
  auto pace = [&](size_t index) { return board_->PlacementJson("chat", index, 1)["throughput"]["prompt_tokens_per_s"].get<double>(); };
  board_->RecordThroughput("chat", 0, 1000, 2000, 100, 11);  // 2000 tokens/s
  EXPECT_NEAR(pace(0), 2000, 1);
  for (int i = 0; i < 10; ++i) board_->RecordThroughput("chat", 0, 5, 1, 100, 11);  // 1 token in 5 ms each
  EXPECT_GT(pace(0), 1800);
  for (int i = 0; i < 10; ++i) board_->RecordThroughput("chat", 1, 5, 1, 100, 11);
  EXPECT_NEAR(pace(1), 200, 1);
  board_->RecordThroughput("chat", 1, 1000, 2000, 100, 11);  // a long prefill outweighs them at once
  EXPECT_GT(pace(1), 1500);
}

// A line whose requests need more cells than a free slot has left waits
// for the cells: it heard "0 s" from that slot for as long as it waited.
TEST_F(PlacementBoardTest, TheLinesWaitIsForTheCellsItsRequestsNeedNotASlotAlone) {
  board_->RecordThroughput("chat", 0, 500, 50, 500, 51);  // 100 tokens/s each way
  board_->RecordThroughput("chat", 1, 500, 50, 500, 51);
  ASSERT_TRUE(board_->Reserve("chat", 0, "a", 200, 50, 150));  // 2 s; its second slot free, with 56 cells
  ASSERT_TRUE(board_->Reserve("chat", 1, "c", 100, 50, 50));   // 1 s; its only slot
  auto wait = [&](uint64_t need) { return board_->LineWaitS("chat", 0, need, All).value_or(-1); };
  EXPECT_EQ(wait(1), 0.0) << "a slot alone is free now";
  EXPECT_NEAR(wait(100), 1.0, 0.01) << "100 cells: when c ends (a's end frees them later)";
  EXPECT_NEAR(wait(200), 2.0, 0.01) << "only the first pool holds 200 cells: when a ends, not c";
  EXPECT_NEAR(wait(100000), 1.0, 0.01) << "more than any pool holds: the whole of the one that frees first";
  // Those ahead are served as many at a time as the pool holds them.
  EXPECT_NEAR(board_->LineWaitS("chat", 2, 200, All).value_or(-1), 2.0 + 2 * 2.0, 0.01)
      << "two ahead, one at a time in 256 cells (not two, its slots), each as long as a's run";
}

// A line waiting for a placement that is loading (an on-demand primary
// gone cold) heard "about 0 s" from its free slots, for the whole load.
TEST_F(PlacementBoardTest, TheLinesWaitCountsOnlyPlacementsThatServeNow) {
  board_->RecordThroughput("chat", 0, 500, 50, 500, 51);  // measured before it was released
  board_->RecordThroughput("chat", 1, 500, 50, 500, 51);
  EXPECT_EQ(board_->LineWaitS("chat", 0, 1, All), 0.0) << "both serve, with free slots";
  const auto loading = [](size_t) { return false; };
  EXPECT_FALSE(board_->LineWaitS("chat", 0, 1, loading).has_value()) << "told 0 s while nothing serves";
  ASSERT_TRUE(board_->Reserve("chat", 0, "a", 100, 50, 50));
  ASSERT_TRUE(board_->Reserve("chat", 0, "b", 100, 50, 50));
  const auto first_only = [](size_t k) { return k == 0; };  // the other, free, is loading
  const auto wait = board_->LineWaitS("chat", 0, 1, first_only);
  ASSERT_TRUE(wait.has_value());
  EXPECT_NEAR(*wait, 1.0, 0.01) << "the one serving is full: a slot frees when a request ends";
}

// Slots taken without cells (a lone placement's requests, embeddings) count
// too: a waiting request was told 0 s (or a constant 1 s) however busy.
TEST_F(PlacementBoardTest, SlotsTakenWithoutCellsCountInTheWaitEstimate) {
  ASSERT_TRUE(board_->TakeSlot("chat", 0, "a", 100));
  ASSERT_TRUE(board_->TakeSlot("chat", 0, "b", 100));
  ASSERT_TRUE(board_->TakeSlot("chat", 1, "c", 100));
  board_->RecordThroughput("chat", 0, 500, 50, 500, 51);  // 100 tokens/s each way
  board_->RecordThroughput("chat", 1, 500, 50, 500, 51);
  const auto head = board_->LineWaitS("chat", 0, 1, All);
  ASSERT_TRUE(head.has_value());
  EXPECT_NEAR(*head, 1.0, 0.01) << "a slot frees when a request's 100 tokens are out";
  EXPECT_EQ(board_->PlacementJson("chat", 0, 1)["kv_cells"]["requests"], 2) << "they run";
  board_->Release("chat", 0, "a", /*cells=*/false, /*slot=*/true);
  EXPECT_EQ(board_->LineWaitS("chat", 0, 1, All), 0.0);
}

// The service's line waits for the placements that serve it: an idle CPU
// fallback (a line of its own) or a placement whose breaker is open do not
// make its wait "0 s".
TEST(PlacementBoardLineTest, TheLinesWaitIgnoresTheCpuPathAndOpenBreakers) {
  auto cfg = config::ParseConfig(R"(
[[service]]
name = "chat"
model = "/nonexistent/chat.gguf"
[service.failover]
breaker_failures = 1
ejection_s = 10
[[service.placement]]
device = "sim:0"
ctx = 256
slots = 1
kv_unified = true
[[service.placement]]
role = "fallback"
device = "cpu"
ctx = 256
slots = 1
kv_unified = true
[[service.placement]]
role = "fallback"
device = "sim:1"
ctx = 256
slots = 1
kv_unified = true
)", "line.toml");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  FakeClock clock;
  PlacementBoard board(*cfg, {}, clock);
  ASSERT_TRUE(board.Reserve("chat", 0, "a", 100, 50, 50));
  board.RecordThroughput("chat", 0, 500, 50, 500, 51);  // 100 tokens/s: its request ends in 1 s
  board.AttemptFailed("chat", 2, "compute", "allocation failed");  // sim:1's breaker opens
  const auto wait = board.LineWaitS("chat", 0, 1, All);
  ASSERT_TRUE(wait.has_value());
  EXPECT_NEAR(*wait, 1.0, 0.01) << "told the idle CPU fallback's or the broken placement's 0 s";
}

}  // namespace
}  // namespace spillway::gateway
