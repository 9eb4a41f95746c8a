#include "cli/serve_notify.h"

#include <boost/asio/post.hpp>

#include <cstdio>

#include "upstream/startup_progress.h"

namespace spillway::cli {

ServeNotifications::ServeNotifications(boost::asio::io_context& ioc, const upstream::Workers& workers,
                                       ServiceNotifier notifier)
    : ioc_(ioc), workers_(workers), notifier_(std::move(notifier)), check_timer_(ioc), watchdog_timer_(ioc) {}

void ServeNotifications::Start(const std::string& listening) {
  if (!notifier_.enabled()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    listening_ = listening;
  }
  Check();
  ScheduleCheck();
  if (notifier_.WatchdogPeriod()) {
    Send("WATCHDOG=1");
    ScheduleWatchdog();
  }
}

void ServeNotifications::WorkerReady(const std::string& key) {
  if (!notifier_.enabled()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    announced_.insert(key);
  }
  boost::asio::post(ioc_, [this] { Check(); });  // READY=1 now, not at the next second
}

void ServeNotifications::Stopping() {
  if (!notifier_.enabled()) return;
  std::lock_guard<std::mutex> lk(mu_);
  stopping_ = true;
  check_timer_.cancel();
  watchdog_timer_.cancel();
  Send("STOPPING=1\nSTATUS=stopping: its workers get SIGTERM, SIGKILL after 5 s");
}

void ServeNotifications::Check() {
  const auto snapshot = workers_.Snapshot();  // outside the lock: the supervisor takes its own
  std::lock_guard<std::mutex> lk(mu_);
  if (stopping_ || listening_.empty()) return;
  const auto progress = upstream::MeasureStartup(snapshot, announced_);
  const std::string status = upstream::StartupStatusLine(progress, listening_);
  std::string message;
  if (status != last_status_) message = "STATUS=" + status;
  if (!ready_sent_ && progress.settled()) {
    message = "READY=1\n" + (message.empty() ? "STATUS=" + status : message);
    ready_sent_ = true;
  }
  last_status_ = status;
  if (!message.empty()) Send(message);
}

// Timers are armed and cancelled under mu_ only: handlers run on either I/O
// thread, and Stopping() comes from the signal handler's.
void ServeNotifications::ScheduleCheck() {
  std::lock_guard<std::mutex> lk(mu_);
  if (stopping_) return;
  check_timer_.expires_after(std::chrono::seconds(1));
  check_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    Check();
    ScheduleCheck();
  });
}

void ServeNotifications::ScheduleWatchdog() {
  std::lock_guard<std::mutex> lk(mu_);
  if (stopping_) return;
  watchdog_timer_.expires_after(*notifier_.WatchdogPeriod() / 2);
  watchdog_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    Send("WATCHDOG=1");
    ScheduleWatchdog();
  });
}

void ServeNotifications::Send(const std::string& state) {
  const Status st = notifier_.Notify(state);
  if (st.ok() || send_failed_.exchange(true)) return;  // said once: a service manager that went away is not worth a line a second
  std::fprintf(stderr, "spillway serve: systemd notification failed (said once): %s\n", st.message().c_str());
}

}  // namespace spillway::cli
