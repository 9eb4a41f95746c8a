// spillway-tie (upstream/tie_main.cpp): an external server's command runs
// in its group, which ends with the gateway that started it; the command's
// end is its own; a signal someone sends it reaches the group.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "devices/sim_ledger.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::string Tie() {
  const char* bin = std::getenv("SPILLWAY_BIN");
  return bin ? std::string(bin) + "/spillway-tie" : "";
}

// spillway-tie GATEWAY STOP -- argv, leading its own session and group as
// the supervisor starts it; run in the child of fork.
[[noreturn]] void ExecTie(pid_t gateway, int stop, const std::vector<std::string>& argv) {
  setsid();
  std::vector<std::string> all = {Tie(), std::to_string(gateway), std::to_string(stop), "--"};
  all.insert(all.end(), argv.begin(), argv.end());
  std::vector<char*> args;
  for (auto& a : all) args.push_back(a.data());
  args.push_back(nullptr);
  execv(args[0], args.data());
  _exit(127);
}


bool Running(pid_t pid) { return spillway::devices::ProcessAlive(pid, 0); }  // (alive, not a zombie)

pid_t ReadPid(const std::string& file) {
  pid_t pid = 0;
  for (int i = 0; i < 1000 && pid == 0; ++i) {
    std::ifstream f(file);
    if (!(f >> pid)) pid = 0;
    if (pid == 0) std::this_thread::sleep_for(5ms);
  }
  return pid;
}

// Waits (bounded) for `pid`, one of ours, and returns its wait status (-1: it did not end).
int Reap(pid_t pid, std::chrono::milliseconds bound) {
  const auto until = std::chrono::steady_clock::now() + bound;
  int status = 0;
  while (std::chrono::steady_clock::now() < until) {
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(5ms);
  }
  return -1;
}

class TieTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Tie().empty() || ::access(Tie().c_str(), X_OK) != 0) GTEST_SKIP() << "SPILLWAY_BIN has no spillway-tie";
    dir_ = (fs::temp_directory_path() / ("spillway-tie-" + std::to_string(getpid()))).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    for (pid_t p : left_) kill(p, SIGKILL);
    fs::remove_all(dir_);
  }
  // One started by this process; its group is killed at the end whatever the test found.
  pid_t StartTie(const std::vector<std::string>& argv) {
    const pid_t pid = fork();
    if (pid == 0) ExecTie(getppid(), SIGTERM, argv);
    left_.push_back(-pid);
    return pid;
  }
  std::string dir_;
  std::vector<pid_t> left_;  // killed whatever the test found
};

TEST_F(TieTest, ItsCommandsEndIsItsOwn) {
  int status = Reap(StartTie({"sh", "-c", "exit 3"}), 5s);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 3);
  status = Reap(StartTie({"sh", "-c", "kill -KILL $$"}), 5s);
  ASSERT_TRUE(WIFSIGNALED(status)) << status;
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  status = Reap(StartTie({"/nonexistent/server"}), 5s);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 127) << "a command that cannot run ends as a shell's would";
}

// The gateway dies without warning (-9): what its command started in the
// group, a wrapper's server, ends with it, not only the command.
TEST_F(TieTest, AGatewayThatDiesTakesTheWholeGroupWithIt) {
  const std::string file = dir_ + "/server";
  const pid_t gateway = fork();
  if (gateway == 0) {
    const pid_t tie = fork();
    if (tie == 0) ExecTie(getppid(), SIGTERM, {"sh", "-c", "sleep 30 & echo $! > " + file + "; wait"});
    pause();  // until killed
    _exit(0);
  }
  const pid_t server = ReadPid(file);
  ASSERT_GT(server, 0);
  left_.push_back(server);
  ASSERT_TRUE(Running(server));
  kill(gateway, SIGKILL);
  ASSERT_EQ(Reap(gateway, 5s) != -1, true);
  for (int i = 0; i < 300 && Running(server); ++i) std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(Running(server)) << "the wrapper's server outlived the gateway";
}

// The gateway's death is the process's, not that of the thread that
// started it (the parent-death signal comes when that thread ends): a
// supervisor thread that ends while the gateway lives stops nothing.
TEST_F(TieTest, AThreadOfTheGatewayThatEndsStopsNothing) {
  const std::string file = dir_ + "/server";
  pid_t tie = 0, server = 0;
  std::thread([&] {
    tie = fork();
    if (tie == 0) ExecTie(getppid(), SIGTERM, {"sh", "-c", "sleep 30 & echo $! > " + file + "; wait"});
    server = ReadPid(file);  // (its death signal asked for by then: the thread ends after)
  }).join();
  ASSERT_GT(tie, 0);
  left_.push_back(-tie);
  ASSERT_GT(server, 0);
  left_.push_back(server);
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(Running(server)) << "stopped when the thread that started it ended";
  EXPECT_TRUE(Running(tie));
}

// One whose gateway is gone by the time it runs (a crash right after the
// spawn) does not start a server nobody will stop.
TEST_F(TieTest, AGatewayGoneBeforeItStartsStopsItAtOnce) {
  const pid_t gone = fork();  // a gateway that has ended
  if (gone == 0) _exit(0);
  waitpid(gone, nullptr, 0);
  const pid_t tie = fork();
  if (tie == 0) ExecTie(gone, SIGTERM, {"sleep", "30"});
  left_.push_back(-tie);  // (its group, should it run on)
  const int status = Reap(tie, 8s);
  ASSERT_NE(status, -1) << "it ran on";
  EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// `kill PID` of the pid /v1/status shows: the command hears it (the group
// does), as it would from the gateway's stop.
TEST_F(TieTest, ASignalSomeoneSendsItReachesItsGroup) {
  const std::string file = dir_ + "/server";
  const pid_t tie = StartTie({"sh", "-c", "sleep 30 & echo $! > " + file + "; wait"});
  const pid_t server = ReadPid(file);
  ASSERT_GT(server, 0);
  left_.push_back(server);
  const pid_t sender = fork();  // (not its gateway: the gateway's own stop goes to the whole group)
  if (sender == 0) {
    kill(tie, SIGTERM);
    _exit(0);
  }
  waitpid(sender, nullptr, 0);
  const int status = Reap(tie, 5s);
  ASSERT_NE(status, -1) << "it ran on";
  ASSERT_TRUE(WIFSIGNALED(status)) << status;
  EXPECT_EQ(WTERMSIG(status), SIGTERM) << "its command ended by the signal, and so does it";
  for (int i = 0; i < 100 && Running(server); ++i) std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(Running(server));
}

}  // namespace
