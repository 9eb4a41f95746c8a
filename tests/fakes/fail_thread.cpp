// LD_PRELOAD shim for tests: the FAIL_THREAD_AT-th pthread_create of the
// process fails with EAGAIN (what the process or user thread limit gives),
// so a test can make each thread a program starts fail in turn.
#include <dlfcn.h>
#include <pthread.h>
#include <atomic>
#include <cerrno>
#include <cstdlib>
extern "C" int pthread_create(pthread_t* t, const pthread_attr_t* a, void* (*f)(void*), void* arg) {
  using Fn = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "pthread_create"));
  static std::atomic<int> n{0};
  static const int fail_at = [] { const char* e = std::getenv("FAIL_THREAD_AT"); return e ? std::atoi(e) : 0; }();
  if (++n == fail_at) return EAGAIN;
  return real(t, a, f, arg);
}
