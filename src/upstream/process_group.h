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

#include <cstdint>
#include <string>

namespace spillway::upstream {

struct WorkerPid {
  pid_t pid = 0;
  uint64_t start_time = 0;  // /proc/<pid>/stat field 22
  bool child = true;        // spawned by this process (false: adopted)
};

// Whether it has ended. A child is reaped; `*status` gets its wait status
// (-1 for an adopted process, whose status is not ours to read).
bool Ended(const WorkerPid& p, int* status);

// "exit 3", "signal 9", or for -1 "exited (adopted: its exit status is not ours to read)".
std::string DescribeEnd(int status);

// `stop_signal` (SIGTERM) to its group, SIGKILL once `grace_ms` have passed (at once for 0);
// returns whether it has ended (false only for an adopted process still
// there 5 s after SIGKILL: a process stuck in the kernel).
bool StopGroup(const WorkerPid& p, int64_t grace_ms, int stop_signal = 15);

}  // namespace spillway::upstream
