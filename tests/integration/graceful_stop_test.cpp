// `spillway serve` on SIGTERM: it takes no new connection, lets a request
// under way finish (for up to shutdown_grace_s) and then exits 0; a second
// signal stops it at once. It used to stop at once on the first: a stream
// under way was cut without an ending event.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "gateway_calls.h"
#include "gateway_process.h"
#include "worker_process.h"

namespace spillway::testing {
namespace {

using nlohmann::json;

// A long request on a gateway of `grace_s`, running when this returns.
std::future<http::ClientResponse> Running(GatewayProcess& gw, const std::string& id) {
  auto slow = std::async(std::launch::async, [port = gw.port(), id] {
    auto r = http::Fetch("127.0.0.1", port, "POST", "/v1/chat/completions", Chat(1500), {{"X-Request-Id", id}},
                         std::chrono::seconds(120));
    return r.ok() ? *r : http::ClientResponse{};
  });
  for (int i = 0; i < 1000; ++i) {
    if (Body(Call(gw.port(), "GET", "/v1/requests/" + id)).value("state", "") == "running") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return slow;
}

TEST(GracefulStopTest, ARequestUnderWayFinishesAfterSigterm) {
  GatewayProcess gw(TestConfig(1, "shutdown_grace_s = 60"));
  ASSERT_TRUE(gw.Start()) << gw.Output();
  const uint16_t port = gw.port();
  auto slow = Running(gw, "under-way");
  ASSERT_EQ(Body(Call(port, "GET", "/v1/requests/under-way")).value("state", ""), "running");
  ASSERT_EQ(::kill(gw.pid(), SIGTERM), 0);
  const auto signalled = std::chrono::steady_clock::now();
  // No new connection meanwhile (the listener is closed at once).
  bool refused = false;
  for (int i = 0; i < 200 && !refused; ++i) {
    refused = !http::Fetch("127.0.0.1", port, "GET", "/healthz", "", {}, std::chrono::seconds(2)).ok();
    if (!refused) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(refused) << "a new connection was still taken while the gateway stopped";
  const http::ClientResponse r = slow.get();
  EXPECT_EQ(r.status, 200) << "the request under way was cut by the stop: " << r.body;
  const json answer = Body(r);
  EXPECT_EQ(answer.is_object() ? answer.value("usage", json::object()).value("completion_tokens", 0) : -1, 1500) << r.body;
  ASSERT_TRUE(gw.WaitExit(std::chrono::seconds(30))) << "still running after its last request ended: " << gw.Output();
  EXPECT_TRUE(WIFEXITED(gw.exit_status()) && WEXITSTATUS(gw.exit_status()) == 0) << gw.exit_status();
  EXPECT_LT(std::chrono::steady_clock::now() - signalled, std::chrono::seconds(30)) << "it waited out the grace";
}

TEST(GracefulStopTest, ASecondSignalStopsAtOnce) {
  GatewayProcess gw(TestConfig(1, "shutdown_grace_s = 60"));
  ASSERT_TRUE(gw.Start()) << gw.Output();
  // Its worker's next compute stalls for a minute: the request stays under way.
  const json chat0 = Body(Call(gw.port(), "GET", "/v1/status"))["services"][0]["placements"][0];
  ASSERT_TRUE(http::Fetch("127.0.0.1", chat0.value("port", 0), "POST", "/v1/worker/faults",
                          json{{"faults", {"hang=60"}}}.dump(), WorkerAuth())
                  .ok());
  auto slow = Running(gw, "cut-short");
  ASSERT_EQ(::kill(gw.pid(), SIGTERM), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // (two at once may arrive as one)
  const auto second = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(gw.pid(), SIGINT), 0);
  EXPECT_TRUE(gw.WaitExit(std::chrono::seconds(15))) << "the second signal did not stop it: " << gw.Output();
  EXPECT_LT(std::chrono::steady_clock::now() - second, std::chrono::seconds(15));
  EXPECT_NE(slow.get().status, 200) << "not cut: the test shows nothing";
}

}  // namespace
}  // namespace spillway::testing
