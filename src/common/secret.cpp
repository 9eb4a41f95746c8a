#include "common/secret.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <sys/random.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/hash.h"

namespace spillway {

namespace {

// The kernel's CSPRNG (getrandom), which also seeds OpenSSL's: one system
// call, where RAND_bytes takes its DRBG's locks and layers on every call
// (it was a visible share of a request's CPU, which draws an id each).
// OpenSSL's is the fallback where getrandom is missing.
void FillRandom(unsigned char* out, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = getrandom(out + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  if (got < n && RAND_bytes(out + got, static_cast<int>(n - got)) != 1) {
    std::fprintf(stderr, "spillway: no cryptographic random source\n");
    std::abort();
  }
}

// Forks of this process so far, counted in each child (pthread_atfork): a
// store filled before a fork is not drawn from after it.
std::atomic<uint64_t> g_forks{0};
void CountFork() { g_forks.fetch_add(1, std::memory_order_relaxed); }

// Small draws (a request's id, one per request) come from a per-thread
// store of the kernel's bytes, refilled 512 at a time: one getrandom every
// few dozen requests instead of one each. Bytes are never handed out twice,
// and a forked child refills before it draws, so it never repeats its
// parent's (told by a count of forks rather than by getpid(), a system call
// on every request's way).
void DrawRandom(unsigned char* out, size_t n) {
  constexpr size_t kStore = 512, kSmall = 32;
  if (n > kSmall) return FillRandom(out, n);
  [[maybe_unused]] static const bool counted = pthread_atfork(nullptr, nullptr, CountFork) == 0;
  thread_local unsigned char store[kStore];
  thread_local size_t left = 0;
  thread_local uint64_t filled_at = 0;
  const uint64_t forks = g_forks.load(std::memory_order_relaxed);
  if (left < n || filled_at != forks) {
    FillRandom(store, kStore);
    left = kStore;
    filled_at = forks;
  }
  unsigned char* from = store + (kStore - left);
  std::memcpy(out, from, n);
  OPENSSL_cleanse(from, n);  // drawn bytes do not linger in the store
  left -= n;
}

}  // namespace

void AppendRandomHex(std::string& out, size_t bytes) {
  // A small draw (a request id's 8 bytes) on the stack; a larger one, drawn
  // straight from the kernel (DrawRandom), on the heap. Wiped after use.
  unsigned char small[32];
  std::vector<unsigned char> large(bytes > sizeof small ? bytes : 0);
  unsigned char* raw = large.empty() ? small : large.data();
  if (bytes == 0) return;
  DrawRandom(raw, bytes);
  AppendHex(out, raw, bytes);
  OPENSSL_cleanse(raw, bytes);
}

std::string RandomHex(size_t bytes) {
  std::string out;
  AppendRandomHex(out, bytes);
  return out;
}

bool SecretEquals(std::string_view given, std::string_view expected) {
  unsigned char a[32], b[32];
  Sha256(given, a);
  Sha256(expected, b);
  return CRYPTO_memcmp(a, b, sizeof a) == 0;
}

}  // namespace spillway
