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
// peer goes away before the exchange completes (a reset, or a write that
// fails), the callback given to OnDisconnect runs once (on the connection's
// strand) and later writes are discarded. A peer that only half-closes (shuts
// down its sending side after the request) keeps its request: it is answered,
// then the connection closes.
//
// Hostile peers: headers are bounded (431), bodies (413), the bodies held at
// once (503), the connections open at once (the longest-idle closes for a
// new one, else 503 and close), and the bytes
// read from a peer while its request runs (the server stops reading it once
// they pass the header limit). HTTP/1.1 requests without Host get 400. An
// exception thrown by the handler is caught and logged; the exchange answers 500.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/beast/http.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace spillway::http {

using Request = boost::beast::http::request<boost::beast::http::string_body>;
using Response = boost::beast::http::response<boost::beast::http::string_body>;
using RequestHead = boost::beast::http::request_header<>;  // a request's line and fields (a Request is one)

struct ServerOptions {
  size_t max_body_bytes = 1 << 20;
  size_t max_header_bytes = 16 << 10;
  // A request's header, and then its body, each within read_timeout (a
  // kept-alive connection's next header within idle_timeout: its first
  // byte's arrival is not seen apart from the rest; read_timeout when bytes
  // of it came with the last request's).
  std::chrono::seconds read_timeout{30};
  std::chrono::seconds idle_timeout{75};    // keep-alive wait for the next request
  // A write to a slow reader that makes no progress for this long ends the
  // connection (a stream's piece: each part the socket takes; a whole answer: all of it).
  std::chrono::seconds write_timeout{60};
  // Each connection's socket send buffer (SO_SNDBUF); 0: the kernel's own,
  // grown as it sees fit (about 1.3 MiB on loopback). Tests set a small one
  // to see what waits in the server for a slow reader rather than in the kernel.
  int send_buffer_bytes = 0;
  // Open connections at once. One more takes the place of the longest-idle
  // keep-alive connection (closed), or, when none is idle, is answered 503
  // and closed. Keep it below the file-descriptor limit (see ConnectionCap).
  size_t max_connections = 512;
  // Request bodies held at once, all connections together (a body counts as
  // it arrives, a step ahead of what has come: at most 64 KiB or a
  // sixteenth of max_body_bytes, never beyond its Content-Length, until its
  // exchange completes); a request over it is answered 503 + Retry-After.
  size_t max_body_memory_bytes = 64 << 20;
  // Each event loop given to the Server is run by one thread alone: a
  // connection's handlers are then serial on its loop without a strand
  // (whose dispatch and re-post cost every completion a lock and a queue
  // round). False: a loop may be run by several threads (the worker's), and
  // each connection gets a strand.
  bool one_thread_per_loop = false;
  // Asked with a request's head, before its body's memory is reserved and
  // before a 100 Continue, when the request declares a body: an answer
  // refuses it (sent, then the connection closes, the body unread); none
  // lets it on. The gateway checks Host, Origin and keys here, so that a
  // caller without a key cannot hold the bodies' budget.
  std::function<std::optional<Response>(const RequestHead& head)> check_head;
};

// Raises the soft file-descriptor limit to the hard one where allowed and
// returns the connection cap that leaves `reserve` descriptors for everything
// else (journal, workers, upstream connections): min(wanted, soft - reserve),
// at least 8.
size_t ConnectionCap(size_t wanted, size_t reserve);

// Runs `ioc` on the calling thread until it is stopped. An exception that
// escapes a handler is logged (prefixed with `who`) and the loop goes on: no
// exception leaves an I/O thread.
void RunLogged(boost::asio::io_context& ioc, const char* who);

class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual void Respond(Response res) = 0;
  // Sends the header with chunked transfer encoding; the body follows as Write()s.
  virtual void StartStream(Response header) = 0;
  virtual void Write(std::string data) = 0;
  virtual void End() = 0;
  // Ends a started stream as cut: the connection closes without the chunked
  // body's last chunk, so the client can tell the answer is incomplete (an
  // HTTP/1.0 stream, which ends by closing anyway, cannot tell it).
  virtual void Abort() { End(); }
  virtual void OnDisconnect(std::function<void()> cb) = 0;
  virtual bool disconnected() const = 0;
  // Bytes given to Write() that have not reached the socket yet: a relay
  // pauses reading its upstream while a slow reader has much of it unsent.
  virtual size_t unsent_bytes() const { return 0; }
  // Where the exchange's own work runs (its connection's strand), so that
  // the request's work may run there too and answer without a hop to
  // another thread; none (the default) when it has no such place.
  virtual boost::asio::any_io_executor executor() const { return {}; }
  // The server's check_head passed for this request's head (it runs for a
  // request with a body, before the body is read): its handler need not run
  // the same check again.
  virtual bool head_checked() const { return false; }
  // The peer's IP address as text ("127.0.0.1", "::1"); empty when unknown.
  virtual std::string peer_address() const { return {}; }
  // Who served a stream (`key`: "fallback_model", "limits"), learnt after its
  // head may have gone: a format that has a place for it in its body (an
  // NDJSON stream's last line) carries it there. The default drops it: an
  // SSE stream says it in comments.
  virtual void Annotate(const std::string& key, const std::string& value) {
    (void)key;
    (void)value;
  }
  // Whether a stream's tool calls reach the client only at its end (a
  // translation that gathers their pieces: Ollama's NDJSON). Until then
  // none has gone out, and a failed stream may still be continued.
  virtual bool holds_tool_calls() const { return false; }
};

using Handler = std::function<void(Request req, std::shared_ptr<Exchange> ex)>;

class Server {
 public:
  // Connections live on `ioc`, or, when `loops` are given, on those in turn
  // (an event loop per thread, as nginx's workers: a connection's reads,
  // its requests' work and its answers then stay on one thread).
  Server(boost::asio::io_context& ioc, ServerOptions opts, Handler handler,
         std::vector<boost::asio::io_context*> loops = {});
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and starts accepting. `host` must be a numeric address; port 0 picks
  // a free port (see port()).
  Status Listen(const std::string& host, uint16_t port);
  uint16_t port() const;
  // Connections accepted so far (tests tell a reused connection from a new one).
  uint64_t accepted() const;
  // Idle keep-alive connections closed to let a new one in at the cap.
  uint64_t evicted() const;
  // Body bytes the connections hold now, reserved against max_body_memory_bytes (tests).
  size_t body_bytes_held() const;
  // Connections with answer bytes queued and not sent yet (a graceful stop
  // waits for them: a request's end is not its answer's last byte).
  size_t writing() const;
  void Stop();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// Helpers for building responses.
Response MakeResponse(unsigned status, std::string body, const std::string& content_type,
                      unsigned version = 11);
bool IsLoopbackAddress(const std::string& host);
// What the server checks of every parsed request before its handler sees it:
// an HTTP/1.1 request needs a Host header (RFC 9112 3.2). InvalidArgument (400)
// otherwise.
Status CheckRequestHead(const Request& req);
// The host part of a Host header value: "[::1]:80" -> "[::1]", "a:80" -> "a".
std::string HostOnly(std::string_view host);

}  // namespace spillway::http
