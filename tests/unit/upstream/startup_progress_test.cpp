#include "upstream/startup_progress.h"

#include <gtest/gtest.h>

namespace spillway::upstream {
namespace {

WorkerView View(const std::string& key, WorkerState state, int failed_starts = 0, bool on_demand = false) {
  WorkerView w;
  w.key = key;
  w.state = state;
  w.failed_starts = failed_starts;
  w.on_demand = on_demand;
  return w;
}

TEST(StartupProgressTest, SettledOnlyWhenEveryWorkerIsReadyOrHasFailed) {
  std::vector<WorkerView> workers = {View("chat.0", WorkerState::kStarting), View("embed.0", WorkerState::kStarting)};
  auto p = MeasureStartup(workers, {});
  EXPECT_FALSE(p.settled());
  EXPECT_EQ(StartupStatusLine(p, "127.0.0.1:8480"), "serving on 127.0.0.1:8480; 0 of 2 workers ready, 2 loading");

  // Ready in the supervisor but not yet announced by the gateway (its /info unread): still loading.
  workers[0].state = WorkerState::kReady;
  EXPECT_FALSE(MeasureStartup(workers, {}).settled());
  p = MeasureStartup(workers, {"chat.0"});
  EXPECT_FALSE(p.settled());
  EXPECT_EQ(p.ready, 1u);

  workers[1] = View("embed.0", WorkerState::kBackoff, 1);
  workers[1].last_error = std::string(100, 'e');
  p = MeasureStartup(workers, {"chat.0"});
  EXPECT_TRUE(p.settled());
  EXPECT_EQ(StartupStatusLine(p, "h:1"),
            "serving on h:1; 1 of 2 workers ready; failing: embed.0 (" + std::string(100, 'e') + ")");
  workers[1].last_error = std::string(130, 'e');
  EXPECT_EQ(StartupStatusLine(MeasureStartup(workers, {"chat.0"}), "h:1"),
            "serving on h:1; 1 of 2 workers ready; failing: embed.0 (" + std::string(117, 'e') + "...)");

  workers[1] = View("embed.0", WorkerState::kReady);
  p = MeasureStartup(workers, {"chat.0", "embed.0"});
  EXPECT_TRUE(p.settled());
  EXPECT_EQ(StartupStatusLine(p, "h:1"), "serving on h:1; 2 of 2 workers ready");
}

TEST(StartupProgressTest, OnDemandWorkersAreNotWaitedFor) {
  const std::vector<WorkerView> workers = {View("chat.0", WorkerState::kReady),
                                           View("chat.1", WorkerState::kStopped, 0, /*on_demand=*/true)};
  const auto p = MeasureStartup(workers, {"chat.0"});
  EXPECT_TRUE(p.settled());
  EXPECT_EQ(StartupStatusLine(p, "h:1"), "serving on h:1; 1 of 1 worker ready");
}

// A worker that crashes soon after each start is failing, not loading, though every start succeeds.
TEST(StartupProgressTest, ACrashLoopIsFailing) {
  std::vector<WorkerView> workers = {View("chat.0", WorkerState::kReady), View("embed.0", WorkerState::kBackoff)};
  workers[1].crashes = 1;  // once: a worker that restarts now and then
  EXPECT_EQ(StartupStatusLine(MeasureStartup(workers, {"chat.0"}), "h:1"),
            "serving on h:1; 1 of 2 workers ready, 1 loading");
  workers[1].crashes = 3;
  workers[1].last_exit = "signal 6";
  EXPECT_EQ(StartupStatusLine(MeasureStartup(workers, {"chat.0"}), "h:1"),
            "serving on h:1; 1 of 2 workers ready; failing: embed.0 (crashed 3 times soon after starting, signal 6)");
}

TEST(StartupProgressTest, NoWorkersIsSettled) {
  EXPECT_TRUE(MeasureStartup({}, {}).settled());
}

TEST(StartupProgressTest, AFailureWithoutAnErrorLineNamesTheExit) {
  auto w = View("chat.0", WorkerState::kBackoff, 2);
  w.last_exit = "exit 2";
  EXPECT_EQ(MeasureStartup({w}, {}).failing, std::vector<std::string>{"chat.0 (exit 2)"});
  // Both: why it was stopped first, then its last word (which alone may be the last thing it loaded).
  w.last_exit = "did not become ready within 120 s (start_timeout_s)";
  w.last_error = "llama_model_load: loading tensors";
  EXPECT_EQ(MeasureStartup({w}, {}).failing,
            std::vector<std::string>{"chat.0 (did not become ready within 120 s (start_timeout_s): llama_model_load: "
                                     "loading tensors)"});
}

}  // namespace
}  // namespace spillway::upstream
