// The Supervisor class itself, on shell-command external servers: its start
// gate, and how the end of an on-demand or keep_alive server is handled.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <algorithm>
#include <filesystem>
#include <memory>
#include <fstream>
#include <iterator>
#include <mutex>
#include <set>
#include <thread>

#include <signal.h>
#include <sys/wait.h>

#include <boost/asio/io_context.hpp>
#include <nlohmann/json.hpp>

#include "api/http_server.h"
#include "common/clock.h"
#include "common/private_files.h"
#include "protocol/worker_protocol.h"
#include "devices/sim_ledger.h"
#include "supervisor_fixture.h"
#include "upstream/worker_record.h"

namespace spillway::upstream {
namespace {

// The start gate (placement admission on the device) is asked before every
// start: a start that falls due while the gate runs for another (its backoff
// ends, a request demands it) waits for its own turn at the gate instead of
// slipping through with the round that was gated.
TEST_F(SupervisorTest, AStartThatFallsDueWhileTheGateRunsIsGatedToo) {
  Supervisor& sup = *sup_;
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
  Start();
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
  sup.Stop(1000);  // before the gate's state above goes
}

// A worker's port file that names another process's port (a worker of an
// earlier gateway with no record wrote it after this one's spawn cleared
// it): the process there answers /info with its own pid, not the spawned
// worker's, and the worker is not taken for ready (nothing is served from a
// process the supervisor does not know).
TEST(SupervisorReadinessTest, AWorkerWhosePortIsAnsweredByAnotherPidIsNotReady) {
  // The other process: an /info that says pid 1.
  boost::asio::io_context ioc;
  std::atomic<int> asked{0};
  http::Server other(ioc, {}, [&](http::Request req, std::shared_ptr<http::Exchange> ex) {
    ++asked;
    nlohmann::json info = {{"protocol_version", protocol::kWorkerProtocolVersion}, {"pid", 1}};
    ex->Respond(http::MakeResponse(200, info.dump(), "application/json", req.version()));
  });
  ASSERT_TRUE(other.Listen("127.0.0.1", 0).ok());
  std::thread io([&] { ioc.run(); });
  const fs::path dir = fs::temp_directory_path() / ("spillway-readiness-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  // The "worker": writes that port into the port file it is given, then waits.
  const fs::path worker = dir / "worker.sh";
  std::ofstream(worker) << "#!/bin/sh\nwhile [ $# -gt 0 ]; do [ \"$1\" = --port-file ] && f=$2; shift; done\n"
                        << "echo " << other.port() << " > \"$f\"\nexec sleep 30\n";
  fs::permissions(worker, fs::perms::owner_all);
  SystemClock clock;
  {
    Supervisor sup(worker.string(), (dir / "state").string(), clock);
    WorkerSpec spec;
    spec.key = "w.0";
    sup.Add(spec);
    ASSERT_TRUE(sup.Claim().ok());
    sup.Start();
    EXPECT_TRUE(Eventually([&] { return asked >= 3; })) << "its /info was never asked";
    const WorkerView v = ViewOf(sup, "w.0");
    EXPECT_NE(v.state, WorkerState::kReady) << "ready, served by pid 1 instead of the worker started (pid " << v.pid << ")";
    EXPECT_GT(v.pid, 0);
    sup.Stop(1000);
  }
  other.Stop();
  ioc.stop();
  io.join();
  fs::remove_all(dir);
}

// The record of an external server "old.ext" a previous gateway started.
WorkerRecord PreviousExternal(pid_t pid, uint64_t start_time) {
  WorkerRecord r;
  r.key = "old.ext";
  r.pid = pid;
  r.start_time = start_time;
  r.spec_hash = std::string(64, 'a');
  r.protocol_version = 1;
  r.external = true;
  return r;
}

// An external server a previous gateway started and that outlived it (no
// parent-death signal: a record from before it had one) is stopped with its
// own stop_signal, as its record says: one that ignores SIGTERM ends at once
// on SIGINT, instead of being killed after the grace period.
TEST_F(SupervisorTest, APreviousExternalServerIsStoppedWithItsOwnSignal) {
  const fs::path said = dir_ / "said";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setpgid(0, 0);  // a group of its own, as the supervisor starts them
    execl("/bin/sh", "sh", "-c",
          ("trap '' TERM; trap 'echo int > " + said.string() + "; exit 0' INT; echo ready > " + said.string() +
           "; while :; do sleep 0.05; done").c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  ASSERT_TRUE(Eventually([&] { return fs::exists(said); })) << "its traps are set once it says ready";
  const uint64_t start_time = devices::ProcessStartTime(pid);
  WorkerRecord r = PreviousExternal(pid, start_time);
  r.stop_signal = SIGINT;
  fs::create_directories(dir_ / "run");
  ASSERT_TRUE(WritePrivateFileAtomically(RecordPath((dir_ / "run").string(), r.key), RecordToJson(r)).ok());
  const auto t0 = std::chrono::steady_clock::now();
  sup_->StopUnadoptable({});  // no longer configured
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "killed, not stopped: status " << status;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(4)) << "waited out the grace period";
  std::ifstream f(said);
  std::string word;
  EXPECT_TRUE(f >> word && word == "int") << "its INT trap never ran";
}

// Pids name a process only within the boot (and pid namespace) they were
// read in: a record from another one names whatever has that pid now (an
// external server's record has no command line to tell it by), so it is
// forgotten, and that process is not signalled.
TEST_F(SupervisorTest, ARecordFromAnotherBootIsForgottenNotStopped) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setpgid(0, 0);
    execl("/bin/sh", "sh", "-c", "exec sleep 30", static_cast<char*>(nullptr));
    _exit(127);
  }
  ASSERT_TRUE(Eventually([&] { return devices::ProcessStartTime(pid) != 0; }));
  WorkerRecord r = PreviousExternal(pid, devices::ProcessStartTime(pid));
  r.boot = "00000000-0000-0000-0000-000000000000:4026531836";  // not this boot
  fs::create_directories(dir_ / "run");
  ASSERT_TRUE(WritePrivateFileAtomically(RecordPath((dir_ / "run").string(), r.key), RecordToJson(r)).ok());
  sup_->StopUnadoptable({});
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, WNOHANG), 0) << "a process named by another boot's record was stopped";
  kill(-pid, SIGKILL);
  waitpid(pid, &status, 0);
}

// A state directory copied beside the original (a backup restored, a test
// setup) holds the original's records: a gateway on the copy neither adopts
// nor stops their processes, which belong to the original's gateway. It
// stopped the original's external servers, judged by pid and start time.
TEST_F(SupervisorTest, ARecordCopiedFromAnotherStateDirectoryIsNotStopped) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setpgid(0, 0);
    execl("/bin/sh", "sh", "-c", "while :; do sleep 0.05; done", static_cast<char*>(nullptr));
    _exit(127);
  }
  uint64_t start_time = 0;
  ASSERT_TRUE(Eventually([&] { return (start_time = devices::ProcessStartTime(pid)) != 0; }));
  const fs::path original = dir_ / "original-run";
  fs::create_directories(original);
  fs::create_directories(dir_ / "run");
  struct stat st {};
  ASSERT_EQ(::stat(original.c_str(), &st), 0);
  WorkerRecord r = PreviousExternal(pid, start_time);
  r.dir_dev = st.st_dev;  // written in the original's run folder, then copied here
  r.dir_ino = st.st_ino;
  ASSERT_TRUE(WritePrivateFileAtomically(RecordPath((dir_ / "run").string(), r.key), RecordToJson(r)).ok());
  sup_->StopUnadoptable({});  // (not configured here: it would be stopped were it this directory's)
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // (a stop's SIGTERM ends sh at once)
  EXPECT_EQ(waitpid(pid, nullptr, WNOHANG), 0) << "the original gateway's server was stopped";
  kill(-pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

// An on-demand server that ends waits, stopped, for the next request; its
// end is still told (the gateway trips the placement's breaker, wakes the
// requests waiting on it, fails them over): it was not while stopped.
TEST_F(SupervisorTest, TheEndOfAnOnDemandServerIsToldThoughItWaitsStopped) {
  Supervisor& sup = *sup_;
  WorkerSpec spec = Sleeper("c.ext");
  spec.command = {"/bin/sh", "-c", "exit 3", "sh", "${PORT}"};
  sup.Add(spec);
  std::mutex mu;
  std::condition_variable cv;
  std::string told;
  sup.SetOnExit([&](const std::string& key, const std::string& why) {
    std::lock_guard<std::mutex> lk(mu);
    told = key + ": " + why;
    cv.notify_all();
  });
  Start();
  sup.Demand("c.ext");
  {
    std::unique_lock<std::mutex> lk(mu);
    EXPECT_TRUE(cv.wait_for(lk, std::chrono::seconds(10), [&] { return !told.empty(); })) << "its end was not told";
    EXPECT_EQ(told, "c.ext: exit 3");
  }
  for (const auto& w : sup.Snapshot()) {
    if (w.key == "c.ext") {
      EXPECT_EQ(w.state, WorkerState::kStopped);
    }
  }
  sup.Stop(1000);  // before the callback's state above goes
}

// keep_alive residency (on demand, loaded at start): one that ends is
// started again after its backoff, as a pinned one is, not left stopped.
TEST_F(SupervisorTest, AKeepAliveServerThatEndsIsStartedAgain) {
  Supervisor& sup = *sup_;
  const std::string starts = (dir_ / "starts").string();
  WorkerSpec spec = Sleeper("k.ext");
  spec.restart_on_exit = true;
  spec.command = {"/bin/sh", "-c", "echo x >> " + starts + "; exit 3", "sh", "${PORT}"};
  sup.Add(spec);
  Start();
  sup.Demand("k.ext");  // loaded at start
  auto lines = [&] {
    std::ifstream f(starts);
    return static_cast<int>(std::count(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>(), '\n'));
  };
  for (int i = 0; i < 500 && lines() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_GE(lines(), 2) << "not started again after it ended";
}

// A server starts as a fresh process would: stdin is /dev/null (a worker
// outlives the gateway; one reading the gateway's terminal from the
// background is stopped), and no signal ignored or blocked (the gateway
// ignores SIGPIPE; under `&` a shell makes it ignore SIGINT and SIGQUIT).
TEST_F(SupervisorTest, AServerStartsWithoutTheGatewaysStdinOrSignalState) {
  Supervisor& sup = *sup_;
  const std::string said = (dir_ / "said").string();
  struct sigaction ignore {}, pipe_before {}, quit_before {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, &pipe_before);  // as `spillway serve` does
  sigaction(SIGQUIT, &ignore, &quit_before);  // as a shell's `&` does
  WorkerSpec spec = Sleeper("s.ext");
  // (Its masks read by the shell's builtins alone: a shell blocks every
  // signal while it starts a command, and a grep of its status read that
  // now and then, as if it had been started so.)
  spec.command = {"/bin/sh", "-c",
                  "readlink /proc/$$/fd/0 > " + said + ".tmp; exec 3< /proc/$$/status; "
                  "while read -r k v <&3; do case \"$k\" in SigIgn:|SigBlk:) printf '%s\\t%s\\n' \"$k\" \"$v\" >> " +
                      said + ".tmp;; esac; done; exec 3<&-; mv " + said + ".tmp " + said + "; exec sleep 30",
                  "sh", "${PORT}"};
  sup.Add(spec);
  Start();
  sup.Demand("s.ext");
  const bool started = Eventually([&] { return fs::exists(said); });
  sigaction(SIGPIPE, &pipe_before, nullptr);
  sigaction(SIGQUIT, &quit_before, nullptr);
  ASSERT_TRUE(started);
  std::ifstream f(said);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("/dev/null"), std::string::npos) << text;
  // (Masks of signals 1 to 31, bit n-1 for signal n: above them glibc's own, not ours to reset.)
  auto mask = [&](const std::string& name) {
    const size_t at = text.find(name + ":\t");
    return at == std::string::npos ? ~0ull : std::stoull(text.substr(at + name.size() + 2, 16), nullptr, 16) & 0x7fffffffull;
  };
  EXPECT_EQ(mask("SigBlk"), 0u) << text;
  EXPECT_EQ(mask("SigIgn"), 0u) << text;
}

// A released server that ignores its stop signal is killed 5 s after its
// release, however often it is released again meanwhile: each release set
// the deadline 5 s further, so one released every few seconds (an exclusive
// device's gate choosing the same lingering victim round after round) was
// never killed, and the start waiting for its room never came.
TEST(SupervisorReleaseTest, ASecondReleaseDoesNotPutOffTheKill) {
  FakeClock clock;
  const fs::path dir = fs::temp_directory_path() / ("spillway-release-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    Supervisor sup("", dir.string(), clock);
    WorkerSpec spec = Sleeper("s.ext");
    spec.command = {"/bin/sh", "-c", "trap '' TERM; exec sleep 30", "sh", "${PORT}"};
    sup.Add(spec);
    ASSERT_TRUE(sup.Claim().ok());
    sup.Start();
    sup.Demand("s.ext");
    pid_t pid = 0;
    auto comm = [&] {
      std::ifstream f("/proc/" + std::to_string(pid) + "/comm");
      std::string name;
      std::getline(f, name);
      return name;
    };
    // Running `sleep`: past the trap, so the stop signal is ignored.
    ASSERT_TRUE(Eventually([&] { return (pid = PidOf(sup, "s.ext")) > 0 && comm() == "sleep"; }));
    sup.Release("s.ext");
    clock.Advance(3000);
    sup.Release("s.ext");  // still exiting: released again
    clock.Advance(2500);   // 5.5 s after the first release, 2.5 s after the second
    EXPECT_TRUE(Eventually([&] { return PidOf(sup, "s.ext") == 0; }, std::chrono::seconds(5)))
        << "not killed 5 s after its first release";
    sup.Stop(1000);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace spillway::upstream
