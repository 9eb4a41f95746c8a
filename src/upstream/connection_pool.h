// Asynchronous kept-alive loopback connections to workers (C++20 coroutines
// on Boost.Asio), reused across requests: a new TCP connection per request
// costs more than everything else the gateway does, and a thread blocked per
// request would cap how many can be open at once.
//
// Each call runs as a coroutine on the caller's executor (a request's
// strand); a connection is used by one call at a time and goes back to the
// idle list after a complete answer that keeps the connection alive, for at
// most a minute. A reused connection that the worker has closed meanwhile
// fails before any answer; the request is then sent once more on a fresh
// connection, and the port's other kept connections (as old) are dropped.
// Transport failures are kUnavailable, timeouts kDeadlineExceeded; any HTTP
// status is a successful call. Thread-safe.
#pragma once

#include <utility>  // before Asio's awaitable.hpp, which uses std::exchange without it (Boost 1.74)

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "api/http_client.h"

namespace spillway::upstream {

// Optional control of one Stream() call (an external service's request, a
// stream with a deadline).
class StreamControl {
 public:
  // From any thread: the call's connection is closed within ~50 ms and the
  // call returns kCancelled (the upstream sees the client go away).
  void Abort() { aborted_ = true; }
  bool aborted() const { return aborted_; }
  // Set before the call (default: none): at this time the call's connection
  // is closed, as by Abort(), and the call returns kDeadlineExceeded: a
  // bound on the whole call, not on each wait as the idle timeout is.
  std::chrono::steady_clock::time_point deadline{};
  bool expired() const { return expired_; }
  void Expire() {
    expired_ = true;
    aborted_ = true;
  }
  // A new connection, never a kept-alive one: a request that must not be
  // sent twice cannot meet a connection the server closed while it was idle
  // (whose failure would leave unknown whether the server acted on it).
  bool fresh_connection = false;
  // The server listens on the IPv6 loopback ([::1]; an external service's
  // url says so), not on 127.0.0.1. Per call, not per port: a worker may get
  // the same port number on 127.0.0.1, and its requests (with its secret)
  // must never go to the [::1] server.
  bool ipv6 = false;
  // Out: the request was written whole (the server may have acted on it).
  bool sent = false;
  // Out: the server took the connection the request went on (it is up, even
  // if the request then failed); false when it could not be reached.
  bool connected = false;

 private:
  std::atomic<bool> aborted_{false};
  std::atomic<bool> expired_{false};
};

class ConnectionPool {
 public:
  explicit ConnectionPool(size_t max_idle_per_port = 64);
  ~ConnectionPool();
  // Closes the idle connections (before their I/O context goes away).
  void Clear();

  // One request, the whole answer. `on_sent` (when set) runs once the
  // request is written whole, while the server works on it (at most once,
  // and not when the request was never written).
  boost::asio::awaitable<StatusOr<http::ClientResponse>> Send(uint16_t port, std::string method, std::string target,
                                                              std::string body, http::HeaderList headers,
                                                              std::chrono::milliseconds timeout,
                                                              std::function<void()> on_sent = nullptr);
  // One request whose answer is handed over as it arrives (SSE relaying):
  // `on_head` sees status and headers, `on_data` each piece of the body
  // (de-chunked); either returning false stops reading (the connection is
  // then closed). `idle_timeout` bounds each wait for more data. While
  // `paused()` says so (the client reads slower than the worker writes), no
  // more is read: the worker's socket fills instead of the gateway's memory
  // (looked at again every 10 ms).
  boost::asio::awaitable<Status> Stream(uint16_t port, std::string method, std::string target, std::string body,
                                        http::HeaderList headers, std::function<bool(const http::StreamHead&)> on_head,
                                        std::function<bool(std::string_view)> on_data,
                                        std::chrono::milliseconds idle_timeout = std::chrono::seconds(600),
                                        std::function<bool()> paused = nullptr, StreamControl* control = nullptr);

 private:
  struct Conn;
  // A new connection lives on the caller's executor.
  // Kept connections are listed by server: its port, and whether on [::1].
  static uint32_t ServerKey(uint16_t port, bool ipv6) { return port | (ipv6 ? 0x10000u : 0u); }
  std::unique_ptr<Conn> Take(uint32_t server, const boost::asio::any_io_executor& ex, bool* reused);
  void Give(uint32_t server, std::unique_ptr<Conn> c);
  // `server`'s kept connections, dropped: one of them was found closed by
  // the server, and the others have been idle as long or longer.
  void DropIdle(uint32_t server);
  boost::asio::awaitable<Status> Connect(Conn& c, uint16_t port, bool ipv6, std::chrono::milliseconds timeout);

  const size_t max_idle_;
  std::mutex mu_;
  // By server (ServerKey), oldest first (each kept at most kMaxIdle; a port
  // no longer used, a worker that restarted elsewhere, is swept).
  std::map<uint32_t, std::vector<std::unique_ptr<Conn>>> idle_;
  std::chrono::steady_clock::time_point last_sweep_{};  // (mu_)
};

}  // namespace spillway::upstream
