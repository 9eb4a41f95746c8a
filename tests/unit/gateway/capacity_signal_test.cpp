// The service line of CapacitySignal: first come, first served; a release
// wakes the head alone and the head's leaving wakes the next; a wake that
// comes while its waiter is busy is kept; NotifyAll reaches everyone.
#include "gateway/capacity_signal.h"

#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace spillway::gateway {
namespace {

namespace net = boost::asio;
using namespace std::chrono_literals;

// Runs `f` once `after` has passed on `ioc`.
void At(net::io_context& ioc, std::chrono::milliseconds after, std::function<void()> f) {
  auto t = std::make_shared<net::steady_timer>(ioc, after);
  t->async_wait([t, f = std::move(f)](const boost::system::error_code&) { f(); });
}

TEST(CapacitySignalLineTest, FirstComeFirstServedAndAReleaseWakesTheHeadAlone) {
  net::io_context ioc;
  CapacitySignal signal;
  int free_units = 0;
  std::vector<std::string> served;
  std::map<std::string, int> wakes;
  auto waiter = [&](std::string name) -> net::awaitable<void> {
    auto ticket = co_await signal.Join();
    while (!(signal.IsHead(*ticket) && free_units > 0)) {
      co_await signal.WaitInLine(*ticket, 30s);
      ++wakes[name];
    }
    --free_units;
    served.push_back(name);  // leaving the line (the ticket goes) hands the head on
  };
  const auto strand = net::make_strand(ioc);
  for (const char* name : {"a", "b", "c"}) net::co_spawn(strand, waiter(name), net::detached);
  At(ioc, 20ms, [&] {
    EXPECT_EQ(signal.in_line(), 3u);
    free_units = 2;  // room for two: the head, then the next in turn
    signal.Notify();
  });
  At(ioc, 60ms, [&] {
    EXPECT_EQ(served, (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(signal.in_line(), 1u);
    free_units = 1;
    signal.Notify();
  });
  const auto t0 = std::chrono::steady_clock::now();
  ioc.run();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s) << "a waiter slept to its bound";
  EXPECT_EQ(served, (std::vector<std::string>{"a", "b", "c"}));
  // a: the release; b: a's leaving; c: b's leaving (nothing left), then the
  // second release. Not one wake per waiter per release.
  EXPECT_EQ(wakes, (std::map<std::string, int>{{"a", 1}, {"b", 1}, {"c", 2}}));
  EXPECT_EQ(signal.in_line(), 0u);
}

TEST(CapacitySignalLineTest, AWakeThatComesWhileTheHeadDecidesIsNotLost) {
  net::io_context ioc;
  CapacitySignal signal;
  std::chrono::steady_clock::duration waited{};
  net::co_spawn(
      net::make_strand(ioc),
      [&]() -> net::awaitable<void> {
        auto ticket = co_await signal.Join();
        // Deciding (it awaits something: asking a worker to count the
        // prompt), and capacity is released meanwhile: the posted wake runs
        // while nobody waits on the timer.
        signal.Notify();
        net::steady_timer asking(co_await net::this_coro::executor, 20ms);
        co_await asking.async_wait(net::use_awaitable);
        const auto t0 = std::chrono::steady_clock::now();
        co_await signal.WaitInLine(*ticket, 3s);
        waited = std::chrono::steady_clock::now() - t0;
      },
      net::detached);
  ioc.run();
  EXPECT_LT(waited, 1s);
}

TEST(CapacitySignalLineTest, NotifyAllWakesEveryoneInTheLineAndNotifyThePlainWaiters) {
  net::io_context ioc;
  CapacitySignal signal;
  int line_woken = 0, plain_woken = 0;
  const auto strand = net::make_strand(ioc);
  for (int i = 0; i < 3; ++i) {
    net::co_spawn(
        strand,
        [&]() -> net::awaitable<void> {
          auto ticket = co_await signal.Join();
          co_await signal.WaitInLine(*ticket, 30s);
          ++line_woken;
          co_await signal.WaitInLine(*ticket, 30s);  // still in the line (the head leaves once the next wake comes)
        },
        net::detached);
  }
  net::co_spawn(
      strand,
      [&]() -> net::awaitable<void> {
        co_await signal.Wait(30s);
        ++plain_woken;
      },
      net::detached);
  At(ioc, 20ms, [&] {
    EXPECT_EQ(signal.waiting(), 4u);
    signal.Notify();  // the head and the plain waiter
  });
  At(ioc, 60ms, [&] {
    EXPECT_EQ(plain_woken, 1);
    EXPECT_EQ(line_woken, 1) << "a release woke more than the head";
    EXPECT_EQ(signal.in_line(), 3u);
    signal.NotifyAll();  // (a cancel: whoever it is must hear it)
  });
  const auto t0 = std::chrono::steady_clock::now();
  ioc.run();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_EQ(line_woken, 3);
}

// A cancel wakes the cancelled request alone, wherever it stands (not the
// whole line: with thousands waiting, each cancel woke every one).
TEST(CapacitySignalLineTest, WakeOneWakesThatWaiterAlone) {
  net::io_context ioc;
  CapacitySignal signal;
  std::map<std::string, int> wakes;
  std::shared_ptr<void> third;
  const auto strand = net::make_strand(ioc);
  for (const char* name : {"a", "b", "c"}) {
    net::co_spawn(
        strand,
        [&, n = std::string(name)]() -> net::awaitable<void> {
          auto ticket = co_await signal.Join();
          if (n == "c") third = signal.Handle(*ticket);
          co_await signal.WaitInLine(*ticket, 2s);
          ++wakes[n];
        },
        net::detached);
  }
  At(ioc, 20ms, [&] {
    ASSERT_TRUE(third);
    signal.WakeOne(third);
  });
  At(ioc, 60ms, [&] {
    EXPECT_EQ(wakes, (std::map<std::string, int>{{"c", 1}})) << "woke others than the one";
    EXPECT_EQ(signal.in_line(), 2u);
    signal.NotifyAll();
  });
  ioc.run();
  EXPECT_EQ(wakes, (std::map<std::string, int>{{"a", 1}, {"b", 1}, {"c", 1}}));
  signal.WakeOne(third);  // after it left: nothing happens
}

}  // namespace
}  // namespace spillway::gateway
