// `spillway serve` on SIGTERM: it takes no new connection, lets a request
// under way finish (for up to shutdown_grace_s) and then exits 0; a second
// signal stops it at once. It used to stop at once on the first: a stream
// under way was cut without an ending event. Past the grace, what is still
// under way is ended, each client told why.
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

// A long request (about a second for 1500 tokens), running when this returns.
std::future<http::ClientResponse> Running(GatewayProcess& gw, const std::string& id, int tokens = 1500) {
  auto slow = std::async(std::launch::async, [port = gw.port(), id, tokens] {
    auto r = http::Fetch("127.0.0.1", port, "POST", "/v1/chat/completions", Chat(tokens), {{"X-Request-Id", id}},
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

// The phase /v1/status shows for request `id` ("" when it is not under way).
std::string PhaseOf(uint16_t port, const std::string& id) {
  const json status = Body(Call(port, "GET", "/v1/status"));
  if (!status.is_object() || !status.contains("requests")) return "";
  for (const auto& r : status["requests"]) {
    if (r.value("id", "") == id) return r.value("phase", "");
  }
  return "";
}

// Past the grace, what is still under way ends, each client told why and
// what the next start does: a stream ends resumable with its checkpoint (a
// restart marks it failed_resumable too); a request not streamed that ran
// has its answer withheld and runs again at the next start; one that never
// ran is refused, to be sent again. They were cut with their connections,
// the stream without an ending event.
TEST(GracefulStopTest, WhatIsStillUnderWayWhenTheGraceEndsIsEndedAndToldWhy) {
  GatewayProcess gw(TestConfig(1, "shutdown_grace_s = 0.3"));
  ASSERT_TRUE(gw.Start()) << gw.Output();
  const uint16_t port = gw.port();
  auto stream = std::async(std::launch::async, [port] {
    auto r = http::Fetch("127.0.0.1", port, "POST", "/v1/chat/completions", Chat(4000, true),
                         {{"X-Request-Id", "cut-stream"}}, std::chrono::seconds(60));
    return r.ok() ? *r : http::ClientResponse{};
  });
  for (int i = 0; i < 1000 && PhaseOf(port, "cut-stream") != "streaming"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(PhaseOf(port, "cut-stream"), "streaming");
  // Behind it on the one slot: one that waits its turn.
  auto queued = std::async(std::launch::async, [port] {
    auto r = http::Fetch("127.0.0.1", port, "POST", "/v1/chat/completions", Chat(4000), {{"X-Request-Id", "cut-queued"}},
                         std::chrono::seconds(60));
    return r.ok() ? *r : http::ClientResponse{};
  });
  for (int i = 0; i < 1000 && PhaseOf(port, "cut-queued") != "queued"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(PhaseOf(port, "cut-queued"), "queued");
  ASSERT_EQ(::kill(gw.pid(), SIGTERM), 0);

  const http::ClientResponse s = stream.get();
  EXPECT_EQ(s.status, 200) << s.body;
  EXPECT_NE(s.body.find("the gateway stopped (its shutdown_grace_s passed) after "), std::string::npos) << s.body;
  EXPECT_NE(s.body.find("resume from the checkpoint with the request id"), std::string::npos) << s.body;
  EXPECT_EQ(s.body.find("cancelled"), std::string::npos) << "the worker's cancel was relayed: " << s.body;
  EXPECT_EQ(s.body.size() >= 14 ? s.body.substr(s.body.size() - 14) : s.body, "data: [DONE]\n\n") << s.body;
  const http::ClientResponse q = queued.get();
  EXPECT_EQ(q.status, 503) << q.body;
  EXPECT_NE(q.body.find("before the request ran; send it again"), std::string::npos) << q.body;
  EXPECT_EQ(q.Header("retry-after"), "5");
  ASSERT_TRUE(gw.WaitExit(std::chrono::seconds(30))) << gw.Output();
  EXPECT_TRUE(WIFEXITED(gw.exit_status()) && WEXITSTATUS(gw.exit_status()) == 0) << gw.exit_status();
  EXPECT_NE(gw.Output().find("ending the 2 requests still under way"), std::string::npos) << gw.Output();

  // The next start finds them as they were told.
  ASSERT_TRUE(gw.Start()) << gw.Output();
  EXPECT_EQ(Body(Call(gw.port(), "GET", "/v1/requests/cut-stream")).value("state", ""), "failed_resumable");
  EXPECT_EQ(Body(Call(gw.port(), "GET", "/v1/requests/cut-queued")).value("state", ""), "failed");
}

TEST(GracefulStopTest, ARequestNotStreamedCutByTheStopRunsAgainAtTheNextStart) {
  GatewayProcess gw(TestConfig(1, "shutdown_grace_s = 0.3"));
  ASSERT_TRUE(gw.Start()) << gw.Output();
  auto slow = Running(gw, "cut-whole", 4000);
  ASSERT_EQ(::kill(gw.pid(), SIGTERM), 0);
  const http::ClientResponse r = slow.get();
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_NE(r.body.find("while the request ran; its answer is withheld"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("the next start runs it again"), std::string::npos) << r.body;
  EXPECT_EQ(r.Header("x-should-retry"), "false") << "an SDK would send it again beside the re-run";
  ASSERT_TRUE(gw.WaitExit(std::chrono::seconds(30))) << gw.Output();

  ASSERT_TRUE(gw.Start()) << gw.Output();
  const json end = WaitTerminal(gw.port(), "cut-whole");
  EXPECT_EQ(end.value("state", ""), "completed") << end.dump();
}

}  // namespace
}  // namespace spillway::testing
