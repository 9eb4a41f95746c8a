#include "api/http_server.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>

#include <array>
#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>

namespace spillway::http {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

Response MakeResponse(unsigned status, std::string body, const std::string& content_type,
                      unsigned version) {
  Response res{static_cast<bhttp::status>(status), version};
  res.set(bhttp::field::server, "spillway");
  res.set(bhttp::field::content_type, content_type);
  res.body() = std::move(body);
  res.prepare_payload();
  return res;
}

bool IsLoopbackAddress(const std::string& host) {
  boost::system::error_code ec;
  auto addr = net::ip::make_address(host, ec);
  return !ec && addr.is_loopback();
}

namespace {

class Session;

class ExchangeImpl final : public Exchange {
 public:
  explicit ExchangeImpl(std::shared_ptr<Session> s) : session_(std::move(s)) {}
  ~ExchangeImpl() override;
  void Respond(Response res) override;
  void StartStream(Response header) override;
  void Write(std::string data) override;
  void End() override;
  void OnDisconnect(std::function<void()> cb) override;
  bool disconnected() const override { return disconnected_.load(); }

  std::atomic<bool> disconnected_{false};
  std::atomic<bool> finished_{false};

 private:
  std::shared_ptr<Session> session_;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket&& socket, const ServerOptions& opts, const Handler& handler)
      : stream_(std::move(socket)), opts_(opts), handler_(handler) {}

  void Start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->DoRead(); });
  }

  // --- called on the strand only ---
  struct Item {
    std::shared_ptr<Response> res;  // a whole response, or
    std::string raw;                // raw bytes (stream header, chunks)
    bool last = false;              // completes the exchange
  };

  void Enqueue(Item item) {
    if (closed_ || exchange_done_) return;
    if (item.last) exchange_done_ = true;
    queue_.push_back(std::move(item));
    if (!writing_) DoWrite();
  }

  void SetDisconnectCallback(std::function<void()> cb) {
    if (peer_gone_) {
      if (cb) cb();
      return;
    }
    on_disconnect_ = std::move(cb);
  }

  void ExchangeDropped() {
    if (!exchange_done_ && !closed_) {
      auto res = MakeResponse(500, R"({"error":{"message":"no response","type":"server_error","code":"internal"}})",
                              "application/json", version_);
      Enqueue({std::make_shared<Response>(std::move(res)), {}, true});
    }
  }

  net::any_io_executor executor() { return stream_.get_executor(); }
  std::weak_ptr<ExchangeImpl> current_;

 private:
  void DoRead() {
    parser_.emplace();
    parser_->body_limit(opts_.max_body_bytes);
    parser_->header_limit(static_cast<std::uint32_t>(opts_.max_header_bytes));
    stream_.expires_after(first_request_ ? opts_.read_timeout : opts_.idle_timeout);
    first_request_ = false;
    bhttp::async_read(stream_, buffer_, *parser_,
                      [self = shared_from_this()](beast::error_code ec, std::size_t) { self->OnRead(ec); });
  }

  void OnRead(beast::error_code ec) {
    if (ec == bhttp::error::body_limit) return RejectAndClose(413, "request body too large");
    if (ec == bhttp::error::header_limit) return RejectAndClose(431, "request header too large");
    if (ec) {
      // EOF between requests, timeouts and resets end the connection quietly;
      // a malformed request gets a 400 first.
      if (ec.category() == bhttp::make_error_code(bhttp::error::bad_method).category() &&
          ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message) {
        return RejectAndClose(400, "malformed HTTP request: " + ec.message());
      }
      return Close();
    }
    stream_.expires_never();
    Request req = parser_->release();
    version_ = req.version();
    keep_alive_ = req.keep_alive();
    exchange_done_ = false;
    peer_gone_ = false;
    on_disconnect_ = nullptr;
    ++exchange_gen_;
    auto ex = std::make_shared<ExchangeImpl>(shared_from_this());
    current_ = ex;
    WatchPeer();
    handler_(std::move(req), std::move(ex));
  }

  // While a request is being handled, keep a read outstanding: end-of-file or
  // an error means the peer closed the connection. Bytes that do arrive (a
  // pipelined request) are kept for the next parse. (A readiness wait plus
  // available() == 0 is not enough: readiness can be reported spuriously.)
  void WatchPeer() {
    const uint64_t gen = exchange_gen_;
    peek_outstanding_ = true;
    stream_.socket().async_read_some(
        net::buffer(peek_), net::bind_executor(stream_.get_executor(),
        [self = shared_from_this(), gen](beast::error_code ec, std::size_t n) {
          self->peek_outstanding_ = false;
          if (n > 0) {
            auto dst = self->buffer_.prepare(n);
            std::memcpy(dst.data(), self->peek_.data(), n);
            self->buffer_.commit(n);
          }
          if (gen != self->exchange_gen_) return self->AfterExchange();  // the answer went out meanwhile
          if (ec == net::error::operation_aborted) return;
          if (ec) return self->PeerGone();
          if (!self->exchange_done_) self->WatchPeer();
        }));
  }

  // The exchange's last byte is written and no peek read is outstanding:
  // read the next request or close.
  void AfterExchange() {
    if (!next_pending_) return;
    next_pending_ = false;
    if (keep_alive_ && !peer_gone_ && !closed_) return DoRead();
    LingeringClose();
  }

  void PeerGone() {
    if (peer_gone_) return;
    peer_gone_ = true;
    if (auto ex = current_.lock()) ex->disconnected_ = true;
    auto cb = std::move(on_disconnect_);
    on_disconnect_ = nullptr;
    if (cb) cb();
  }

  void DoWrite() {
    if (queue_.empty()) {
      writing_ = false;
      return;
    }
    writing_ = true;
    stream_.expires_after(opts_.write_timeout);
    auto& item = queue_.front();
    auto done = [self = shared_from_this()](beast::error_code ec, std::size_t) { self->OnWrite(ec); };
    if (item.res) {
      bhttp::async_write(stream_, *item.res, std::move(done));
    } else {
      net::async_write(stream_, net::buffer(item.raw), std::move(done));
    }
  }

  void OnWrite(beast::error_code ec) {
    stream_.expires_never();
    if (ec) {
      queue_.clear();
      writing_ = false;
      PeerGone();
      return Close();
    }
    const bool last = queue_.front().last;
    queue_.pop_front();
    if (last) {
      writing_ = false;
      queue_.clear();
      ++exchange_gen_;  // retires the peer watch
      next_pending_ = true;
      if (peek_outstanding_) {
        // Its handler runs (aborted, or with pipelined bytes it keeps) and
        // then continues; the next read must not start before it.
        beast::error_code cec;
        stream_.socket().cancel(cec);
        return;
      }
      return AfterExchange();
    }
    DoWrite();
  }

  // Closes the sending side, then reads and discards what the peer still
  // sends (for a short while) so that an early answer such as 413 is not
  // destroyed by a reset while the client is still writing its body.
  void LingeringClose() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return Close();
    stream_.expires_after(std::chrono::seconds(2));
    Drain();
  }

  void Drain() {
    stream_.async_read_some(net::buffer(discard_), [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) return self->Close();
      self->Drain();
    });
  }

  void RejectAndClose(unsigned status, const std::string& msg) {
    keep_alive_ = false;
    exchange_done_ = false;
    std::string body = R"({"error":{"message":")" + msg + R"(","type":"invalid_request_error","code":")" +
                       (status == 413 ? "body_too_large" : "bad_request") + R"("}})";
    auto res = MakeResponse(status, std::move(body), "application/json");
    res.keep_alive(false);
    Enqueue({std::make_shared<Response>(std::move(res)), {}, true});
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
  }

  beast::tcp_stream stream_;
  const ServerOptions opts_;
  const Handler handler_;
  beast::flat_buffer buffer_;
  std::array<char, 16384> discard_;
  std::array<char, 4096> peek_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::deque<Item> queue_;
  std::function<void()> on_disconnect_;
  uint64_t exchange_gen_ = 0;
  unsigned version_ = 11;
  bool first_request_ = true;
  bool keep_alive_ = true;
  bool writing_ = false;
  bool exchange_done_ = true;
  bool peer_gone_ = false;
  bool closed_ = false;
  bool peek_outstanding_ = false;
  bool next_pending_ = false;
};

std::string ChunkFrame(const std::string& data) {
  char head[24];
  int n = std::snprintf(head, sizeof head, "%zx\r\n", data.size());
  std::string out;
  out.reserve(n + data.size() + 2);
  out.append(head, n).append(data).append("\r\n");
  return out;
}

ExchangeImpl::~ExchangeImpl() {
  if (finished_) return;
  auto s = session_;
  net::post(s->executor(), [s] { s->ExchangeDropped(); });
}

void ExchangeImpl::Respond(Response res) {
  if (finished_.exchange(true)) return;
  auto s = session_;
  auto r = std::make_shared<Response>(std::move(res));
  net::post(s->executor(), [s, r] { s->Enqueue({r, {}, true}); });
}

void ExchangeImpl::StartStream(Response header) {
  header.chunked(true);
  header.body().clear();
  std::string raw;
  raw.reserve(256);
  raw += "HTTP/1.1 " + std::to_string(header.result_int()) + " " + std::string(header.reason()) + "\r\n";
  for (const auto& f : header) {
    raw.append(f.name_string().data(), f.name_string().size()).append(": ");
    raw.append(f.value().data(), f.value().size()).append("\r\n");
  }
  raw += "\r\n";
  auto s = session_;
  net::post(s->executor(), [s, raw = std::move(raw)]() mutable { s->Enqueue({nullptr, std::move(raw), false}); });
}

void ExchangeImpl::Write(std::string data) {
  if (finished_ || data.empty()) return;
  auto s = session_;
  net::post(s->executor(), [s, raw = ChunkFrame(data)]() mutable { s->Enqueue({nullptr, std::move(raw), false}); });
}

void ExchangeImpl::End() {
  if (finished_.exchange(true)) return;
  auto s = session_;
  net::post(s->executor(), [s] { s->Enqueue({nullptr, "0\r\n\r\n", true}); });
}

void ExchangeImpl::OnDisconnect(std::function<void()> cb) {
  auto s = session_;
  net::post(s->executor(), [s, cb = std::move(cb)]() mutable { s->SetDisconnectCallback(std::move(cb)); });
}

}  // namespace

struct Server::Impl : std::enable_shared_from_this<Server::Impl> {
  Impl(net::io_context& ioc, ServerOptions o, Handler h)
      : ioc(ioc), acceptor(net::make_strand(ioc)), opts(std::move(o)), handler(std::move(h)) {}

  void DoAccept() {
    acceptor.async_accept(net::make_strand(ioc), [self = shared_from_this()](beast::error_code ec, tcp::socket s) {
      if (ec == net::error::operation_aborted || !self->acceptor.is_open()) return;
      if (!ec) {
        s.set_option(tcp::no_delay(true), ec);
        std::make_shared<Session>(std::move(s), self->opts, self->handler)->Start();
      }
      self->DoAccept();
    });
  }

  net::io_context& ioc;
  tcp::acceptor acceptor;
  ServerOptions opts;
  Handler handler;
};

Server::Server(net::io_context& ioc, ServerOptions opts, Handler handler)
    : impl_(std::make_shared<Impl>(ioc, std::move(opts), std::move(handler))) {}

Server::~Server() { Stop(); }

Status Server::Listen(const std::string& host, uint16_t port) {
  beast::error_code ec;
  auto addr = net::ip::make_address(host, ec);
  if (ec) return Status::InvalidArgument("not a numeric address: '" + host + "'");
  tcp::endpoint ep{addr, port};
  auto& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return Status::Unavailable("cannot listen on " + host + ":" + std::to_string(port) + ": " + ec.message());
  impl_->DoAccept();
  return Status::Ok();
}

uint16_t Server::port() const {
  beast::error_code ec;
  auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

void Server::Stop() {
  auto impl = impl_;
  net::dispatch(impl->acceptor.get_executor(), [impl] {
    beast::error_code ec;
    impl->acceptor.close(ec);
  });
}

}  // namespace spillway::http
