#include "common/run_capture.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

extern char** environ;

namespace spillway {

StatusOr<Captured> RunCapture(const std::vector<std::string>& argv) {
  if (argv.empty()) return Status::InvalidArgument("RunCapture: no program");
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Status::Internal(std::string("pipe: ") + std::strerror(errno));
  // stderr into an anonymous file, read once the program has ended (a second
  // pipe read after the first could fill and stall the program).
  const int err_fd = ::memfd_create("run-capture-stderr", MFD_CLOEXEC);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  if (err_fd >= 0) {
    posix_spawn_file_actions_adddup2(&fa, err_fd, 2);
  } else {
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  }
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0].c_str(), &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    if (err_fd >= 0) ::close(err_fd);
    return Status::Unavailable("cannot run " + argv[0] + ": " + std::strerror(rc));
  }
  Captured c;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n > 0) c.out.append(buf, static_cast<size_t>(n));
    else if (n == 0 || errno != EINTR) break;
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (err_fd >= 0) {
    constexpr off_t kTail = 64 << 10;
    struct stat st {};
    const off_t size = ::fstat(err_fd, &st) == 0 ? st.st_size : 0;
    c.err.resize(static_cast<size_t>(std::min(size, kTail)));
    const ssize_t n = c.err.empty() ? 0 : ::pread(err_fd, c.err.data(), c.err.size(), size - static_cast<off_t>(c.err.size()));
    c.err.resize(n > 0 ? static_cast<size_t>(n) : 0);
    ::close(err_fd);
  }
  return c;
}

}  // namespace spillway
