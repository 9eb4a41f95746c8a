#include "common/hash.h"

#include <openssl/evp.h>

#include <cstdio>
#include <memory>
#include <vector>

namespace spillway {
namespace {

struct MdCtxFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};

std::string Hex(const unsigned char* d, unsigned n) {
  static const char* kDigits = "0123456789abcdef";
  std::string out(n * 2, '0');
  for (unsigned i = 0; i < n; ++i) {
    out[2 * i] = kDigits[d[i] >> 4];
    out[2 * i + 1] = kDigits[d[i] & 15];
  }
  return out;
}

}  // namespace

std::string Sha256Hex(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  EVP_Digest(data.data(), data.size(), md, &n, EVP_sha256(), nullptr);
  return Hex(md, n);
}

StatusOr<std::string> Sha256File(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) return Status::NotFound("cannot open " + path);
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
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
