// libslow_sync.so: fdatasync and fsync made SLOW_SYNC_US microseconds
// slower (default 2000), for a process started with LD_PRELOAD. This
// machine's virtual disk syncs in 100-200 us; a home server's consumer SSD
// without power-loss protection takes milliseconds to flush. Benchmarks run
// under it show what the journal's syncs cost there, e.g.
//   LD_PRELOAD=build/bench/libslow_sync.so SLOW_SYNC_US=2000 build/bench/gateway_overhead
// (the gateway inherits it; so does the benchmark's own disk-sync floor).
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <ctime>

namespace {

void Delay() {
  static const long us = [] {
    const char* v = std::getenv("SLOW_SYNC_US");
    const long n = v ? std::strtol(v, nullptr, 10) : 2000;
    return n > 0 ? n : 0L;
  }();
  timespec ts{us / 1000000, (us % 1000000) * 1000};
  while (::nanosleep(&ts, &ts) != 0) {
  }
}

template <typename F>
F Next(const char* name) {
  return reinterpret_cast<F>(::dlsym(RTLD_NEXT, name));
}

}  // namespace

extern "C" int fdatasync(int fd) {
  static const auto real = Next<int (*)(int)>("fdatasync");
  Delay();
  return real(fd);
}

extern "C" int fsync(int fd) {
  static const auto real = Next<int (*)(int)>("fsync");
  Delay();
  return real(fd);
}
