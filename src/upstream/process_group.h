// A worker's process as the supervisor sees it. Each worker leads its own
// process group (it and anything it starts) and is signalled as a group.
//
// A worker this gateway spawned is its child: its end is reaped with
// waitpid, which says how it ended. A worker adopted from a crashed gateway
// is not (waitpid cannot see it; init reaps it): its end is seen through
// /proc, by pid and start time, which also tells a reused pid apart, so a
// process that merely inherited the pid is never signalled.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace spillway::upstream {

struct WorkerPid {
  pid_t pid = 0;
  uint64_t start_time = 0;  // /proc/<pid>/stat field 22
  bool child = true;        // spawned by this process (false: adopted)
  // Adopted, with its leader (`pid`) ended and processes it started in its
  // group living on (a wrapper script that did not exec its server, killed
  // with the gateway that started it): judged and signalled through those
  // (OrphanedGroup), whose group id no new group can take while they hold it.
  bool leader_gone = false;
  pid_t session = 0;  // (leader_gone) the session they must be in (0: none is theirs)
};

// The processes left in `leader`'s group once its leader has ended: those
// whose process group is `leader.pid`, in `leader.session`, started no
// earlier than the leader, zombies left out. Empty while the leader's pid
// names a live process (the leader itself, whose group is stopped through
// it, or another process, whose pid could not have been handed out while
// the leader's group was there, so that group is not the leader's), and
// without a session to match (a record written before it was recorded).
// nullopt when /proc cannot tell (no descriptor left, hidepid): such a group
// is neither taken for ended nor signalled.
std::optional<std::vector<pid_t>> OrphanedGroup(const WorkerPid& leader);

// Whether it has ended. A child is reaped, and what is left of its group
// killed first; `*status` gets its wait status (-1 for an adopted process,
// whose status is not ours to read).
bool Ended(const WorkerPid& p, int* status);

// Its command line (/proc/<pid>/cmdline, one string per argument; empty
// when it cannot be read).
std::vector<std::string> CommandLine(pid_t pid);

// Whether `argv` (a recorded process's CommandLine) is key `key`'s worker of
// the state directory `run_dir`: it names `<run_dir>/<key>.port` after
// --port-file (compared as files). kGone: it has none (a process exiting:
// once its memory is released, its command line reads empty while a GPU
// driver's teardown may hold it in the kernel for seconds).
enum class CommandLineMatch { kNamesIt, kOther, kGone };
CommandLineMatch MatchWorkerCommandLine(const std::vector<std::string>& argv, const std::string& key,
                                        const std::string& run_dir);

// "exit 3", "signal 9", or for -1 "exited (adopted: its exit status is not ours to read)".
std::string DescribeEnd(int status);

// Blocks until it has ended (a child is reaped) or `deadline` passes;
// returns whether it has ended. A waiter, not a sleep loop: it polls a
// pidfd (pidfd_open, Linux 5.3) that becomes readable when the process
// ends; only a kernel without pidfd_open, and a group whose leader has gone
// (WorkerPid::leader_gone), get 10 ms rounds.
bool WaitEnded(const WorkerPid& p, std::chrono::steady_clock::time_point deadline);

// Blocks until it has ended or `bound` passes, without reaping it (a
// caller that reaps under its own lock checks Ended() afterwards); true
// when woken by its end (or it was gone already).
bool AwaitEnd(const WorkerPid& p, std::chrono::milliseconds bound);

// `sig` to its group, unless it has ended (checked first: an adopted pid may
// be someone else's now).
void SignalGroup(const WorkerPid& p, int sig);

// Many stopped together: each `stop_signal` to its group (SIGKILL: no
// grace), one grace period of `grace_ms` for all, SIGKILL to every one still
// there, then 5 s for all of those together (N processes stuck in the
// kernel cost 5 s, not 5 s each). Whether each has ended, in order.
struct GroupStop {
  WorkerPid pid;
  int stop_signal = 15;
};
std::vector<bool> StopGroups(const std::vector<GroupStop>& groups, int64_t grace_ms);

// `stop_signal` (SIGTERM) to its group, SIGKILL once `grace_ms` have passed
// (at once for 0); returns whether it has ended within 5 s of the SIGKILL
// (false: a process stuck in the kernel, which SIGKILL ends only once the
// kernel lets go of it; the caller must not count its memory as free).
bool StopGroup(const WorkerPid& p, int64_t grace_ms, int stop_signal = 15);

}  // namespace spillway::upstream
