// What `spillway serve` tells systemd (Type=notify, common/service_notify.h):
//
//   READY=1     once it listens and its start has settled: every worker ready,
//               or each that is not has failed a start and is being retried
//               with backoff (so `systemctl start` returns and says why,
//               rather than hang until TimeoutStartSec and restart a gateway
//               whose other services work);
//   STATUS=...  the startup line (upstream/startup_progress.h) whenever it
//               changes, checked every second and at each worker's readiness;
//   WATCHDOG=1  every half of $WATCHDOG_USEC, from a timer on the I/O
//               context: a wedged event loop stops the pings and systemd
//               restarts the gateway (WatchdogSec=);
//   STOPPING=1  when a shutdown begins.
//
// Without $NOTIFY_SOCKET nothing is scheduled. Notification failures are
// logged once and never stop the gateway.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <atomic>
#include <mutex>
#include <set>
#include <string>

#include "common/service_notify.h"
#include "upstream/workers.h"

namespace spillway::cli {

// Lives as long as `ioc` runs; callers stop the I/O context before it goes.
class ServeNotifications {
 public:
  ServeNotifications(boost::asio::io_context& ioc, const upstream::Workers& workers, ServiceNotifier notifier);
  // Starts the status checks and the watchdog, once the gateway listens.
  void Start(const std::string& listening);
  // The gateway announced `key` ready (any thread).
  void WorkerReady(const std::string& key);
  // A shutdown begins (I/O thread): STOPPING=1, timers cancelled.
  void Stopping();

 private:
  void Check();  // sends STATUS (and READY once) when something changed
  void ScheduleCheck();
  void ScheduleWatchdog();
  void Send(const std::string& state);

  boost::asio::io_context& ioc_;
  const upstream::Workers& workers_;
  const ServiceNotifier notifier_;
  boost::asio::steady_timer check_timer_, watchdog_timer_;
  std::mutex mu_;  // guards what follows: checks run on either I/O thread
  std::set<std::string> announced_;
  std::string listening_, last_status_;
  bool ready_sent_ = false, stopping_ = false;
  std::atomic<bool> send_failed_{false};
};

}  // namespace spillway::cli
