#include "common/service_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>

namespace spillway {

namespace {

// A positive decimal number and nothing else, or nullopt.
std::optional<unsigned long long> Number(const char* text) {
  if (!text || !*text) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (errno != 0 || *end != 0 || text[0] == '-' || v == 0) return std::nullopt;
  return v;
}

}  // namespace

ServiceNotifier::ServiceNotifier(const char* notify_socket, const char* watchdog_usec, const char* watchdog_pid,
                                 pid_t self)
    : socket_(notify_socket ? notify_socket : "") {
  const auto usec = Number(watchdog_usec);
  // As sd_watchdog_enabled(3): a WATCHDOG_PID of another process means the
  // watchdog is not ours (a child that inherited the environment).
  const auto pid = Number(watchdog_pid);
  if (usec && (!watchdog_pid || (pid && static_cast<pid_t>(*pid) == self))) {
    watchdog_ = std::chrono::microseconds(*usec);
  }
}

ServiceNotifier ServiceNotifier::FromEnvironment() {
  return ServiceNotifier(std::getenv("NOTIFY_SOCKET"), std::getenv("WATCHDOG_USEC"), std::getenv("WATCHDOG_PID"),
                         ::getpid());
}

Status ServiceNotifier::Notify(std::string_view state) const {
  if (socket_.empty()) return Status::Ok();
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_[0] != '/' && socket_[0] != '@') {
    return Status::InvalidArgument("NOTIFY_SOCKET '" + socket_ + "' is neither an absolute path nor @name");
  }
  if (socket_.size() >= sizeof addr.sun_path) {
    return Status::InvalidArgument("NOTIFY_SOCKET '" + socket_ + "' is too long for a socket address");
  }
  std::memcpy(addr.sun_path, socket_.data(), socket_.size());
  // "@name": an abstract socket, its address a leading NUL and exactly the name.
  if (socket_[0] == '@') addr.sun_path[0] = 0;
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + socket_.size() +
                                               (socket_[0] == '@' ? 0 : 1));
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Unavailable(std::string("cannot open a socket for NOTIFY_SOCKET: ") + std::strerror(errno));
  ssize_t sent;
  do {
    sent = ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&addr), len);
  } while (sent < 0 && errno == EINTR);
  const int err = errno;
  ::close(fd);
  if (sent < 0) return Status::Unavailable("cannot notify " + socket_ + ": " + std::strerror(err));
  if (static_cast<size_t>(sent) != state.size()) return Status::Unavailable("short notification to " + socket_);
  return Status::Ok();
}

}  // namespace spillway
