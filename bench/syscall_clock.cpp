// libsyscall_clock.so: times the socket, file-write, sync and epoll calls of a
// process started with LD_PRELOAD, for bench/path_timeline. Each call's
// start and end (CLOCK_MONOTONIC, the vDSO's: no system call of its own),
// its kind, descriptor and result go to a buffer of the calling thread.
// The signal DumpSignal() names writes every thread's buffer to `$SYSCALL_CLOCK_OUT.<pid>.<n>`
// (n counts the dumps from 0) and empties them: a benchmark signals once
// after its warm-up (dump 0, ignored) and once after its requests (dump 1).
// The handler uses only open, write and close (async-signal-safe); a call
// that a thread makes while it runs may be lost (the benchmark sends no
// request then; a loop's timer tick may come).
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "syscall_clock.h"

namespace {

using spillway::bench::ClockEvent;
using spillway::bench::ClockKind;

constexpr int kMaxThreads = 128;
constexpr uint32_t kPerThread = 1 << 17;  // ~128k calls a thread between dumps

struct ThreadLog {
  std::atomic<uint32_t> n{0};
  ClockEvent* ev = nullptr;
  int32_t tid = 0;  // (looked up once: a gettid per call would add a system call to what is timed)
};
ThreadLog g_logs[kMaxThreads];
std::atomic<int> g_threads{0};
std::atomic<int> g_dumps{0};
thread_local ThreadLog* t_log = nullptr;
// $SYSCALL_CLOCK_OUT, read at load: nginx replaces its environment later.
char g_prefix[400] = "/tmp/syscall_clock";

int64_t NowNs() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return int64_t{t.tv_sec} * 1000000000 + t.tv_nsec;
}

ThreadLog* Log() {
  if (t_log) return t_log;
  const int i = g_threads.fetch_add(1);
  if (i >= kMaxThreads) return nullptr;
  auto* ev = static_cast<ClockEvent*>(std::calloc(kPerThread, sizeof(ClockEvent)));
  if (!ev) return nullptr;
  g_logs[i].ev = ev;
  g_logs[i].tid = static_cast<int32_t>(syscall(SYS_gettid));
  t_log = &g_logs[i];
  return t_log;
}

void Record(ClockKind kind, int fd, int64_t t0, int64_t t1, long result) {
  ThreadLog* l = Log();
  if (!l) return;
  uint32_t i = l->n.load(std::memory_order_relaxed);
  if (i >= kPerThread) return;
  l->ev[i] = ClockEvent{t0, t1, l->tid, static_cast<int32_t>(kind), fd, static_cast<int32_t>(result)};
  // (A dump that emptied the buffer meanwhile wins: this call is dropped,
  // not the count set back past what the dump already wrote.)
  l->n.compare_exchange_strong(i, i + 1, std::memory_order_release, std::memory_order_relaxed);
}

template <typename F>
F Next(const char* name) {
  return reinterpret_cast<F>(::dlsym(RTLD_NEXT, name));
}

// Calls `real(args...)` and records it.
template <typename R, typename... A>
R Timed(ClockKind kind, int fd, R (*real)(A...), A... args) {
  const int64_t t0 = NowNs();
  const R r = real(args...);
  const int64_t t1 = NowNs();
  const int err = errno;
  Record(kind, fd, t0, t1, static_cast<long>(r));
  errno = err;
  return r;
}

void WriteAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w <= 0) return;
    c += w;
    n -= static_cast<size_t>(w);
  }
}

// "<prefix>.<pid>.<n>" without snprintf (not async-signal-safe).
void AppendNumber(char* out, size_t cap, long v) {
  char digits[24];
  int k = 0;
  do {
    digits[k++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v > 0 && k < 23);
  size_t len = std::strlen(out);
  while (k > 0 && len + 1 < cap) out[len++] = digits[--k];
  out[len] = '\0';
}

void Dump(int) {
  const int saved = errno;
  char path[512];
  std::strcpy(path, g_prefix);
  std::strcat(path, ".");
  AppendNumber(path, sizeof(path), ::getpid());
  std::strcat(path, ".");
  AppendNumber(path, sizeof(path), g_dumps.fetch_add(1));
  const int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const int threads = g_threads.load() < kMaxThreads ? g_threads.load() : kMaxThreads;
  for (int i = 0; i < threads; ++i) {
    ThreadLog& l = g_logs[i];
    const uint32_t n = l.n.load(std::memory_order_acquire);
    if (fd >= 0 && l.ev && n > 0) WriteAll(fd, l.ev, n * sizeof(ClockEvent));
    l.n.store(0, std::memory_order_relaxed);
  }
  if (fd >= 0) ::close(fd);
  errno = saved;
}

[[gnu::constructor]] void Install() {
  if (const char* p = std::getenv("SYSCALL_CLOCK_OUT"); p && std::strlen(p) < sizeof(g_prefix)) std::strcpy(g_prefix, p);
  struct sigaction sa {};
  sa.sa_handler = Dump;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(spillway::bench::DumpSignal(), &sa, nullptr);
}

}  // namespace

extern "C" {

ssize_t sendmsg(int fd, const msghdr* m, int flags) {
  static const auto real = Next<ssize_t (*)(int, const msghdr*, int)>("sendmsg");
  return Timed(ClockKind::kSend, fd, real, fd, m, flags);
}
ssize_t send(int fd, const void* b, size_t n, int flags) {
  static const auto real = Next<ssize_t (*)(int, const void*, size_t, int)>("send");
  return Timed(ClockKind::kSend, fd, real, fd, b, n, flags);
}
ssize_t writev(int fd, const iovec* v, int c) {
  static const auto real = Next<ssize_t (*)(int, const iovec*, int)>("writev");
  return Timed(ClockKind::kSend, fd, real, fd, v, c);
}
ssize_t recvmsg(int fd, msghdr* m, int flags) {
  static const auto real = Next<ssize_t (*)(int, msghdr*, int)>("recvmsg");
  return Timed(ClockKind::kRecv, fd, real, fd, m, flags);
}
ssize_t recv(int fd, void* b, size_t n, int flags) {
  static const auto real = Next<ssize_t (*)(int, void*, size_t, int)>("recv");
  return Timed(ClockKind::kRecv, fd, real, fd, b, n, flags);
}
ssize_t readv(int fd, const iovec* v, int c) {
  static const auto real = Next<ssize_t (*)(int, const iovec*, int)>("readv");
  return Timed(ClockKind::kRecv, fd, real, fd, v, c);
}
ssize_t recvfrom(int fd, void* b, size_t n, int flags, sockaddr* a, socklen_t* l) {
  static const auto real = Next<ssize_t (*)(int, void*, size_t, int, sockaddr*, socklen_t*)>("recvfrom");
  if (fd <= spillway::bench::kMarkFd) {
    const int64_t t = NowNs();
    Record(ClockKind::kMark, spillway::bench::kMarkFd - fd, t, t, 0);
    errno = EBADF;
    return -1;
  }
  return Timed(ClockKind::kRecv, fd, real, fd, b, n, flags, a, l);
}
ssize_t pwrite64(int fd, const void* b, size_t n, off_t o) {
  static const auto real = Next<ssize_t (*)(int, const void*, size_t, off_t)>("pwrite64");
  return Timed(ClockKind::kFileWrite, fd, real, fd, b, n, o);
}
ssize_t pwrite(int fd, const void* b, size_t n, off_t o) {
  static const auto real = Next<ssize_t (*)(int, const void*, size_t, off_t)>("pwrite");
  return Timed(ClockKind::kFileWrite, fd, real, fd, b, n, o);
}
int fdatasync(int fd) {
  static const auto real = Next<int (*)(int)>("fdatasync");
  return Timed(ClockKind::kSync, fd, real, fd);
}
int fsync(int fd) {
  static const auto real = Next<int (*)(int)>("fsync");
  return Timed(ClockKind::kSync, fd, real, fd);
}
int epoll_wait(int fd, epoll_event* ev, int max, int timeout) {
  static const auto real = Next<int (*)(int, epoll_event*, int, int)>("epoll_wait");
  return Timed(timeout == 0 ? ClockKind::kPoll : ClockKind::kWait, fd, real, fd, ev, max, timeout);
}

}  // extern "C"
