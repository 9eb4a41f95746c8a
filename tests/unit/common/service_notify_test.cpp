#include "common/service_notify.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>

#include "notify_listener.h"

namespace spillway {
namespace {

using std::chrono::milliseconds;
using testing::NotifyListener;

TEST(ServiceNotifierTest, SendsOneDatagramToAPathSocket) {
  NotifyListener listener;
  ServiceNotifier n(listener.address().c_str(), nullptr, nullptr, ::getpid());
  ASSERT_TRUE(n.enabled());
  ASSERT_TRUE(n.Notify("READY=1\nSTATUS=serving").ok());
  EXPECT_EQ(listener.Receive(milliseconds(5000)), "READY=1\nSTATUS=serving");
  ASSERT_TRUE(n.Notify("WATCHDOG=1").ok());
  EXPECT_EQ(listener.Receive(milliseconds(5000)), "WATCHDOG=1");
}

TEST(ServiceNotifierTest, SendsToAnAbstractSocket) {
  NotifyListener listener(/*abstract=*/true);
  ASSERT_EQ(listener.address()[0], '@');
  ServiceNotifier n(listener.address().c_str(), nullptr, nullptr, ::getpid());
  ASSERT_TRUE(n.Notify("STOPPING=1").ok());
  EXPECT_EQ(listener.Receive(milliseconds(5000)), "STOPPING=1");
}

TEST(ServiceNotifierTest, ReadsTheEnvironment) {
  NotifyListener listener;
  setenv("NOTIFY_SOCKET", listener.address().c_str(), 1);
  setenv("WATCHDOG_USEC", "3000000", 1);
  setenv("WATCHDOG_PID", std::to_string(::getpid()).c_str(), 1);
  const ServiceNotifier n = ServiceNotifier::FromEnvironment();
  unsetenv("NOTIFY_SOCKET");
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
  ASSERT_TRUE(n.Notify("READY=1").ok());
  EXPECT_EQ(listener.Receive(milliseconds(5000)), "READY=1");
  EXPECT_EQ(n.WatchdogPeriod(), std::chrono::microseconds(3000000));
}

TEST(ServiceNotifierTest, WithoutASocketNothingIsSent) {
  ServiceNotifier n(nullptr, nullptr, nullptr, ::getpid());
  EXPECT_FALSE(n.enabled());
  EXPECT_TRUE(n.Notify("READY=1").ok());
  EXPECT_FALSE(n.WatchdogPeriod());
  EXPECT_FALSE(ServiceNotifier("", nullptr, nullptr, 1).enabled());
}

TEST(ServiceNotifierTest, ABadSocketIsAClearError) {
  const Status relative = ServiceNotifier("run/notify", nullptr, nullptr, 1).Notify("READY=1");
  EXPECT_EQ(relative.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(relative.message().find("run/notify"), std::string::npos);
  EXPECT_EQ(ServiceNotifier(("/" + std::string(200, 'x')).c_str(), nullptr, nullptr, 1).Notify("x").code(),
            StatusCode::kInvalidArgument);
  // Nobody bound there: the send fails, naming the socket.
  const Status gone = ServiceNotifier("/nonexistent/notify.sock", nullptr, nullptr, 1).Notify("READY=1");
  EXPECT_EQ(gone.code(), StatusCode::kUnavailable);
  EXPECT_NE(gone.message().find("/nonexistent/notify.sock"), std::string::npos);
}

TEST(ServiceNotifierTest, TheWatchdogIsOursOnlyForOurPid) {
  EXPECT_EQ(ServiceNotifier("/x", "500000", nullptr, 42).WatchdogPeriod(), std::chrono::microseconds(500000));
  EXPECT_EQ(ServiceNotifier("/x", "500000", "42", 42).WatchdogPeriod(), std::chrono::microseconds(500000));
  EXPECT_FALSE(ServiceNotifier("/x", "500000", "43", 42).WatchdogPeriod());  // a parent's watchdog, inherited
  EXPECT_FALSE(ServiceNotifier("/x", "500000", "x", 42).WatchdogPeriod());
  EXPECT_FALSE(ServiceNotifier("/x", "0", nullptr, 42).WatchdogPeriod());
  EXPECT_FALSE(ServiceNotifier("/x", "-5", nullptr, 42).WatchdogPeriod());
  EXPECT_FALSE(ServiceNotifier("/x", "12abc", nullptr, 42).WatchdogPeriod());
  EXPECT_FALSE(ServiceNotifier("/x", nullptr, "42", 42).WatchdogPeriod());
}

}  // namespace
}  // namespace spillway
