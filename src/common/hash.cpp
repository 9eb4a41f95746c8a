#include "common/hash.h"

#include <openssl/evp.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

namespace spillway {
namespace {

struct MdCtxFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};

std::string Hex(const unsigned char* d, unsigned n) {
  std::string out;
  AppendHex(out, d, n);
  return out;
}

}  // namespace

void AppendHex(std::string& out, const unsigned char* data, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  out.reserve(out.size() + 2 * n);
  for (size_t i = 0; i < n; ++i) {
    out += kDigits[data[i] >> 4];
    out += kDigits[data[i] & 15];
  }
}

namespace {

// Fetched once: EVP_sha256() makes OpenSSL 3 look the algorithm up again on
// every digest (a global lock and a table search), which costs more than
// hashing a request body.
const EVP_MD* Sha256Md() {
  static EVP_MD* const md = [] {
    EVP_MD* m = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    if (!m) {
      std::fprintf(stderr, "spillway: OpenSSL has no SHA-256\n");
      std::abort();
    }
    return m;
  }();
  return md;
}

}  // namespace

void Sha256(std::string_view data, unsigned char (&out)[32]) {
  unsigned n = 0;
  EVP_Digest(data.data(), data.size(), out, &n, Sha256Md(), nullptr);
}

std::string Sha256Hex(std::string_view data) {
  unsigned char md[32];
  Sha256(data, md);
  return Hex(md, sizeof md);
}

StatusOr<std::string> Sha256File(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) return Status::NotFound("cannot open " + path);
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  EVP_DigestInit_ex(ctx.get(), Sha256Md(), nullptr);
  std::vector<char> buf(1 << 20);
  size_t got;
  while ((got = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) {
    EVP_DigestUpdate(ctx.get(), buf.data(), got);
  }
  if (std::ferror(f.get())) return Status::Internal("read error on " + path);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &n);
  return Hex(md, n);
}

}  // namespace spillway
