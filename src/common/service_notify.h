// The systemd notification protocol (sd_notify(3)), written out: one
// datagram of "KEY=VALUE\n" lines to the AF_UNIX socket named by
// $NOTIFY_SOCKET (a path, or "@name" for an abstract socket), and the
// watchdog period from $WATCHDOG_USEC / $WATCHDOG_PID.
//
//   ServiceNotifier n = ServiceNotifier::FromEnvironment();
//   if (n.enabled()) n.Notify("READY=1\nSTATUS=serving");
//   if (auto period = n.WatchdogPeriod()) ... send "WATCHDOG=1" every *period / 2
//
// Hand-written rather than linked against libsystemd: the protocol is a
// documented, stable interface (systemd's own man page gives a reference
// implementation for services to copy), it is thirty lines, and the
// installed binary then runs the same with or without systemd.
//
// Outside systemd (no $NOTIFY_SOCKET) every call is a no-op returning Ok.
// Thread-safe: Notify() may be called from any thread (one sendto per call).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace spillway {

class ServiceNotifier {
 public:
  // From the given values of $NOTIFY_SOCKET, $WATCHDOG_USEC and $WATCHDOG_PID
  // (each may be null) as seen by process `self`: tests pass their own.
  ServiceNotifier(const char* notify_socket, const char* watchdog_usec, const char* watchdog_pid, pid_t self);
  // From this process's environment.
  static ServiceNotifier FromEnvironment();

  // Whether a service manager listens ($NOTIFY_SOCKET set and not empty).
  bool enabled() const { return !socket_.empty(); }
  // The watchdog timeout systemd expects pings within (WatchdogSec=), when it
  // is set for this process: $WATCHDOG_USEC a positive number and
  // $WATCHDOG_PID unset or this process's pid. Ping at half of it.
  std::optional<std::chrono::microseconds> WatchdogPeriod() const { return watchdog_; }

  // Sends `state` ("READY=1", "STATUS=...", "WATCHDOG=1", "STOPPING=1", or
  // several of them separated by '\n') in one datagram. Ok without a
  // listener; kUnavailable naming the socket when it cannot be sent,
  // kInvalidArgument for a $NOTIFY_SOCKET that is neither an absolute path
  // nor "@name", or too long for a socket address.
  Status Notify(std::string_view state) const;

 private:
  std::string socket_;
  std::optional<std::chrono::microseconds> watchdog_;
};

}  // namespace spillway
