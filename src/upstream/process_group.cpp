#include "upstream/process_group.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/proc_file.h"
#include "devices/sim_ledger.h"

namespace spillway::upstream {

namespace {

using Clock = std::chrono::steady_clock;

// A pidfd for `p`'s process, or -1 (no pidfd_open here, or no such process).
// For an adopted process the start time is checked once the fd is open:
// from then on the fd names that process, whatever reuses its pid later.
int OpenPidfd(const WorkerPid& p) {
#ifdef SYS_pidfd_open
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, p.pid, 0));
  if (fd < 0) return -1;
  if (!p.child && !devices::ProcessAlive(p.pid, p.start_time)) {
    ::close(fd);
    return -1;
  }
  return fd;
#else
  (void)p;
  return -1;
#endif
}

}  // namespace

std::optional<std::vector<pid_t>> OrphanedGroup(const WorkerPid& leader) {
  if (leader.pid <= 1 || leader.session <= 0) return std::vector<pid_t>{};
  if (const auto own = ReadProcStat(leader.pid)) {
    if (own->state != 'Z' || own->start_time != leader.start_time) return std::vector<pid_t>{};  // not ended, or not it
  } else if (errno != ENOENT && errno != ESRCH) {
    return std::nullopt;
  }
  const auto members = ProcessesOfGroup(leader.pid);
  if (!members) return std::nullopt;
  std::vector<pid_t> left;
  for (const auto& [pid, f] : *members) {
    if (f.start_time >= leader.start_time && f.session == leader.session) left.push_back(pid);
  }
  return left;
}

bool Ended(const WorkerPid& p, int* status) {
  *status = -1;
  if (p.pid <= 0) return true;
  if (p.leader_gone) {  // (one that /proc cannot tell about has not ended)
    const auto left = OrphanedGroup(p);
    return left && left->empty();
  }
  if (p.child) {
    siginfo_t info{};
    if (waitid(P_PID, static_cast<id_t>(p.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
      return errno == ECHILD;  // (reaped already)
    }
    if (info.si_pid != p.pid) return false;  // running
    // It ended: what it started in its group (a launcher's server, a
    // shard) ends with it, killed while its zombie still holds the group's
    // id (no other group can have it). Once reaped, nothing signalled them:
    // they kept their memory and port past a crash, and past a stop.
    ::kill(-p.pid, SIGKILL);
    const pid_t r = waitpid(p.pid, status, WNOHANG);
    return r == p.pid || (r < 0 && errno == ECHILD);
  }
  // A zombie counts as ended; one whose /proc entry cannot be read now (no
  // descriptor left) does not: it was taken for dead, its record dropped and
  // a second worker started beside it.
  return devices::ProcessLiveness(p.pid, p.start_time) == devices::Liveness::kGone;
}

std::vector<std::string> CommandLine(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::vector<std::string> out;
  for (std::string arg; std::getline(f, arg, '\0');) out.push_back(std::move(arg));
  return out;
}

CommandLineMatch MatchWorkerCommandLine(const std::vector<std::string>& argv, const std::string& key,
                                        const std::string& run_dir) {
  if (argv.empty()) return CommandLineMatch::kGone;
  // The same file, however the state directory was named (relative, a
  // link, a trailing slash): compared as files, not as strings.
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] != "--port-file") continue;
    const std::filesystem::path named(argv[i + 1]);
    std::error_code ec;
    if (named.filename() == key + ".port" && std::filesystem::equivalent(named.parent_path(), run_dir, ec)) {
      return CommandLineMatch::kNamesIt;
    }
  }
  return CommandLineMatch::kOther;
}

std::string DescribeEnd(int status) {
  if (status == -1) return "exited (adopted: its exit status is not ours to read)";
  return WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status)) : "signal " + std::to_string(WTERMSIG(status));
}

bool AwaitEnd(const WorkerPid& p, std::chrono::milliseconds bound) {
  if (p.pid <= 0) return true;
  if (bound.count() <= 0) return false;
  const int fd = OpenPidfd(p);
  if (fd < 0) {  // gone already (or no pidfd_open, or a group whose leader is gone: one short round)
    std::this_thread::sleep_for(std::min(bound, std::chrono::milliseconds(10)));
    return true;
  }
  pollfd pfd{fd, POLLIN, 0};
  const int n = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(bound.count(), INT_MAX)));
  ::close(fd);
  return n > 0;  // readable: it ended
}

bool WaitEnded(const WorkerPid& p, Clock::time_point deadline) {
  int status = 0;
  bool woken = false;
  while (true) {
    if (Ended(p, &status)) return true;
    // Told it ended, yet not seen so (its pidfd before /proc): a short
    // pause, not a spin.
    if (woken) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    woken = AwaitEnd(p, left);
  }
}

void SignalGroup(const WorkerPid& p, int sig) {
  if (p.leader_gone) {  // while they are there, the group's id is theirs (see OrphanedGroup)
    if (const auto left = OrphanedGroup(p); left && !left->empty()) ::kill(-p.pid, sig);
    return;
  }
  // A child: unless it has been reaped (until then its pid, and its group's
  // id, are its own; an ended one's group may still hold what it started).
  // It is not reaped here: its exit status stays for Ended, whose caller
  // reports it (reaped here, it was lost). Another process: only one seen
  // alive with its start time; one whose /proc entry cannot be read (no
  // descriptor left) is not ours to tell, and is not signalled either (a
  // previous gateway's worker that adoption could not judge got SIGKILL at
  // shutdown, though its pid may be another process's by then).
  bool ours = false;
  if (p.child) {
    siginfo_t info{};
    ours = waitid(P_PID, static_cast<id_t>(p.pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0;
  } else {
    ours = devices::ProcessAlive(p.pid, p.start_time);
  }
  if (ours) ::kill(-p.pid, sig);
}

std::vector<bool> StopGroups(const std::vector<GroupStop>& groups, int64_t grace_ms) {
  for (const auto& g : groups) SignalGroup(g.pid, g.stop_signal);
  const auto graced = Clock::now() + std::chrono::milliseconds(grace_ms);
  for (const auto& g : groups) {
    if (g.stop_signal != SIGKILL) WaitEnded(g.pid, graced);
  }
  for (const auto& g : groups) SignalGroup(g.pid, SIGKILL);
  // Bounded for children too: one stuck in the kernel must not hang a stop.
  const auto killed = Clock::now() + std::chrono::seconds(5);
  std::vector<bool> ended;
  for (const auto& g : groups) ended.push_back(WaitEnded(g.pid, killed));
  return ended;
}

bool StopGroup(const WorkerPid& p, int64_t grace_ms, int stop_signal) {
  return StopGroups({{p, grace_ms > 0 ? stop_signal : SIGKILL}}, grace_ms)[0];
}

}  // namespace spillway::upstream
