#include "upstream/supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <spawn.h>
#include <unistd.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "api/http_client.h"
#include "common/json_log.h"
#include "common/private_files.h"
#include "common/run_capture.h"
#include "common/secret.h"
#include "common/survive.h"
#include "common/thread_name.h"
#include "common/utf8.h"
#include "devices/sim_ledger.h"
#include "devices/telemetry.h"
#include "protocol/worker_protocol.h"
#include "upstream/log_rotation.h"
#include "upstream/worker_secret.h"

extern char** environ;

namespace spillway::upstream {

namespace fs = std::filesystem;

const char* WorkerStateName(WorkerState s) {
  switch (s) {
    case WorkerState::kStarting: return "starting";
    case WorkerState::kReady: return "ready";
    case WorkerState::kBackoff: return "backoff";
    case WorkerState::kStopped: return "stopped";
  }
  return "unknown";
}

namespace {

// The kept secret (worker_secret.h); one for this process only when it
// cannot be kept, which costs adoption after a crash, not service.
std::string SecretForWorkers(const std::string& run_dir) {
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  auto kept = WorkerSecretFor(run_dir);
  if (kept.ok()) return *kept;
  std::fprintf(stderr, "spillway: %s; workers will not be adopted after a crash\n", kept.status().message().c_str());
  return RandomHex(32);
}

// The environment a worker needs, and nothing of the gateway's secrets.
std::vector<std::string> WorkerEnvironment(const std::string& secret) {
  std::vector<std::string> env = HelperEnvironment();
  // CUDA numbers devices in PCI bus order, as NVML does, so that cuda:N is
  // the GPU the gateway observes (CUDA's default puts the fastest first).
  // Set by the operator: left as it is.
  if (std::none_of(env.begin(), env.end(), [](const std::string& e) { return e.rfind("CUDA_DEVICE_ORDER=", 0) == 0; })) {
    env.emplace_back("CUDA_DEVICE_ORDER=PCI_BUS_ID");
  }
  if (!secret.empty()) env.push_back(std::string(kWorkerSecretEnv) + "=" + secret);
  return env;
}

std::string Expand(std::string s, const std::string& name, const std::string& value) {
  for (size_t at = s.find(name); at != std::string::npos; at = s.find(name, at + value.size())) s.replace(at, name.size(), value);
  return s;
}

}  // namespace

Supervisor::Supervisor(std::string worker_binary, std::string state_dir, const Clock& clock)
    : binary_(std::move(worker_binary)),
      state_dir_(std::move(state_dir)),
      run_dir_(state_dir_ + "/run"),
      secret_(SecretForWorkers(run_dir_)),
      clock_(clock) {
  std::error_code ec;
  fs::create_directories(state_dir_ + "/logs", ec);
}

Supervisor::~Supervisor() {
  Stop();
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

void Supervisor::Add(WorkerSpec spec) {
  Held lk(*this);
  Worker w;
  w.view.key = spec.key;
  w.view.log_path = state_dir_ + "/logs/" + spec.key + ".log";
  w.view.on_demand = spec.on_demand;
  w.view.start_timeout_ms = spec.start_timeout_ms;
  ::chmod(w.view.log_path.c_str(), kPrivateFileMode);  // one an older version made 0644
  w.spec_hash = SpecHashOf(spec);
  w.spec = std::move(spec);
  workers_[w.view.key] = std::move(w);
}

std::string TieBeside(const std::string& worker_binary) {
  const fs::path dir = fs::path(worker_binary).parent_path();
  return dir.empty() ? "" : (fs::absolute(dir) / "spillway-tie").string();
}

std::string SpecHashOf(const WorkerSpec& spec) {
  std::vector<std::string> hashed = spec.external() ? spec.command : spec.args;
  if (spec.nice != 0) hashed.insert(hashed.end(), {"--nice", std::to_string(spec.nice)});  // (unset: as before it counted)
  return SpecHash(hashed);
}

void Supervisor::Start() {
  // Before anything is spawned: never two workers for one placement.
  RunSurviving("spillway: adopting the workers of the previous gateway", [this] { Adopt(); });
  thread_ = std::thread([this] { Loop(); });
}

// How much nicer than this gateway a process must start to run at `nice` (never less nice than the gateway).
static int NicenessIncrement(int nice) {
  errno = 0;
  const int own = getpriority(PRIO_PROCESS, 0);
  return nice - (errno ? 0 : own);
}

std::vector<std::string> Supervisor::Argv(Worker& w, const std::string& port_file, const std::string& load_file) {
  if (w.spec.external()) {
    // Its port is chosen here and known at once; ready is what its health path says.
    // (A port free now, for the server's ${PORT}: another process may take it first; that start then
    // fails and is retried after a backoff with another port.)
    w.view.port = http::FreeLoopbackPort();
    std::vector<std::string> args;
    // Never adopted (a later gateway stops it), so tied to this one: its
    // whole group gets its stop signal when the gateway dies, killed with -9
    // included, through spillway-tie beside the worker binary (it leads the
    // group; a wrapper script that does not exec its server left the server
    // running with util-linux's setpriv, which ties only the process it
    // execs: setpriv is what stands in where spillway-tie is missing). Else
    // it held its device memory until some later gateway came.
    // (spillway-tie first: it reads the gateway's death from its parent.)
    const std::string tie = TieBeside(binary_);
    static const bool setpriv = ::access("/usr/bin/setpriv", X_OK) == 0;
    if (!tie.empty() && ::access(tie.c_str(), X_OK) == 0) {
      args = {tie, std::to_string(::getpid()), std::to_string(w.spec.stop_signal), "--"};
    } else {
      static std::once_flag said;
      std::call_once(said, [&] {
        std::fprintf(stderr,
                     "spillway: no spillway-tie beside the worker binary (%s): external servers are tied to the "
                     "gateway %s, not what they start (a wrapper script's server outlives a gateway killed with -9)\n",
                     binary_.c_str(), setpriv ? "by util-linux's setpriv" : "by nothing (no setpriv either)");
      });
      if (const char* name = sigabbrev_np(w.spec.stop_signal); setpriv && name) {
        args = {"/usr/bin/setpriv", "--pdeathsig", name};
      }
    }
    // Niceness before its first instruction (and so for every thread and
    // process it starts): through coreutils' nice, which execs the rest.
    if (const int more = NicenessIncrement(w.spec.nice); more > 0) args.insert(args.end(), {"nice", "-n", std::to_string(more)});
    for (const auto& a : w.spec.command) args.push_back(Expand(a, "${PORT}", std::to_string(w.view.port)));
    return args;
  }
  w.view.port = 0;
  std::vector<std::string> args = {binary_};
  args.insert(args.end(), w.spec.args.begin(), w.spec.args.end());
  // No --parent-pid: a worker outlives a crash of the gateway, to be adopted
  // by the next one; the orphan rule ends it if none comes.
  args.insert(args.end(), {"--listen", "127.0.0.1:0", "--port-file", port_file, "--load-progress-file", load_file,
                           "--orphan-timeout", std::to_string(orphan_timeout_s_)});
  if (w.spec.nice > 0) args.insert(args.end(), {"--nice", std::to_string(w.spec.nice)});
  return args;
}

void Supervisor::Spawn(Worker& w) {
  ++w.view.spawn_attempts;
  w.view.released_idle = false;  // (loading again: a crash from now restarts it by its configuration)
  struct stat log_stat {};
  w.log_from = ::stat(w.view.log_path.c_str(), &log_stat) == 0 ? static_cast<int64_t>(log_stat.st_size) : 0;
  const std::string port_file = run_dir_ + "/" + w.spec.key + ".port";
  const std::string load_file = run_dir_ + "/" + w.spec.key + ".load";
  std::error_code ec;
  fs::remove(port_file, ec);
  fs::remove(load_file, ec);
  w.view.load_bytes = w.view.load_total_bytes = 0;
  w.view.load_progress_ms = 0;
  std::vector<std::string> args = Argv(w, port_file, load_file);
  if (w.spec.external() && w.view.port == 0) {
    Exited(w, "spawn failed: no free loopback port");
    return;
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, w.view.log_path.c_str(), kPrivateAppendFlags, kPrivateFileMode);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  // Not the gateway's stdin either (a terminal, a harness's pipe): a worker
  // outlives the gateway, and one reading a terminal it is in the background
  // of would be stopped (SIGTTIN).
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  // Nothing else of the gateway's: a worker outlives a crash of the gateway,
  // and one that held the gateway's listening socket (Asio's are not
  // close-on-exec) would leave clients of the dead gateway queued on it
  // instead of refused; one holding a client connection would keep it open.
  posix_spawn_file_actions_addclosefrom_np(&fa, 3);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Its signals as a fresh process's: the gateway ignores SIGPIPE, and one
  // started with `&` from a script ignores SIGINT and SIGQUIT, which an
  // external server (restarted by the gateway) inherited.
  //
  // Its own session, so its own process group too (setsid): its group id and
  // its session id are its pid, which every pid namespace it is seen from
  // can read. What it leaves in its group is told by both (OrphanedGroup).
  // The gateway's session could not serve: where the gateway runs in a pid
  // namespace whose session leader is outside it (a container, a CI
  // sandbox), its session reads as 0, and a wrapper's server was left
  // running. No terminal's hangup or job control reaches it either.
  ResetSignalsOnSpawn(&attr, POSIX_SPAWN_SETSID);
  // An external server is not ours to trust with the workers' secret.
  std::vector<std::string> env = WorkerEnvironment(w.spec.external() ? "" : secret_);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = 0;
  const int rc = w.spec.external() ? posix_spawnp(&pid, args[0].c_str(), &fa, &attr, argv.data(), envp.data())
                                   : posix_spawn(&pid, binary_.c_str(), &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    Exited(w, "spawn failed: " + std::string(std::strerror(rc)));
    return;
  }
  w.view.pid = pid;
  ++w.view.starts;
  w.view.adopted = false;
  w.start_time = devices::ProcessStartTime(pid);  // a zombie until reaped, so readable even if it died at once
  w.view.state = WorkerState::kStarting;
  w.spawned_ms = clock_.NowMs();
  w.next_health_ms = 0;  // (a previous process's schedule)
  w.view.starting_since_ms = w.spawned_ms;
  w.health_failures = 0;
  WriteRecord(w);  // port 0: a gateway crashing now finds it loading, and stops it
}

namespace {

// Where Exited leaves a worker: in backoff, or stopped until a request wants it again.
bool DownAfterExit(WorkerState s) { return s == WorkerState::kBackoff || s == WorkerState::kStopped; }

// The last non-empty line a worker wrote to its log past `written_from`
// (the log's size when it was spawned; the whole log when it has been
// rotated since): its own last word (the worker ends a failed start with a
// structured line naming the phase and reason), never an earlier process's.
std::string LastLogLine(const std::string& path, int64_t written_from) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return "";
  std::string tail(4096, '\0');
  std::fseek(f, 0, SEEK_END);
  const long size = std::ftell(f);
  const long mine = written_from <= size ? static_cast<long>(written_from) : 0;
  const long from = std::max(mine, size > 4096 ? size - 4096 : 0L);
  std::fseek(f, from, SEEK_SET);
  tail.resize(std::fread(tail.data(), 1, tail.size(), f));
  std::fclose(f);
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == '\r' || tail.back() == ' ')) tail.pop_back();
  const size_t nl = tail.rfind('\n');
  std::string line = nl == std::string::npos ? tail : tail.substr(nl + 1);
  if (line.size() > 500) line = line.substr(0, 500) + "...";
  // (Cut anywhere, and a process writes what bytes it likes: the line goes
  // into JSON answers, events and the journal.)
  return ValidUtf8(line);
}

}  // namespace

void Supervisor::Exited(Worker& w, const std::string& why, bool by_itself, bool log_says_why) {
  if (!w.dying) memory_freed_ = true;  // (a killed one's memory is free once Poll reaps it)
  w.view.last_exit = why;
  w.view.last_error = log_says_why ? LastLogLine(w.view.log_path, w.log_from) : "";
  w.view.pid = 0;
  w.view.port = 0;
  w.view.adopted = false;
  w.view.info.reset();  // the next process reports its own
  // A killed process that lingers (stuck in the driver) keeps its record, so
  // that a gateway started meanwhile knows it holds memory (DyingEnded
  // removes it once it has ended).
  if (!w.dying) RemoveRecord(w.spec.key);
  // An on-demand worker waits, stopped, for the next request that wants it
  // (Demand), which starts it no sooner than its backoff allows: started
  // again for nobody, a model that cannot load would be reloaded every 30 s
  // for good, unloading other services' models to make room each time.
  const bool wait_for_demand = w.spec.on_demand && !w.spec.restart_on_exit;
  w.view.state = wait_for_demand ? WorkerState::kStopped : WorkerState::kBackoff;
  const int64_t now = clock_.NowMs();
  w.view.down_since_ms = now;
  const bool was_serving = w.ready_since_ms != 0;
  const bool served_long = was_serving && now - w.ready_since_ms > kCrashWindowMs;
  if (served_long) w.backoff_level = 0;
  // Ended by its own hand soon after it became ready: it crashes at its first
  // requests, and would otherwise be reloaded every 2 s for good, never shown
  // as failing. Killed from outside (SIGKILL: the OOM killer, an operator)
  // or by the supervisor, it is wanted back soon.
  if (was_serving) w.view.crashes = by_itself && !served_long ? w.view.crashes + 1 : 0;
  const int64_t cap = was_serving && w.view.crashes == 0 ? 2000 : 30000;
  const int64_t delay = std::min<int64_t>(cap, 500LL << std::min(w.backoff_level, 6));
  ++w.backoff_level;
  w.view.next_start_ms = now + delay;
  w.view.failed_starts = was_serving ? 0 : w.view.failed_starts + 1;
  // One line per failure in the gateway's own log, with the worker's reason.
  const std::string what = !was_serving         ? "failed to start"
                           : w.view.crash_looping() ? "crashed " + std::to_string(w.view.crashes) +
                                                          " times in a row, each within " +
                                                          std::to_string(kCrashWindowMs / 1000) + " s of becoming ready"
                                                    : "exited";
  char text[1024];
  std::snprintf(text, sizeof text, "spillway: worker %s %s (%s)%s; %s %.1f s", w.spec.key.c_str(), what.c_str(),
                why.c_str(),
                w.view.last_error.empty() ? "" : (": " + w.view.last_error).c_str(),
                wait_for_demand ? "started again when a request wants it, not within" : "next start in",
                static_cast<double>(delay) / 1000);
  LogEvent(was_serving ? "worker.exited" : "worker.start_failed",
           nlohmann::json{{"worker", w.spec.key},
                          {"reason", why},
                          {"worker_said", w.view.last_error},
                          {"failed_starts", w.view.failed_starts},
                          {"crashes", w.view.crashes},
                          {"next_start_s", static_cast<double>(delay) / 1000}}
               .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
           text);
  w.ready_since_ms = 0;
  ++w.view.restarts;
  ++restarts_;
}

void Supervisor::Kill(Worker& w, const std::string& why) {
  const WorkerPid p = Process(w);
  int status = 0;
  if (!Ended(p, &status)) {
    SignalGroup(p, SIGKILL);  // (an adopted pid that /proc cannot tell is not signalled: it may be someone else's now)
    w.dying = p;
    w.view.exiting = true;
  }
  Exited(w, why);
}

bool Supervisor::DyingEnded(Worker& w) {
  if (!w.dying) return true;
  int status = 0;
  if (!Ended(*w.dying, &status)) return false;
  w.dying.reset();
  w.view.exiting = false;
  memory_freed_ = true;
  if (w.view.pid <= 0) RemoveRecord(w.spec.key);  // (a previous gateway's worker kept its record until now)
  return true;
}

bool Supervisor::ReleasedEnded(Worker& w) {
  int status = 0;
  if (!Ended(Process(w), &status)) return false;
  w.view.pid = 0;
  w.view.adopted = false;
  RemoveRecord(w.spec.key);
  memory_freed_ = true;
  return true;
}

void Supervisor::Poll(Worker& w, bool may_start) {
  const int64_t now = clock_.NowMs();
  if (!DyingEnded(w)) return;  // SIGKILL sent: nothing else until it has ended
  if (w.view.pid > 0 && !w.view.adopted && w.start_time == 0) {
    // Its start time could not be read when it was spawned (out of file
    // descriptors): its record waited for it. A child's pid is not reused
    // before it is reaped, so reading it now names the same process.
    if ((w.start_time = devices::ProcessStartTime(w.view.pid)) != 0) WriteRecord(w);
  }
  if (w.view.state == WorkerState::kBackoff) {
    if (may_start && now >= w.view.next_start_ms) Spawn(w);
    return;
  }
  if (w.view.pid <= 0) return;
  int status = 0;
  if (w.view.state == WorkerState::kStopped) {  // released: reap it, SIGKILL when it lingers
    if (!ReleasedEnded(w) && now >= w.kill_at_ms) SignalGroup(Process(w), SIGKILL);
    return;
  }
  if (Ended(Process(w), &status)) {
    // (-1: an adopted process, whose status is not ours to read: not counted
    // as a crash. SIGKILL, which Spillway did not send here: the kernel's
    // OOM killer, or a person.)
    const bool killed = status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    Exited(w, DescribeEnd(status), status != -1 && !killed, /*log_says_why=*/!killed);
    return;
  }
  if (w.view.state == WorkerState::kStarting) {
    if (w.spec.external() && w.spec.start_timeout_ms > 0 && now - w.spawned_ms >= w.spec.start_timeout_ms) {
      char why[96];
      std::snprintf(why, sizeof why, "its health path did not answer within %.0f s (start_timeout_s)",
                    static_cast<double>(w.spec.start_timeout_ms) / 1000);
      Kill(w, why);
    } else if (w.spec.external()) {
      // Ready once its health path answers (Round asks).
    } else if (w.view.port != 0) {
      // Listening; ready once Round() has read its /info (and checked its protocol).
      if (now - w.listening_ms >= kInfoTimeoutMs) {
        char why[128];
        std::snprintf(why, sizeof why, "listened but its %s did not answer within %.0f s",
                      std::string(protocol::kInfoPath).c_str(), static_cast<double>(kInfoTimeoutMs) / 1000);
        Kill(w, why);
      }
    } else if (const uint16_t port = PortFromFile(w.spec.key)) {
      w.view.load_bytes = w.view.load_total_bytes;  // all of it
      w.view.port = port;
      w.listening_ms = now;
    } else if (w.spec.start_timeout_ms > 0 &&
               now - std::max(w.spawned_ms, w.view.load_progress_ms) >= w.spec.start_timeout_ms) {
      // A start that hangs holds no request forever: end it and say so. One
      // whose model still loads is not hung (a large model on a slow disk).
      char why[128];
      std::snprintf(why, sizeof why,
                    w.view.load_progress_ms > 0 ? "made no load progress for %.0f s (start_timeout_s)"
                                                : "did not become ready within %.0f s (start_timeout_s)",
                    static_cast<double>(w.spec.start_timeout_ms) / 1000);
      Kill(w, why);
    } else {
      const uint64_t before = w.view.load_bytes;
      ReadLoadProgress(w);
      if (w.view.load_bytes > before) w.view.load_progress_ms = now;
    }
    return;
  }
}

void Supervisor::HealthResult(Worker& w, pid_t pid, bool healthy, bool device_lost) {
  if (w.view.pid != pid || w.view.state != WorkerState::kReady) return;  // it changed meanwhile
  w.health_failures = healthy ? 0 : w.health_failures + 1;
  if (healthy) w.view.failed_starts = 0;  // it started and serves
  if (healthy && clock_.NowMs() - w.ready_since_ms > kCrashWindowMs) {  // and has served a while
    w.view.crashes = 0;
    // (Its end after an idle release counts as no service at all: the level
    // that failed loads left grew over days to 30 s for the next lone one.)
    w.backoff_level = 0;
  }
  if (w.health_failures >= 3 || device_lost) {
    Kill(w, device_lost ? std::string(protocol::kExitDeviceLost) : "unhealthy");
  }
}

void Supervisor::Loop() {
  NameThisThread("sw-supervisor");
  {
    Held lk(*this);
    for (auto& [k, w] : workers_) {
      // Adopted: serving already. A previous gateway's worker that could
      // not be stopped: started once it has ended (Poll).
      if (w.spec.on_demand || w.view.pid > 0 || w.dying) continue;
      try {
        Spawn(w);
      } catch (const std::exception& e) {
        Exited(w, std::string("spawn failed: ") + e.what());  // retried after a backoff
      }
    }
  }
  int64_t next_rotation_ms = 0;
  while (!stop_) {
    // Out of file descriptors, out of memory: logged, tried again next round.
    RunSurviving("spillway: a supervisor round", [this] { Round(); });
    if (clock_.NowMs() >= next_rotation_ms) {
      RunSurviving("spillway: rotating worker logs", [this] { RotateLogs(); });
      next_rotation_ms = clock_.NowMs() + 10000;
    }
    Held lk(*this);
    // While a worker starts, its readiness is looked for every 10 ms: a
    // request waiting for a load (on demand, after an eviction) gets it sooner.
    bool starting = false;
    for (const auto& [k, w] : workers_) starting |= w.view.state == WorkerState::kStarting;
    cv_.wait_for(lk.lock(), std::chrono::milliseconds(starting ? 10 : 50), [&] { return stop_.load() || wake_; });
    wake_ = false;
  }
}

// Every worker's log kept under kWorkerLogMaxBytes (upstream/log_rotation.h).
void Supervisor::RotateLogs() {
  std::vector<std::string> paths;
  {
    Held lk(*this);
    for (const auto& [k, w] : workers_) paths.push_back(w.view.log_path);
  }
  for (const auto& p : paths) {
    if (Status st = RotateIfLarger(p, kWorkerLogMaxBytes); !st.ok()) std::fprintf(stderr, "spillway: %s\n", st.message().c_str());
  }
}

void Supervisor::Round() {
  struct Check {
    std::string key;
    pid_t pid;
    uint16_t port;
    bool info;                 // also refresh its cached /info
    std::string health_path;   // an external server's ("": a worker's own)
  };
  {
    std::vector<Check> checks;
    struct Ready {
      std::string key;
      pid_t pid;
      uint16_t port;
      std::string health_path;  // an external server's, while it starts
    };
    std::vector<Ready> became_ready, listening, probes;
    std::vector<std::string> idle_candidates;
    std::vector<std::pair<std::string, std::string>> exits;
    std::vector<std::tuple<std::string, pid_t, bool>> rss_due;  // key, pid, its whole group (an external server)
    // Restarts due now pass the start gate first (it may read telemetry: no lock held).
    std::vector<std::string> due;
    {
      Held lk(*this);
      for (auto& [k, w] : workers_) {
        // (Not while its killed process lives: its memory is not free yet.)
        if (w.view.state == WorkerState::kBackoff && !w.dying && clock_.NowMs() >= w.view.next_start_ms) {
          due.push_back(k);
        }
      }
    }
    std::map<std::string, Status> refused;
    if (gate_) {
      for (const auto& k : due) {
        Status st = gate_(k);
        if (!st.ok()) refused[k] = st;
      }
    }
    {
      Held lk(*this);
      const int64_t now = clock_.NowMs();
      for (auto& [k, w] : workers_) {
        if (auto it = refused.find(k); it != refused.end()) {
          w.view.last_exit = std::string(kNotAdmitted) + it->second.message();
          // Unavailable: waiting on another start that is about to finish (asked again next round); else no room.
          w.view.next_start_ms = now + (it->second.code() == StatusCode::kUnavailable ? 0 : 1000);
          continue;
        }
        const bool was_ready = w.view.state == WorkerState::kReady;
        const bool was_up = was_ready || w.view.state == WorkerState::kStarting;
        // Only a start that passed the gate above: one that fell due while
        // the gate ran (its backoff ended, or Demand) waits for the next
        // round's gate, so that no start skips the device's admission.
        Poll(w, !gate_ || std::find(due.begin(), due.end(), k) != due.end());
        if (w.spec.external()) {
          if (w.view.state == WorkerState::kStarting && now >= w.next_health_ms) {
            w.next_health_ms = now + kStartProbePeriodMs;
            probes.push_back({k, w.view.pid, w.view.port, w.spec.health_path});
          }
        } else if (w.view.state == WorkerState::kStarting && w.view.port != 0 && now >= w.next_health_ms) {
          w.next_health_ms = now + kStartProbePeriodMs;  // its /info asked again until it answers
          listening.push_back({k, w.view.pid, w.view.port, ""});
        }
        if (was_up && DownAfterExit(w.view.state)) exits.emplace_back(k, w.view.last_exit);
        if ((!was_ready || w.announce_ready) && w.view.state == WorkerState::kReady) {
          became_ready.push_back({k, w.view.pid, w.view.port, ""});
        }
        w.announce_ready = false;
        if (w.spec.on_demand && w.view.state == WorkerState::kReady) idle_candidates.push_back(k);
        if ((w.view.state == WorkerState::kStarting || w.view.state == WorkerState::kReady) && w.view.pid > 0 &&
            now >= w.next_rss_ms) {
          // (An external server's group is a walk of all /proc: once every few seconds.)
          w.next_rss_ms = now + (w.spec.external() ? kGroupRssPeriodMs : kRssPeriodMs);
          rss_due.emplace_back(k, w.view.pid, w.spec.external());
        }
        if (w.view.state == WorkerState::kReady && now >= w.next_health_ms) {
          w.next_health_ms = now + kHealthPeriodMs;
          const bool info = now >= w.next_info_ms;
          if (info) w.next_info_ms = now + kInfoPeriodMs;
          checks.push_back({k, w.view.pid, w.view.port, info && !w.spec.external(),
                            w.spec.external() ? w.spec.health_path : std::string()});
        }
      }
      // A process ended (released, evicted, exited): starts the gate held
      // back for want of memory are asked again next round, not a second later.
      if (memory_freed_) {
        memory_freed_ = false;
        for (auto& [k, w] : workers_) {
          if (w.view.state == WorkerState::kBackoff && !w.view.NotAdmittedWhy().empty()) {
            w.view.next_start_ms = std::min(w.view.next_start_ms, now);
          }
        }
      }
    }
    // Resident sets, read with no lock held (procfs), kept for admission.
    for (const auto& [k, pid, group] : rss_due) {
      // An external server's children too (a wrapper's server, a server's runners): a worker has none.
      const auto rss = group ? devices::HostTelemetry().GroupRss(pid) : devices::HostTelemetry().ProcessRss(pid);
      if (!rss.ok()) continue;
      Held lk(*this);
      auto it = workers_.find(k);
      if (it == workers_.end() || it->second.view.pid != pid) continue;  // replaced meanwhile
      it->second.view.rss_bytes = *rss;
      it->second.rss_pid = pid;
    }
    // What a worker says of itself is known from the moment it is ready.
    // Only adopted workers are ready yet (Poll makes none ready): ask them now.
    for (const auto& r : became_ready) RefreshInfo(r.key, r.pid, r.port);
    // An external server that is starting is ready once its health path answers 200.
    for (const auto& r : probes) {
      auto h = http::Fetch("127.0.0.1", r.port, "GET", r.health_path, "", {}, std::chrono::milliseconds(500));
      if (h.ok() && h->status == 200) listening.push_back(r);
    }
    // A worker listening is ready once its /info answered and says it
    // speaks this gateway's protocol: nobody sees it ready before (nor
    // without its memory and slots). Not answered: asked again next probe.
    std::vector<std::pair<std::string, std::string>> refused_workers;
    for (const auto& r : listening) {
      if (r.health_path.empty()) {  // (an external server has no /info: its health path answered)
        int status = 0;
        const auto info = RefreshInfo(r.key, r.pid, r.port, &status);
        if (!info && (status == 401 || status == 403 || status == 404)) {
          // Not this gateway's worker (another secret), or another build's routes.
          refused_workers.emplace_back(r.key, "its " + std::string(protocol::kInfoPath) + " answered HTTP " +
                                                  std::to_string(status) +
                                                  " (another build of spillway-worker, or another gateway's secret)");
          continue;
        }
        if (!info) continue;
        const auto typed = protocol::WorkerInfo::FromJson(nlohmann::json::parse(*info, nullptr, false));
        const Status st = typed ? protocol::CheckCompatible(*typed)
                                : Status::Unavailable("its " + std::string(protocol::kInfoPath) +
                                                      " is not a spillway-worker's: " + info->substr(0, 200));
        if (!st.ok()) {
          refused_workers.emplace_back(r.key, st.message());
          continue;
        }
        // Another process answers its port file's port: a worker of an
        // earlier gateway that has no record (its write failed, or that
        // gateway died before it) wrote the file after this one's spawn
        // cleared it. Not ready: nothing is served from a process this
        // gateway does not know, and this one's start timeout ends the wait.
        if (typed->pid != 0 && typed->pid != r.pid) {
          // (Said once per start: asked again every probe until its start timeout.)
          if (std::exchange(foreign_port_said_[r.key], r.pid) != r.pid) {
            std::fprintf(stderr,
                         "spillway: worker %s: port %u is answered by pid %lld, not by the worker started (pid %d); "
                         "not taken for ready\n",
                         r.key.c_str(), static_cast<unsigned>(r.port), static_cast<long long>(typed->pid),
                         static_cast<int>(r.pid));
          }
          continue;
        }
      }
      Held lk(*this);
      auto it = workers_.find(r.key);
      if (it == workers_.end() || it->second.view.pid != r.pid || it->second.view.state != WorkerState::kStarting) continue;
      Worker& w = it->second;
      const int64_t now = clock_.NowMs();
      w.view.state = WorkerState::kReady;
      w.view.ever_ready = true;
      w.view.last_start_ms = now - w.spawned_ms;
      w.ready_since_ms = now;
      w.next_health_ms = now + kHealthPeriodMs;  // its first passed health check ends the failed-start count
      WriteRecord(w);  // now with its port: adoptable
      became_ready.push_back(r);
    }
    // A worker from another build would be misread: stopped, with the reason where a person looks.
    for (const auto& [k, why] : refused_workers) Refuse(k, why);
    // Each told on its own: a readiness or an exit is worked out once, from a
    // change of state, so one that a throw skipped would never be told.
    if (on_ready_) {
      for (const auto& r : became_ready) {
        RunSurviving("spillway: telling the gateway a worker is ready", [&] { on_ready_(r.key, r.port); });
      }
    }
    if (on_exit_) {
      for (const auto& [k, why] : exits) {
        RunSurviving("spillway: telling the gateway a worker exited", [&] { on_exit_(k, why); });
      }
    }
    if (idle_) {
      for (const auto& k : idle_candidates) {
        RunSurviving("spillway: an idle check", [&] {
          if (idle_(k)) Release(k);
        });
      }
    }
    // Health checks run without the lock: callers asking for ports never wait on them.
    for (const auto& c : checks) {
      const bool external = !c.health_path.empty();
      auto r = external ? http::Fetch("127.0.0.1", c.port, "GET", c.health_path, "", {}, std::chrono::milliseconds(1000))
                        : http::Fetch("127.0.0.1", c.port, "GET", std::string(protocol::kHealthPath), "", AuthHeaders(),
                                      std::chrono::milliseconds(1000));
      // A worker whose device is lost answers 503: it cannot recover in place.
      const bool healthy = r.ok() && r->status == 200;
      // A lost device or a stalled decode loop (a hung driver that still
      // answers HTTP) cannot recover in place: replace the worker at once.
      const bool lost = !external && r.ok() && protocol::HealthReport::FromBody(r->body).replace_now();
      std::string why;
      {
        Held lk(*this);
        auto it = workers_.find(c.key);
        if (it == workers_.end()) continue;
        const bool was_ready = it->second.view.state == WorkerState::kReady;
        HealthResult(it->second, c.pid, healthy, lost);
        if (was_ready && DownAfterExit(it->second.view.state)) why = it->second.view.last_exit;
      }
      if (!why.empty() && on_exit_) {
        RunSurviving("spillway: telling the gateway a worker exited", [&] { on_exit_(c.key, why); });
      }
      if (healthy && c.info) RefreshInfo(c.key, c.pid, c.port);
    }
  }
}

std::shared_ptr<const std::string> Supervisor::RefreshInfo(const std::string& key, pid_t pid, uint16_t port,
                                                           int* http_status) {
  if (http_status) *http_status = 0;
  {
    Held lk(*this);
    auto it = workers_.find(key);
    if (it == workers_.end() || it->second.spec.external()) return nullptr;  // no /info
  }
  auto r = http::Fetch("127.0.0.1", port, "GET", std::string(protocol::kInfoPath), "", AuthHeaders(),
                       std::chrono::milliseconds(1000));
  if (r.ok() && http_status) *http_status = r->status;
  if (!r.ok() || r->status != 200) return nullptr;
  auto body = std::make_shared<const std::string>(std::move(r->body));
  Held lk(*this);
  auto it = workers_.find(key);
  if (it == workers_.end() || it->second.view.pid != pid) return nullptr;  // replaced meanwhile: not its info
  it->second.view.info = body;
  it->second.view.info_ms = clock_.NowMs();
  return body;
}

void Supervisor::Demand(const std::string& key) {
  Held lk(*this);
  auto it = workers_.find(key);
  if (it == workers_.end() || it->second.view.state != WorkerState::kStopped || stop_) return;
  auto& w = it->second;
  if (w.view.pid > 0) return;  // the released process has not exited yet: asked again next time
  // Started by the loop, through the start gate, once the backoff of its
  // last failure (if any: Exited) has passed.
  w.view.state = WorkerState::kBackoff;
  wake_ = true;  // a request waits for it: the loop's next round now, not at its next tick
  cv_.notify_all();
}

void Supervisor::Release(const std::string& key) {
  Held lk(*this);
  auto it = workers_.find(key);
  if (it == workers_.end() || !it->second.spec.on_demand) return;
  auto& w = it->second;
  // Released already and still exiting: its SIGKILL deadline stands (set
  // again by every release, one that ignores its stop signal was never killed).
  if (w.view.state == WorkerState::kStopped && w.view.pid > 0) return;
  if (w.view.pid > 0) SignalGroup(Process(w), w.spec.stop_signal);
  w.view.state = WorkerState::kStopped;
  w.view.port = 0;
  w.view.last_exit = "released (idle)";
  w.view.released_idle = true;
  // Its next run begins anew: a load that then fails is a failed start, not
  // the exit of a worker that served (backed off as one, and said so).
  w.ready_since_ms = 0;
  w.view.info.reset();
  w.kill_at_ms = clock_.NowMs() + 5000;
}

bool Supervisor::WaitReleased(const std::string& key, int64_t timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    WorkerPid process;
    {
      Held lk(*this);
      auto it = workers_.find(key);
      if (it == workers_.end()) return true;
      Worker& w = it->second;
      if (w.view.state != WorkerState::kStopped) return false;  // started again meanwhile
      // A process still holding its memory: its own, or one killed before
      // or a previous gateway's that would not stop (dying). Reaped here as
      // Poll would.
      if (w.view.pid <= 0) {
        if (DyingEnded(w)) return true;
        process = *w.dying;
      } else if (ReleasedEnded(w)) {
        return true;
      } else {
        process = Process(w);
      }
    }
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    // Woken by its end (reaped above under the lock), or after a while to
    // see whether it was started again meanwhile.
    AwaitEnd(process, std::min(left, std::chrono::milliseconds(100)));
  }
}

bool Supervisor::Running(const std::string& key) const {
  const auto table = published_.load();
  const WorkerView* v = Find(*table, key);
  return v && (v->state == WorkerState::kStarting || v->state == WorkerState::kReady);
}

bool Supervisor::OnDemand(const std::string& key) const {
  const auto table = published_.load();
  const WorkerView* v = Find(*table, key);
  return v && v->on_demand;
}

void Supervisor::Refuse(const std::string& key, const std::string& why) {
  Held lk(*this);
  auto it = workers_.find(key);
  if (it == workers_.end() || it->second.view.pid <= 0) return;
  auto& w = it->second;
  w.ready_since_ms = 0;  // it never served: a failed start
  Kill(w, why);
}

void Supervisor::Suspect(const std::string& key) {
  Held lk(*this);
  auto it = workers_.find(key);
  if (it != workers_.end()) it->second.next_health_ms = 0;
}

void Supervisor::Stop(int64_t grace_ms) {
  if (stop_.exchange(true)) {
    if (thread_.joinable()) thread_.join();
    return;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // Taken from the workers under the lock, then stopped together without
  // it: a process that is slow to die (or stuck in the kernel) does not hold
  // up the I/O threads that ask for ports and views.
  std::vector<std::string> keys;  // whose record each one's is ("": none left)
  std::vector<GroupStop> ending;
  {
    Held lk(*this);
    for (auto& [k, w] : workers_) {
      int status = 0;
      if (w.dying) {  // killed before (its record gone), or a previous gateway's that would not stop (its record kept)
        keys.push_back(w.view.pid > 0 ? "" : k);
        ending.push_back({*w.dying, SIGKILL});
      }
      w.dying.reset();
      w.view.exiting = false;
      if (w.view.pid > 0) {
        if (Ended(Process(w), &status)) {
          RemoveRecord(k);  // reaped: its pid is no longer ours to signal
        } else {
          keys.push_back(k);
          ending.push_back({Process(w), w.spec.stop_signal});
        }
      }
      w.view.pid = 0;
      w.view.adopted = false;
      w.view.state = WorkerState::kStopped;
    }
  }
  const std::vector<bool> ended = StopGroups(ending, grace_ms);
  for (size_t i = 0; i < ending.size(); ++i) {
    if (ended[i]) {
      if (!keys[i].empty()) RemoveRecord(keys[i]);
      continue;
    }
    // Its record stays: the next gateway on this state directory finds it
    // and starts no second worker beside it while it holds its memory.
    std::fprintf(stderr, "spillway: worker %s (pid %d) could NOT be stopped: still there 5 s after SIGKILL\n",
                 keys[i].empty() ? "(killed before)" : keys[i].c_str(), static_cast<int>(ending[i].pid.pid));
  }
}

std::optional<uint16_t> Supervisor::ReadyPort(const std::string& key) const {
  const auto table = published_.load();
  const WorkerView* v = Find(*table, key);
  if (!v || v->state != WorkerState::kReady) return std::nullopt;
  return v->port;
}

std::vector<WorkerView> Supervisor::Snapshot() const { return published_.load()->views; }

void Supervisor::Publish() noexcept {
  try {
    auto table = std::make_shared<Published>();
    table->views.reserve(workers_.size());
    for (const auto& [k, w] : workers_) {
      table->views.push_back(w.view);
      table->views.back().ready_since_ms = w.view.state == WorkerState::kReady ? w.ready_since_ms : 0;
      if (w.rss_pid != w.view.pid) table->views.back().rss_bytes = 0;  // an earlier process's
    }
    published_.store(std::move(table));
  } catch (const std::exception& e) {
    // Out of memory: the readers keep the last table until a later scope publishes.
    std::fprintf(stderr, "spillway: the workers' state could not be published: %s\n", e.what());
  }
}

const WorkerView* Supervisor::Find(const Published& table, const std::string& key) {
  auto it = std::lower_bound(table.views.begin(), table.views.end(), key,
                             [](const WorkerView& v, const std::string& k) { return v.key < k; });
  return it != table.views.end() && it->key == key ? &*it : nullptr;
}

}  // namespace spillway::upstream
