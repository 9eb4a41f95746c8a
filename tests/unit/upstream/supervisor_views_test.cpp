// What the request path reads of the workers (ports, on-demand, views) never
// waits for the supervisor's own thread, and nothing a worker leaves in the
// run directory stalls that thread.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <future>
#include <mutex>
#include <thread>

#include "supervisor_fixture.h"

namespace spillway::upstream {
namespace {

// The supervisor holds its lock while it spawns a process, kills one, waits
// for one and writes its record; a request asks for its worker's port
// several times on its way. Those questions are answered from the published
// table meanwhile, not after the supervisor is done (a stall of the I/O
// thread that every request behind it paid).
TEST_F(SupervisorTest, ViewsAnswerWhileTheSupervisorHoldsItsLock) {
  Supervisor& sup = *sup_;
  sup.Add(Sleeper("a.ext"));
  Start();
  sup.Demand("a.ext");
  ASSERT_TRUE(Eventually([&] { return PidOf(sup, "a.ext") > 0; }));
  std::mutex mu;
  std::condition_variable cv;
  bool holding = false, release = false;
  std::thread holder([&] {
    sup.TEST_WhileLocked([&] {
      std::unique_lock<std::mutex> lk(mu);
      holding = true;
      cv.notify_all();
      cv.wait_for(lk, std::chrono::seconds(30), [&] { return release; });
    });
  });
  bool held = false;
  {
    std::unique_lock<std::mutex> lk(mu);
    held = cv.wait_for(lk, std::chrono::seconds(10), [&] { return holding; });
  }
  if (!held) {  // (the holder let go, and joined, before the test ends)
    {
      std::lock_guard<std::mutex> lk(mu);
      release = true;
    }
    cv.notify_all();
    holder.join();
    FAIL() << "the supervisor's lock was never taken";
  }
  auto asked = std::async(std::launch::async, [&] {
    return std::make_tuple(sup.ReadyPort("a.ext"), sup.OnDemand("a.ext"), sup.Running("a.ext"), PidOf(sup, "a.ext"));
  });
  const bool answered = asked.wait_for(std::chrono::seconds(2)) == std::future_status::ready;
  {
    std::lock_guard<std::mutex> lk(mu);
    release = true;
  }
  cv.notify_all();
  holder.join();
  ASSERT_TRUE(answered) << "the readers waited for the supervisor's lock";
  const auto [port, on_demand, running, pid] = asked.get();
  EXPECT_FALSE(port.has_value());  // starting: its health path never answers
  EXPECT_TRUE(on_demand);
  EXPECT_TRUE(running);
  EXPECT_GT(pid, 0);
}

// A worker stopped when idle (or for another's room) says so in its view
// until it is spawned again: its next load is for the requests that want
// it (the start gate judges it as an on-demand one's), and a refusal of
// that load meanwhile does not change what it is.
TEST_F(SupervisorTest, AReleasedWorkerSaysSoUntilItIsSpawnedAgain) {
  Supervisor& sup = *sup_;
  sup.Add(Sleeper("a.ext"));
  std::atomic<bool> refuse{false};
  sup.SetStartGate([&](const std::string&) { return refuse.load() ? Status::ResourceExhausted("no room") : Status::Ok(); });
  Start();
  sup.Demand("a.ext");
  ASSERT_TRUE(Eventually([&] { return PidOf(sup, "a.ext") > 0; }));
  EXPECT_FALSE(ViewOf(sup, "a.ext").released_idle);
  sup.Release("a.ext");
  EXPECT_TRUE(ViewOf(sup, "a.ext").released_idle);
  ASSERT_TRUE(sup.WaitReleased("a.ext", 10'000));
  refuse = true;
  sup.Demand("a.ext");
  ASSERT_TRUE(Eventually([&] { return ViewOf(sup, "a.ext").last_exit.rfind("not admitted", 0) == 0; }));
  EXPECT_TRUE(ViewOf(sup, "a.ext").released_idle) << "a refused start made it look loaded by its configuration";
  refuse = false;
  ASSERT_TRUE(Eventually([&] { return PidOf(sup, "a.ext") > 0; }));
  EXPECT_FALSE(ViewOf(sup, "a.ext").released_idle) << "still marked released once spawned again";
  sup.Stop(1000);  // (before the gate's state goes)
}

// A worker killed by the supervisor says so (exiting) until its process has
// ended: the memory that process holds is still in use on its device, and
// the start gate does not hold that memory a second time for its restart.
TEST_F(SupervisorTest, AKilledWorkerIsExitingUntilItsProcessEnds) {
  Supervisor& sup = *sup_;
  sup.Add(Sleeper("a.ext"));
  Start();
  sup.Demand("a.ext");
  ASSERT_TRUE(Eventually([&] { return PidOf(sup, "a.ext") > 0; }));
  const pid_t pid = PidOf(sup, "a.ext");
  EXPECT_FALSE(ViewOf(sup, "a.ext").exiting);
  sup.Refuse("a.ext", "refused by the test");  // SIGKILL, not waited for
  // (Read at once: the round that reaps it comes up to 50 ms later.)
  EXPECT_TRUE(ViewOf(sup, "a.ext").exiting) << "killed, and not told as still exiting";
  ASSERT_TRUE(Eventually([&] { return !ViewOf(sup, "a.ext").exiting; })) << "still exiting once it had ended";
  EXPECT_NE(::kill(pid, 0), 0) << "no longer exiting while its process lives";
}

// A worker's port file is read under the supervisor's lock. A FIFO there
// (a worker gone wrong, a file planted in the run directory) is not a
// port file: it is not opened for a reading that would wait for a writer
// forever, holding the lock and with it every start, stop and health check.
TEST_F(SupervisorTest, AFifoAtAPortFileStallsNothing) {
  // A worker that makes its port file a FIFO and then never writes a port.
  const std::string script = (dir_ / "fifo-worker.sh").string();
  {
    std::ofstream(script) << "#!/bin/sh\n"
                             "while [ $# -gt 0 ]; do [ \"$1\" = --port-file ] && mkfifo \"$2\"; shift; done\n"
                             "exec sleep 30\n";
  }
  ASSERT_EQ(::chmod(script.c_str(), 0755), 0);
  Supervisor sup(script, (dir_ / "state").string(), clock_);
  WorkerSpec spec;
  spec.key = "fifo.0";
  spec.args = {"--model", "none.gguf"};
  sup.Add(spec);
  ASSERT_TRUE(sup.Claim().ok());
  sup.Start();
  const std::string fifo = (dir_ / "state" / "run" / "fifo.0.port").string();
  struct stat st {};
  ASSERT_TRUE(Eventually([&] { return ::stat(fifo.c_str(), &st) == 0 && S_ISFIFO(st.st_mode); }))
      << "the worker did not make its FIFO";
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // a few rounds of reading it
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    sup.Stop(1000);
    stopped = true;
  });
  const bool in_time = Eventually([&] { return stopped.load(); }, std::chrono::seconds(10));
  if (!in_time) {
    // A reader stuck in open(): a writer releases it, so that the test ends.
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
  }
  stopper.join();
  EXPECT_TRUE(in_time) << "the supervisor's thread was stuck on the FIFO";
}

}  // namespace
}  // namespace spillway::upstream
