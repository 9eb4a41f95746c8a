#include "common/run_capture.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <thread>

extern char** environ;

namespace spillway {

std::vector<std::string> HelperEnvironment() {
  static const char* kPrefixes[] = {"LC_", "GGML_", "LLAMA_", "CUDA_", "NVIDIA_", "HIP_", "ROCR_", "OMP_", "GOMP_"};
  static const char* kNames[] = {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR",
                                 "LD_LIBRARY_PATH", "SPILLWAY_SIM_DIR", "SPILLWAY_FAULTS",
                                 "SPILLWAY_MUTATIONS"};
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const std::string_view kv(*e);
    const std::string_view name = kv.substr(0, kv.find('='));
    bool keep = false;
    for (const char* n : kNames) keep |= name == n;
    for (const char* p : kPrefixes) keep |= name.rfind(p, 0) == 0;
    if (keep) env.emplace_back(kv);
  }
  return env;
}

namespace {

// How long a killed program may take to end before it is left to a thread
// of its own (one in uninterruptible sleep, in a driver, outlives SIGKILL).
constexpr auto kKilledGrace = std::chrono::seconds(5);

// Waits for `pid`: its exit code (-1: a signal), or why it could not be
// waited for. With a deadline, a program still running then (its stdout
// closed, but not ended) is killed (*killed), and waited for kKilledGrace
// more at most.
StatusOr<int> Reap(pid_t pid, std::optional<std::chrono::steady_clock::time_point> deadline, bool* killed) {
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, deadline ? WNOHANG : 0);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) return Status::Internal(std::string("waitpid: ") + std::strerror(errno));
    if (r == 0 && std::chrono::steady_clock::now() >= *deadline) {
      if (*killed) {
        std::thread([pid] {
          while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
          }
        }).detach();
        return Status::DeadlineExceeded("it did not end when killed");
      }
      ::kill(pid, SIGKILL);
      *killed = true;
      deadline = std::chrono::steady_clock::now() + kKilledGrace;
    } else if (r == 0) {
      ::usleep(2000);
    }
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

void ResetSignalsOnSpawn(posix_spawnattr_t* attr, short flags) {
  sigset_t none, defaults;
  sigemptyset(&none);
  sigfillset(&defaults);  // (every signal a process may set; glibc keeps its own two out)
  sigdelset(&defaults, SIGKILL);
  sigdelset(&defaults, SIGSTOP);
  posix_spawnattr_setsigmask(attr, &none);
  posix_spawnattr_setsigdefault(attr, &defaults);
  posix_spawnattr_setflags(attr, static_cast<short>(flags | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF));
}

StatusOr<Captured> RunCapture(const std::vector<std::string>& argv, const RunOptions& options) {
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
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addclosefrom_np(&fa, 3);  // (descriptors without O_CLOEXEC too)
  // Default signal handling and no blocked signals (the caller may ignore SIGPIPE, block others).
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  ResetSignalsOnSpawn(&attr);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  if (options.env) {
    for (const auto& e : *options.env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
  }
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0].c_str(), &fa, &attr, args.data(), options.env ? envp.data() : environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    if (err_fd >= 0) ::close(err_fd);
    return Status::Unavailable("cannot run " + argv[0] + ": " + std::strerror(rc));
  }
  Captured c;
  Status cut;  // why it was killed, if it was
  auto too_long = [&] {
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.1f", static_cast<double>(options.timeout_ms) / 1000);
    return Status::DeadlineExceeded(argv[0] + " did not finish within " + secs + " s: killed");
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options.timeout_ms);
  char buf[4096];
  for (;;) {
    int wait_ms = -1;
    if (options.timeout_ms > 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        cut = too_long();
        break;
      }
      wait_ms = static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
    }
    pollfd p{fds[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, wait_ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) {
      cut = Status::Internal(std::string("poll: ") + std::strerror(errno));
      break;
    }
    if (ready == 0) continue;  // (the deadline is checked above)
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n > 0) {
      c.out.append(buf, static_cast<size_t>(n));
      if (c.out.size() > options.max_out) {
        cut = Status::ResourceExhausted(argv[0] + " wrote more than " + std::to_string(options.max_out) +
                                        " bytes: killed");
        break;
      }
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(fds[0]);
  bool killed = !cut.ok();
  if (killed) ::kill(pid, SIGKILL);
  std::optional<std::chrono::steady_clock::time_point> reap_by;
  if (killed) reap_by = std::chrono::steady_clock::now() + kKilledGrace;
  else if (options.timeout_ms > 0) reap_by = deadline;
  auto code = Reap(pid, reap_by, &killed);
  if (killed && cut.ok()) cut = too_long();
  if (!cut.ok() || !code.ok()) {
    if (err_fd >= 0) ::close(err_fd);
    return !cut.ok() ? cut : code.status();
  }
  c.exit_code = *code;
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
