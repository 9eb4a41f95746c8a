// A stand-in for systemd's notification socket: a datagram socket bound to a
// fresh path (or an abstract name) that tests point $NOTIFY_SOCKET at, and
// read with a deadline (poll, never a sleep).
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>

namespace spillway::testing {

class NotifyListener {
 public:
  // abstract: bind "@spillway-notify-<random>" instead of a file.
  explicit NotifyListener(bool abstract = false) {
    const std::string tag = std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}());
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) throw std::runtime_error("socket");
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    socklen_t len;
    if (abstract) {
      address_ = "@spillway-notify-" + tag;
      std::memcpy(addr.sun_path + 1, address_.data() + 1, address_.size() - 1);
      len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address_.size());
    } else {
      address_ = (std::filesystem::temp_directory_path() / ("spillway-notify-" + tag)).string();
      path_ = address_;
      std::memcpy(addr.sun_path, address_.c_str(), address_.size() + 1);
      len = sizeof addr;
    }
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0) throw std::runtime_error("bind " + address_);
  }
  ~NotifyListener() {
    ::close(fd_);
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  NotifyListener(const NotifyListener&) = delete;
  NotifyListener& operator=(const NotifyListener&) = delete;

  // What $NOTIFY_SOCKET names: the path, or "@name".
  const std::string& address() const { return address_; }

  // The next datagram, or nullopt when none arrives within `timeout`.
  std::optional<std::string> Receive(std::chrono::milliseconds timeout) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return std::nullopt;
    char buf[4096];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n < 0) return std::nullopt;
    return std::string(buf, static_cast<size_t>(n));
  }

  // Datagrams are read until one contains `needle`; returns it (nullopt at the
  // deadline). Everything read on the way is appended to *seen when given.
  std::optional<std::string> WaitFor(const std::string& needle, std::chrono::milliseconds timeout,
                                     std::string* seen = nullptr) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      auto m = Receive(left);
      if (!m) return std::nullopt;
      if (seen) *seen += *m + "\n--\n";
      if (m->find(needle) != std::string::npos) return m;
    }
  }

 private:
  int fd_ = -1;
  std::string address_, path_;
};

}  // namespace spillway::testing
