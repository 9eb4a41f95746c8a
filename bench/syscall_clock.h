// What libsyscall_clock.so (syscall_clock.cpp) records of each call, as
// bench/path_timeline reads it back: one fixed-size record per call.
#pragma once

#include <csignal>
#include <cstdint>

namespace spillway::bench {

enum class ClockKind : int32_t {
  kSend = 0,       // sendmsg, send, writev
  kRecv = 1,       // recvmsg, recv, readv, recvfrom
  kFileWrite = 2,  // pwrite
  kPoll = 3,       // epoll_wait with a zero timeout (nothing waited for)
  kWait = 4,       // epoll_wait that may block: the thread sleeps until woken
  kMark = 5,       // no call: a point an experimental build marks (below), its id as `fd`
  kSync = 6,       // fdatasync, fsync
};

// An experimental build (never a committed one) can timestamp a point of its
// own code under the library with `::recvfrom(kMarkFd - id, nullptr, 0, 0,
// nullptr, nullptr)`: the library records it as kMark and makes no system
// call; without the library it fails at once with EBADF.
inline constexpr int kMarkFd = -1000;

// The signal that writes the calls out: a real-time one, which nginx and the
// gateway leave alone (nginx takes SIGUSR2 for a binary upgrade).
inline int DumpSignal() { return SIGRTMIN + 5; }

struct ClockEvent {
  int64_t start_ns;  // CLOCK_MONOTONIC
  int64_t end_ns;
  int32_t tid;
  int32_t kind;  // ClockKind
  int32_t fd;
  int32_t result;  // bytes, or -1
};
static_assert(sizeof(ClockEvent) == 32);

}  // namespace spillway::bench
