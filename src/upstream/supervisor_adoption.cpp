// Supervisor: the records of its workers and the adoption of the workers an
// earlier gateway on the same state directory left behind (supervisor.h).
#include "upstream/supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#include <tuple>
#include <utility>

#include "api/http_client.h"
#include "common/json_log.h"
#include "common/private_files.h"
#include "common/proc_file.h"
#include "common/survive.h"
#include "devices/sim_ledger.h"
#include "protocol/worker_protocol.h"

namespace spillway::upstream {

namespace fs = std::filesystem;

namespace {

// How long the work an adopted worker still ran for the dead gateway may take
// to end once cancelled (a decode step; a worker slower than that is replaced).
constexpr auto kDrainTimeout = std::chrono::seconds(10);
// A worker of the previous gateway that must go gets this long after SIGTERM.
constexpr int64_t kStopGraceMs = 5000;

// The group a record's process led, once that process has ended (OrphanedGroup).
WorkerPid LeaderGone(const WorkerRecord& r) {
  return {r.pid, r.start_time, /*child=*/false, /*leader_gone=*/true, r.session};
}

// A recorded process as it is stopped or waited out: its group through it, or through what it left there.
WorkerPid ToStop(const WorkerRecord& r, const AdoptDecision& d) {
  return d.leader_gone ? LeaderGone(r) : WorkerPid{r.pid, r.start_time, /*child=*/false};
}

// The folder's device and inode (WorkerRecord::dir_dev, dir_ino); nullopt
// when it cannot be read.
std::optional<std::pair<uint64_t, uint64_t>> FolderIdentity(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return std::nullopt;
  return std::pair<uint64_t, uint64_t>{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

}  // namespace

Status Supervisor::Claim() {
  if (lock_fd_ >= 0) return Status::Ok();
  const std::string path = run_dir_ + "/supervisor.lock";
  // Close-on-exec: a worker holding it would keep the claim past a crash.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, kPrivateFileMode);
  if (fd < 0) return Status::Unavailable("cannot open " + path + ": " + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char holder[32] = {0};
    const ssize_t n = ::pread(fd, holder, sizeof holder - 1, 0);
    ::close(fd);
    std::string pid = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "?";
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    return Status::Unavailable("another gateway (pid " + pid + ") is running on state directory " + state_dir_ +
                               "; stop it first or use another --state-dir");
  }
  // The holder's pid, for the refusal above; failing to write it costs only that message.
  const std::string me = std::to_string(::getpid()) + "\n";
  const bool named = ::ftruncate(fd, 0) == 0 && ::pwrite(fd, me.data(), me.size(), 0) > 0;
  (void)named;
  lock_fd_ = fd;
  return Status::Ok();
}

uint16_t Supervisor::PortFromFile(const std::string& key) const {
  // (Read under the lock: a FIFO there must not stall it, ReadPrivateFile.)
  const auto text = ReadPrivateFile(run_dir_ + "/" + key + ".port", 32);
  if (!text.ok()) return 0;
  std::istringstream f(*text);
  int port = 0;
  return f >> port && port > 0 && port <= 65535 ? static_cast<uint16_t>(port) : 0;
}

void Supervisor::ReadLoadProgress(Worker& w) const {
  const auto text = ReadPrivateFile(run_dir_ + "/" + w.spec.key + ".load", 64);  // "LOADED TOTAL", rewritten atomically
  if (!text.ok()) return;
  std::istringstream f(*text);
  uint64_t loaded = 0, total = 0;
  if (f >> loaded >> total && total > 0 && loaded <= total) {
    w.view.load_bytes = loaded;
    w.view.load_total_bytes = total;
  }
}

void Supervisor::WriteRecord(const Worker& w) {
  if (w.start_time == 0) return;  // not readable yet (Poll tries again): such a record is refused anyway
  WorkerRecord r;
  r.key = w.spec.key;
  r.pid = w.view.pid;
  r.start_time = w.start_time;
  r.port = w.view.port;
  r.spec_hash = w.spec_hash;
  r.protocol_version = protocol::kWorkerProtocolVersion;
  r.external = w.spec.external();
  r.stop_signal = w.spec.stop_signal;
  if (const auto dir = FolderIdentity(run_dir_)) std::tie(r.dir_dev, r.dir_ino) = *dir;
  if (const pid_t sid = ::getsid(w.view.pid); sid > 0) r.session = sid;
  r.boot = BootIdentity();
  if (Status st = WritePrivateFileAtomically(RecordPath(run_dir_, w.spec.key), RecordToJson(r)); !st.ok()) {
    std::fprintf(stderr, "spillway: worker %s will not be adopted after a crash: %s\n", w.spec.key.c_str(),
                 st.message().c_str());
  }
}

void Supervisor::RemoveRecord(const std::string& key) {
  std::error_code ec;
  fs::remove(RecordPath(run_dir_, key), ec);
}

bool Supervisor::RunsAsWorkerOf(const WorkerRecord& record) const {
  // With its recorded start time, and no command line left: it is exiting
  // (killed by the last gateway, its GPU memory not yet given back). Taken
  // for another process, its record was forgotten and a second worker
  // started beside it; as ours, it is stopped and waited for (StopPrevious).
  return MatchWorkerCommandLine(CommandLine(record.pid), record.key, run_dir_) != CommandLineMatch::kOther;
}

AdoptDecision Supervisor::Judge(WorkerRecord& record, const std::optional<std::string>& configured_hash,
                               bool external) const {
  // Its pid with its start time, and (a worker) started for this key of
  // this state directory: a record copied or planted for another placement
  // names a process that is not this placement's, which is never signalled.
  // (An external server's record says so itself: its key may be gone from the config, or be a worker's now.)
  external = external || record.external;
  // (An external server's record only: a worker's command line names its
  // state directory, compared as files below, which a copy's does not; the
  // folder's device number may change while workers live, on a remount of
  // a network or overlay file system, and its workers were forgotten,
  // running on beside their replacements.)
  if (external && record.dir_ino != 0) {  // (recorded: not in records written before it was)
    const auto dir = FolderIdentity(run_dir_);
    if (dir && *dir != std::pair<uint64_t, uint64_t>{record.dir_dev, record.dir_ino}) {
      return {AdoptAction::kForget, "it was recorded in another state directory (this one is a copy of it): pid " +
                                        std::to_string(record.pid) + " belongs to that directory's gateway"};
    }
  }
  // Pids and start times name a process only within the boot and pid
  // namespace they were read in: elsewhere the recorded pid is some other
  // process's (an external server's record has no command line to tell).
  if (!record.boot.empty()) {
    const std::string boot = BootIdentity();
    if (!boot.empty() && boot != record.boot) {
      return {AdoptAction::kForget, "it was recorded in another boot or pid namespace: pid " +
                                        std::to_string(record.pid) + " names another process here"};
    }
  }
  devices::Liveness process = devices::ProcessLiveness(record.pid, record.start_time);
  if (process == devices::Liveness::kAlive && !external && !RunsAsWorkerOf(record)) process = devices::Liveness::kGone;
  // Its /proc entry unreadable, and owned by another user (hidepid=1): the pid is another user's process now, not a worker
  // this user started. (Taken for "cannot tell", its placement never started again.)
  if (process == devices::Liveness::kUnknown && ::geteuid() != 0) {
    if (const auto owner = ProcOwner(record.pid); owner && *owner != ::geteuid()) process = devices::Liveness::kGone;
  }
  const bool alive = process == devices::Liveness::kAlive;
  // Recorded while it loaded; it may have finished since (its own port file says).
  if (alive && !external && record.port == 0) record.port = PortFromFile(record.key);
  std::optional<WorkerInfoFacts> info;
  std::string not_held;  // why the secret was not sent to its port
  // An external server is never asked: it is not ours to trust with the
  // workers' secret (Spawn withholds it too), and it is not adopted.
  if (alive && !external && configured_hash == record.spec_hash && record.port != 0) {
    auto r = FetchFromWorker(record.pid, record.port, "GET", std::string(protocol::kInfoPath));
    if (!r.ok() && r.status().code() == StatusCode::kPermissionDenied) not_held = r.status().message();
    const auto answer = r.ok() && r->status == 200
                            ? protocol::WorkerInfo::FromJson(nlohmann::json::parse(r->body, nullptr, false))
                            : std::nullopt;
    if (answer) info = WorkerInfoFacts{answer->protocol_version, static_cast<pid_t>(answer->pid)};
  }
  // Gone: what it may have left in its group (a wrapper's server) is looked
  // for, in the boot and pid namespace it was recorded in (elsewhere its pid
  // and start time name nothing of it).
  std::optional<size_t> orphans = 0;
  if (process == devices::Liveness::kGone && !record.boot.empty() && record.boot == BootIdentity()) {
    const auto left = OrphanedGroup(LeaderGone(record));
    orphans = left ? std::optional<size_t>(left->size()) : std::nullopt;
  }
  AdoptDecision d =
      DecideAdoption(record, configured_hash, protocol::kWorkerProtocolVersion, process, info, external, orphans);
  if (d.action == AdoptAction::kStop && !info && !not_held.empty()) d.reason = not_held;
  return d;
}

StatusOr<http::ClientResponse> Supervisor::FetchFromWorker(pid_t pid, uint16_t port, const std::string& method,
                                                          const std::string& path) const {
  // The secret goes only to a port the recorded worker holds alone: the
  // port of a worker that has closed its listener (exiting) or ended may
  // be bound by any local program, another user's too, which would get the
  // secret of every worker of this state directory.
  const std::optional<bool> alone = ListensAlone(pid, port);
  if (alone != true) {
    return Status::PermissionDenied(
        "port " + std::to_string(port) + (alone ? " is not held by pid " + std::to_string(pid) + " alone"
                                                : " could not be told to be pid " + std::to_string(pid) +
                                                      "'s (/proc cannot be read)") +
        ": the worker secret is not sent there");
  }
  return http::Fetch("127.0.0.1", port, method, path, "", AuthHeaders(), std::chrono::seconds(2));
}

Status Supervisor::ClearLeftovers(pid_t pid, uint16_t port) const {
  auto r = FetchFromWorker(pid, port, "DELETE", std::string(protocol::kCancelAllPath));
  if (!r.ok() || r->status != 200) {
    return Status::Unavailable("it did not cancel the previous gateway's requests (" +
                               (r.ok() ? "HTTP " + std::to_string(r->status) : r.status().message()) + ")");
  }
  const auto deadline = std::chrono::steady_clock::now() + kDrainTimeout;
  while (std::chrono::steady_clock::now() < deadline) {
    auto info = FetchFromWorker(pid, port, "GET", std::string(protocol::kInfoPath));
    const auto w = info.ok() && info->status == 200
                       ? protocol::WorkerInfo::FromJson(nlohmann::json::parse(info->body, nullptr, false))
                       : std::nullopt;
    if (w && w->slots && w->slots->busy == 0 && w->slots->queued == 0) return Status::Ok();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return Status::Unavailable("the previous gateway's requests did not end within 10 s of their cancellation");
}

std::set<std::string> Supervisor::StopUnadoptable(const std::vector<WorkerSpec>& specs) {
  const bool claimed = Claim().ok();  // (unclaimed: nothing is stopped; Adopt says why)
  std::set<std::string> adoptable;
  std::vector<Previous> to_stop;
  for (const auto& f : ReadWorkerRecords(run_dir_)) {
    if (!f.record.ok()) continue;  // (Adopt forgets it)
    WorkerRecord r = *f.record;
    std::optional<std::string> hash;  // as Add() keeps it
    bool external = false;
    for (const auto& spec : specs) {
      if (spec.key != f.key) continue;
      hash = SpecHashOf(spec);
      external = spec.external();
    }
    const AdoptDecision d = Judge(r, hash, external);
    if (d.action == AdoptAction::kAdopt) adoptable.insert(f.key);
    if (d.action == AdoptAction::kStop && claimed) {
      to_stop.push_back({r.key, ToStop(r, d), d.reason, r.stop_signal});
    }
  }
  // (One that could not be stopped keeps its record: Adopt finds it again
  // and keeps its placement from starting beside it.)
  RunSurviving("spillway: stopping the previous gateway's workers", [&] { StopPrevious(to_stop); });
  return adoptable;
}

void Supervisor::Adopt() {
  if (Status st = Claim(); !st.ok()) {
    std::fprintf(stderr, "spillway: no worker adopted: %s\n", st.message().c_str());
    return;
  }
  std::set<pid_t> adopted;  // one process serves one placement
  std::vector<Previous> to_stop;
  for (const auto& f : ReadWorkerRecords(run_dir_)) {
    RunSurviving("spillway: adopting a worker", [&] { AdoptOrStop(f, &adopted, &to_stop); });
  }
  RunSurviving("spillway: stopping the previous gateway's workers", [&] { StopPrevious(to_stop); });
}

void Supervisor::StopPrevious(const std::vector<Previous>& previous) {
  std::vector<GroupStop> groups;
  for (const auto& p : previous) groups.push_back({p.process, p.stop_signal});  // (an external server's own)
  // Together: one grace period for all (N hung ones cost seconds, not N times that).
  const std::vector<bool> ended = StopGroups(groups, kStopGraceMs);
  for (size_t i = 0; i < previous.size(); ++i) {
    [[maybe_unused]] const auto& [key, process, reason, stop_signal] = previous[i];
    LogEvent("worker.previous_stopped",
             nlohmann::json{{"worker", key}, {"pid", process.pid}, {"stopped", ended[i]}, {"reason", reason}}
                 .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
             "spillway: worker " + key + " of the previous gateway (pid " + std::to_string(process.pid) + ") " +
                 (ended[i] ? "stopped" : "could NOT be stopped (still there 5 s after SIGKILL)") + ": " + reason);
    if (ended[i]) {
      RemoveRecord(key);
      continue;
    }
    // Stuck in the kernel, with its memory: its record stays (a later
    // gateway still knows it), and this placement starts no worker beside
    // it until it has ended.
    WaitOutPrevious(key, process,
                    "the previous gateway's worker (pid " + std::to_string(process.pid) + ") could not be stopped");
  }
}

void Supervisor::WaitOutPrevious(const std::string& key, const WorkerPid& process, const std::string& why) {
  // (Poll watches it as a killed one: Ended() takes only a process seen gone.)
  Held lk(*this);
  if (auto it = workers_.find(key); it != workers_.end()) {
    Worker& w = it->second;
    w.dying = process;
    w.view.exiting = true;
    if (!w.spec.on_demand) {
      w.view.state = WorkerState::kBackoff;
      w.view.next_start_ms = 0;
    }
    w.view.last_exit = why;
  }
}

void Supervisor::AdoptOrStop(const RecordFile& f, std::set<pid_t>* adopted, std::vector<Previous>* to_stop) {
  if (!f.record.ok()) {
    std::fprintf(stderr, "spillway: ignoring worker record %s: %s\n", f.path.c_str(), f.record.status().message().c_str());
    RemoveRecord(f.key);
    return;
  }
  WorkerRecord rec = *f.record;
  std::optional<std::string> hash;
  bool external = false;
  {
    Held lk(*this);
    if (auto it = workers_.find(rec.key); it != workers_.end()) {
      hash = it->second.spec_hash;
      external = it->second.spec.external();
    }
  }
  AdoptDecision d = Judge(rec, hash, external);
  if (d.action == AdoptAction::kAdopt && adopted->count(rec.pid)) {
    // Two records name one process (a copied record): it serves the
    // placement that adopted it first, and is not signalled for this one.
    d = {AdoptAction::kForget, "pid " + std::to_string(rec.pid) + " was adopted for another placement already"};
    std::fprintf(stderr, "spillway: ignoring worker record %s: %s\n", f.path.c_str(), d.reason.c_str());
  }
  if (d.action == AdoptAction::kAdopt) {
    if (Status st = ClearLeftovers(rec.pid, rec.port); !st.ok()) d = {AdoptAction::kStop, st.message()};
  }
  switch (d.action) {
    case AdoptAction::kForget:
      RemoveRecord(rec.key);
      return;
    case AdoptAction::kStop:
      to_stop->push_back({rec.key, ToStop(rec, d), d.reason, rec.stop_signal});
      return;
    case AdoptAction::kWait:
      LogEvent("worker.previous_unknown", nlohmann::json{{"worker", rec.key}, {"pid", rec.pid}, {"reason", d.reason}}.dump(),
               "spillway: worker " + rec.key + " of the previous gateway: " + d.reason);
      WaitOutPrevious(rec.key, ToStop(rec, d), "the previous gateway's worker: " + d.reason);
      return;
    case AdoptAction::kAdopt:
      break;
  }
  Held lk(*this);
  Worker& w = workers_.at(rec.key);
  const int64_t now = clock_.NowMs();
  w.view.pid = rec.pid;
  w.view.port = rec.port;
  w.view.state = WorkerState::kReady;
  w.view.ever_ready = true;
  w.view.adopted = true;
  w.view.last_start_ms = 0;  // nothing was loaded
  w.start_time = rec.start_time;
  w.spawned_ms = now;
  w.ready_since_ms = now;
  w.next_health_ms = now + kHealthPeriodMs;
  w.health_failures = 0;
  w.announce_ready = true;
  WriteRecord(w);  // with the port it may have had only in its port file
  adopted->insert(rec.pid);
  ++adopted_;
  LogEvent("worker.adopted", nlohmann::json{{"worker", rec.key}, {"pid", rec.pid}, {"port", rec.port}}.dump(),
           "spillway: worker " + rec.key + " adopted from the previous gateway (pid " + std::to_string(rec.pid) +
               ", port " + std::to_string(rec.port) + "): serving on, no reload");
}

}  // namespace spillway::upstream
