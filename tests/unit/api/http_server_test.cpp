#include "api/http_server.h"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>

#include <atomic>
#include <future>
#include <thread>

#include "api/http_client.h"

namespace spillway::http {
namespace {

namespace net = boost::asio;

// A server on port 0 with a few test routes, run on its own thread.
class ServerFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions o;
    o.max_body_bytes = 1024;
    server_ = std::make_unique<Server>(ioc_, o, [this](Request req, std::shared_ptr<Exchange> ex) {
      const std::string t(req.target());
      if (t == "/echo") return ex->Respond(MakeResponse(200, req.body(), "text/plain"));
      if (t == "/stream") {
        ex->StartStream(MakeResponse(200, "", "text/event-stream"));
        std::thread([ex] {
          for (int i = 0; i < 3; ++i) ex->Write("data: " + std::to_string(i) + "\n\n");
          ex->End();
        }).detach();
        return;
      }
      if (t == "/hang") {  // never answers until the peer goes away
        held_ = ex;
        ex->OnDisconnect([this] { disconnected_ = true; });
        return;
      }
      if (t == "/drop") return;  // the Exchange is dropped unanswered
      ex->Respond(MakeResponse(404, "", "text/plain"));
    });
    ASSERT_TRUE(server_->Listen("127.0.0.1", 0).ok());
    thread_ = std::thread([this] { ioc_.run(); });
  }
  void TearDown() override {
    held_.reset();
    server_->Stop();
    ioc_.stop();
    thread_.join();
  }

  net::io_context ioc_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  std::shared_ptr<Exchange> held_;
  std::atomic<bool> disconnected_{false};
};

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
}

TEST_F(ServerFixture, DroppedExchangeAnswers500) {
  auto r = Fetch("127.0.0.1", server_->port(), "GET", "/drop");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 500);
}

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

}  // namespace
}  // namespace spillway::http
