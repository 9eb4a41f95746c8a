#include "upstream/worker_secret.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "common/private_files.h"
#include "common/secret.h"

namespace spillway::upstream {

namespace {

constexpr size_t kMinSecret = 16;

// The file's content if it is a regular file (not a link) of this user that
// no one else may read; empty otherwise.
std::string ReadOwnPrivateFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat st {};
  std::string out;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() && (st.st_mode & 077) == 0 &&
      st.st_size < 4096) {
    out.resize(static_cast<size_t>(st.st_size));
    const ssize_t n = ::read(fd, out.data(), out.size());
    out.resize(n > 0 ? static_cast<size_t>(n) : 0);
  }
  ::close(fd);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r' || out.back() == ' ')) out.pop_back();
  return out;
}

}  // namespace

StatusOr<std::string> WorkerSecretFor(const std::string& run_dir) {
  if (const char* given = std::getenv(kWorkerSecretEnv); given && std::strlen(given) >= kMinSecret) return std::string(given);
  const std::string path = run_dir + "/worker.secret";
  // (Tested in the condition, built in the return: GCC 12 warned of a bounds
  // error that is not there, -Warray-bounds, when `kept` was moved out whole.)
  if (const std::string kept = ReadOwnPrivateFile(path); kept.size() >= kMinSecret) {
    return std::string(kept.data(), kept.size());
  }
  std::string fresh = RandomHex(32);
  if (Status st = WritePrivateFileAtomically(path, fresh + "\n"); !st.ok()) return st;
  return fresh;
}

}  // namespace spillway::upstream
