// An in-process fake worker for tests of the gateway's async plumbing: an
// HTTP server (the same Beast server the worker uses) on a loopback port,
// answering from a handler the test gives, on its own I/O thread. It counts
// the requests it was sent and the connections it accepted.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/beast/http.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "api/http_server.h"

namespace spillway::testing {

class FakeWorker {
 public:
  using Handler = std::function<void(http::Request& req, std::shared_ptr<http::Exchange> ex)>;
  // `host`: the loopback address it listens on ("::1": IPv6 alone).
  explicit FakeWorker(Handler h, const std::string& host = "127.0.0.1") : handler_(std::move(h)) {
    http::ServerOptions options;
    options.max_body_bytes = 16 << 20;  // as a worker takes (twice the gateway's 8 MiB, and more)
    server_ = std::make_unique<http::Server>(ioc_, options, [this](http::Request req, std::shared_ptr<http::Exchange> ex) {
      ++requests_;
      handler_(req, std::move(ex));
    });
    ok_ = server_->Listen(host, 0).ok();
    thread_ = std::thread([this] { ioc_.run(); });
  }
  ~FakeWorker() {
    server_->Stop();
    ioc_.stop();
    thread_.join();
    // Answers its handler still holds go while their connections' loop is
    // there to take their last post (after it, they used a freed strand:
    // valgrind, and a heap corruption now and then in a later test).
    handler_ = nullptr;
  }
  bool ok() const { return ok_; }
  uint16_t port() const { return server_->port(); }
  int requests() const { return requests_.load(); }
  uint64_t connections() const { return server_->accepted(); }

 private:
  Handler handler_;
  boost::asio::io_context ioc_;
  std::unique_ptr<http::Server> server_;
  std::atomic<int> requests_{0};
  bool ok_ = false;
  std::thread thread_;
};

}  // namespace spillway::testing
