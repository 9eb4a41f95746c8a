#include "api/http_server.h"

#include <gtest/gtest.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>

#include <sys/socket.h>

#include <atomic>
#include <stdexcept>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "api/http_client.h"

namespace spillway::http {
namespace {

namespace net = boost::asio;

// A server on port 0 with a few test routes, run on its own thread.
class ServerFixture : public ::testing::Test {
 protected:
  virtual ServerOptions Options() {
    ServerOptions o;
    o.max_body_bytes = 1024;
    return o;
  }
  void SetUp() override {
    server_ = std::make_unique<Server>(ioc_, Options(), [this](Request req, std::shared_ptr<Exchange> ex) {
      const std::string t(req.target());
      if (t == "/echo") return ex->Respond(MakeResponse(200, req.body(), "text/plain"));
      if (t == "/hello" && req.method() == boost::beast::http::verb::get) {
        return ex->Respond(MakeResponse(200, "hello", "text/plain"));
      }
      if (t == "/stream") {
        ex->StartStream(MakeResponse(200, "", "text/event-stream"));
        // Joined at TearDown: detached, it could drop the last reference to
        // its session after the test's I/O context was gone (a crash in the
        // next test, seen under load).
        std::lock_guard<std::mutex> lk(writers_mu_);
        writers_.emplace_back([ex] {
          for (int i = 0; i < 3; ++i) ex->Write("data: " + std::to_string(i) + "\n\n");
          ex->End();
        });
        return;
      }
      if (t == "/stream-here") {  // a stream written whole by the handler itself
        ex->StartStream(MakeResponse(200, "", "text/event-stream"));
        for (int i = 0; i < 3; ++i) ex->Write("data: " + std::to_string(i) + "\n\n");
        return ex->End();
      }
      if (t == "/stream-forever") {  // a stream that ends only when its reader goes
        ex->StartStream(MakeResponse(200, "", "text/event-stream"));
        held_ = ex;
        ex->OnDisconnect([this] { disconnected_ = true; });
        return;
      }
      if (t == "/hang") {  // never answers until the peer goes away
        held_ = ex;
        ex->OnDisconnect([this] { disconnected_ = true; });
        return;
      }
      if (t == "/abort") {  // a stream cut short
        ex->StartStream(MakeResponse(200, "", "text/event-stream"));
        ex->Write("data: 0\n\n");
        return ex->Abort();
      }
      if (t == "/quick") {  // answered at once; the test keeps the exchange
        late_ = ex;
        return ex->Respond(MakeResponse(200, "quick", "text/plain"));
      }
      if (t == "/drop") return;  // the Exchange is dropped unanswered
      if (t == "/drop-stream") {  // ... once its stream has begun
        ex->StartStream(MakeResponse(200, "", "text/event-stream"));
        ex->Write("data: 0\n\n");
        return;
      }
      if (t == "/throw") throw std::runtime_error("handler bug");
      ex->Respond(MakeResponse(404, "", "text/plain"));
    });
    ASSERT_TRUE(server_->Listen("127.0.0.1", 0).ok());
    thread_ = std::thread([this] { ioc_.run(); });
  }
  void TearDown() override {
    {
      std::lock_guard<std::mutex> lk(writers_mu_);
      for (auto& w : writers_) w.join();
    }
    held_.reset();
    late_.reset();
    server_->Stop();
    ioc_.stop();
    thread_.join();
  }

  net::io_context ioc_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  std::shared_ptr<Exchange> held_;
  std::shared_ptr<Exchange> late_;  // an exchange answered already
  std::atomic<bool> disconnected_{false};
  std::mutex writers_mu_;
  std::vector<std::thread> writers_;  // threads writing a /stream
};

// `spillway status --url http://[::1]:8480` sent "Host: ::1:8480", which
// the gateway reads as host "" and refuses (403).
TEST(HttpClientTest, AnIpv6AddressIsBracketedInTheHost) {
  EXPECT_EQ(HostHeader("::1", 8480), "[::1]:8480");
  EXPECT_EQ(HostHeader("fe80::1", 80), "[fe80::1]:80");
  EXPECT_EQ(HostHeader("127.0.0.1", 8480), "127.0.0.1:8480");
  EXPECT_EQ(HostHeader("localhost", 1), "localhost:1");
  EXPECT_EQ(HostHeader("[::1]", 8480), "[::1]:8480");
}

TEST_F(ServerFixture, KeepAliveServesSeveralRequestsOnOneConnection) {
  Connection c("127.0.0.1", server_->port());
  for (int i = 0; i < 5; ++i) {
    auto r = c.Send("POST", "/echo", "body" + std::to_string(i));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "body" + std::to_string(i));
  }
}

TEST_F(ServerFixture, ChunkedStreamArrivesWhole) {
  auto r = Fetch("127.0.0.1", server_->port(), "GET", "/stream");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->Header("transfer-encoding"), "chunked");
  EXPECT_EQ(ParseSseData(r->body), (std::vector<std::string>{"0", "1", "2"}));
}

TEST_F(ServerFixture, OversizedBodyIs413) {
  auto r = Fetch("127.0.0.1", server_->port(), "POST", "/echo", std::string(4096, 'x'));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 413);
  EXPECT_EQ(r->body.rfind(R"({"error":{"message":)", 0), 0u) << r->body;
  // On an Ollama route, in Ollama's shape ({"error": "<message>"}: what its clients read).
  r = Fetch("127.0.0.1", server_->port(), "POST", "/api/chat", std::string(4096, 'x'));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 413);
  EXPECT_EQ(r->body, R"({"error":"request body too large"})");
}

TEST_F(ServerFixture, DroppedExchangeAnswers500) {
  auto r = Fetch("127.0.0.1", server_->port(), "GET", "/drop");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 500);
}

// A peer that closes (end of file, as a client's abort does) is told from one
// that half-closes by an interim 100 Continue: its kernel answers with a reset.
TEST_F(ServerFixture, PeerCloseRunsTheDisconnectCallback) {
  {
    net::io_context ioc;
    net::ip::tcp::socket s(ioc);
    s.connect({net::ip::make_address("127.0.0.1"), server_->port()});
    net::write(s, net::buffer(std::string("GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")));
    for (int i = 0; i < 200 && !held_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int i = 0; i < 400 && !disconnected_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_TRUE(disconnected_);
  EXPECT_TRUE(held_->disconnected());
  held_->Respond(MakeResponse(200, "late", "text/plain"));  // discarded, no crash
  auto r = Fetch("127.0.0.1", server_->port(), "POST", "/echo", "still serving");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->body, "still serving");
}

TEST(ServerListenTest, RejectsNonNumericHost) {
  net::io_context ioc;
  Server s(ioc, {}, [](Request, std::shared_ptr<Exchange>) {});
  EXPECT_EQ(s.Listen("localhost", 0).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackAddress("::1"));
  EXPECT_FALSE(IsLoopbackAddress("0.0.0.0"));
  EXPECT_FALSE(IsLoopbackAddress("nonsense"));
}

// With event loops given, connections go to each in turn, and a
// connection's requests are handled on its loop's thread, answered there
// without a hop (the exchange's executor is that connection's strand).
TEST(ServerLoopsTest, ConnectionsTakeTheLoopsInTurnAndStayOnTheirThread) {
  net::io_context loop_a(1), loop_b(1);  // outlive main_ioc: its pending accept holds a socket of one of them
  net::io_context main_ioc;
  std::mutex mu;
  std::vector<std::thread::id> seen;
  bool on_strand = true;
  Server s(
      main_ioc, {},
      [&](Request, std::shared_ptr<Exchange> ex) {
        {
          std::lock_guard<std::mutex> lk(mu);
          seen.push_back(std::this_thread::get_id());
          const auto where = ex->executor();
          const auto* strand = where.target<net::strand<net::io_context::executor_type>>();
          on_strand = on_strand && strand && strand->running_in_this_thread();
        }
        ex->Respond(MakeResponse(200, "ok", "text/plain"));
      },
      {&loop_a, &loop_b});
  ASSERT_TRUE(s.Listen("127.0.0.1", 0).ok());
  auto guard_a = net::make_work_guard(loop_a);
  auto guard_b = net::make_work_guard(loop_b);
  std::thread main_thread([&] { main_ioc.run(); });
  std::thread ta([&] { loop_a.run(); }), tb([&] { loop_b.run(); });
  const std::thread::id main_id = main_thread.get_id(), a = ta.get_id(), b = tb.get_id();
  {
    Connection first("127.0.0.1", s.port()), second("127.0.0.1", s.port());
    for (int i = 0; i < 2; ++i) {
      for (auto* c : {&first, &second}) {
        auto r = c->Send("GET", "/", "");
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        EXPECT_EQ(r->status, 200);
      }
    }
  }
  s.Stop();
  main_ioc.stop();
  loop_a.stop();
  loop_b.stop();
  main_thread.join();
  ta.join();
  tb.join();
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_NE(seen[0], seen[1]) << "two connections on one loop";
  EXPECT_TRUE((seen[0] == a && seen[1] == b) || (seen[0] == b && seen[1] == a)) << "a connection outside the loops";
  EXPECT_EQ(seen[0], seen[2]) << "a connection's requests moved between threads";
  EXPECT_EQ(seen[1], seen[3]) << "a connection's requests moved between threads";
  EXPECT_NE(seen[0], main_id);
  EXPECT_TRUE(on_strand) << "a handler ran outside its exchange's executor";
}

// Raw connections for the hostile-peer tests.
struct RawPeer {
  explicit RawPeer(uint16_t port) : sock(ioc) { sock.connect({net::ip::make_address("127.0.0.1"), port}); }
  void Send(const std::string& bytes) { net::write(sock, net::buffer(bytes)); }
  // Reads until the peer closes or `timeout` passes.
  std::string ReadAll(std::chrono::milliseconds timeout = std::chrono::milliseconds(3000)) {
    timeval tv{static_cast<time_t>(timeout.count() / 1000), static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
    setsockopt(sock.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string out;
    char buf[4096];
    while (true) {
      const ssize_t n = ::recv(sock.native_handle(), buf, sizeof buf, 0);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }
  // Reads until `needle` has arrived (or the peer closes, or 3 s pass).
  std::string ReadUntil(const std::string& needle) {
    timeval tv{3, 0};
    setsockopt(sock.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string out;
    char buf[4096];
    while (out.find(needle) == std::string::npos) {
      const ssize_t n = ::recv(sock.native_handle(), buf, sizeof buf, 0);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }
  net::io_context ioc;
  net::ip::tcp::socket sock;
};

// A chunked answer's body, chunk by chunk, from the bytes after its head
// (up to the last chunk). Fails the test on a malformed frame.
std::vector<std::string> Chunks(const std::string& answer) {
  std::vector<std::string> chunks;
  const size_t head_end = answer.find("\r\n\r\n");
  EXPECT_NE(head_end, std::string::npos) << answer.substr(0, 200);
  if (head_end == std::string::npos) return chunks;
  for (size_t at = head_end + 4; at < answer.size();) {
    const size_t eol = answer.find("\r\n", at);
    if (eol == std::string::npos) {
      ADD_FAILURE() << "a chunk-size line without its end at byte " << at;
      break;
    }
    const size_t n = std::stoul(answer.substr(at, eol - at), nullptr, 16);
    if (n == 0) break;
    if (eol + 2 + n + 2 > answer.size() || answer.compare(eol + 2 + n, 2, "\r\n") != 0) {
      ADD_FAILURE() << "a chunk of " << n << " bytes not framed whole at byte " << at;
      break;
    }
    chunks.push_back(answer.substr(eol + 2, n));
    at = eol + 2 + n + 2;
  }
  return chunks;
}

// An exchange dropped once its stream has begun (a handler's bug) ends the
// stream as cut: a 500 written there landed inside the chunked body, and
// the connection went on as if in step.
TEST_F(ServerFixture, AStreamDroppedMidwayEndsAsCut) {
  RawPeer p(server_->port());
  p.Send("GET /drop-stream HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string got = p.ReadAll(std::chrono::milliseconds(2000));
  EXPECT_NE(got.find("data: 0"), std::string::npos) << got;
  EXPECT_EQ(got.find("500"), std::string::npos) << got;
  EXPECT_EQ(got.find("0\r\n\r\n"), std::string::npos) << "no last chunk: the stream is cut, not whole: " << got;
}

// A stream to a reader that does not read: its events queue in the server,
// where each joins the one queued before it (Session::Enqueue). They still
// arrive whole, as their own chunks and in order, and what counts as unsent
// goes back to nothing once they are out (a joined event counted twice, or
// not at all, would pause a generation's relay for good or never).
TEST_F(ServerFixture, EventsQueuedForASlowReaderArriveWholeAndInOrder) {
  RawPeer p(server_->port());
  p.Send("GET /stream-forever HTTP/1.1\r\nHost: x\r\n\r\n");
  for (int i = 0; i < 200 && !held_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(held_);
  constexpr int kEvents = 40000;  // about 8 MiB: more than loopback's socket buffers take
  const std::string pad(200, 'x');
  for (int i = 0; i < kEvents; ++i) held_->Write("data: " + std::to_string(i) + pad + "\n\n");
  size_t queued = 0;
  for (int i = 0; i < 200 && queued == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    queued = held_->unsent_bytes();
  }
  EXPECT_GT(queued, 0u) << "nothing waited in the server: the test did not queue events";
  held_->End();
  const std::vector<std::string> chunks = Chunks(p.ReadUntil("\r\n0\r\n\r\n"));
  ASSERT_EQ(chunks.size(), static_cast<size_t>(kEvents));
  for (int i = 0; i < kEvents; ++i) {
    ASSERT_EQ(chunks[i], "data: " + std::to_string(i) + pad + "\n\n") << "chunk " << i;
  }
  size_t left = held_->unsent_bytes();
  for (int i = 0; i < 200 && left != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    left = held_->unsent_bytes();
  }
  EXPECT_EQ(left, 0u);
}

TEST_F(ServerFixture, PeerResetRunsTheDisconnectCallback) {
  {
    RawPeer p(server_->port());
    p.Send("GET /hang HTTP/1.1\r\nHost: x\r\n\r\n");
    for (int i = 0; i < 200 && !held_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    p.sock.set_option(net::socket_base::linger(true, 0));  // close() sends a reset
  }
  for (int i = 0; i < 400 && !disconnected_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_TRUE(disconnected_);
}

TEST_F(ServerFixture, HalfClosedPeerKeepsItsRequestAndGetsTheAnswer) {
  RawPeer p(server_->port());
  p.Send("GET /hang HTTP/1.1\r\nHost: x\r\n\r\n");
  p.sock.shutdown(net::ip::tcp::socket::shutdown_send);  // "I have sent everything"
  for (int i = 0; i < 200 && !held_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(held_);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the server has seen the end of file by now
  EXPECT_FALSE(disconnected_);
  EXPECT_FALSE(held_->disconnected());
  held_->Respond(MakeResponse(200, "late answer", "text/plain"));
  const std::string got = p.ReadAll();
  EXPECT_NE(got.find("200 OK"), std::string::npos) << got;
  EXPECT_NE(got.find("late answer"), std::string::npos) << got;
}

TEST_F(ServerFixture, RequestHeadsAreTakenAsRfc9112AndRfc9110Say) {
  RawPeer p(server_->port());
  p.Send("POST /echo HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi");
  const std::string got = p.ReadAll();
  EXPECT_NE(got.find("400 Bad Request"), std::string::npos) << got;
  EXPECT_NE(got.find("Host"), std::string::npos) << got;
  // Two are as bad (RFC 9112 3.2).
  RawPeer two(server_->port());
  two.Send("POST /echo HTTP/1.1\r\nHost: a\r\nHost: b\r\nContent-Length: 2\r\n\r\nhi");
  const std::string twice = two.ReadAll();
  EXPECT_NE(twice.find("400 Bad Request"), std::string::npos) << twice;
  EXPECT_NE(twice.find("one Host header"), std::string::npos) << twice;
  // A compressed body is not read as plain (RFC 9110: 415).
  RawPeer gz(server_->port());
  gz.Send("POST /echo HTTP/1.1\r\nHost: a\r\nContent-Encoding: gzip\r\nContent-Length: 2\r\n\r\nhi");
  const std::string coded = gz.ReadAll();
  EXPECT_NE(coded.find("415 Unsupported Media Type"), std::string::npos) << coded;
  // The absolute form is its path (RFC 9112 3.2.2; it was a 404 "no route").
  RawPeer absolute(server_->port());
  absolute.Send("POST http://a:1/echo HTTP/1.1\r\nHost: a:1\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi");
  const std::string routed = absolute.ReadAll();
  EXPECT_NE(routed.find("200 OK"), std::string::npos) << routed;
  RawPeer query(server_->port());  // (a '/' in its query is not its path)
  query.Send("POST http://a:1?next=/echo HTTP/1.1\r\nHost: a:1\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi");
  const std::string rooted = query.ReadAll();
  EXPECT_EQ(rooted.find("200 OK"), std::string::npos) << "taken as /echo: " << rooted;
  // HTTP/1.0 has no Host requirement.
  RawPeer q(server_->port());
  q.Send("POST /echo HTTP/1.0\r\nContent-Length: 2\r\n\r\nhi");
  EXPECT_NE(q.ReadAll().find("200 OK"), std::string::npos);
}

TEST_F(ServerFixture, HandlerExceptionIs500AndTheServerGoesOn) {
  auto r = Fetch("127.0.0.1", server_->port(), "GET", "/throw");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 500);
  auto ok = Fetch("127.0.0.1", server_->port(), "POST", "/echo", "alive");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->body, "alive");
}

// While a request runs, a peer that keeps sending (pipelining without end)
// is no longer read past the header limit: its bytes stay in the kernel's
// buffers, and its writes stall, instead of growing the server's memory.
TEST_F(ServerFixture, BytesSentDuringARequestAreNotBufferedWithoutBound) {
  RawPeer p(server_->port());
  p.Send("GET /hang HTTP/1.1\r\nHost: x\r\n\r\n");
  for (int i = 0; i < 200 && !held_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(held_);
  p.sock.non_blocking(true);
  const std::string chunk(1 << 20, 'x');
  size_t sent = 0;
  auto last_progress = std::chrono::steady_clock::now();
  while (sent < (size_t{256} << 20) && std::chrono::steady_clock::now() - last_progress < std::chrono::milliseconds(1500)) {
    boost::system::error_code ec;
    const size_t n = p.sock.write_some(net::buffer(chunk), ec);
    if (n > 0) {
      sent += n;
      last_progress = std::chrono::steady_clock::now();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  // Loopback socket buffers hold a few MiB; a server that reads everything takes all 256 MiB.
  EXPECT_LT(sent, size_t{64} << 20) << "the server kept reading a peer whose request was running";
  EXPECT_FALSE(disconnected_);
}

// A chunk-size line (or a trailer) that never ends: Beast's header limit
// covers only the head, so the connection's read buffer grew with every
// byte until the read timeout (gigabytes on a fast link). Its buffer is
// bounded: past the bound, a 400 at once.
TEST_F(ServerFixture, AChunkSizeLineThatNeverEndsIsRefusedNotBuffered) {
  RawPeer p(server_->port());
  p.Send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1");
  std::thread writer([&p] {
    const std::string junk(64 << 10, 'x');
    boost::system::error_code ec;
    for (int i = 0; i < 16 && !ec; ++i) net::write(p.sock, net::buffer(junk), ec);  // 1 MiB, no line end
  });
  const std::string got = p.ReadAll(std::chrono::milliseconds(5000));
  writer.join();
  EXPECT_NE(got.find("400"), std::string::npos) << "no answer: the line was buffered for the read timeout";
}

// A chunked body's trailer fields joined the head's after its checks and
// past its size limit (the first of a name wins, so a trailer could add an
// Idempotency-Key or a timeout the head did not carry): refused.
TEST_F(ServerFixture, TrailerFieldsAfterAChunkedBodyAreRefused) {
  RawPeer p(server_->port());
  p.Send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
         "5\r\nabcde\r\n0\r\nIdempotency-Key: late\r\n\r\n");
  const std::string got = p.ReadAll(std::chrono::milliseconds(2000));
  EXPECT_NE(got.find("400"), std::string::npos) << got;
  EXPECT_NE(got.find("trailer"), std::string::npos) << got;
  EXPECT_EQ(got.find("abcde"), std::string::npos) << "answered: " << got;
  // Without trailer fields, the same body is read.
  RawPeer q(server_->port());
  q.Send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
         "5\r\nabcde\r\n0\r\n\r\n");
  EXPECT_NE(q.ReadAll(std::chrono::milliseconds(2000)).find("abcde"), std::string::npos);
}

// A client that asks leave to send its body (Expect: 100-continue, as curl
// does for large ones) gets it at once; it waited out its own timeout (a
// second for curl) before sending anyway.
TEST_F(ServerFixture, ExpectContinueIsAnsweredBeforeTheBody) {
  RawPeer p(server_->port());
  p.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n");
  timeval tv{2, 0};
  setsockopt(p.sock.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[64];
  const ssize_t n = ::recv(p.sock.native_handle(), buf, sizeof buf, 0);
  ASSERT_GT(n, 0) << "no interim answer: the client waits before it sends its body";
  EXPECT_EQ(std::string(buf, static_cast<size_t>(n)), "HTTP/1.1 100 Continue\r\n\r\n");
  p.Send("hello");
  const std::string got = p.ReadAll(std::chrono::milliseconds(1000));
  EXPECT_NE(got.find("200 OK"), std::string::npos) << got;
  EXPECT_NE(got.find("hello"), std::string::npos) << got;
}

// HEAD is answered as GET is, without the body (RFC 9110 9.3.2): a client
// on a kept-alive connection read the body as the start of its next answer.
// A stream's HEAD gets the stream's head, and the connection closes.
TEST_F(ServerFixture, HeadGetsTheHeadAloneAndTheConnectionStaysInStep) {
  RawPeer p(server_->port());
  p.Send("HEAD /hello HTTP/1.1\r\nHost: x\r\n\r\nGET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string got = p.ReadAll(std::chrono::milliseconds(2000));
  const size_t second = got.find("HTTP/1.1", 1);
  ASSERT_NE(second, std::string::npos) << got;
  const std::string head = got.substr(0, second);
  EXPECT_NE(head.find("200 OK"), std::string::npos) << got;
  EXPECT_NE(head.find("Content-Length: 5"), std::string::npos) << got;
  EXPECT_EQ(head.substr(head.size() - 4), "\r\n\r\n") << "nothing after the head: " << got;
  EXPECT_NE(got.find("hello", second), std::string::npos) << got;
  EXPECT_EQ(got.find("hello"), got.rfind("hello")) << "one body, the GET's: " << got;

  RawPeer s(server_->port());
  s.Send("HEAD /stream-here HTTP/1.1\r\nHost: x\r\n\r\n");  // (no thread of its own to outlive the test)
  const std::string stream = s.ReadAll(std::chrono::milliseconds(2000));
  EXPECT_NE(stream.find("200 OK"), std::string::npos) << stream;
  EXPECT_EQ(stream.find("data:"), std::string::npos) << stream;
  // The connection closes after it, and its head says so (a client reused it, and found it shut).
  EXPECT_NE(stream.find("\r\nConnection: close\r\n"), std::string::npos) << stream;
  EXPECT_EQ(stream.substr(stream.size() - 4), "\r\n\r\n") << stream;

  // A stream that never ends (an event feed): its writer hears the peer is
  // gone, so the exchange and the connection's place are let go (it held
  // them for good: HEAD /v1/events, repeated, filled the connection cap).
  RawPeer forever(server_->port());
  forever.Send("HEAD /stream-forever HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_NE(forever.ReadAll(std::chrono::milliseconds(2000)).find("200 OK"), std::string::npos);
  for (int i = 0; i < 200 && !disconnected_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(disconnected_) << "the stream's writer was never told";
  held_.reset();
}

// A body in a coding other than chunked is refused, not read as plain
// bytes: what followed the head was parsed as the next request (the shape
// of request smuggling behind a proxy that forwards it).
TEST_F(ServerFixture, ATransferCodingOtherThanChunkedIs501AndCloses) {
  for (const std::string te : {"gzip", "gzip, chunked", "chunked, chunked"}) {
    RawPeer p(server_->port());
    p.Send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: " + te +
           "\r\n\r\nGET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
    const std::string got = p.ReadAll(std::chrono::milliseconds(2000));
    EXPECT_NE(got.find("501"), std::string::npos) << te << ": " << got;
    EXPECT_EQ(got.find("hello"), std::string::npos) << te << ": the body was read as a request: " << got;
  }
  RawPeer chunked(server_->port());
  chunked.Send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\nConnection: close\r\n\r\n"
               "5\r\nhello\r\n0\r\n\r\n");
  EXPECT_NE(chunked.ReadAll(std::chrono::milliseconds(2000)).find("hello"), std::string::npos);
}

// A finished exchange's late call (a worker's thread registering its cancel
// after the answer went out) touches nothing of the connection's next
// exchange: it took that one's disconnect callback, and a client that went
// away did not cancel the request it left running. Nor does a late stream
// head land in the next exchange.
TEST_F(ServerFixture, AFinishedExchangesLateCallsLeaveTheNextExchangeAlone) {
  std::atomic<bool> stolen{false};
  {
    RawPeer p(server_->port());
    p.Send("GET /quick HTTP/1.1\r\nHost: x\r\n\r\n");
    ASSERT_NE(p.ReadUntil("quick").find("quick"), std::string::npos);
    p.Send("GET /hang HTTP/1.1\r\nHost: x\r\n\r\n");
    for (int i = 0; i < 400 && !held_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_TRUE(held_);
    late_->OnDisconnect([&] { stolen = true; });
    late_->StartStream(MakeResponse(200, "", "text/event-stream"));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // (both reach the session's strand)
    EXPECT_EQ(p.ReadAll(std::chrono::milliseconds(100)), "") << "the finished exchange wrote into the next one";
  }
  for (int i = 0; i < 400 && !disconnected_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_TRUE(disconnected_) << "the request running when its client went away was not told";
  EXPECT_FALSE(stolen);
}

// HTTP/1.0 has no chunked coding: a request that says Transfer-Encoding is
// answered and the connection closed (RFC 9112 6.1), so that an HTTP/1.0
// proxy in front, which takes the chunks for the next request, cannot slip
// a request past it. It was kept alive and the next request answered.
TEST_F(ServerFixture, AnHttp10RequestWithATransferEncodingClosesAfterItsAnswer) {
  RawPeer p(server_->port());
  p.Send("POST /echo HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n"
         "5\r\nabcde\r\n0\r\n\r\nGET /hello HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\r\n");
  const std::string got = p.ReadAll(std::chrono::milliseconds(2000));
  EXPECT_NE(got.find("abcde"), std::string::npos) << got;
  EXPECT_EQ(got.find("hello"), std::string::npos) << "answered on after it: " << got;
}

// An HTTP/1.0 client keeps its connection only when the answer says
// "Connection: keep-alive" (ab -k): kept open unsaid, it read until the end
// of a connection that stayed open for idle_timeout. One that did not ask
// is told the connection closes.
TEST_F(ServerFixture, AnHttp10ClientIsToldWhetherItsConnectionStaysOpen) {
  RawPeer p(server_->port());
  p.Send("GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /hello HTTP/1.0\r\n\r\n");
  const auto t0 = std::chrono::steady_clock::now();
  const std::string got = p.ReadAll(std::chrono::milliseconds(5000));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(4)) << "not closed after the second";
  const size_t second = got.find("HTTP/1.1", 1);
  ASSERT_NE(second, std::string::npos) << got;
  EXPECT_NE(got.substr(0, second).find("\r\nConnection: keep-alive\r\n"), std::string::npos) << got;
  EXPECT_NE(got.substr(second).find("\r\nConnection: close\r\n"), std::string::npos) << got;
}

// Two pipelined requests, then a half-close (nc -N, a client that sends all
// it has, then shuts its side): both are answered. The second, already in
// the buffer, was dropped with the connection.
TEST_F(ServerFixture, PipelinedRequestsOfAHalfClosedPeerAreAllAnswered) {
  RawPeer p(server_->port());
  p.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nfirst"
         "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\nsecond");
  p.sock.shutdown(net::socket_base::shutdown_send);
  const std::string got = p.ReadAll();
  EXPECT_NE(got.find("first"), std::string::npos) << got;
  EXPECT_NE(got.find("second"), std::string::npos) << got;
}

// HTTP/1.0 has no chunked encoding: a stream to an HTTP/1.0 client is its
// bytes as they are, ended by closing the connection. It got chunk sizes
// in its body.
TEST_F(ServerFixture, AStreamToAnHttp10ClientIsUnframedAndEndsWithTheConnection) {
  RawPeer p(server_->port());
  p.Send("GET /stream HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
  const auto t0 = std::chrono::steady_clock::now();
  const std::string got = p.ReadAll(std::chrono::milliseconds(5000));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(4)) << "the stream's end did not close it";
  EXPECT_EQ(got.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << got;
  EXPECT_EQ(got.find("chunked"), std::string::npos) << got;
  const size_t body = got.find("\r\n\r\n");
  ASSERT_NE(body, std::string::npos) << got;
  EXPECT_EQ(got.substr(body + 4), "data: 0\n\ndata: 1\n\ndata: 2\n\n");
}

// A stream ended as cut closes without the chunked body's last chunk: the
// client can tell it is incomplete.
TEST_F(ServerFixture, AnAbortedStreamClosesWithoutItsLastChunk) {
  RawPeer p(server_->port());
  p.Send("GET /abort HTTP/1.1\r\nHost: x\r\n\r\n");
  const auto t0 = std::chrono::steady_clock::now();
  const std::string got = p.ReadAll(std::chrono::milliseconds(3000));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2)) << "the connection stayed open";
  EXPECT_NE(got.find("data: 0"), std::string::npos) << got;
  EXPECT_NE(got.find("chunked"), std::string::npos) << got;
  EXPECT_EQ(got.find("\r\n0\r\n\r\n"), std::string::npos) << got;
}

// A server that refuses, by their head, requests without "X-Key: ok" (as
// the gateway refuses a missing API key).
class GuardedServer : public ServerFixture {
 protected:
  ServerOptions Options() override {
    ServerOptions o;
    o.max_body_bytes = 1024;
    o.check_head = [](const RequestHead& head) -> std::optional<Response> {
      if (head["X-Key"] == "ok") return std::nullopt;
      return MakeResponse(401, R"({"error":"a key is required"})", "application/json");
    };
    return o;
  }
};

// A request refused by its head is answered before its body is read: no
// 100 Continue, no share of the bodies' budget, and the connection closes
// (a caller without a key held 64 KiB of it per connection for 30 s).
TEST_F(GuardedServer, ARequestRefusedByItsHeadHoldsNoBodyBudget) {
  RawPeer p(server_->port());
  p.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 900\r\nExpect: 100-continue\r\n\r\n");
  const std::string got = p.ReadAll(std::chrono::milliseconds(2000));
  EXPECT_EQ(got.find("100 Continue"), std::string::npos) << got;
  EXPECT_NE(got.find("401"), std::string::npos) << got;
  EXPECT_NE(got.find("a key is required"), std::string::npos) << got;
  EXPECT_NE(got.find("Connection: close"), std::string::npos) << got;
  EXPECT_EQ(server_->body_bytes_held(), 0u);

  RawPeer keyed(server_->port());
  keyed.Send("POST /echo HTTP/1.1\r\nHost: x\r\nX-Key: ok\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello");
  const std::string ok = keyed.ReadAll(std::chrono::milliseconds(2000));
  EXPECT_NE(ok.find("200 OK"), std::string::npos) << ok;
  EXPECT_NE(ok.find("hello"), std::string::npos) << ok;

  // A request without a body is the handler's to judge (it is not checked here).
  RawPeer bodiless(server_->port());
  bodiless.Send("GET /nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_NE(bodiless.ReadAll(std::chrono::milliseconds(2000)).find("404"), std::string::npos);
}

// A server whose requests must arrive within 1 s, kept-alive connections
// idle for up to 20 s.
class QuickReadServer : public ServerFixture {
 protected:
  ServerOptions Options() override {
    ServerOptions o;
    o.max_body_bytes = 1024;
    o.read_timeout = std::chrono::seconds(1);
    o.idle_timeout = std::chrono::seconds(20);
    return o;
  }
};

// write_timeout bounds a reader that takes nothing, not one that is slow:
// the events queued for a slow reader are joined into pieces of up to
// 64 KiB, and a piece is written by what the socket takes at a time, each
// part within the bound. (Written whole with one bound, a piece to a reader
// slower than 64 KiB per write_timeout was cut.)
class SlowWriteServer : public ServerFixture {
 protected:
  ServerOptions Options() override {
    ServerOptions o;
    o.max_body_bytes = 1024;
    o.write_timeout = std::chrono::seconds(1);
    o.send_buffer_bytes = 8192;  // (the kernel's own, about 1.3 MiB here, would hold the whole stream)
    return o;
  }
};

TEST_F(SlowWriteServer, AReaderSlowerThanAPiecePerWriteTimeoutIsNotCut) {
  net::io_context ioc;
  net::ip::tcp::socket sock(ioc);
  sock.open(net::ip::tcp::v4());
  sock.set_option(net::socket_base::receive_buffer_size(4096));  // (before connecting: the window it offers)
  sock.connect({net::ip::make_address("127.0.0.1"), server_->port()});
  net::write(sock, net::buffer(std::string("GET /stream-forever HTTP/1.1\r\nHost: x\r\n\r\n")));
  for (int i = 0; i < 200 && !held_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(held_);
  constexpr int kEvents = 2000;  // 1 MiB: most of it waits in the server
  const std::string pad(500, 'y');
  for (int i = 0; i < kEvents; ++i) held_->Write("data: " + std::to_string(i) + pad + "\n\n");
  held_->End();
  timeval tv{3, 0};
  setsockopt(sock.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string got;
  char buf[4096];
  // 2.5 s at 16 KiB a second: a 64 KiB piece written whole would take 4 s.
  const auto slow_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2500);
  while (std::chrono::steady_clock::now() < slow_until) {
    const ssize_t n = ::recv(sock.native_handle(), buf, sizeof buf, 0);
    ASSERT_GT(n, 0) << "the server closed the connection to a slow reader after " << got.size() << " bytes";
    got.append(buf, static_cast<size_t>(n));
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  while (got.find("\r\n0\r\n\r\n") == std::string::npos) {
    const ssize_t n = ::recv(sock.native_handle(), buf, sizeof buf, 0);
    ASSERT_GT(n, 0) << "the server closed the connection to a slow reader after " << got.size() << " bytes";
    got.append(buf, static_cast<size_t>(n));
  }
  EXPECT_FALSE(disconnected_);
  const std::vector<std::string> chunks = Chunks(got);
  ASSERT_EQ(chunks.size(), static_cast<size_t>(kEvents));
  for (int i = 0; i < kEvents; ++i) {
    ASSERT_EQ(chunks[i], "data: " + std::to_string(i) + pad + "\n\n") << "chunk " << i;
  }
}

// A request begun behind the last one (pipelined bytes already read) is
// being read: its head has read_timeout, not the idle wait of a connection
// with nothing of its next request yet (a slow sender held it 75 s).
TEST_F(QuickReadServer, APipelinedRequestsHeadHasTheReadTimeout) {
  RawPeer p(server_->port());
  p.Send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\nGET /hel");
  const auto t0 = std::chrono::steady_clock::now();
  const std::string got = p.ReadAll(std::chrono::milliseconds(8000));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5)) << "held for the idle timeout";
  EXPECT_NE(got.find("hello"), std::string::npos) << got;
}

// read_timeout bounds a whole head, not each read of it: a peer that
// sends a byte now and then (within the bound each time) is closed once the
// head has taken longer than the bound, unanswered.
TEST_F(QuickReadServer, AHeadTrickledAByteAtATimeIsClosedAtItsReadTimeout) {
  RawPeer p(server_->port());
  const std::string head = "GET /hello HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
  const auto t0 = std::chrono::steady_clock::now();
  bool closed = false;
  for (char c : head) {
    boost::system::error_code ec;
    net::write(p.sock, net::buffer(&c, 1), ec);
    if (ec) {
      closed = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));  // 4 s in all at most
    if (std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(2500)) break;
  }
  // Closed by now (one write after a close may still succeed): the read
  // sees the end at once, not its own timeout.
  const auto t1 = std::chrono::steady_clock::now();
  const std::string got = p.ReadAll(std::chrono::milliseconds(4000));
  EXPECT_LT(std::chrono::steady_clock::now() - t1, std::chrono::milliseconds(2000)) << "still open";
  EXPECT_EQ(got, "") << "a head cut by its timeout is closed quietly";
  (void)closed;
}

// Between two requests a kept-alive connection waits idle_timeout, not the
// head's read_timeout: the deadline moves with each request.
TEST_F(QuickReadServer, AKeptAliveConnectionIdleLongerThanTheReadTimeoutServesItsNextRequest) {
  RawPeer p(server_->port());
  p.Send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_NE(p.ReadUntil("hello").find("hello"), std::string::npos);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // past read_timeout (1 s) twice
  p.Send("GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string got = p.ReadAll(std::chrono::milliseconds(3000));
  EXPECT_NE(got.find("hello"), std::string::npos) << "closed while idle within idle_timeout";
  EXPECT_EQ(server_->accepted(), 1u);
}

// A pipelined head after an idle wait has read_timeout too: the head's
// timer, waiting for the idle wait's later deadline, is brought forward
// (moved only later, it held the half-sent head for idle_timeout).
TEST_F(QuickReadServer, APipelinedHeadAfterAnIdleWaitHasTheReadTimeout) {
  RawPeer p(server_->port());
  p.Send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_NE(p.ReadUntil("hello").find("hello"), std::string::npos);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // idle past read_timeout (1 s), within idle_timeout (20 s)
  p.Send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\nGET /hel");
  const auto t0 = std::chrono::steady_clock::now();
  const std::string got = p.ReadAll(std::chrono::milliseconds(8000));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(4)) << "held for the idle timeout";
  EXPECT_NE(got.find("hello"), std::string::npos) << got;
}

// A server with small connection and body budgets.
class TightServer : public ServerFixture {
 protected:
  ServerOptions Options() override {
    ServerOptions o;
    o.max_body_bytes = 1024;
    o.max_body_memory_bytes = 1500;
    o.max_connections = 2;
    return o;
  }
};

TEST_F(TightServer, ConnectionsBeyondTheCapAre503AndClosed) {
  auto a = std::make_unique<RawPeer>(server_->port());
  auto b = std::make_unique<RawPeer>(server_->port());
  for (int i = 0; i < 1000 && server_->accepted() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(server_->accepted(), 2u);  // both sessions accepted
  RawPeer c(server_->port());
  const std::string got = c.ReadAll();
  EXPECT_NE(got.find("503"), std::string::npos) << got;
  EXPECT_NE(got.find("Retry-After"), std::string::npos) << got;
  a.reset();
  b.reset();
  int status = 0;
  for (int i = 0; i < 200 && status != 200; ++i) {  // the idle sessions end as their peers close
    auto r = Fetch("127.0.0.1", server_->port(), "POST", "/echo", "again");
    status = r.ok() ? r->status : 0;
    if (status != 200) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(status, 200);
}

// A client refused at the cap that is sending its request (a POST and its
// body) reads the 503: the socket was closed with its bytes unread, which
// sends a reset that destroyed the answer before the client read it (it saw
// ECONNRESET, and an SDK does not retry a POST on that).
TEST_F(TightServer, AClientRefusedAtTheCapWhileSendingItsBodyReadsThe503) {
  RawPeer a(server_->port()), b(server_->port());
  a.Send("POST /echo HTTP/1.1\r\nHost: x\r\n");  // (both begun: neither is evicted for the newcomer)
  b.Send("POST /echo HTTP/1.1\r\nHost: x\r\n");
  for (int i = 0; i < 1000 && server_->accepted() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(server_->accepted(), 2u);
  // As an SDK does: the whole request written (more than the sockets'
  // buffers hold), then the answer read; a failed write is its error.
  RawPeer c(server_->port());
  boost::system::error_code ec;
  const std::string body(1 << 20, 'x');
  net::write(c.sock, net::buffer(std::string("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 16777216\r\n\r\n")), ec);
  for (int i = 0; i < 16 && !ec; ++i) net::write(c.sock, net::buffer(body), ec);
  EXPECT_FALSE(ec) << "refused with a reset while it sent its body: " << ec.message();
  EXPECT_NE(c.ReadAll(std::chrono::milliseconds(3000)).find("503"), std::string::npos);
}

// At the cap a new client takes the place of the longest-idle keep-alive
// connection; the other idle one keeps its connection. Before, clients that
// keep idle pools (browsers, SDKs) held the cap and a new client got 503
// until their idle timeout (75 s).
TEST_F(TightServer, ANewConnectionAtTheCapClosesTheLongestIdleOne) {
  RawPeer a(server_->port()), b(server_->port());
  a.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nfirst");
  ASSERT_NE(a.ReadUntil("first").find("200 OK"), std::string::npos);
  b.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\nsecond");
  ASSERT_NE(b.ReadUntil("second").find("200 OK"), std::string::npos);
  auto r = Fetch("127.0.0.1", server_->port(), "POST", "/echo", "third");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "third");
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(a.ReadAll(std::chrono::milliseconds(2000)), "");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1500)) << "the longest-idle was not closed";
  EXPECT_EQ(server_->evicted(), 1u);
  b.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nagain");
  EXPECT_NE(b.ReadUntil("again").find("200 OK"), std::string::npos);
}

// An idle connection that has begun its next request (half a header) is not
// closed for a newcomer, and the newcomer is let in only in place of one
// that is: the next idle one. It was let in anyway, past the cap, and each
// such decoy could push the count higher.
TEST_F(TightServer, AConnectionThatBeganARequestIsNotEvictedAndTheCapHolds) {
  RawPeer a(server_->port()), b(server_->port());
  a.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\na");
  ASSERT_NE(a.ReadUntil("\r\n\r\na").find("200 OK"), std::string::npos);
  b.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nb");
  ASSERT_NE(b.ReadUntil("\r\n\r\nb").find("200 OK"), std::string::npos);
  a.Send("POST /echo HTTP/1.1\r\nHost: x\r\n");  // the longest idle begins a request
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // (its bytes reach the server first, loaded too)
  auto r = Fetch("127.0.0.1", server_->port(), "POST", "/echo", "c");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 200);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(b.ReadAll(std::chrono::milliseconds(2000)), "") << "the idle one stayed open";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1500)) << "the idle one stayed open";
  EXPECT_EQ(server_->evicted(), 1u);
  a.Send("Content-Length: 1\r\n\r\nA");
  EXPECT_NE(a.ReadUntil("\r\n\r\nA").find("200 OK"), std::string::npos) << "the one that began a request was cut";
}

// A declared length is held as its body arrives, a step ahead: a peer that
// declared 1000 bytes and sent 10 holds about a step, and another body fits
// beside it (before, the 1000 were reserved at the header: 503, and four
// peers that declared 8 MiB and trickled held the default budget for the
// read timeout). What has arrived counts: past the budget, 503.
TEST_F(TightServer, ADeclaredLengthHoldsTheBudgetForWhatArrived) {
  RawPeer slow(server_->port());
  slow.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + std::string(10, 'a'));
  for (int i = 0; i < 1000 && server_->body_bytes_held() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_GT(server_->body_bytes_held(), 0u);
  EXPECT_LT(server_->body_bytes_held(), 200u);  // a step ahead of its 10 bytes, not 1000
  auto r = Fetch("127.0.0.1", server_->port(), "POST", "/echo", std::string(1000, 'b'));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 200) << r->body;
  slow.Send(std::string(590, 'a'));  // 600 of its 1000 here
  for (int i = 0; i < 1000 && server_->body_bytes_held() < 600; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  slow.Send(std::string(300, 'a'));  // 900
  for (int i = 0; i < 1000 && server_->body_bytes_held() < 900; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_GE(server_->body_bytes_held(), 900u);
  // What its string holds is counted, and it holds no more than declared
  // (a string's own growth took 1200 bytes for 1000).
  EXPECT_LE(server_->body_bytes_held(), 1000u);
  RawPeer other(server_->port());
  other.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + std::string(700, 'c'));
  const std::string refused = other.ReadAll(std::chrono::milliseconds(2000));
  EXPECT_NE(refused.find("503"), std::string::npos) << refused;
  EXPECT_NE(refused.find("Retry-After: 1"), std::string::npos) << refused;
  slow.Send(std::string(100, 'a'));
  const std::string got = slow.ReadUntil(std::string(1000, 'a'));
  EXPECT_NE(got.find("200 OK"), std::string::npos) << got.substr(0, 200);
  auto after = Fetch("127.0.0.1", server_->port(), "POST", "/echo", std::string(1000, 'c'));
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->status, 200);
  EXPECT_EQ(after->body, std::string(1000, 'c'));
}

// A chunked body holds the budget for what it has sent (a step ahead), not
// for the largest body allowed: two small chunked uploads at once fit in a
// budget that two largest bodies would not. The second was a 503.
TEST_F(TightServer, AChunkedBodyHoldsTheBudgetForWhatItSent) {
  RawPeer a(server_->port()), b(server_->port());
  a.Send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n");
  for (int i = 0; i < 1000 && server_->body_bytes_held() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  b.Send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nsecond\r\n0\r\n\r\n");
  const std::string second = b.ReadAll(std::chrono::milliseconds(1000));
  EXPECT_NE(second.find("200 OK"), std::string::npos) << second;
  EXPECT_NE(second.find("second"), std::string::npos) << second;
  a.Send(std::string(600, 'x').insert(0, "258\r\n") + "\r\n0\r\n\r\n");  // 0x258 = 600: within the body limit
  const std::string first = a.ReadAll(std::chrono::milliseconds(1000));
  EXPECT_NE(first.find("200 OK"), std::string::npos) << first;
  EXPECT_NE(first.find("first" + std::string(600, 'x')), std::string::npos);
  EXPECT_EQ(server_->body_bytes_held(), 0u);
}

// A chunked body's string grows no further than the body limit: its
// doubling took 1200 bytes for 900 (limit 1024), counted against the budget
// as more than any one body may hold.
TEST_F(TightServer, AChunkedBodyHoldsNoMoreThanTheBodyLimit) {
  RawPeer a(server_->port());
  a.Send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + std::string(600, 'x').insert(0, "258\r\n") +
         "\r\n");
  for (int i = 0; i < 1000 && server_->body_bytes_held() < 600; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  a.Send(std::string(300, 'y').insert(0, "12c\r\n") + "\r\n");  // 0x12c = 300: 900 in all
  for (int i = 0; i < 1000 && server_->body_bytes_held() < 900; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_GE(server_->body_bytes_held(), 900u);
  EXPECT_LE(server_->body_bytes_held(), 1024u);
  a.Send("0\r\n\r\n");
  const std::string got = a.ReadUntil(std::string(300, 'y'));
  EXPECT_NE(got.find("200 OK"), std::string::npos) << got.substr(0, 200);
  EXPECT_NE(got.find(std::string(600, 'x') + std::string(300, 'y')), std::string::npos);
}

}  // namespace
}  // namespace spillway::http
