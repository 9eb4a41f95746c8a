#include "upstream/connection_pool.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <iterator>
#include <optional>

#include "api/growing_body.h"
#include "api/http_wire.h"
#include "api/socket_read.h"
#include "upstream/request_head.h"
#include "upstream/simple_answer.h"

namespace spillway::upstream {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

struct ConnectionPool::Conn {
  // Reads of up to 16 KiB: Beast reads max(512, free capacity) bytes at a
  // time and the parser empties the buffer as it goes, so it would stay at
  // 512 (an embedding's answer took a read and a timer reset per 512 bytes).
  // Bounded: the parser takes a body out as it reads, so what stays is an
  // answer's head (8 KiB, Beast's limit) or a chunk's size line or trailer,
  // which Beast does not bound; a server sending one without end grew it
  // until the gateway ran out of memory (every request lost with it). Past
  // the bound the read fails (buffer_overflow) and the connection is dropped.
  static constexpr size_t kBufferLimit = 256 * 1024;
  explicit Conn(net::any_io_executor ex) : stream(ex), buffer(kBufferLimit) { buffer.reserve(16 * 1024); }
  beast::tcp_stream stream;
  beast::flat_buffer buffer;
  bool connected = false;
  std::chrono::steady_clock::time_point idle_since{};  // when it was given back
};

namespace {

// An interim answer (100 Continue, 102 Processing, 103 Early Hints) comes
// before the final one and is skipped: taken for the answer, it ended the
// request with no body and left the real answer on a kept connection, read
// by the next request as its own.
bool Interim(unsigned status) { return status >= 100 && status < 200 && status != 101; }

// A parser for the next answer on a connection (one per answer: an interim
// one is followed by the final one). Not boost::none for no limit: Boost
// 1.74 compares the length against an empty optional and fails.
template <class Body>
void NewReader(std::optional<bhttp::response_parser<Body>>* reader, std::uint64_t body_limit) {
  reader->emplace();
  (*reader)->body_limit(body_limit);
}

// (On the heap: only an answer SimpleAnswer leaves has one, and in the
// coroutine's frame it made every request's frame 300 bytes larger.)
template <class Body>
void NewReader(std::unique_ptr<bhttp::response_parser<Body>>* reader, std::uint64_t body_limit) {
  *reader = std::make_unique<bhttp::response_parser<Body>>();
  (*reader)->body_limit(body_limit);
}

// A kept connection is used within this or closed: servers close idle
// keep-alive connections (Spillway's workers after 75 s, http_server.h), and
// one closed meanwhile costs a failed write and read before the retry.
constexpr auto kMaxIdle = std::chrono::seconds(60);
// How often every port's list is swept of connections idle past kMaxIdle.
constexpr auto kSweepEvery = std::chrono::seconds(30);

// Moves `v`'s connections idle since before `cutoff` (its oldest, at the front) to `out`.
template <typename V>
void TakeExpired(V& v, std::chrono::steady_clock::time_point cutoff, V* out) {
  auto end = std::find_if(v.begin(), v.end(), [&](const auto& c) { return c->idle_since >= cutoff; });
  std::move(v.begin(), end, std::back_inserter(*out));
  v.erase(v.begin(), end);
}

std::string Lower(beast::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}


Status Failure(const beast::error_code& ec, const std::string& method, const std::string& target) {
  if (ec == beast::error::timeout) return Status::DeadlineExceeded(method + " " + target + ": timed out");
  return Status::Unavailable(method + " " + target + ": " + ec.message());
}

using http::AtEndOfFile;
using http::ReadDeadline;
using http::ReadSize;

// A deadline for reads of `sock`: once it passes, the read in flight is
// cancelled (it then reports a timeout: ReadDeadline::Tell).
std::shared_ptr<ReadDeadline> SocketDeadline(const net::any_io_executor& ex, tcp::socket* sock) {
  return ReadDeadline::Make(ex, [sock] {
    beast::error_code ignored;
    sock->cancel(ignored);
  });
}

// Stops a ReadDeadline when the scope ends (a coroutine's every way out).
struct DeadlineStop {
  std::shared_ptr<ReadDeadline>& d;
  ~DeadlineStop() {
    if (d) d->Stop();
  }
};

// Reads into `p` until `done(p)` from what `b` holds and what the socket
// brings: Beast's parser and its errors, by the socket's own reads rather
// than through Beast's composed operations and its stream's timer. `limit`
// bounds them (its timer cancels a read in flight; a read is not begun past
// it: beast::error::timeout). `piece`: a body's next piece (buffer_body;
// Beast's read_some): back once the parser has taken anything, need_buffer
// when the piece's buffer is full. One coroutine, no layers under it: each
// is a frame and a resumption on a request's way.
template <class Parser, class Done>
net::awaitable<void> ReadUntil(tcp::socket& sock, beast::flat_buffer& b, Parser& p, const ReadDeadline& limit,
                               beast::error_code& ec, Done done, bool piece = false) {
  for (;;) {
    if (b.size() > 0) {
      const size_t used = p.put(b.data(), ec);
      b.consume(used);
      if (piece ? ec != bhttp::error::need_more : ec ? ec != bhttp::error::need_more : done(p)) co_return;
      ec = {};
      if (used > 0 && b.size() > 0) continue;  // (the head parsed: its body next)
    }
    const size_t size = ReadSize(b);
    if (size == 0) {
      ec = bhttp::error::buffer_overflow;
      co_return;
    }
    if (limit.Passed()) {
      ec = beast::error::timeout;
      co_return;
    }
    b.commit(co_await sock.async_read_some(b.prepare(size), net::redirect_error(net::use_awaitable, ec)));
    if (ec == net::error::eof) AtEndOfFile(p, ec);
    if (ec || done(p)) co_return;  // (done: ended by the end of file)
  }
}

template <class Parser>
net::awaitable<void> ReadAnswer(tcp::socket& sock, beast::flat_buffer& b, Parser& p, const ReadDeadline& limit,
                                beast::error_code& ec) {
  return ReadUntil(sock, b, p, limit, ec, [](const Parser& q) { return q.is_done(); });
}

template <class Parser>
net::awaitable<void> ReadHead(tcp::socket& sock, beast::flat_buffer& b, Parser& p, const ReadDeadline& limit,
                              beast::error_code& ec) {
  return ReadUntil(sock, b, p, limit, ec, [](const Parser& q) { return q.is_header_done(); });
}

template <class Parser>
net::awaitable<void> ReadBodyPiece(tcp::socket& sock, beast::flat_buffer& b, Parser& p, const ReadDeadline& limit,
                                   beast::error_code& ec) {
  return ReadUntil(sock, b, p, limit, ec, [](const Parser& q) { return q.is_done(); }, true);
}

// Watches a StreamControl on the call's own executor (the request's strand,
// where the stream lives): once aborted, the stream is cancelled. `done` is
// set, on that executor, before the stream goes away.
struct AbortWatch : std::enable_shared_from_this<AbortWatch> {
  AbortWatch(const net::any_io_executor& ex, StreamControl* control) : timer(ex), control(control) {}
  net::steady_timer timer;
  StreamControl* control;
  beast::tcp_stream* stream = nullptr;
  bool done = false;
  void Arm() {
    auto at = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
    const auto deadline = control->deadline;
    if (deadline != std::chrono::steady_clock::time_point{} && !control->aborted()) at = std::min(at, deadline);
    timer.expires_at(at);
    timer.async_wait([self = shared_from_this(), deadline](const beast::error_code&) {
      if (self->done) return;
      if (deadline != std::chrono::steady_clock::time_point{} && std::chrono::steady_clock::now() >= deadline) {
        self->control->Expire();
      }
      // Cancelled again every 50 ms until the call ends: a cancel finds only
      // the operation waiting then, and one whose completion was already
      // queued (a write done, a piece of the head read) goes on to the next
      // read, which waited for the server's head for up to the idle timeout.
      if (self->control->aborted() && self->stream) self->stream->cancel();
      self->Arm();
    });
  }
  void Stop() {
    done = true;
    timer.cancel();
  }
};

}  // namespace

// Opens `c` once (a reused connection is open already).
net::awaitable<Status> ConnectionPool::Connect(Conn& c, uint16_t port, bool v6, std::chrono::milliseconds timeout) {
  if (c.connected) co_return Status::Ok();
  beast::error_code ec;
  const net::ip::address host = v6 ? net::ip::address(net::ip::address_v6::loopback())
                                   : net::ip::address(net::ip::address_v4::loopback());
  c.stream.expires_after(timeout);
  co_await c.stream.async_connect(tcp::endpoint(host, port), net::redirect_error(net::use_awaitable, ec));
  if (!ec) c.stream.socket().set_option(tcp::no_delay(true), ec);
  if (ec) {
    co_return Status::Unavailable("connect to " + std::string(v6 ? "[::1]:" : "127.0.0.1:") + std::to_string(port) + ": " +
                                  ec.message());
  }
  c.connected = true;
  co_return Status::Ok();
}

ConnectionPool::ConnectionPool(size_t max_idle_per_port) : max_idle_(max_idle_per_port) {}

ConnectionPool::~ConnectionPool() = default;

void ConnectionPool::Clear() {
  std::lock_guard<std::mutex> lk(mu_);
  idle_.clear();
}

void ConnectionPool::DropIdle(uint32_t server) {
  std::vector<std::unique_ptr<Conn>> dropped;  // (closed outside the lock)
  std::lock_guard<std::mutex> lk(mu_);
  if (auto it = idle_.find(server); it != idle_.end()) {
    dropped = std::move(it->second);
    idle_.erase(it);
  }
}

std::unique_ptr<ConnectionPool::Conn> ConnectionPool::Take(uint32_t server, const net::any_io_executor& ex, bool* reused) {
  std::unique_ptr<Conn> c;
  std::vector<std::unique_ptr<Conn>> expired;  // (declared before the lock: closed after it)
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto& v = idle_[server];
    TakeExpired(v, std::chrono::steady_clock::now() - kMaxIdle, &expired);
    // One that lives on the caller's executor already (the same client
    // connection's strand), else the most recent one.
    auto it = std::find_if(v.rbegin(), v.rend(), [&](const auto& k) { return k->stream.get_executor() == ex; });
    if (it == v.rend() && !v.empty()) it = v.rbegin();
    if (it != v.rend()) {
      c = std::move(*it);
      v.erase(std::next(it).base());
    }
  }
  *reused = c != nullptr;
  if (!c) return std::make_unique<Conn>(ex);
  if (c->stream.get_executor() == ex) return c;
  // Moved to the caller's executor: its completions and timeouts then run
  // where the caller runs (a stream's timeout fires on its own executor).
  auto moved = std::make_unique<Conn>(ex);
  beast::error_code ec;
  const auto fd = c->stream.socket().release(ec);
  if (!ec) {
    moved->stream.socket().assign(server > 0xFFFF ? tcp::v6() : tcp::v4(), fd, ec);
    if (ec) ::close(fd);
  }
  if (ec) {  // dropped: a fresh one instead
    *reused = false;
    return moved;
  }
  moved->buffer = std::move(c->buffer);
  moved->connected = true;
  return moved;
}

void ConnectionPool::Give(uint32_t server, std::unique_ptr<Conn> c) {
  // Bytes past the answer (a server that sent more than its Content-Length)
  // would be read as the next request's answer.
  if (c->buffer.size() > 0) return;
  const auto now = std::chrono::steady_clock::now();
  c->idle_since = now;
  std::vector<std::unique_ptr<Conn>> expired;  // (declared before the lock: closed after it)
  std::lock_guard<std::mutex> lk(mu_);
  auto& v = idle_[server];
  if (v.size() < max_idle_) v.push_back(std::move(c));
  if (now - last_sweep_ < kSweepEvery) return;
  last_sweep_ = now;
  for (auto it = idle_.begin(); it != idle_.end();) {
    TakeExpired(it->second, now - kMaxIdle, &expired);
    it = it->second.empty() ? idle_.erase(it) : std::next(it);
  }
}

namespace {

// The request in one gathered write: its head as Beast writes it
// (http_wire.h), then its body; at once when the socket takes it all
// (http_wire.h's SendNow: true), else the caller writes the rest (WriteRest).
bool WriteNow(beast::tcp_stream& stream, const std::string& head, const std::string& body, size_t* sent) {
  const std::array<net::const_buffer, 2> bufs = {net::buffer(head), net::buffer(body)};
  *sent = http::SendNow(stream.socket().native_handle(), bufs);
  return *sent == head.size() + body.size();
}

net::awaitable<void> WriteRest(beast::tcp_stream& stream, const std::string& head, const std::string& body, size_t sent,
                               beast::error_code& ec) {
  const std::array<net::const_buffer, 2> bufs = {net::buffer(head), net::buffer(body)};
  co_await net::async_write(stream, http::Consumed(bufs, sent), net::redirect_error(net::use_awaitable, ec));
}

}  // namespace

net::awaitable<StatusOr<http::ClientResponse>> ConnectionPool::Send(uint16_t port, std::string method,
                                                                    std::string target, std::string body,
                                                                    http::HeaderList headers,
                                                                    std::chrono::milliseconds timeout,
                                                                    std::function<void()> on_sent) {
  const uint32_t server = ServerKey(port, false);  // (a worker's: on 127.0.0.1)
  for (int round = 0; round < 2; ++round) {
    bool reused = false;
    // Again after a stale kept connection: on a fresh one (another kept one
    // is as stale). (No ?: between two class values in a coroutine: see Stream.)
    const net::any_io_executor ex = co_await net::this_coro::executor;
    std::unique_ptr<Conn> c;
    if (round == 0) {
      c = Take(server, ex, &reused);
    } else {
      c = std::make_unique<Conn>(ex);
    }
    beast::error_code ec;
    if (!c->connected) {  // (a kept one is: no coroutine to call for nothing)
      if (Status st = co_await Connect(*c, port, false, timeout); !st.ok()) co_return st;
    }
    const std::string head = RequestHead(port, method, target, body.size(), headers);
    c->stream.expires_after(timeout);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    if (size_t sent = 0; !WriteNow(c->stream, head, body, &sent)) co_await WriteRest(c->stream, head, body, sent, ec);
    // A server may answer early (413) and stop reading: a failed write is
    // followed by a read, which returns that answer when there is one.
    const bool write_failed = static_cast<bool>(ec);
    if (!write_failed && on_sent) std::exchange(on_sent, nullptr)();
    // A worker's answer in its commonest form is read by SimpleAnswer; any
    // other (a 1xx first, chunked, HTTP/1.0...) by Beast's parser, from the
    // same bytes. (A declared Content-Length is not reserved at once by
    // either: a server that says 4 GB and sends less holds what it sent.)
    SimpleAnswer simple;
    std::unique_ptr<bhttp::response_parser<http::GrowingBody>> reader;
    if (!ec || ec == net::error::broken_pipe || ec == net::error::connection_reset) {
      beast::error_code rec;
      auto limit = SocketDeadline(ex, &c->stream.socket());
      const DeadlineStop stop{limit};
      limit->Set(deadline);
      co_await ReadAnswer(c->stream.socket(), c->buffer, simple, *limit, rec);
      if (simple.fallback()) {
        rec = {};
        NewReader(&reader, SimpleAnswer::kMaxBody);
        co_await ReadAnswer(c->stream.socket(), c->buffer, *reader, *limit, rec);
        while (!rec && Interim(reader->get().result_int())) {
          NewReader(&reader, SimpleAnswer::kMaxBody);
          co_await ReadAnswer(c->stream.socket(), c->buffer, *reader, *limit, rec);
        }
      }
      limit->Tell(rec);
      if (!rec || !write_failed) ec = rec;
    }
    if (ec) {
      // A kept-alive connection the worker closed meanwhile: once more on a fresh one.
      if (reused && round == 0 && ec != beast::error::timeout) {
        DropIdle(server);
        continue;
      }
      co_return Failure(ec, method, target);
    }
    http::ClientResponse out;
    bool keep = false;
    if (reader) {
      // (The parser's keep_alive: an answer framed by the connection's end is
      // not kept, where the message's own said HTTP/1.1 keeps it.)
      keep = reader->keep_alive();
      auto res = reader->release();
      out.status = res.result_int();
      for (const auto& f : res) out.headers[Lower(f.name_string())] = std::string(f.value());
      out.body = std::move(res.body());
    } else {
      keep = simple.keep_alive();
      out = std::move(simple.answer());
    }
    if (keep && out.status != 101 && !write_failed) Give(server, std::move(c));
    co_return out;
  }
  co_return Status::Unavailable(method + " " + target + ": no connection");
}

net::awaitable<Status> ConnectionPool::Stream(uint16_t port, std::string method, std::string target, std::string body,
                                              http::HeaderList headers,
                                              std::function<bool(const http::StreamHead&)> on_head,
                                              std::function<bool(std::string_view)> on_data,
                                              std::chrono::milliseconds idle_timeout, std::function<bool()> paused,
                                              StreamControl* control) {
  std::shared_ptr<AbortWatch> watch;
  if (control) {
    watch = std::make_shared<AbortWatch>(co_await net::this_coro::executor, control);
    watch->Arm();
  }
  struct StopWatch {
    std::shared_ptr<AbortWatch>& w;
    ~StopWatch() {
      if (w) w->Stop();
    }
  } stop_watch{watch};
  auto failure = [&](const beast::error_code& ec) {
    if (control && control->expired()) return Status::DeadlineExceeded(method + " " + target + ": past its deadline");
    if (control && control->aborted()) return Status::Cancelled(method + " " + target + ": aborted");
    return Failure(ec, method, target);
  };
  const bool v6 = control && control->ipv6;
  const uint32_t server = ServerKey(port, v6);
  for (int round = 0; round < 2; ++round) {
    bool reused = false;
    // (No ?: between two class values here: GCC 12 destroys such a temporary
    // twice in a coroutine; see gateway_internal.h.)
    const net::any_io_executor ex = co_await net::this_coro::executor;
    std::unique_ptr<Conn> c;
    if ((control && control->fresh_connection) || round > 0) {  // (round 1: after a stale kept one, as Send)
      c = std::make_unique<Conn>(ex);
    } else {
      c = Take(server, ex, &reused);
    }
    if (watch) watch->stream = &c->stream;
    struct Unwatch {
      std::shared_ptr<AbortWatch>& w;
      ~Unwatch() {
        if (w) w->stream = nullptr;
      }
    } unwatch{watch};
    beast::error_code ec;
    // (`sent` stays as round 0 left it: a request written whole on a kept
    // connection that then closed may have been read, and crashed its
    // server; counted as reached, it counts toward the three sends.)
    if (control) control->connected = false;
    if (Status st = co_await Connect(*c, port, v6, std::chrono::seconds(10)); !st.ok()) co_return st;
    if (control) control->connected = !reused;  // (a kept one may be stale: known once it answers)
    if (control && control->aborted()) co_return failure(net::error::operation_aborted);
    const std::string request_head = RequestHead(port, method, target, body.size(), headers, v6);
    c->stream.expires_after(idle_timeout);
    if (size_t sent = 0; !WriteNow(c->stream, request_head, body, &sent)) {
      co_await WriteRest(c->stream, request_head, body, sent, ec);
    }
    auto limit = SocketDeadline(ex, &c->stream.socket());
    const DeadlineStop stop{limit};
    if (!ec && control) control->sent = true;
    std::optional<bhttp::response_parser<bhttp::buffer_body>> reader;
    NewReader(&reader, std::uint64_t{1} << 40);
    // A server may answer early (413) and stop reading: a failed write is
    // followed by a read, which returns that answer when there is one (as Send does).
    const bool write_failed = static_cast<bool>(ec);
    if (!ec || ec == net::error::broken_pipe || ec == net::error::connection_reset) {
      beast::error_code rec;
      limit->Set(std::chrono::steady_clock::now() + idle_timeout);
      co_await ReadHead(c->stream.socket(), c->buffer, *reader, *limit, rec);
      while (!rec && Interim(reader->get().result_int())) {
        NewReader(&reader, std::uint64_t{1} << 40);
        co_await ReadHead(c->stream.socket(), c->buffer, *reader, *limit, rec);
      }
      limit->Tell(rec);
      if (!rec || !write_failed) ec = rec;
    }
    auto& parser = *reader;
    if (!ec && control) control->connected = true;
    if (ec) {
      const bool aborted = control && control->aborted();
      if (reused && round == 0 && ec != beast::error::timeout && !aborted) {  // closed while idle: once more
        DropIdle(server);
        continue;
      }
      co_return failure(ec);
    }
    http::StreamHead head;
    head.status = parser.get().result_int();
    for (const auto& f : parser.get()) head.headers[Lower(f.name_string())] = std::string(f.value());
    if (!on_head(head)) co_return Status::Ok();  // the connection is dropped mid-answer
    std::vector<char> chunk(16384);
    std::optional<net::steady_timer> pause_timer;
    while (!parser.is_done()) {
      while (paused && paused() && !(control && control->aborted())) {
        if (!pause_timer) pause_timer.emplace(co_await net::this_coro::executor);
        pause_timer->expires_after(std::chrono::milliseconds(10));
        beast::error_code tec;
        co_await pause_timer->async_wait(net::redirect_error(net::use_awaitable, tec));
      }
      // (Stopped while paused: the watch found no read to cancel.)
      if (control && control->aborted()) co_return failure(net::error::operation_aborted);
      parser.get().body().data = chunk.data();
      parser.get().body().size = chunk.size();
      limit->Set(std::chrono::steady_clock::now() + idle_timeout);
      co_await ReadBodyPiece(c->stream.socket(), c->buffer, parser, *limit, ec);
      limit->Tell(ec);
      if (ec == bhttp::error::need_buffer) ec = {};
      if (ec) co_return failure(ec);
      const size_t n = chunk.size() - parser.get().body().size;
      if (n > 0 && !on_data(std::string_view(chunk.data(), n))) co_return Status::Ok();
    }
    // (A fresh connection's request never takes a kept one: it is closed, not kept idle for nobody.)
    // (Nor one that switched protocols: the next request's answer would not be HTTP.)
    if (parser.keep_alive() && parser.get().result_int() != 101 && !write_failed &&
        !(control && (control->aborted() || control->fresh_connection))) {
      limit->Stop();  // (before another request may take the connection)
      Give(server, std::move(c));
    }
    co_return Status::Ok();
  }
  co_return Status::Unavailable(method + " " + target + ": no connection");
}

}  // namespace spillway::upstream
