#include "common/secret.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace spillway {

std::string RandomHex(size_t bytes) {
  std::vector<unsigned char> raw(bytes);
  if (bytes > 0 && RAND_bytes(raw.data(), static_cast<int>(bytes)) != 1) {
    std::fprintf(stderr, "spillway: no cryptographic random source\n");
    std::abort();
  }
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
  unsigned char a[SHA256_DIGEST_LENGTH], b[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(given.data()), given.size(), a);
  SHA256(reinterpret_cast<const unsigned char*>(expected.data()), expected.size(), b);
  return CRYPTO_memcmp(a, b, sizeof a) == 0;
}

}  // namespace spillway
