#include "upstream/worker_secret.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
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
  // (O_NONBLOCK: a FIFO planted under the name would block the open until a writer came.)
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
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
  if (const char* given = std::getenv(kWorkerSecretEnv)) {
    if (std::strlen(given) >= kMinSecret) return std::string(given);
    std::fprintf(stderr, "spillway: $%s is shorter than %zu characters: ignored (the state directory's secret is used)\n",
                 kWorkerSecretEnv, kMinSecret);
  }
  const std::string path = run_dir + "/worker.secret";
  // (Tested in the condition, built in the return: GCC 12 warned of a bounds
  // error that is not there, -Warray-bounds, when `kept` was moved out whole.)
  if (const std::string kept = ReadOwnPrivateFile(path); kept.size() >= kMinSecret) {
    return std::string(kept.data(), kept.size());
  }
  std::string fresh = RandomHex(32);
  // Only where there is none: a gateway starting beside this one on the same
  // state directory (one of the two then exits, refused its lock) must not
  // replace the secret the other's workers were started with.
  Status st = WriteFileAtomically(path, fresh + "\n", 0600, /*replace=*/false);
  if (st.code() == StatusCode::kConflict) {
    if (const std::string kept = ReadOwnPrivateFile(path); kept.size() >= kMinSecret) {
      return std::string(kept.data(), kept.size());  // the other's, written meanwhile
    }
    st = WritePrivateFileAtomically(path, fresh + "\n");  // not one to keep (see the header)
  }
  if (!st.ok()) return st;
  return fresh;
}

}  // namespace spillway::upstream
