// The async connection pool and the capacity signal against an in-process
// fake worker: keep-alive reuse, SSE relaying, early stop, timeouts, and
// waiters woken by Notify rather than by their bound.
#include "upstream/connection_pool.h"

#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/detached.hpp>

#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>

#include "fake_worker.h"
#include "gateway/capacity_signal.h"

namespace spillway::upstream {
namespace {

namespace net = boost::asio;
using spillway::testing::FakeWorker;

// Runs a coroutine to completion on a fresh I/O context and returns its result.
template <typename T>
T RunCo(net::io_context& ioc, net::awaitable<T> a) {
  std::optional<T> out;
  auto run = [&]() -> net::awaitable<void> { out.emplace(co_await std::move(a)); };
  net::co_spawn(net::make_strand(ioc), run(), net::detached);
  ioc.restart();
  ioc.run();
  return std::move(*out);
}

// Streams written from threads of their own ("/trickle"), joined when the handler goes.
struct Writers {
  std::mutex mu;
  std::vector<std::thread> threads;
  ~Writers() {
    for (auto& t : threads) t.join();
  }
};

FakeWorker::Handler EchoHandler() {
  auto held = std::make_shared<std::vector<std::shared_ptr<http::Exchange>>>();  // "/slow": never answered
  auto writers = std::make_shared<Writers>();
  return [held, writers](http::Request& req, std::shared_ptr<http::Exchange> ex) {
    const std::string target(req.target());
    if (target == "/trickle" || target == "/stall") {
      // "/trickle": six events 150 ms apart; "/stall": one, then nothing while the test runs.
      ex->StartStream(http::MakeResponse(200, "", "text/event-stream"));
      ex->Write("data: 0\n\n");
      if (target == "/stall") return held->push_back(std::move(ex));
      std::lock_guard lk(writers->mu);
      writers->threads.emplace_back([ex] {
        for (int i = 1; i < 6; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(150));
          ex->Write("data: " + std::to_string(i) + "\n\n");
        }
        ex->End();
      });
      return;
    }
    if (target == "/stream") {
      auto head = http::MakeResponse(200, "", "text/event-stream");
      ex->StartStream(std::move(head));
      for (int i = 0; i < 5; ++i) ex->Write("data: " + std::to_string(i) + "\n\n");
      ex->Write("data: [DONE]\n\n");
      return ex->End();
    }
    if (target == "/slow") return held->push_back(std::move(ex));  // never answered while the test runs
    ex->Respond(http::MakeResponse(200, "{\"echo\":\"" + target + "\"}", "application/json"));
  };
}

FakeWorker Echo() { return FakeWorker(EchoHandler()); }

TEST(ConnectionPoolTest, SendsOneRequestAfterAnotherThroughThePool) {
  FakeWorker worker = Echo();
  ASSERT_TRUE(worker.ok());
  net::io_context ioc;
  ConnectionPool pool;
  for (int i = 0; i < 3; ++i) {
    auto r = RunCo(ioc, pool.Send(worker.port(), "GET", "/a" + std::to_string(i), "", {}, std::chrono::seconds(5)));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "{\"echo\":\"/a" + std::to_string(i) + "\"}");
  }
  EXPECT_EQ(worker.requests(), 3);
  EXPECT_EQ(worker.connections(), 1u) << "the pool keeps one connection alive";
  pool.Clear();
}

// A server on the IPv6 loopback alone (an external service's url =
// "http://[::1]:PORT") is reached: the pool dialled 127.0.0.1 only. Only a
// call named so is dialled there (a worker's request, with its secret, never
// goes to whatever else listens on [::1] at its port number).
TEST(ConnectionPoolTest, AServerOnTheIpv6LoopbackAloneIsReachedWhenNamedSo) {
  FakeWorker worker(EchoHandler(), "::1");
  if (!worker.ok()) GTEST_SKIP() << "no IPv6 loopback here";
  net::io_context ioc;
  ConnectionPool pool;
  auto refused = RunCo(ioc, pool.Send(worker.port(), "GET", "/v4", "", {}, std::chrono::seconds(5)));
  EXPECT_FALSE(refused.ok()) << "dialled [::1] for a call not named so";
  auto relay = [&](bool ipv6) {
    StreamControl control;
    control.ipv6 = ipv6;
    std::string body;
    const Status st = RunCo(ioc, pool.Stream(worker.port(), "GET", "/v6", "", {}, [](const http::StreamHead&) { return true; },
                                             [&](std::string_view d) {
                                               body.append(d);
                                               return true;
                                             },
                                             std::chrono::seconds(5), nullptr, &control));
    return st.ok() ? body : st.ToString();
  };
  EXPECT_EQ(relay(true), "{\"echo\":\"/v6\"}");
  // Per call: the same port without the flag (a worker's request, which may
  // have that port number on 127.0.0.1) is not sent there, even with a
  // [::1] connection kept.
  EXPECT_NE(relay(false), "{\"echo\":\"/v6\"}");
  EXPECT_FALSE(RunCo(ioc, pool.Send(worker.port(), "GET", "/v4", "", {}, std::chrono::seconds(5))).ok());
  pool.Clear();
}

// Its Host names where it is: [::1] (a server that checks Host refused 127.0.0.1).
TEST(ConnectionPoolTest, AServerOnTheIpv6LoopbackIsNamedSoInTheHost) {
  FakeWorker worker(
      [](http::Request& req, std::shared_ptr<http::Exchange> ex) {
        ex->Respond(http::MakeResponse(200, std::string(req[boost::beast::http::field::host]), "text/plain"));
      },
      "::1");
  if (!worker.ok()) GTEST_SKIP() << "no IPv6 loopback here";
  net::io_context ioc;
  ConnectionPool pool;
  StreamControl control;
  control.ipv6 = true;
  std::string host;
  const Status st = RunCo(ioc, pool.Stream(worker.port(), "GET", "/", "", {}, [](const http::StreamHead&) { return true; },
                                           [&](std::string_view d) {
                                             host.append(d);
                                             return true;
                                           },
                                           std::chrono::seconds(5), nullptr, &control));
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(host, "[::1]:" + std::to_string(worker.port()));
  pool.Clear();
}

// Each call runs on a strand of its own (RunCo's), as requests of different
// client connections do: the kept-alive connection moves to the caller's
// strand and is reused, not replaced.
TEST(ConnectionPoolTest, AKeptConnectionMovesToTheCallersExecutor) {
  FakeWorker worker = Echo();
  ASSERT_TRUE(worker.ok());
  net::io_context ioc;
  ConnectionPool pool;
  auto on = [&](net::any_io_executor ex) {
    std::optional<StatusOr<http::ClientResponse>> out;
    auto run = [&]() -> net::awaitable<void> {
      out.emplace(co_await pool.Send(worker.port(), "GET", "/x", "", {}, std::chrono::seconds(5)));
    };
    net::co_spawn(ex, run(), net::detached);
    ioc.restart();
    ioc.run();
    return std::move(*out);
  };
  const net::any_io_executor a = net::make_strand(ioc), b = net::make_strand(ioc);
  for (const auto& ex : {a, b, b, a}) {
    auto r = on(ex);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->status, 200);
  }
  EXPECT_EQ(worker.requests(), 4);
  EXPECT_EQ(worker.connections(), 1u) << "a kept connection was dropped when another executor took it";
  pool.Clear();
}

TEST(ConnectionPoolTest, RelaysAStreamPieceByPieceAndStopsWhenAsked) {
  FakeWorker worker = Echo();
  net::io_context ioc;
  ConnectionPool pool;
  std::string got;
  int status = 0;
  auto st = RunCo(ioc, pool.Stream(
                           worker.port(), "POST", "/stream", "{}", {},
                           [&](const http::StreamHead& h) {
                             status = h.status;
                             return true;
                           },
                           [&](std::string_view d) {
                             got.append(d);
                             return true;
                           }));
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(status, 200);
  EXPECT_NE(got.find("data: 4\n\n"), std::string::npos) << got;
  EXPECT_NE(got.find("[DONE]"), std::string::npos) << got;
  // Stopping early is not an error; the connection is dropped, not reused mid-answer.
  std::string first;
  st = RunCo(ioc, pool.Stream(
                      worker.port(), "POST", "/stream", "{}", {}, [](const http::StreamHead&) { return true; },
                      [&](std::string_view d) {
                        first.append(d);
                        return false;
                      }));
  EXPECT_TRUE(st.ok());
  EXPECT_FALSE(first.empty());
  auto r = RunCo(ioc, pool.Send(worker.port(), "GET", "/after", "", {}, std::chrono::seconds(5)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->body, "{\"echo\":\"/after\"}");
  pool.Clear();
}

// Backpressure: while `paused` says so, nothing more is read from the worker.
TEST(ConnectionPoolTest, APausedRelayReadsNothingUntilResumed) {
  FakeWorker worker = Echo();
  net::io_context ioc;
  ConnectionPool pool;
  int pieces = 0, polls = 0;
  bool pause = true;
  auto st = RunCo(ioc, pool.Stream(
                           worker.port(), "POST", "/stream", "{}", {}, [](const http::StreamHead&) { return true; },
                           [&](std::string_view) {
                             ++pieces;
                             return true;
                           },
                           std::chrono::seconds(5),
                           [&] {
                             // Paused for the first 20 looks (about 200 ms): no piece may arrive meanwhile.
                             if (++polls > 20) pause = false;
                             if (pause) {
                               EXPECT_EQ(pieces, 0);
                             }
                             return pause;
                           }));
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_GT(polls, 20);
  EXPECT_GT(pieces, 0);
  pool.Clear();
}

// A relay's idle_timeout bounds each wait for the worker, not the whole
// answer: pieces 150 ms apart go through a 400 ms bound for as long as they
// come; a worker that stops sending is a timeout once the bound passes.
TEST(ConnectionPoolTest, ARelaysIdleTimeoutBoundsEachWaitNotTheWholeAnswer) {
  FakeWorker worker = Echo();
  net::io_context ioc;
  ConnectionPool pool;
  std::string got;
  auto keep = [&](std::string_view d) {
    got.append(d);
    return true;
  };
  auto head = [](const http::StreamHead&) { return true; };
  Status st = RunCo(ioc, pool.Stream(worker.port(), "GET", "/trickle", "", {}, head, keep, std::chrono::milliseconds(400)));
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_NE(got.find("data: 5\n\n"), std::string::npos) << got;
  got.clear();
  const auto t0 = std::chrono::steady_clock::now();
  st = RunCo(ioc, pool.Stream(worker.port(), "GET", "/stall", "", {}, head, keep, std::chrono::milliseconds(400)));
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  EXPECT_EQ(got, "data: 0\n\n");
  pool.Clear();
}

TEST(ConnectionPoolTest, ATimeoutIsDeadlineExceededAndARefusedPortIsUnavailable) {
  FakeWorker worker = Echo();
  net::io_context ioc;
  ConnectionPool pool;
  auto r = RunCo(ioc, pool.Send(worker.port(), "GET", "/slow", "", {}, std::chrono::milliseconds(200)));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().ToString();
  // A port nobody listens on (the fake's, once it is gone).
  uint16_t gone = 0;
  {
    FakeWorker brief = Echo();
    gone = brief.port();
  }
  r = RunCo(ioc, pool.Send(gone, "GET", "/x", "", {}, std::chrono::seconds(2)));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  pool.Clear();
}

// A server of a test's own, on a thread: it answers as the test writes the
// bytes, right or wrong.
struct RawServer {
  net::io_context ioc;
  net::ip::tcp::acceptor acceptor{ioc, {net::ip::make_address("127.0.0.1"), 0}};
  uint16_t port() const { return acceptor.local_endpoint().port(); }
  // The next connection, once a request's head has arrived on it; false when none came.
  bool AcceptWithHead(net::ip::tcp::socket& s) {
    boost::system::error_code ec;
    acceptor.accept(s, ec);
    if (ec) return false;
    std::string got;
    char buf[4096];
    while (got.find("\r\n\r\n") == std::string::npos) {
      const size_t n = s.read_some(net::buffer(buf), ec);
      if (ec) return false;
      got.append(buf, n);
    }
    return true;
  }
};

// An answer's deadline holds when it passes while bytes are still coming:
// the timer's cancel then finds no read to cancel (the one in flight has
// just completed with bytes), and the next read, begun past the deadline,
// had no bound: a server that then stalled held the request for good. Here
// the loop is busy (a handler that sleeps) while the server sends more than
// a read takes and the deadline passes; the server then stalls, its
// connection open.
TEST(ConnectionPoolTest, AnAnswersDeadlineHoldsWhenItPassesWhileBytesStillCome) {
  RawServer raw;
  const uint16_t port = raw.port();
  std::atomic<bool> done{false};
  std::thread server([&] {
    net::ip::tcp::socket s(raw.ioc);
    if (!raw.AcceptWithHead(s)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(150));  // (the client's loop sleeps meanwhile)
    boost::system::error_code ec;
    net::write(s, net::buffer("HTTP/1.1 200 OK\r\nContent-Length: 1048576\r\n\r\n" + std::string(200 << 10, 'x')), ec);
    for (int i = 0; i < 400 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));  // stalls, open
  });
  net::io_context ioc;
  ConnectionPool pool;
  net::steady_timer busy(ioc, std::chrono::milliseconds(100));
  busy.async_wait([](const boost::system::error_code&) { std::this_thread::sleep_for(std::chrono::milliseconds(350)); });
  const auto t0 = std::chrono::steady_clock::now();
  auto r = RunCo(ioc, pool.Send(port, "GET", "/big", "", {}, std::chrono::milliseconds(300)));
  const auto took = std::chrono::steady_clock::now() - t0;
  done = true;
  server.join();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().ToString();
  EXPECT_LT(took, std::chrono::milliseconds(2500)) << "held past its deadline until the server gave up";
  pool.Clear();
}

// A request that must go on a fresh connection (an external service that
// is not idempotent) closes it after its answer: kept, it was never taken
// again (such requests never take one) and sat idle, up to 64 a server.
TEST(ConnectionPoolTest, AFreshConnectionIsClosedAfterItsAnswer) {
  RawServer raw;
  const uint16_t port = raw.port();
  std::atomic<bool> closed{false};
  std::thread server([&] {
    net::ip::tcp::socket s(raw.ioc);
    if (!raw.AcceptWithHead(s)) return;
    boost::system::error_code ec;
    net::write(s, net::buffer(std::string("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")), ec);
    timeval tv{3, 0};  // the client's close, within 3 s
    setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char b = 0;
    closed = ::recv(s.native_handle(), &b, 1, 0) == 0;
  });
  net::io_context ioc;
  ConnectionPool pool;
  StreamControl control;
  control.fresh_connection = true;
  std::string got;
  auto st = RunCo(ioc, pool.Stream(
                           port, "GET", "/x", "", {}, [](const http::StreamHead&) { return true; },
                           [&](std::string_view d) {
                             got.append(d);
                             return true;
                           },
                           std::chrono::seconds(5), nullptr, &control));
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(got, "ok");
  server.join();
  EXPECT_TRUE(closed) << "the connection was kept idle";
  pool.Clear();
}

// A server that sends more than its Content-Length: the extra bytes are not
// read as the next request's answer (the connection was kept with them).
TEST(ConnectionPoolTest, AConnectionWithBytesPastItsAnswerIsNotKept) {
  RawServer raw;
  const uint16_t port = raw.port();
  std::thread server([&] {
    for (int i = 0; i < 2; ++i) {  // each connection: one request, one answer
      net::ip::tcp::socket s(raw.ioc);
      if (!raw.AcceptWithHead(s)) return;
      boost::system::error_code ec;
      const std::string answer = i == 0 ? "okHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale" : "fresh";
      const std::string head = "HTTP/1.1 200 OK\r\nContent-Length: " + std::string(i == 0 ? "2" : "5") + "\r\n\r\n";
      net::write(s, net::buffer(head + answer), ec);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // (the pipelined garbage arrives with it)
    }
  });
  net::io_context ioc;
  ConnectionPool pool;
  auto first = RunCo(ioc, pool.Send(port, "GET", "/a", "", {}, std::chrono::seconds(5)));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->body, "ok");
  auto second = RunCo(ioc, pool.Send(port, "GET", "/b", "", {}, std::chrono::seconds(5)));
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->body, "fresh");
  pool.Clear();
  server.join();
}

// An interim answer (103 Early Hints, 102 Processing) comes before the
// final one: taken for the answer, it ended a stream with no body and left
// the real answer on the kept connection for the next request to read as its own.
TEST(ConnectionPoolTest, AnInterimAnswerIsSkippedForTheFinalOne) {
  RawServer raw;
  const uint16_t port = raw.port();
  std::thread server([&] {
    net::ip::tcp::socket s(raw.ioc);
    if (!raw.AcceptWithHead(s)) return;
    boost::system::error_code ec;
    for (int i = 1; i <= 2; ++i) {  // two requests on one kept connection
      net::write(s, net::buffer(std::string("HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n")), ec);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      net::write(s, net::buffer("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok" + std::to_string(i)), ec);
      if (i == 2) break;
      std::string got;  // the next request's head
      char buf[4096];
      while (got.find("\r\n\r\n") == std::string::npos) {
        const size_t n = s.read_some(net::buffer(buf), ec);
        if (ec) return;
        got.append(buf, n);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  });
  net::io_context ioc;
  ConnectionPool pool;
  int status = 0;
  std::string got;
  auto st = RunCo(ioc, pool.Stream(
                           port, "POST", "/a", "{}", {},
                           [&](const http::StreamHead& h) {
                             status = h.status;
                             return true;
                           },
                           [&](std::string_view d) {
                             got.append(d);
                             return true;
                           }));
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(status, 200);
  EXPECT_EQ(got, "ok1");
  auto second = RunCo(ioc, pool.Send(port, "GET", "/b", "", {}, std::chrono::seconds(5)));
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->status, 200);
  EXPECT_EQ(second->body, "ok2");
  pool.Clear();
  server.join();
}

// A server that closed every kept connection while they were idle (a
// worker's keep-alive timeout after a lull): the request goes out once more
// on a fresh connection, not on the next stale one (which failed it, and the
// gateway tripped the placement's breaker after every quiet spell).
TEST(ConnectionPoolTest, AfterAStaleKeptConnectionTheRequestGoesOnAFreshOne) {
  RawServer raw;
  const uint16_t port = raw.port();
  std::atomic<bool> closed{false};
  std::thread server([&] {
    boost::system::error_code ec;
    std::vector<net::ip::tcp::socket> kept;
    for (int i = 0; i < 3; ++i) {  // three requests at once: three connections
      kept.emplace_back(raw.ioc);
      if (!raw.AcceptWithHead(kept.back())) return;
    }
    for (auto& s : kept) net::write(s, net::buffer(std::string("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")), ec);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // (their answers are read and the connections kept)
    for (auto& s : kept) s.close(ec);  // idle too long
    closed = true;
    net::ip::tcp::socket fresh(raw.ioc);
    if (!raw.AcceptWithHead(fresh)) return;
    net::write(fresh, net::buffer(std::string("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh")), ec);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  });
  net::io_context ioc;
  ConnectionPool pool;
  int ok = 0;
  for (int i = 0; i < 3; ++i) {
    net::co_spawn(net::make_strand(ioc), [&]() -> net::awaitable<void> {
      auto r = co_await pool.Send(port, "GET", "/a", "", {}, std::chrono::seconds(5));
      ok += r.ok() && r->body == "ok";
    }, net::detached);
  }
  ioc.run();
  ASSERT_EQ(ok, 3);
  while (!closed) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // (the FINs arrive)
  auto r = RunCo(ioc, pool.Send(port, "GET", "/b", "", {}, std::chrono::seconds(5)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->body, "fresh");
  pool.Clear();
  server.join();
}

// A server that answers a large upload early (413) and closes while it is
// still being sent: the relay hears its answer, not a broken pipe (the
// upload was sent again three times and answered 502).
TEST(ConnectionPoolTest, AnEarlyAnswerToAnUploadIsHeardByARelay) {
  RawServer raw;
  const uint16_t port = raw.port();
  std::thread server([&] {
    net::ip::tcp::socket s(raw.ioc);
    if (!raw.AcceptWithHead(s)) return;
    boost::system::error_code ec;
    const std::string answer = "HTTP/1.1 413 Payload Too Large\r\nContent-Length: 8\r\nConnection: close\r\n\r\ntoo big!";
    net::write(s, net::buffer(answer), ec);
    s.close(ec);  // the unread upload: a reset
  });
  net::io_context ioc;
  ConnectionPool pool;
  StreamControl control;
  int status = 0;
  std::string body;
  const Status st = RunCo(ioc, pool.Stream(port, "POST", "/upload", std::string(32 << 20, 'x'), {},
                                           [&](const http::StreamHead& h) {
                                             status = h.status;
                                             return true;
                                           },
                                           [&](std::string_view d) {
                                             body.append(d);
                                             return true;
                                           },
                                           std::chrono::seconds(5), nullptr, &control));
  server.join();
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(status, 413);
  EXPECT_EQ(body, "too big!");
  EXPECT_TRUE(control.connected);
  pool.Clear();
}

// A server whose chunk-size line (or trailer) never ends: Beast keeps
// asking for more without consuming it, so nothing reaches on_data (and its
// answer cap) and each read grew the connection's buffer, until the gateway
// ran out of memory. The read fails at the buffer's bound instead.
TEST(ConnectionPoolTest, AChunkLineWithoutEndFailsTheAnswerInsteadOfGrowingWithoutBound) {
  RawServer raw;
  const uint16_t port = raw.port();
  std::atomic<size_t> sent{0};
  std::thread server([&] {
    net::ip::tcp::socket s(raw.ioc);
    if (!raw.AcceptWithHead(s)) return;
    boost::system::error_code ec;
    net::write(s, net::buffer(std::string("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                          "Transfer-Encoding: chunked\r\n\r\n1;")), ec);
    const std::string ext(64 * 1024, 'a');
    while (!ec && sent < (64u << 20)) {  // (64 MiB at most: the test's own bound)
      net::write(s, net::buffer(ext), ec);
      if (!ec) sent += ext.size();
    }
  });
  net::io_context ioc;
  ConnectionPool pool;
  StreamControl control;
  size_t got = 0;
  const Status st = RunCo(ioc, pool.Stream(
                                   port, "GET", "/events", "", {}, [](const http::StreamHead&) { return true; },
                                   [&](std::string_view d) {
                                     got += d.size();
                                     return true;
                                   },
                                   std::chrono::seconds(10), nullptr, &control));
  server.join();
  EXPECT_FALSE(st.ok()) << "an endless chunk line was taken for an answer";
  EXPECT_EQ(got, 0u);
  EXPECT_LT(sent.load(), 16u << 20) << "the gateway read " << (sent >> 20) << " MiB of one chunk line";
  pool.Clear();
}

// A server that declares an answer of 4 GB and sends a few bytes (a broken
// or hostile server behind the gateway): the answer fails, and nothing near
// 4 GB is allocated for it. Beast's string_body reserved the declared length
// at once (a bad_alloc that ended the gateway where memory is short); run in
// a child whose address space is bounded, so that a reservation ends it.
TEST(ConnectionPoolTest, ADeclaredLengthIsNotAllocatedBeforeItArrives) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        RawServer raw;
        const uint16_t port = raw.port();
        std::thread server([&] {
          net::ip::tcp::socket s(raw.ioc);
          if (!raw.AcceptWithHead(s)) return;
          boost::system::error_code ec;
          net::write(s, net::buffer(std::string("HTTP/1.1 200 OK\r\nContent-Length: 4000000000\r\n\r\nshort")), ec);
          s.shutdown(net::ip::tcp::socket::shutdown_both, ec);
        });
        rlimit bound{};
        getrlimit(RLIMIT_AS, &bound);
        std::ifstream status("/proc/self/status");
        uint64_t vm_kib = 0;
        for (std::string line; std::getline(status, line);) {
          if (line.rfind("VmSize:", 0) == 0) vm_kib = std::stoull(line.substr(7));
        }
        bound.rlim_cur = (vm_kib << 10) + (1ull << 30);  // what it holds now, and 1 GiB
        if (vm_kib == 0 || setrlimit(RLIMIT_AS, &bound) != 0) std::_Exit(3);  // (not bounded: proves nothing)
        net::io_context ioc;
        ConnectionPool pool;
        auto r = RunCo(ioc, pool.Send(port, "GET", "/huge", "", {}, std::chrono::seconds(5)));
        // A body cut short is a failed answer (not a refused connection, nor a
        // timeout). (Not joined: a server still waiting to accept ends here.)
        std::_Exit(!r.ok() && r.status().message().find("partial message") != std::string::npos ? 0 : 2);
      },
      ::testing::ExitedWithCode(0), "");
}

// A waiter is woken by Notify, not by its bound; one that nobody notifies
// wakes at its bound.
TEST(CapacitySignalTest, NotifyWakesWaitersAtOnceAndTheBoundEndsAForgottenWait) {
  net::io_context ioc;
  gateway::CapacitySignal signal;
  const auto t0 = std::chrono::steady_clock::now();
  auto waiter = [&]() -> net::awaitable<int> {
    co_await signal.Wait(std::chrono::seconds(30));
    co_return 1;
  };
  int woken = 0;
  for (int i = 0; i < 3; ++i) {
    net::co_spawn(net::make_strand(ioc), waiter(), [&](std::exception_ptr, int v) { woken += v; });
  }
  net::steady_timer later(ioc, std::chrono::milliseconds(50));
  later.async_wait([&](const boost::system::error_code&) {
    EXPECT_EQ(signal.waiting(), 3u);
    signal.Notify();
  });
  ioc.run();
  EXPECT_EQ(woken, 3);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));  // not the 30 s bound
  EXPECT_EQ(signal.waiting(), 0u);
  const auto t1 = std::chrono::steady_clock::now();
  RunCo(ioc, [&]() -> net::awaitable<int> {
    co_await signal.Wait(std::chrono::milliseconds(100));
    co_return 0;
  }());
  EXPECT_GE(std::chrono::steady_clock::now() - t1, std::chrono::milliseconds(90));
  EXPECT_EQ(signal.waiting(), 0u);  // a timed-out waiter leaves the list
}

}  // namespace
}  // namespace spillway::upstream
