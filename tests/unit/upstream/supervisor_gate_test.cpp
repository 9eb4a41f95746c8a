// The supervisor's start gate (placement admission on the device) is asked
// before every start: a start that falls due while the gate runs for
// another (its backoff ends, a request demands it) waits for its own turn
// at the gate instead of slipping through with the round that was gated.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

#include "common/clock.h"
#include "upstream/supervisor.h"

namespace spillway::upstream {
namespace {

namespace fs = std::filesystem;

// An on-demand external server that never answers its health path: it starts, and stays starting.
WorkerSpec Sleeper(const std::string& key) {
  WorkerSpec s;
  s.key = key;
  s.on_demand = true;
  s.command = {"/bin/sh", "-c", "exec sleep 30", "sh", "${PORT}"};
  return s;
}

pid_t PidOf(const Supervisor& sup, const std::string& key) {
  for (const auto& w : sup.Snapshot()) {
    if (w.key == key) return w.pid;
  }
  return 0;
}

TEST(SupervisorGateTest, AStartThatFallsDueWhileTheGateRunsIsGatedToo) {
  const fs::path dir = fs::temp_directory_path() / ("spillway-gate-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  SystemClock clock;
  Supervisor sup("", dir.string(), clock);
  sup.Add(Sleeper("a.ext"));
  sup.Add(Sleeper("b.ext"));
  std::mutex mu;
  std::condition_variable cv;
  bool a_in_gate = false, release = false;
  std::set<std::string> asked;
  sup.SetStartGate([&](const std::string& key) {
    std::unique_lock<std::mutex> lk(mu);
    asked.insert(key);
    if (key == "a.ext") {
      a_in_gate = true;
      cv.notify_all();
      cv.wait(lk, [&] { return release; });  // a slow admission (telemetry, an unload to wait for)
    }
    return Status::Ok();
  });
  ASSERT_TRUE(sup.Claim().ok());
  sup.Start();
  sup.Demand("a.ext");
  {
    std::unique_lock<std::mutex> lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(10), [&] { return a_in_gate; }));
  }
  sup.Demand("b.ext");  // while a's admission runs
  {
    std::lock_guard<std::mutex> lk(mu);
    release = true;
  }
  cv.notify_all();
  pid_t b = 0;
  for (int i = 0; i < 500 && (b = PidOf(sup, "b.ext")) <= 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_GT(b, 0) << "b was never started";
  {
    std::lock_guard<std::mutex> lk(mu);
    EXPECT_TRUE(asked.count("b.ext")) << "b started without passing the start gate";
  }
  EXPECT_GT(PidOf(sup, "a.ext"), 0);
  sup.Stop(1000);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace spillway::upstream
