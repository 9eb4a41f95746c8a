// `spillway serve` on SIGTERM: it takes no new connection, lets a request
// under way finish (for up to shutdown_grace_s) and then exits 0; a second
// signal stops it at once. It used to stop at once on the first: a stream
// under way was cut without an ending event. Past the grace, what is still
// under way is ended, each client told why.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
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

// An answer the gateway still writes to a client that reads slowly is
// written whole before it stops: its request has ended, but the drain
// waits for the bytes too (up to the grace). Stopping once no request was
// under way cut such an answer at whatever the kernel had taken of it.
TEST(GracefulStopTest, AnAnswerStillBeingWrittenToASlowReaderIsWrittenWholeFirst) {
  GatewayProcess gw(TestConfig(1, "shutdown_grace_s = 60"));
  ASSERT_TRUE(gw.Start()) << gw.Output();
  // A client that takes little at a time: 512 embeddings (about 700 KB)
  // cannot all fit in the sockets' buffers, so the gateway holds the rest.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  // (A small window, and small segments: loopback's 64 KB segments give
  // the sender megabytes of buffer from the start.)
  const int small = 4096, segment = 536;
  ASSERT_EQ(::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small), 0);
  ASSERT_EQ(::setsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &segment, sizeof segment), 0);
  const timeval patience{60, 0};  // (a gateway that hangs fails the test, not the run)
  ASSERT_EQ(::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof patience), 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(gw.port());
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  json inputs = json::array();
  for (int i = 0; i < 512; ++i) inputs.push_back("word " + std::to_string(i));
  const std::string body = json{{"model", "embed"}, {"input", inputs}}.dump();
  const std::string request = "POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                              "X-Request-Id: slow-reader\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
  // Ended (journaled, answered): nothing is under way, only bytes to write.
  for (int i = 0; i < 6000; ++i) {
    if (Body(Call(gw.port(), "GET", "/v1/requests/slow-reader")).value("state", "") == "completed") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(Body(Call(gw.port(), "GET", "/v1/requests/slow-reader")).value("state", ""), "completed");
  ASSERT_EQ(::kill(gw.pid(), SIGTERM), 0);
  // Its drain looks every 20 ms; a gateway that did not wait for the bytes
  // was gone within two looks.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_FALSE(gw.WaitExit(std::chrono::milliseconds(0)))
      << "it stopped with the answer unsent (or this host's TCP buffers took all of it, and the test shows nothing): "
      << gw.Output();
  std::string got;
  char buf[65536];
  size_t want = std::string::npos;
  while (got.size() < want) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
    const size_t head_end = got.find("\r\n\r\n");
    if (want == std::string::npos && head_end != std::string::npos) {
      const size_t cl = got.find("Content-Length: ");
      if (cl != std::string::npos && cl < head_end) want = head_end + 4 + std::strtoull(got.c_str() + cl + 16, nullptr, 10);
    }
  }
  ::close(fd);
  ASSERT_NE(want, std::string::npos) << got.substr(0, 300);
  EXPECT_EQ(got.size(), want) << "the answer was cut at " << got.size() << " of " << want << " bytes";
  const json answer = json::parse(got.substr(got.find("\r\n\r\n") + 4), nullptr, false);
  EXPECT_EQ(answer.is_object() ? answer.value("data", json::array()).size() : 0, 512u);
  ASSERT_TRUE(gw.WaitExit(std::chrono::seconds(30))) << "still running after its answer was written: " << gw.Output();
  EXPECT_TRUE(WIFEXITED(gw.exit_status()) && WEXITSTATUS(gw.exit_status()) == 0) << gw.exit_status();
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
