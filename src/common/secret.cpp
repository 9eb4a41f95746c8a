#include "common/secret.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
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

}  // namespace

std::string RandomHex(size_t bytes) {
  std::vector<unsigned char> raw(bytes);
  if (bytes > 0) FillRandom(raw.data(), bytes);
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes);
  for (unsigned char c : raw) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

bool SecretEquals(std::string_view given, std::string_view expected) {
  unsigned char a[32], b[32];
  Sha256(given, a);
  Sha256(expected, b);
  return CRYPTO_memcmp(a, b, sizeof a) == 0;
}

}  // namespace spillway
