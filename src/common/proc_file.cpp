#include "common/proc_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

namespace spillway {

std::optional<std::string> ReadAll(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      return out;
    } else if (errno != EINTR) {
      return std::nullopt;
    }
  }
}

std::optional<std::string> ReadSmallFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  auto out = ReadAll(fd);
  const int read_errno = errno;
  ::close(fd);
  errno = read_errno;  // (the caller may ask why: ESRCH, a process reaped meanwhile)
  return out;
}

}  // namespace spillway
