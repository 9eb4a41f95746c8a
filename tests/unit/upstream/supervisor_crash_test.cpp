// A worker that crashes soon after it becomes ready (at its first requests,
// on every start) is a crash loop: backed off as a failed start is, up to
// 30 s, and counted where a person looks (WorkerView::crashes), not
// reloaded every 2 s for good looking like a worker that restarts now and
// then. One killed from outside (SIGKILL: the OOM killer, an operator, the
// chaos harness) is wanted back soon: its backoff stays within 2 s.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "supervisor_fixture.h"

namespace spillway::upstream {
namespace {

// A pinned external server: fake-upstream, with `extra` arguments.
WorkerSpec FakeServer(const std::string& key, std::vector<std::string> extra) {
  WorkerSpec s;
  s.key = key;
  const char* fake = std::getenv("FAKE_UPSTREAM");
  s.command = {fake ? fake : "fake-upstream", "--port", "${PORT}"};
  s.command.insert(s.command.end(), extra.begin(), extra.end());
  return s;
}

// Its backoff when it last ended: from its next start back to now, in backoff.
int64_t BackoffLeftMs(const WorkerView& w, const Clock& clock) {
  return w.state == WorkerState::kBackoff ? w.next_start_ms - clock.NowMs() : -1;
}

TEST_F(SupervisorTest, AServerThatCrashesSoonAfterItIsReadyIsACrashLoop) {
  if (!std::getenv("FAKE_UPSTREAM")) GTEST_SKIP() << "FAKE_UPSTREAM not set (ctest sets it)";
  Supervisor& sup = *sup_;
  // Ready at its first health check, exit 3 at its second (0.5 s later).
  sup.Add(FakeServer("crash.ext", {"--crash-at-health", "2"}));
  Start();
  int64_t left = -1;
  ASSERT_TRUE(Eventually([&] {
    const WorkerView w = ViewOf(sup, "crash.ext");
    left = BackoffLeftMs(w, clock_);
    return w.crashes >= 4 && left >= 0;
  })) << "crashes " << ViewOf(sup, "crash.ext").crashes;
  const WorkerView w = ViewOf(sup, "crash.ext");
  EXPECT_EQ(w.last_exit, "exit 3");
  EXPECT_EQ(w.failed_starts, 0) << "it did start: a crash, not a failed start";
  // 0.5, 1, 2, then 4 s: past the 2 s of a worker killed from outside.
  EXPECT_GT(left, 2500) << "the fourth crash in a row is restarted as soon as a killed worker";
}

TEST_F(SupervisorTest, AServerKilledFromOutsideIsWantedBackSoon) {
  if (!std::getenv("FAKE_UPSTREAM")) GTEST_SKIP() << "FAKE_UPSTREAM not set (ctest sets it)";
  Supervisor& sup = *sup_;
  sup.Add(FakeServer("killed.ext", {}));
  Start();
  for (int kill_n = 1; kill_n <= 4; ++kill_n) {
    pid_t pid = 0;
    ASSERT_TRUE(Eventually([&] {
      const WorkerView w = ViewOf(sup, "killed.ext");
      pid = w.pid;
      return w.state == WorkerState::kReady;
    })) << "not ready again before kill " << kill_n;
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int64_t left = -1;
    ASSERT_TRUE(Eventually([&] {
      const WorkerView w = ViewOf(sup, "killed.ext");
      left = BackoffLeftMs(w, clock_);
      return w.pid != pid && left >= 0;
    })) << "its end was not seen after kill " << kill_n;
    EXPECT_LE(left, 2000) << "kill " << kill_n;
    const WorkerView w = ViewOf(sup, "killed.ext");
    EXPECT_EQ(w.crashes, 0) << "a SIGKILL from outside counted as its own crash";
    EXPECT_EQ(w.last_exit, "signal 9");
    // Its log knows nothing of a kill from outside: its last line ("fake-upstream listening on ...") is no reason.
    EXPECT_EQ(w.last_error, "") << "kill " << kill_n;
  }
}

// An on-demand server that served, was released and then fails to load
// again is a failed start: it was counted as the exit of a serving worker
// (failed_starts 0, "exited", a 2 s backoff), since its readiness of the
// earlier run was never forgotten, so a request waiting for it was not told.
TEST_F(SupervisorTest, ALoadThatFailsAfterAReleaseIsAFailedStart) {
  if (!std::getenv("FAKE_UPSTREAM")) GTEST_SKIP() << "FAKE_UPSTREAM not set (ctest sets it)";
  Supervisor& sup = *sup_;
  const std::string broken = (dir_ / "broken").string();
  WorkerSpec s;
  s.key = "od.ext";
  s.on_demand = true;
  // fake-upstream, until the file `broken` exists: then it exits at once.
  s.command = {"/bin/sh", "-c", "[ -e " + broken + " ] && exit 4; exec \"$0\" --port \"$1\"",
               std::getenv("FAKE_UPSTREAM"), "${PORT}"};
  sup.Add(s);
  Start();
  sup.Demand("od.ext");
  ASSERT_TRUE(Eventually([&] { return ViewOf(sup, "od.ext").state == WorkerState::kReady; }));
  sup.Release("od.ext");
  ASSERT_TRUE(Eventually([&] { return PidOf(sup, "od.ext") == 0; })) << "not ended after its release";
  { std::ofstream(broken) << "x"; }
  sup.Demand("od.ext");
  ASSERT_TRUE(Eventually([&] { return ViewOf(sup, "od.ext").last_exit == "exit 4"; }))
      << ViewOf(sup, "od.ext").last_exit;
  EXPECT_EQ(ViewOf(sup, "od.ext").failed_starts, 1) << "counted as the exit of a worker that served";
  EXPECT_EQ(ViewOf(sup, "od.ext").crashes, 0);
}

}  // namespace
}  // namespace spillway::upstream
