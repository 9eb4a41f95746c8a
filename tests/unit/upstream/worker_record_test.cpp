// Worker records and the adoption decision (upstream/worker_record.h), the
// kept worker secret (upstream/worker_secret.h) and stopping a process group
// that is not our child (upstream/process_group.h).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "common/clock.h"
#include "common/secret.h"
#include "devices/sim_ledger.h"
#include "upstream/process_group.h"
#include "upstream/supervisor.h"
#include "upstream/worker_record.h"
#include "upstream/worker_secret.h"

namespace spillway::upstream {
namespace {

namespace fs = std::filesystem;

WorkerRecord Sample() {
  WorkerRecord r;
  r.key = "chat.0";
  r.pid = 4242;
  r.start_time = 987654;
  r.port = 40123;
  r.spec_hash = SpecHash({"--model", "m.gguf", "--ctx", "4096"});
  r.protocol_version = 1;
  return r;
}

struct TempDir {
  std::string path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "spillway-rec-XXXXXX").string();
    path = mkdtemp(t.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

TEST(WorkerRecordTest, RoundTrips) {
  auto r = ParseWorkerRecord(RecordToJson(Sample()));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->key, "chat.0");
  EXPECT_EQ(r->pid, 4242);
  EXPECT_EQ(r->start_time, 987654u);
  EXPECT_EQ(r->port, 40123);
  EXPECT_EQ(r->spec_hash, Sample().spec_hash);
  EXPECT_EQ(r->protocol_version, 1);
  EXPECT_FALSE(r->external);
  WorkerRecord ext = Sample();
  ext.external = true;  // an external server's record says so: judged by pid and start time alone
  auto e = ParseWorkerRecord(RecordToJson(ext));
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_TRUE(e->external);
  EXPECT_EQ(e->stop_signal, 15) << "SIGTERM unless it says otherwise";
  ext.stop_signal = 2;  // its own stop signal (SIGINT), what a later gateway stops it with
  auto i = ParseWorkerRecord(RecordToJson(ext));
  ASSERT_TRUE(i.ok()) << i.status().message();
  EXPECT_EQ(i->stop_signal, 2);
  ext.dir_dev = 2049;  // the run folder it was written in
  ext.dir_ino = 131077;
  auto d = ParseWorkerRecord(RecordToJson(ext));
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->dir_dev, 2049u);
  EXPECT_EQ(d->dir_ino, 131077u);
  EXPECT_EQ(d->session, 0) << "no session unless recorded";
  ext.session = 3170;  // its session: what it leaves in its group is stopped only there
  auto s = ParseWorkerRecord(RecordToJson(ext));
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->session, 3170);
  EXPECT_EQ(s->boot, "") << "no boot unless recorded";
  ext.boot = "0b6e7c1e-3f5d-4c52-9a43-2ad0e8a7d1a3:4026531836";  // the boot and pid namespace it was written in
  auto b = ParseWorkerRecord(RecordToJson(ext));
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b->boot, ext.boot);
  EXPECT_FALSE(ParseWorkerRecord(R"({"key":"chat.0","pid":4242,"start_time":1,"port":0,"spec_hash":")" + ext.spec_hash +
                                 R"(","protocol_version":1,"session":-1})")
                   .ok());
}

TEST(WorkerRecordTest, RefusesWhatIsNotACompleteRecord) {
  const std::string h = Sample().spec_hash;
  auto with = [&](const std::string& pid, const std::string& start, const std::string& port, const std::string& hash) {
    return "{\"key\":\"chat.0\",\"pid\":" + pid + ",\"start_time\":" + start + ",\"port\":" + port +
           ",\"spec_hash\":\"" + hash + "\",\"protocol_version\":1}";
  };
  EXPECT_TRUE(ParseWorkerRecord(with("4242", "9", "1", h)).ok());
  EXPECT_FALSE(ParseWorkerRecord(with("0", "9", "1", h)).ok());    // kill(-0) is our own group
  EXPECT_FALSE(ParseWorkerRecord(with("1", "9", "1", h)).ok());    // init
  EXPECT_FALSE(ParseWorkerRecord(with("-5", "9", "1", h)).ok());
  EXPECT_FALSE(ParseWorkerRecord(with("4242", "0", "1", h)).ok());  // no start time: a reused pid could not be told
  EXPECT_FALSE(ParseWorkerRecord(with("4242", "9", "70000", h)).ok());
  EXPECT_FALSE(ParseWorkerRecord(with("4242", "9", "1", "abc")).ok());
  EXPECT_FALSE(ParseWorkerRecord(with("4242", "9", "1", h).insert(1, "\"external\":\"yes\",")).ok());
  EXPECT_FALSE(ParseWorkerRecord(with("4242", "9", "1", h).insert(1, "\"stop_signal\":0,")).ok());   // a probe
  EXPECT_FALSE(ParseWorkerRecord(with("4242", "9", "1", h).insert(1, "\"stop_signal\":40,")).ok());  // real-time
  EXPECT_TRUE(ParseWorkerRecord(with("4242", "9", "1", h).insert(1, "\"stop_signal\":2,")).ok());
  EXPECT_FALSE(ParseWorkerRecord(with("4242", "9", "1", h).insert(1, "\"dir_ino\":-1,")).ok());
  EXPECT_FALSE(ParseWorkerRecord(with("4242", "9", "1", h).insert(1, "\"dir_dev\":\"2049\",")).ok());
  EXPECT_FALSE(ParseWorkerRecord("{\"key\":\"chat.0\"").ok());  // truncated
  EXPECT_FALSE(ParseWorkerRecord("[]").ok());
  EXPECT_FALSE(ParseWorkerRecord("").ok());
}

TEST(WorkerRecordTest, SpecHashSeesEveryArgumentAndItsBoundaries) {
  const std::vector<std::string> base = {"--model", "m.gguf", "--ctx", "4096"};
  EXPECT_EQ(SpecHash(base), SpecHash(base));
  EXPECT_NE(SpecHash(base), SpecHash({"--model", "m.gguf", "--ctx", "8192"}));
  EXPECT_NE(SpecHash(base), SpecHash({"--model", "m.gguf", "--ctx", "4096", "--kv-unified"}));
  EXPECT_NE(SpecHash({"a b"}), SpecHash({"a", "b"}));
  EXPECT_NE(SpecHash({"ab", "c"}), SpecHash({"a", "bc"}));
}

// A worker whose service changed priority is not adopted at its old
// niceness (an interactive service ran at nice 10 until its next restart);
// one without a niceness hashes as before it was counted (no restart on upgrade).
TEST(WorkerRecordTest, TheSpecsHashSeesItsNiceness) {
  WorkerSpec spec;
  spec.args = {"--model", "m.gguf", "--ctx", "4096"};
  EXPECT_EQ(SpecHashOf(spec), SpecHash(spec.args));
  WorkerSpec batch = spec;
  batch.nice = 10;
  EXPECT_NE(SpecHashOf(batch), SpecHashOf(spec));
  WorkerSpec background = spec;
  background.nice = 19;
  EXPECT_NE(SpecHashOf(background), SpecHashOf(batch));
}

TEST(WorkerRecordTest, ReadsTheRecordsOfADirectory) {
  TempDir d;
  std::ofstream(RecordPath(d.path, "chat.0")) << RecordToJson(Sample());
  WorkerRecord other = Sample();
  other.key = "embed.0";
  std::ofstream(RecordPath(d.path, "chat.1")) << RecordToJson(other);  // its key is not its name
  std::ofstream(d.path + "/chat.0.port") << "40123\n";                  // not a record
  std::ofstream(d.path + "/worker.secret") << "x\n";
  fs::create_symlink(RecordPath(d.path, "chat.0"), RecordPath(d.path, "planted"));
  const auto all = ReadWorkerRecords(d.path);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].key, "chat.0");
  EXPECT_TRUE(all[0].record.ok());
  EXPECT_EQ(all[1].key, "chat.1");
  EXPECT_FALSE(all[1].record.ok());
  EXPECT_TRUE(ReadWorkerRecords(d.path + "/missing").empty());
}

TEST(AdoptionDecisionTest, AdoptsOnlyItsOwnMatchingAnsweringWorker) {
  const WorkerRecord r = Sample();
  const std::optional<std::string> same = r.spec_hash;
  const WorkerInfoFacts answer{1, r.pid};
  EXPECT_EQ(DecideAdoption(r, same, 1, devices::Liveness::kAlive, answer).action, AdoptAction::kAdopt);
}

TEST(AdoptionDecisionTest, GoneOrReusedPidIsForgottenWhateverElseMatches) {
  const WorkerRecord r = Sample();
  // Not alive with the record's start time: never signalled, whatever answers on its port.
  EXPECT_EQ(DecideAdoption(r, r.spec_hash, 1, devices::Liveness::kGone, WorkerInfoFacts{1, r.pid}).action, AdoptAction::kForget);
  EXPECT_EQ(DecideAdoption(r, std::nullopt, 1, devices::Liveness::kGone, std::nullopt).action, AdoptAction::kForget);
}

// With no descriptor left (or /proc mounted hidepid), a living worker's
// /proc entry cannot be read: it was taken for gone, its record forgotten and
// a second worker started beside it for the same placement.
TEST(AdoptionDecisionTest, AProcessThatCannotBeToldAliveOrGoneIsWaitedOutNeitherForgottenNorSignalled) {
  const WorkerRecord r = Sample();
  for (const bool external : {false, true}) {
    const AdoptDecision d =
        DecideAdoption(r, r.spec_hash, 1, devices::Liveness::kUnknown, WorkerInfoFacts{1, r.pid}, external);
    EXPECT_EQ(d.action, AdoptAction::kWait) << external;
    EXPECT_NE(d.reason.find("cannot be read"), std::string::npos) << d.reason;
  }
  EXPECT_EQ(DecideAdoption(r, std::nullopt, 1, devices::Liveness::kUnknown, std::nullopt).action, AdoptAction::kWait);
  EXPECT_STREQ(AdoptActionName(AdoptAction::kWait), "wait");
}

TEST(AdoptionDecisionTest, OursButNotMatchingIsStopped) {
  const WorkerRecord r = Sample();
  const WorkerInfoFacts answer{1, r.pid};
  auto action = [&](const WorkerRecord& rec, std::optional<std::string> hash, int version,
                    std::optional<WorkerInfoFacts> info) { return DecideAdoption(rec, hash, version, devices::Liveness::kAlive, info).action; };
  EXPECT_EQ(action(r, std::nullopt, 1, answer), AdoptAction::kStop);  // placement gone or not admitted
  EXPECT_EQ(action(r, SpecHash({"--ctx", "8192"}), 1, answer), AdoptAction::kStop);  // config changed
  EXPECT_EQ(action(r, r.spec_hash, 2, WorkerInfoFacts{2, r.pid}), AdoptAction::kStop);  // started for version 1
  WorkerRecord loading = r;
  loading.port = 0;
  EXPECT_EQ(action(loading, r.spec_hash, 1, std::nullopt), AdoptAction::kStop);
  EXPECT_EQ(action(r, r.spec_hash, 1, std::nullopt), AdoptAction::kStop);  // no answer with the secret
  EXPECT_EQ(action(r, r.spec_hash, 1, WorkerInfoFacts{1, r.pid + 1}), AdoptAction::kStop);  // another process's port
  EXPECT_EQ(action(r, r.spec_hash, 1, WorkerInfoFacts{2, r.pid}), AdoptAction::kStop);  // it speaks another version
  EXPECT_FALSE(DecideAdoption(r, SpecHash({"x"}), 1, devices::Liveness::kAlive, answer).reason.empty());
}

// An external server (started from the config's command) is stopped, not
// adopted: nothing it answers could prove it is the one recorded, and the
// gateway never asks it anything with the workers' secret (Judge).
TEST(AdoptionDecisionTest, AnExternalServerIsStoppedNotAdopted) {
  const WorkerRecord r = Sample();
  const AdoptDecision d = DecideAdoption(r, r.spec_hash, 1, devices::Liveness::kAlive, std::nullopt, /*external=*/true);
  EXPECT_EQ(d.action, AdoptAction::kStop);
  EXPECT_NE(d.reason.find("external server"), std::string::npos) << d.reason;
  EXPECT_EQ(DecideAdoption(r, r.spec_hash, 1, devices::Liveness::kGone, std::nullopt, true).action, AdoptAction::kForget);
}

// A wrapper script that does not exec its server, killed with the gateway
// that started it, leaves the server running in its group: forgotten with
// its leader, that ran on beside the server the next gateway started, with
// its device memory. It is stopped, configured or not.
TEST(AdoptionDecisionTest, WhatAnEndedServerLeftInItsGroupIsStoppedNotForgotten) {
  const WorkerRecord r = Sample();
  for (const std::optional<std::string>& hash : {std::optional<std::string>(r.spec_hash), std::optional<std::string>()}) {
    const AdoptDecision d = DecideAdoption(r, hash, 1, devices::Liveness::kGone, std::nullopt, true, /*orphans=*/2);
    EXPECT_EQ(d.action, AdoptAction::kStop);
    EXPECT_TRUE(d.leader_gone);
    EXPECT_NE(d.reason.find("2 processes"), std::string::npos) << d.reason;
  }
  const AdoptDecision gone = DecideAdoption(r, r.spec_hash, 1, devices::Liveness::kGone, std::nullopt, true, 0);
  EXPECT_EQ(gone.action, AdoptAction::kForget);
  EXPECT_FALSE(gone.leader_gone);
  EXPECT_FALSE(DecideAdoption(r, r.spec_hash, 1, devices::Liveness::kAlive, std::nullopt, true, 1).leader_gone)
      << "a leader still there is stopped through itself";
  // /proc cannot tell (no descriptor left): waited out through its group, neither forgotten nor signalled.
  const AdoptDecision unknown = DecideAdoption(r, r.spec_hash, 1, devices::Liveness::kGone, std::nullopt, true, std::nullopt);
  EXPECT_EQ(unknown.action, AdoptAction::kWait);
  EXPECT_TRUE(unknown.leader_gone);
}

class WorkerSecretTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* s = std::getenv(kWorkerSecretEnv)) saved_ = s;
    unsetenv(kWorkerSecretEnv);
  }
  void TearDown() override {
    if (saved_) setenv(kWorkerSecretEnv, saved_->c_str(), 1);
  }
  std::optional<std::string> saved_;
};

TEST_F(WorkerSecretTest, CreatedOncePrivateAndReused) {
  TempDir d;
  auto first = WorkerSecretFor(d.path);
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_GE(first->size(), 32u);
  struct stat st {};
  ASSERT_EQ(::stat((d.path + "/worker.secret").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto again = WorkerSecretFor(d.path);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *first);
}

TEST_F(WorkerSecretTest, TheEnvironmentWinsAndIsNotWritten) {
  TempDir d;
  setenv(kWorkerSecretEnv, "0123456789abcdef-from-env", 1);
  auto s = WorkerSecretFor(d.path);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, "0123456789abcdef-from-env");
  EXPECT_FALSE(fs::exists(d.path + "/worker.secret"));
}

TEST_F(WorkerSecretTest, AFileOthersCanReadIsReplaced) {
  TempDir d;
  const std::string path = d.path + "/worker.secret";
  std::ofstream(path) << "0123456789abcdef0123456789abcdef\n";
  ::chmod(path.c_str(), 0644);
  auto s = WorkerSecretFor(d.path);
  ASSERT_TRUE(s.ok());
  EXPECT_NE(*s, "0123456789abcdef0123456789abcdef");
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

// A FIFO under the name (planted, or left by a mistake) is replaced, not
// waited on: the open blocked until a writer came, and the gateway never started.
TEST_F(WorkerSecretTest, AFifoUnderItsNameIsReplacedNotWaitedOn) {
  TempDir d;
  const std::string path = d.path + "/worker.secret";
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  auto s = std::async(std::launch::async, [&] { return WorkerSecretFor(d.path); });
  if (s.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    const int w = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);  // (a writer lets it go, and the test end)
    if (w >= 0) ::close(w);
    s.wait();
    FAIL() << "blocked on the FIFO";
  }
  auto secret = s.get();
  ASSERT_TRUE(secret.ok()) << secret.status().message();
  struct stat st {};
  ASSERT_EQ(::lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
}

// A process in its own group, as a worker is.
// A `sleep 30` leading its own group; `deaf`: it ignores SIGTERM (only
// SIGKILL ends it).
pid_t SpawnSleeper(bool deaf = false) {
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    if (deaf) signal(SIGTERM, SIG_IGN);  // (kept across exec)
    execlp("sleep", "sleep", "30", static_cast<char*>(nullptr));
    _exit(127);
  }
  setpgid(pid, pid);
  // Deaf only once it runs `sleep` (a SIGTERM before would end it).
  for (int i = 0; deaf && i < 5000 && CommandLine(pid) != std::vector<std::string>{"sleep", "30"}; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return pid;
}

// Whether child `pid` (a SpawnSleeper) ends within `within`: a kill takes
// effect when the process next runs, so one is looked for a while, not once.
// It is reaped either way (killed with its group first when it ran on).
bool EndsWithin(pid_t pid, std::chrono::milliseconds within) {
  int status = 0;
  const auto until = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < until) {
    if (waitpid(pid, &status, WNOHANG) == pid) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  kill(-pid, SIGKILL);
  waitpid(pid, &status, 0);
  return false;
}

// A recorded process is this placement's worker when its command line names
// the key's port file in this state directory (however the directory is
// spelled); one exiting, with no command line left, may be: taken for
// another process, its record was forgotten and a second worker started
// beside one whose GPU memory a driver's teardown still held.
TEST(ProcessGroupTest, AWorkersCommandLineNamesItsPortFileAndAnExitingOneHasNone) {
  const fs::path dir = fs::temp_directory_path() / ("spillway-cmdline-" + std::to_string(::getpid()));
  fs::create_directories(dir / "run");
  const std::string run = (dir / "run").string();
  const std::vector<std::string> worker = {"spillway-worker", "--model", "m.gguf", "--port-file", run + "/chat.0.port"};
  EXPECT_EQ(MatchWorkerCommandLine(worker, "chat.0", run), CommandLineMatch::kNamesIt);
  EXPECT_EQ(MatchWorkerCommandLine({"w", "--port-file", (dir / "run/../run/chat.0.port").string()}, "chat.0", run + "/"),
            CommandLineMatch::kNamesIt);
  EXPECT_EQ(MatchWorkerCommandLine(worker, "chat.1", run), CommandLineMatch::kOther) << "another placement's";
  EXPECT_EQ(MatchWorkerCommandLine(worker, "chat.0", dir.string()), CommandLineMatch::kOther) << "another directory's";
  EXPECT_EQ(MatchWorkerCommandLine({"sleep", "30"}, "chat.0", run), CommandLineMatch::kOther);
  EXPECT_EQ(MatchWorkerCommandLine({}, "chat.0", run), CommandLineMatch::kGone);
  fs::remove_all(dir);
}

TEST(ProcessGroupTest, StopsAProcessThatIsNotTreatedAsAChild) {
  const pid_t pid = SpawnSleeper();
  const WorkerPid p{pid, devices::ProcessStartTime(pid), /*child=*/false};
  int status = 0;
  EXPECT_FALSE(Ended(p, &status));
  EXPECT_TRUE(StopGroup(p, 2000));  // seen ended as a zombie, through /proc
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
}

TEST(ProcessGroupTest, AnotherStartTimeIsAnotherProcessAndIsNotSignalled) {
  const pid_t pid = SpawnSleeper();
  const WorkerPid stranger{pid, devices::ProcessStartTime(pid) + 1, /*child=*/false};
  int status = 0;
  EXPECT_TRUE(Ended(stranger, &status));
  EXPECT_TRUE(StopGroup(stranger, 0));
  EXPECT_FALSE(EndsWithin(pid, std::chrono::milliseconds(150)))
      << "a process with the recorded pid but another start time was signalled";
}

// With no file descriptor left (a connection surge), /proc cannot be read:
// an adopted worker that runs on is neither taken for ended (its record was
// dropped and a second worker started beside it) nor signalled.
TEST(ProcessGroupTest, AnAdoptedProcessWhoseProcEntryCannotBeReadIsNotTakenForEnded) {
  const pid_t pid = SpawnSleeper();
  const WorkerPid adopted{pid, devices::ProcessStartTime(pid), /*child=*/false};
  ASSERT_NE(adopted.start_time, 0u);
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit few = saved;
  few.rlim_cur = 64;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &few), 0);
  std::vector<int> taken;  // every descriptor left: an open fails (EMFILE)
  for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) taken.push_back(fd);
  const int err = errno;
  int status = 0;
  const devices::Liveness seen = devices::ProcessLiveness(pid, adopted.start_time);
  const bool ended = Ended(adopted, &status);
  const bool alive = devices::ProcessAlive(pid, adopted.start_time);
  SignalGroup(adopted, SIGKILL);  // (a gateway stopping: one it cannot tell is not signalled)
  for (int fd : taken) ::close(fd);
  setrlimit(RLIMIT_NOFILE, &saved);
  ASSERT_EQ(err, EMFILE);
  EXPECT_EQ(seen, devices::Liveness::kUnknown);
  EXPECT_FALSE(ended) << "a running worker was taken for ended for want of a descriptor";
  EXPECT_FALSE(alive) << "one that cannot be checked is not signalled";
  // (A kill takes effect when the process next runs: give it the time to show.)
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(devices::ProcessLiveness(pid, adopted.start_time), devices::Liveness::kAlive) << "signalled";
  kill(-pid, SIGKILL);
  waitpid(pid, &status, 0);
  EXPECT_EQ(devices::ProcessLiveness(pid, adopted.start_time), devices::Liveness::kGone);
}

// A server that ends while what it started runs on in its group (a
// launcher's engine): that is killed with it, before the leader is reaped.
// Nothing signalled it once the leader was gone: it kept its memory and
// port past a crash, and past a stop.
TEST(ProcessGroupTest, WhatAnEndedChildLeftInItsGroupEndsWithIt) {
  const std::string pid_file =
      (std::filesystem::temp_directory_path() / ("spillway-group-" + std::to_string(getpid()))).string();
  std::filesystem::remove(pid_file);
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    const std::string script = "sleep 30 & echo $! > " + pid_file + "; exit 3";
    execlp("sh", "sh", "-c", script.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  setpgid(pid, pid);
  pid_t left = 0;
  for (int i = 0; i < 5000 && left == 0; ++i) {
    std::ifstream f(pid_file);
    if (!(f >> left)) left = 0;
    if (left == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_GT(left, 0);
  const WorkerPid p{pid, devices::ProcessStartTime(pid), /*child=*/true};
  int status = 0;
  ASSERT_TRUE(WaitEnded(p, std::chrono::steady_clock::now() + std::chrono::seconds(10)));
  bool gone = false;
  for (int i = 0; i < 2000 && !gone; ++i) {
    gone = devices::ProcessLiveness(left, 0) == devices::Liveness::kGone;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(gone) << "what it left in its group runs on";
  if (!gone) kill(left, SIGKILL);
  std::filesystem::remove(pid_file);
  (void)status;
}

// What a group's leader left there once it has ended and is reaped (a
// wrapper script's server, after the gateway that started it was killed):
// found by its group, session and start time, and stopped through it.
TEST(ProcessGroupTest, WhatAnEndedLeaderLeftInItsGroupIsFoundAndStopped) {
  const std::string pid_file =
      (std::filesystem::temp_directory_path() / ("spillway-orphans-" + std::to_string(getpid()))).string();
  std::filesystem::remove(pid_file);
  const pid_t pid = fork();
  if (pid == 0) {
    setsid();  // as the supervisor spawns it: its own session and group
    const std::string script = "sleep 30 & echo $! > " + pid_file + "; sleep 0.2; exit 3";
    execlp("sh", "sh", "-c", script.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  const uint64_t started = devices::ProcessStartTime(pid);
  ASSERT_NE(started, 0u);
  pid_t session = 0;  // (once its setsid has run)
  for (int i = 0; i < 2000 && session != pid; ++i) {
    session = ::getsid(pid);
    if (session != pid) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(session, pid);
  const WorkerPid leader{pid, started, /*child=*/false, /*leader_gone=*/true, session};
  const std::optional<std::vector<pid_t>> none = std::vector<pid_t>{};
  EXPECT_EQ(OrphanedGroup(leader), none) << "while the leader runs, nothing is orphaned";
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);  // ended and reaped: its pid is held by its group alone
  pid_t left = 0;
  {
    std::ifstream f(pid_file);
    f >> left;
  }
  ASSERT_GT(left, 0);
  EXPECT_EQ(OrphanedGroup(leader), std::optional<std::vector<pid_t>>(std::vector<pid_t>{left}));
  WorkerPid elsewhere = leader;
  elsewhere.session = session + 1;
  EXPECT_EQ(OrphanedGroup(elsewhere), none) << "another session's group is not its";
  elsewhere.session = 0;
  EXPECT_EQ(OrphanedGroup(elsewhere), none) << "without a recorded session, no group is its";
  WorkerPid later = leader;
  later.start_time = devices::ProcessStartTime(left) + 1;
  EXPECT_EQ(OrphanedGroup(later), none) << "nothing started before the leader is its";
  EXPECT_FALSE(Ended(leader, &status));
  EXPECT_TRUE(StopGroup(leader, 2000));
  EXPECT_EQ(OrphanedGroup(leader), none);
  EXPECT_EQ(devices::ProcessLiveness(left, 0), devices::Liveness::kGone);
  std::filesystem::remove(pid_file);
  // A pid that names a live process is not an ended leader: its group is not looked at, nor signalled.
  const pid_t live = SpawnSleeper();
  const WorkerPid not_gone{live, devices::ProcessStartTime(live) + 1, false, true, ::getsid(0)};
  EXPECT_EQ(OrphanedGroup(not_gone), none);
  SignalGroup(not_gone, SIGKILL);
  EXPECT_FALSE(EndsWithin(live, std::chrono::milliseconds(150))) << "signalled";
}

TEST(ProcessGroupTest, AChildIsReapedWithItsStatus) {
  const pid_t pid = SpawnSleeper();
  const WorkerPid p{pid, devices::ProcessStartTime(pid), /*child=*/true};
  EXPECT_TRUE(StopGroup(p, 2000));
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, WNOHANG), -1);  // reaped already
  EXPECT_EQ(DescribeEnd(-1).rfind("exited (adopted", 0), 0u);
}

// Waiting for a process's end is bounded, children included (a SIGKILLed
// child stuck in the kernel once hung a gateway's stop in waitpid), and
// ends as soon as the process does.
TEST(ProcessGroupTest, WaitingForAnEndIsBoundedAndEndsWithIt) {
  const pid_t pid = SpawnSleeper();
  for (const bool child : {true, false}) {
    const WorkerPid p{pid, devices::ProcessStartTime(pid), child};
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_FALSE(WaitEnded(p, t0 + std::chrono::milliseconds(150)));
    EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(150));
  }
  const std::vector<std::string> argv = CommandLine(pid);
  ASSERT_EQ(argv.size(), 2u);
  EXPECT_EQ(argv[0], "sleep");
  EXPECT_EQ(argv[1], "30");
  const WorkerPid p{pid, devices::ProcessStartTime(pid), /*child=*/true};
  std::thread killer([pid] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    kill(pid, SIGKILL);
  });
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(WaitEnded(p, t0 + std::chrono::seconds(20)));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5)) << "woken by its end, not by the bound";
  killer.join();
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, WNOHANG), -1);  // reaped
  EXPECT_TRUE(Ended(p, &status)) << "a child reaped already counts as ended";
}

// Workers that ignore SIGTERM, stopped together (a gateway's SIGTERM, the
// previous gateway's workers at adoption): one grace period for all, then
// SIGKILL, not one grace period after another.
TEST(ProcessGroupTest, GroupsStoppedTogetherShareOneGracePeriod) {
  std::vector<GroupStop> groups;
  for (int i = 0; i < 3; ++i) {
    const pid_t pid = SpawnSleeper(/*deaf=*/true);
    groups.push_back({{pid, devices::ProcessStartTime(pid), /*child=*/i != 0}, SIGTERM});
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<bool> ended = StopGroups(groups, 500);
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(ended, std::vector<bool>(3, true));
  EXPECT_GE(took, std::chrono::milliseconds(500)) << "SIGTERM was not given its grace";
  EXPECT_LT(took, std::chrono::milliseconds(1400)) << "one grace period after another (1500 ms)";
  int status = 0;
  waitpid(groups[0].pid.pid, &status, 0);  // the one not treated as a child
}

TEST(SupervisorClaimTest, OneSupervisorPerStateDirectory) {
  TempDir d;
  SystemClock clock;
  Supervisor first("/bin/false", d.path, clock), second("/bin/false", d.path, clock);
  ASSERT_TRUE(first.Claim().ok());
  EXPECT_TRUE(first.Claim().ok());  // claiming again is a no-op
  const Status refused = second.Claim();
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("pid " + std::to_string(getpid())), std::string::npos) << refused.message();
}

// Stop waits out a worker that ignores SIGTERM (its grace period) without
// the supervisor's lock: the I/O threads' calls for ports and views answer
// meanwhile.
TEST(SupervisorStopTest, AWorkerSlowToDieDoesNotHoldUpViews) {
  TempDir d;
  SystemClock clock;
  Supervisor sup("/bin/false", d.path, clock);
  WorkerSpec spec;
  spec.key = "slow.0";
  spec.command = {"sh", "-c", "trap '' TERM; exec sleep 30"};  // SIGTERM ignored, through the exec too
  sup.Add(spec);
  sup.Start();
  const auto pid = [&] {
    for (const auto& w : sup.Snapshot()) return w.pid;
    return pid_t{0};
  };
  const auto t0 = std::chrono::steady_clock::now();
  while (pid() <= 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GT(pid(), 0);
  // Until sh has run its trap and exec'd sleep, a SIGTERM still ends it (the
  // test then failed under load: Stop had nothing to wait out).
  auto comm = [&] {
    std::ifstream in("/proc/" + std::to_string(pid()) + "/comm");
    std::string name;
    std::getline(in, name);
    return name;
  };
  while (comm() != "sleep" && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(comm(), "sleep");
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    sup.Stop(1500);
    stopped = true;
  });
  // Once Stop has signalled it (the view says stopped), views answer at once while it waits.
  while (!stopped && pid() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const auto before = std::chrono::steady_clock::now();
  (void)sup.Snapshot();
  (void)sup.ReadyPort("slow.0");
  const auto took = std::chrono::steady_clock::now() - before;
  EXPECT_FALSE(stopped.load()) << "Stop ended before its grace period: the test proves nothing";
  EXPECT_LT(took, std::chrono::milliseconds(500));
  stopper.join();
}

}  // namespace
}  // namespace spillway::upstream
