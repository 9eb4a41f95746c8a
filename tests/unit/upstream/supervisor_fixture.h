// A real Supervisor on a state directory of its own, for the supervisor's
// unit tests (the start gate, on-demand ends, crash loops): its workers are
// shell commands or tests/fakes' fake-upstream ($FAKE_UPSTREAM) run as
// external servers.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "common/clock.h"
#include "upstream/supervisor.h"

namespace spillway::upstream {

namespace fs = std::filesystem;

// An on-demand external server that never answers its health path: it starts, and stays starting.
inline WorkerSpec Sleeper(const std::string& key) {
  WorkerSpec s;
  s.key = key;
  s.on_demand = true;
  s.command = {"/bin/sh", "-c", "exec sleep 30", "sh", "${PORT}"};
  return s;
}

// A real Supervisor on a state directory of its own, stopped at the end.
class SupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("spillway-supervisor-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    sup_ = std::make_unique<Supervisor>("", dir_.string(), clock_);
  }
  void TearDown() override {
    sup_->Stop(1000);
    sup_.reset();
    fs::remove_all(dir_);
  }
  void Start() {
    ASSERT_TRUE(sup_->Claim().ok());
    sup_->Start();
  }
  SystemClock clock_;
  fs::path dir_;
  std::unique_ptr<Supervisor> sup_;
};

inline pid_t PidOf(const Supervisor& sup, const std::string& key) {
  for (const auto& w : sup.Snapshot()) {
    if (w.key == key) return w.pid;
  }
  return 0;
}

// `key`'s view (a default one, key empty, when there is none).
inline WorkerView ViewOf(const Supervisor& sup, const std::string& key) {
  for (const auto& w : sup.Snapshot()) {
    if (w.key == key) return w;
  }
  return {};
}

// Polls `done` every 10 ms for up to `limit`; whether it came true.
template <typename F>
bool Eventually(F done, std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace spillway::upstream
