// A small asynchronous HTTP/1.1 server on Boost.Beast, shared by the worker and
// the gateway.
//
// Threading: the server runs on the io_context it is given; run that context
// on one or more threads. Each connection lives on its own strand. The
// Handler is called on that strand and must not block: it either answers
// through the Exchange at once or hands the Exchange to another thread, which
// may call any Exchange method (they are thread-safe and post to the strand).
//
// Lifecycle of an Exchange: exactly one of Respond() or StartStream() ... End()
// completes it. An Exchange dropped without an answer answers 500. If the
// peer closes the connection before the exchange completes, the callback
// given to OnDisconnect runs once (on the connection's strand) and later
// writes are discarded.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/beast/http.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"

namespace spillway::http {

using Request = boost::beast::http::request<boost::beast::http::string_body>;
using Response = boost::beast::http::response<boost::beast::http::string_body>;

struct ServerOptions {
  size_t max_body_bytes = 1 << 20;
  size_t max_header_bytes = 16 << 10;
  std::chrono::seconds read_timeout{30};    // header + body of one request
  std::chrono::seconds idle_timeout{75};    // keep-alive wait for the next request
  std::chrono::seconds write_timeout{60};   // one write to a slow reader
};

class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual void Respond(Response res) = 0;
  // Sends the header with chunked transfer encoding; the body follows as Write()s.
  virtual void StartStream(Response header) = 0;
  virtual void Write(std::string data) = 0;
  virtual void End() = 0;
  virtual void OnDisconnect(std::function<void()> cb) = 0;
  virtual bool disconnected() const = 0;
};

using Handler = std::function<void(Request req, std::shared_ptr<Exchange> ex)>;

class Server {
 public:
  Server(boost::asio::io_context& ioc, ServerOptions opts, Handler handler);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and starts accepting. `host` must be a numeric address; port 0 picks
  // a free port (see port()).
  Status Listen(const std::string& host, uint16_t port);
  uint16_t port() const;
  void Stop();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// Helpers for building responses.
Response MakeResponse(unsigned status, std::string body, const std::string& content_type,
                      unsigned version = 11);
bool IsLoopbackAddress(const std::string& host);

}  // namespace spillway::http
