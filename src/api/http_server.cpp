#include "api/http_server.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>

#include <boost/asio/steady_timer.hpp>

#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <list>
#include <mutex>
#include <optional>

#include "api/growing_body.h"
#include "api/http_wire.h"
#include "api/ollama_request.h"
#include "api/socket_read.h"
#include "common/survive.h"

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

Status CheckRequestHead(const Request& req) {
  // The Host allow-lists (gateway, workers) rely on it being there.
  if (req.version() >= 11 && req.find(bhttp::field::host) == req.end()) {
    return Status::InvalidArgument("HTTP/1.1 requests need a Host header");
  }
  // RFC 9112 3.2: more than one Host is a 400 (which one the allow-lists
  // judged, and which one a proxy in front routed by, could differ).
  if (req.count(bhttp::field::host) > 1) return Status::InvalidArgument("a request has one Host header, not several");
  return Status::Ok();
}

std::string HostOnly(std::string_view host) {
  if (!host.empty() && host.front() == '[') {
    auto end = host.find(']');
    return std::string(host.substr(0, end == std::string_view::npos ? host.size() : end + 1));
  }
  return std::string(host.substr(0, host.find(':')));
}

size_t ConnectionCap(size_t wanted, size_t reserve) {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return wanted;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max == RLIM_INFINITY ? std::max<rlim_t>(rl.rlim_cur, 1 << 16) : rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
  }
  if (rl.rlim_cur == RLIM_INFINITY) return wanted;
  const size_t soft = static_cast<size_t>(rl.rlim_cur);
  const size_t room = soft > reserve + 8 ? soft - reserve : 8;
  return std::min(wanted, room);
}

void RunLogged(net::io_context& ioc, const char* who) {
  const std::string what = std::string(who) + ": an I/O thread";
  while (!RunSurviving(what.c_str(), [&] { ioc.run(); })) {
  }
}

namespace {

class Session;

std::string PeerOf(const tcp::socket& s) {
  beast::error_code ec;
  const auto ep = s.remote_endpoint(ec);
  if (ec) return {};
  const auto a = ep.address();
  // An IPv4 peer of a dual-stack socket is one address whichever way it came.
  return a.is_v6() && a.to_v6().is_v4_mapped() ? net::ip::make_address_v4(net::ip::v4_mapped, a.to_v6()).to_string()
                                                : a.to_string();
}

// A connection's read buffer (see Session's constructor).
constexpr size_t kReadBufferBytes = 8 * 1024;
constexpr size_t kMaxReadBytes = 64 * 1024;  // what Beast reads at most at once
constexpr size_t kPeekBytes = 4096;            // what the peer watch reads at once (Session::WatchPeer)
constexpr size_t kDrainBytes = 16 * 1024;      // what a lingering close reads (and drops) at once
constexpr size_t kJoinBytes = 64 * 1024;       // a queued piece of a stream joins events up to this (Session::Enqueue; its string's capacity up to twice that)

// What all connections of one server share: how many are open, how many
// body bytes they hold, which wait idle for their next request.
struct Shared {
  explicit Shared(const ServerOptions& o) : opts(o) {}
  // Keep-alive connections waiting for their next request, the longest idle
  // first. At the connection cap a new connection takes the place of the
  // front one (nginx closes idle keep-alive connections the same way when
  // it runs out of connections): clients that keep pools of idle
  // connections (browsers, SDKs) would otherwise hold the cap and every new
  // client would get 503 for the idle timeout.
  using IdleList = std::list<std::weak_ptr<Session>>;
  std::mutex idle_mu;
  IdleList idle;  // guarded by idle_mu, as each Session's idle_it_
  // The longest-idle connection, taken off the list; null when none waits.
  std::shared_ptr<Session> TakeIdle();
  bool TakeBody(size_t n) {
    size_t cur = body_bytes.load();
    do {
      if (cur + n > opts.max_body_memory_bytes && cur > 0) return false;
    } while (!body_bytes.compare_exchange_weak(cur, cur + n));
    return true;
  }
  void GiveBody(size_t n) { body_bytes.fetch_sub(n); }
  const ServerOptions opts;
  std::atomic<size_t> connections{0};
  std::atomic<uint64_t> accepted{0};
  std::atomic<size_t> body_bytes{0};
  std::atomic<uint64_t> evicted{0};
  std::atomic<size_t> writing{0};  // connections with answer bytes queued and not sent yet (Session::SetWriting)
};

class ExchangeImpl final : public Exchange {
 public:
  // `version`: the request's (HTTP/1.0 gets an unframed stream that ends
  // with the connection: it has no chunked encoding).
  // `gen`: the session's exchange it is (Session::exchange_gen_ when it began).
  ExchangeImpl(std::shared_ptr<Session> s, unsigned version, uint64_t gen, bool head_checked)
      : session_(std::move(s)), http10_(version < 11), gen_(gen), head_checked_(head_checked) {}
  ~ExchangeImpl() override;
  void Respond(Response res) override;
  void StartStream(Response header) override;
  void Write(std::string data) override;
  void End() override;
  void Abort() override;
  void OnDisconnect(std::function<void()> cb) override;
  bool disconnected() const override { return disconnected_.load(); }
  size_t unsent_bytes() const override { return static_cast<size_t>(std::max<int64_t>(0, unsent_->load())); }
  net::any_io_executor executor() const override;
  std::string peer_address() const override;
  bool head_checked() const override { return head_checked_; }

  std::atomic<bool> disconnected_{false};
  // Shared with the session's queue items, which count down as they are sent.
  std::shared_ptr<std::atomic<int64_t>> unsent_ = std::make_shared<std::atomic<int64_t>>(0);
  std::atomic<bool> finished_{false};

 private:
  std::shared_ptr<Session> session_;
  const bool http10_;
  const uint64_t gen_;
  const bool head_checked_;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket&& socket, std::shared_ptr<Shared> shared, const Handler& handler)
      : stream_(std::move(socket)),
        peer_(PeerOf(stream_.socket())),
        probe_timer_(stream_.get_executor()),
        shared_(std::move(shared)),
        opts_(shared_->opts),
        handler_(handler),
        // Bounded: Beast's header limit covers the head only, and a chunk-size
        // line or a trailer that never ends would grow the buffer with every
        // byte (past the bound Beast reports buffer_overflow: a 400). It holds
        // a head, a peek's bytes and one read.
        buffer_(opts_.max_header_bytes + kPeekBytes + kMaxReadBytes) {
    // Beast reads max(512, free capacity) bytes at a time, and a parser that
    // takes each body chunk out of the buffer keeps it from growing: without
    // this a 20 KB body took 40 reads, each with its own timer reset.
    buffer_.reserve(kReadBufferBytes);
    shared_->connections.fetch_add(1);
    shared_->accepted.fetch_add(1);
  }
  ~Session() {
    SetWriting(false);
    ReleaseBody();
    if (head_deadline_) head_deadline_->Stop();  // (its timer's wait ends with the session, as a member's did)
    if (waiting_idle_) Unlist();
    shared_->connections.fetch_sub(1);
  }

  void Start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->DoRead(); });
  }

  // --- called on the strand only ---
  struct Item {
    std::shared_ptr<Response> res;  // a whole response, or
    std::string raw;                // raw bytes (stream header, chunks)
    std::string head;               // res's start line and fields while it is written (WireHead)
    bool last = false;              // completes the exchange
    bool head_only = false;         // res answers a HEAD request: its head goes, not its body
    std::shared_ptr<std::atomic<int64_t>> unsent = nullptr;  // counted down once sent (or dropped)
    ~Item() {
      if (unsent) *unsent -= static_cast<int64_t>(raw.size());
    }
    Item(std::shared_ptr<Response> r, std::string w, bool l, std::shared_ptr<std::atomic<int64_t>> u = nullptr)
        : res(std::move(r)), raw(std::move(w)), last(l), unsent(std::move(u)) {}
    Item(Item&& o) noexcept
        : res(std::move(o.res)),
          raw(std::move(o.raw)),
          head(std::move(o.head)),
          last(o.last),
          head_only(o.head_only),
          unsent(std::move(o.unsent)) {
      o.unsent = nullptr;
    }
    Item& operator=(Item&&) = delete;
  };

  void Enqueue(Item item) {
    if (closed_ || exchange_done_) return;
    bool head_of_stream = false;
    if (head_method_) {
      // A HEAD request's answer is its head alone (RFC 9110 9.3.2): a whole
      // response without its body; a stream's head, and the stream ends
      // there with the connection (its events would never come to an end).
      if (item.res) {
        item.head_only = true;
      } else {
        if (answer_started_) return;
        item.last = true;
        keep_alive_ = false;
        head_of_stream = true;
        // Said in its head: a client that reused the connection (a monitor's
        // next HEAD, a pipelined POST) found it shut.
        if (version_ >= 11 && item.raw.size() >= 2) item.raw.insert(item.raw.size() - 2, "Connection: close\r\n");
      }
    }
    // An HTTP/1.0 client keeps its connection only when the answer says so
    // (RFC 9112 9.3, RFC 2068 19.7.1): kept open unsaid, it read until the
    // end of a connection that stayed open for idle_timeout.
    if (item.res && version_ < 11) item.res->set(bhttp::field::connection, keep_alive_ ? "keep-alive" : "close");
    if (item.last) exchange_done_ = true;
    answer_started_ = true;
    // A stream's piece joins the one queued before it (not the one being
    // written): to a slow reader thousands of small events wait, and each
    // as its own item held its own allocations and took its own write.
    if (!item.res && !item.last && queue_.size() >= 2) {
      Item& back = queue_.back();
      if (!back.res && !back.last && back.unsent == item.unsent && back.raw.size() + item.raw.size() <= kJoinBytes) {
        back.raw += item.raw;
        item.raw.clear();  // (counted as unsent in back now)
        return;
      }
    }
    queue_.push_back(std::move(item));
    if (!writing_) DoWrite();
    // Its writer hears that nobody reads the stream any more: one that
    // waits for that (an event feed, a generation) lets the exchange, and
    // with it the connection's place, go.
    if (head_of_stream) PeerGone();
  }

  // The connection closes once this exchange's answer is out (an HTTP/1.0
  // stream's end is the connection's).
  void CloseAfterExchange() { keep_alive_ = false; }

  // From exchange `gen`: ignored once that exchange is over (a late call of a
  // finished one took the callback of the connection's next exchange).
  void SetDisconnectCallback(std::function<void()> cb, uint64_t gen) {
    if (gen != exchange_gen_) return;
    if (peer_gone_) {
      if (cb) cb();
      return;
    }
    on_disconnect_ = std::move(cb);
  }

  void ExchangeDropped() {
    if (exchange_done_ || closed_) return;
    if (answer_started_) {  // a stream begun: it ends as cut (a 500 would land inside its body)
      CloseAfterExchange();
      return Enqueue({nullptr, std::string(), true});
    }
    auto res = MakeResponse(500, R"({"error":{"message":"no response","type":"server_error","code":"internal"}})",
                            "application/json", version_);
    Enqueue({std::make_shared<Response>(std::move(res)), {}, true});
  }

  net::any_io_executor executor() { return stream_.get_executor(); }
  const std::string& peer() const { return peer_; }
  std::weak_ptr<ExchangeImpl> current_;

  // Taken off the idle list for a new connection (Shared::TakeIdle): closes
  // (true) unless a request began to arrive meanwhile.
  bool EvictIfIdle() {
    if (!waiting_idle_ || buffer_.size() > 0 || closed_) return false;
    // Bytes of a request in the socket, not read yet (sent as the eviction
    // was decided): closed now, its sender would get a reset for a request
    // it had sent, and a POST is not sent again by most clients.
    beast::error_code ec;
    if (stream_.socket().available(ec) > 0 && !ec) return false;
    shared_->evicted.fetch_add(1);
    Close();
    return true;
  }

  // Where this session stands in Shared::idle; guarded by Shared::idle_mu.
  std::optional<Shared::IdleList::iterator> idle_it_;

 private:
  // Reads the header first: the body's bytes are reserved against the
  // server's body budget before any of them is read.
  void DoRead() {
    head_method_ = false;  // (until a HEAD request is read)
    parser_.emplace();
    parser_->body_limit(opts_.max_body_bytes);
    parser_->get().body().cap = opts_.max_body_bytes;  // a chunked body's string grows no further
    parser_->header_limit(static_cast<std::uint32_t>(opts_.max_header_bytes));
    // A kept-alive connection waits idle_timeout for its next request, unless
    // bytes of it are here already (pipelined): then its head is being read.
    HeadDeadline(first_request_ || buffer_.size() > 0 ? opts_.read_timeout : opts_.idle_timeout);
    // Idle: answered before and nothing of the next request here yet.
    if (!first_request_ && buffer_.size() == 0) {
      waiting_idle_ = true;
      std::lock_guard lk(shared_->idle_mu);
      idle_it_ = shared_->idle.insert(shared_->idle.end(), weak_from_this());
    }
    first_request_ = false;
    reading_head_ = true;
    // A pipelined request's head, here already, is parsed in a handler of its
    // own: answered at once, each would read the next one inside the last
    // one's answer, a stack frame deeper each time.
    if (buffer_.size() > 0) return net::post(stream_.get_executor(), [self = shared_from_this()] { self->ParseHead(); });
    ParseHead();
  }

  // The head is parsed from what the buffer holds (a pipelined request's
  // bytes, or what the last read brought) and read by the socket's own
  // reads until it is whole (socket_read.h): what Beast's composed read
  // does, without its layers of operations and its timer armed around every
  // read (the head's deadline is HeadDeadline's). The parser is Beast's, and
  // its errors are what they were.
  void ParseHead() {
    if (buffer_.size() > 0) {
      beast::error_code ec;
      buffer_.consume(parser_->put(buffer_.data(), ec));
      if (ec ? ec != bhttp::error::need_more : parser_->is_header_done()) return OnHeader(ec);
    }
    const size_t size = ReadSize(buffer_, kMaxReadBytes);
    if (size == 0) return OnHeader(bhttp::error::buffer_overflow);
    stream_.socket().async_read_some(buffer_.prepare(size), [self = shared_from_this()](beast::error_code ec, std::size_t n) {
      self->buffer_.commit(n);
      if (ec == net::error::eof) {
        // Within a head: cut short (a 400's quiet close); between requests: the peer is done.
        AtEndOfFile(*self->parser_, ec);
        return self->OnHeader(ec ? ec : bhttp::error::partial_message);  // (a head is never framed by the end)
      }
      if (ec) return self->OnHeader(ec);
      self->ParseHead();
    });
  }

  // The head's read timeout (socket_read.h's ReadDeadline, one a
  // connection): a request's read moves it, not its timer. Past it, while a
  // head is still being read, the connection closes (its read ends, aborted).
  void HeadDeadline(std::chrono::seconds within) {
    if (!head_deadline_) {
      head_deadline_ = ReadDeadline::Make(stream_.get_executor(), [weak = weak_from_this()] {
        if (const auto self = weak.lock(); self && self->reading_head_) self->Close();
      });
    }
    head_deadline_->Set(std::chrono::steady_clock::now() + within);
  }

  void OnHeader(beast::error_code ec) {
    reading_head_ = false;
    if (waiting_idle_) {
      waiting_idle_ = false;
      Unlist();
    }
    // Closed meanwhile (its deadline passed as the head's last bytes came in
    // a read already done): nobody would hear its answer.
    if (closed_) return;
    if (ec) return OnRead(ec);
    stream_.expires_after(opts_.read_timeout);
    // A body is reserved as it arrives, a step ahead (its string grows as it
    // comes): reserving the declared length, or for a chunked body the
    // largest allowed, let a few peers that trickle hold the whole budget.
    // A body coded otherwise than chunked (gzip, or gzip then chunked) is not
    // read as if it were plain: its bytes would be taken for the next request
    // (RFC 9112 6.1: 501, and the connection closes).
    const auto& head = parser_->get();
    if (auto te = head.find(bhttp::field::transfer_encoding); te != head.end()) {
      std::string_view coding(te->value().data(), te->value().size());
      while (!coding.empty() && (coding.front() == ' ' || coding.front() == '\t')) coding.remove_prefix(1);
      while (!coding.empty() && (coding.back() == ' ' || coding.back() == '\t')) coding.remove_suffix(1);
      if (!beast::iequals(beast::string_view(coding.data(), coding.size()), "chunked") || head.count(bhttp::field::transfer_encoding) > 1) {
        return RejectAndClose(501, "only Transfer-Encoding: chunked is supported", "not_implemented");
      }
    }
    head_fields_ = static_cast<size_t>(std::distance(head.begin(), head.end()));
    const auto length = parser_->content_length();
    head_checked_ = false;
    if (opts_.check_head && ((length && *length > 0) || parser_->chunked())) {
      if (auto refusal = opts_.check_head(parser_->get())) return RefuseAndClose(std::move(*refusal));
      head_checked_ = true;
    }
    if (length && *length > opts_.max_body_bytes) return RejectAndClose(413, "request body too large", "body_too_large");
    if (!ReserveBody(length || parser_->chunked() ? std::min(BodyCap(), BodyStep()) : 0)) return RejectBusy();
    if (parser_->is_done()) return OnRead({});
    // A client that waits for leave to send its body (curl for large ones)
    // gets it now, the body's budget taken, instead of waiting out its own
    // timeout (a second for curl) before sending anyway.
    if (auto e = parser_->get().find(bhttp::field::expect); parser_->get().version() >= 11 &&
        e != parser_->get().end() && beast::iequals(e->value(), "100-continue") && buffer_.size() == 0) {
      // Sent at once, outside the write queue (whose timer would replace the
      // body's read timeout): 25 bytes a fresh connection's socket always
      // takes. One that does not: the client sends after its own wait.
      static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      const ssize_t sent = ::send(stream_.socket().native_handle(), kContinue.data(), kContinue.size(),
                                  MSG_DONTWAIT | MSG_NOSIGNAL);
      if (sent > 0 && static_cast<size_t>(sent) < kContinue.size()) return Close();  // half a line: unusable
    }
    if (parser_->chunked() || *length > BodyStep()) return ReadInSteps();
    // A body that came whole with its head (a small request's, as a rule) is
    // parsed from the buffer at once: an asynchronous read that needs no I/O
    // completes through rounds of the loop (Beast posts its completions, and
    // each round is an epoll_wait), two of them on every such request's way.
    if (buffer_.size() >= *length) {
      beast::error_code pec;
      buffer_.consume(parser_->put(buffer_.data(), pec));
      if (pec || parser_->is_done()) return OnRead(pec);
    }
    bhttp::async_read(stream_, buffer_, *parser_,  // all of it reserved
                      [self = shared_from_this()](beast::error_code ec, std::size_t) { self->OnRead(ec); });
  }

  // A body longer than a step, read by parts: its reservation grows with it
  // (the memory its string holds, or what has come plus a step, never more
  // than it may take, whichever is more).
  void ReadInSteps() {
    bhttp::async_read_some(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec || self->parser_->is_done()) return self->OnRead(ec);
      const std::string& body = self->parser_->get().body();
      const size_t ahead = std::min(self->BodyCap(), body.size() + self->BodyStep());
      if (!self->ReserveBody(std::max(body.capacity(), ahead))) {
        return self->RejectBusy();
      }
      self->ReadInSteps();
    });
  }

  size_t BodyStep() const { return std::clamp<size_t>(opts_.max_body_bytes / 16, 1, 64 << 10); }
  // The most the body being read may take: its declared length, or the limit.
  size_t BodyCap() const {
    const auto length = parser_->content_length();
    return length ? static_cast<size_t>(*length) : opts_.max_body_bytes;
  }

  // Holds `want` body bytes in all against the server's budget (what it
  // holds already counts); false when the budget has no room.
  bool ReserveBody(size_t want) {
    if (want <= reserved_) return true;
    if (!shared_->TakeBody(want - reserved_)) return false;
    reserved_ = want;
    return true;
  }

  void Unlist() {
    std::lock_guard lk(shared_->idle_mu);
    if (!idle_it_) return;  // taken by TakeIdle
    shared_->idle.erase(*idle_it_);
    idle_it_.reset();
  }

  void RejectBusy() {
    RejectAndClose(503, "the server holds too many request bodies at once; retry shortly", "server_busy", 1);
  }

  void ReleaseBody() {
    if (reserved_ == 0) return;
    shared_->GiveBody(reserved_);
    reserved_ = 0;
  }

  void OnRead(beast::error_code ec) {
    if (ec == bhttp::error::body_limit) return RejectAndClose(413, "request body too large", "body_too_large");
    if (ec == bhttp::error::header_limit) return RejectAndClose(431, "request header too large");
    if (ec == bhttp::error::buffer_overflow) {
      return RejectAndClose(400, "malformed HTTP request: a chunk-size line or trailer longer than " +
                                     std::to_string(buffer_.max_size()) + " bytes");
    }
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
    answer_started_ = false;
    auto parsed = parser_->release();
    Request req(std::move(parsed.base()), std::move(parsed.body()));
    // A chunked body's trailer fields join the head's, past its checks and
    // its size limit (thousands of fields): none is taken.
    if (head_fields_ && static_cast<size_t>(std::distance(req.begin(), req.end())) > head_fields_) {
      return RejectAndClose(400, "malformed HTTP request: trailer fields after a chunked body are not accepted");
    }
    head_fields_ = 0;
    if (Status st = CheckRequestHead(req); !st.ok()) return RejectAndClose(400, st.message());
    // The absolute form (GET http://host/path, as a proxy sends it) is taken
    // as its path and query (RFC 9112 3.2.2: a server accepts it); it was a 404.
    if (const beast::string_view t = req.target();
        t.size() > 7 && (beast::iequals(t.substr(0, 7), "http://") || beast::iequals(t.substr(0, 8), "https://"))) {
      // (Its path begins at the first '/' or '?' after the authority: "http://h?x=1" is "/?x=1".)
      const size_t path = t.find_first_of("/?", t.find("://") + 3);
      req.target(path == beast::string_view::npos ? std::string("/")
                 : t[path] == '?'                ? "/" + std::string(t.substr(path))
                                                 : std::string(t.substr(path)));
    }
    // A body in a content coding (gzip, br) is not read as if it were plain:
    // its bytes were taken for JSON ("not valid JSON at byte 1"), and a plain
    // body labelled gzip was taken as plain (RFC 9110 15.5.16: 415).
    if (auto ce = req.find(bhttp::field::content_encoding); ce != req.end() && !beast::iequals(ce->value(), "identity")) {
      return RejectAndClose(415, "Content-Encoding '" + std::string(ce->value().substr(0, 32)) +
                                     "' is not supported: send the body uncompressed", "unsupported_media_type");
    }
    version_ = req.version();
    keep_alive_ = req.keep_alive();
    // HTTP/1.0 has no chunked coding: a Transfer-Encoding there is framing
    // an HTTP/1.0 proxy in front would not see (it takes the chunks for the
    // next request). Answered, then closed (RFC 9112 6.1).
    if (version_ < 11 && req.find(bhttp::field::transfer_encoding) != req.end()) keep_alive_ = false;
    // A HEAD request is handled as a GET whose answer goes without its body (Enqueue).
    head_method_ = req.method() == bhttp::verb::head;
    if (head_method_) req.method(bhttp::verb::get);
    exchange_done_ = false;
    peer_gone_ = false;
    on_disconnect_ = nullptr;
    ++exchange_gen_;
    auto ex = std::make_shared<ExchangeImpl>(shared_from_this(), version_, exchange_gen_, head_checked_);
    current_ = ex;
    // The exchange (if dropped) answers 500.
    RunSurviving("spillway: a request handler", [&] { handler_(std::move(req), std::move(ex)); });
    // The peer is watched once the handler's work has gone its way: a
    // request's lifecycle starts in a handler posted before this one (on
    // this loop, or another) and usually sends to its worker first; the
    // watch's read (a system call) goes after it, off the request's way. An
    // exchange answered meanwhile is not watched: the watch reads into the
    // buffer the next request's head is read from, and an answer already out
    // has started that read (the two must never overlap).
    net::post(stream_.get_executor(), [self = shared_from_this(), gen = exchange_gen_] {
      if (gen == self->exchange_gen_ && !self->exchange_done_ && !self->closed_) self->WatchPeer();
    });
  }

  // While a request is being handled, keep a read outstanding: an error (a
  // reset) means the peer is gone. End-of-file means it half-closed: it
  // still waits for its answer, so the request goes on and the connection
  // closes after it. Bytes that do arrive (a pipelined request) are kept for
  // the next parse, but only up to the header limit: past it the peer is
  // no longer read until its answer is out. (A readiness wait plus
  // available() == 0 is not enough: readiness can be reported spuriously.)
  void WatchPeer() {
    // A peer that half-closed before (its request was pipelined) can only be
    // probed: nothing more comes to read.
    if (read_closed_) return ProbePeer();
    if (buffer_.size() >= opts_.max_header_bytes) return;
    const uint64_t gen = exchange_gen_;
    peek_outstanding_ = true;
    // Straight into the buffer the next request is parsed from (nothing
    // else uses it while the exchange runs): no buffer of its own per
    // connection, which thousands of open streams would each hold.
    stream_.socket().async_read_some(
        buffer_.prepare(kPeekBytes), net::bind_executor(stream_.get_executor(),
        [self = shared_from_this(), gen](beast::error_code ec, std::size_t n) {
          self->peek_outstanding_ = false;
          self->buffer_.commit(n);
          if (ec == net::error::eof) {
            self->read_closed_ = true;  // nothing more comes; what it sent is still answered
          }
          if (gen != self->exchange_gen_) return self->AfterExchange();  // the answer went out meanwhile
          if (ec == net::error::eof) return self->ProbePeer();
          if (ec == net::error::operation_aborted) return;
          if (ec) return self->PeerGone();
          if (!self->exchange_done_) self->WatchPeer();
        }));
  }

  // End of file while the request runs: the peer half-closed (it still reads)
  // or closed for good (it reads nothing more). TCP tells them apart only
  // when bytes reach a closed socket, which answers with a reset. So an
  // HTTP/1.1 peer whose answer has not started gets an interim "100
  // Continue" (clients must accept unexpected 1xx responses, RFC 9110 15.2):
  // a reset then makes the socket report an error, and the peer is gone. A
  // started answer finds out by its own writes; HTTP/1.0 may not get a 1xx.
  void ProbePeer() {
    if (version_ < 11 || answer_started_ || exchange_done_) return;
    queue_.push_back({nullptr, "HTTP/1.1 100 Continue\r\n\r\n", false});
    if (!writing_) DoWrite();
    CheckGoneAfter(std::chrono::milliseconds(200));
  }

  void CheckGoneAfter(std::chrono::milliseconds delay) {
    probe_timer_.expires_after(delay);
    probe_timer_.async_wait(net::bind_executor(
        stream_.get_executor(), [self = shared_from_this(), gen = exchange_gen_](beast::error_code ec) {
          if (ec || gen != self->exchange_gen_ || self->exchange_done_ || self->peer_gone_ || self->closed_) return;
          int err = 0;
          socklen_t len = sizeof err;
          if (::getsockopt(self->stream_.socket().native_handle(), SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err != 0) {
            return self->PeerGone();
          }
          self->CheckGoneAfter(std::chrono::seconds(1));
        }));
  }

  // The exchange's last byte is written and no peek read is outstanding:
  // read the next request or close.
  void AfterExchange() {
    if (!next_pending_) return;
    next_pending_ = false;
    // A peer that half-closed gets answers to the requests it sent before
    // (pipelined, in the buffer), then the connection closes.
    if (keep_alive_ && !peer_gone_ && !closed_ && (!read_closed_ || buffer_.size() > 0)) return DoRead();
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

  // writing_, counted in the server's Shared::writing (a graceful stop waits for it).
  void SetWriting(bool w) {
    if (w == writing_) return;
    writing_ = w;
    if (w) shared_->writing.fetch_add(1);
    else shared_->writing.fetch_sub(1);
  }

  void DoWrite() {
    if (queue_.empty()) {
      SetWriting(false);
      return;
    }
    SetWriting(true);
    auto& item = queue_.front();
    if (item.res && (!item.res->chunked() || item.head_only)) {
      // Head and body in one gathered write (see http_wire.h), sent at once
      // when the socket takes it all; the rest, if any, asynchronously.
      item.head = WireHead(*item.res);
      const std::array<net::const_buffer, 2> bufs = {
          net::buffer(item.head), item.head_only ? net::const_buffer() : net::buffer(item.res->body())};
      const size_t sent = SendNow(stream_.socket().native_handle(), bufs);
      if (sent == net::buffer_size(bufs)) return OnWrite({});
      stream_.expires_after(opts_.write_timeout);
      net::async_write(stream_, Consumed(bufs, sent),
                       [self = shared_from_this()](beast::error_code ec, std::size_t) { self->OnWrite(ec); });
      return;
    }
    if (!item.res) return WriteRaw(0);
    stream_.expires_after(opts_.write_timeout);
    auto done = [self = shared_from_this()](beast::error_code ec, std::size_t) { self->OnWrite(ec); };
    bhttp::async_write(stream_, *item.res, std::move(done));
  }

  // A raw piece (a stream's events, joined while its reader was slow) goes
  // out by as much as the socket takes at a time, each part within
  // write_timeout: the bound is on a reader that takes nothing, not on one
  // that is slow (64 KiB of events whole, to a reader of one event a
  // second, took minutes). The front item stays while it is written: only
  // OnWrite takes it off, and joins go to the back (Enqueue).
  void WriteRaw(size_t from) {
    stream_.expires_after(opts_.write_timeout);
    stream_.async_write_some(net::buffer(queue_.front().raw) + from,
                             [self = shared_from_this(), from](beast::error_code ec, std::size_t n) {
                               if (!ec && from + n < self->queue_.front().raw.size()) return self->WriteRaw(from + n);
                               self->OnWrite(ec);
                             });
  }

  void OnWrite(beast::error_code ec) {
    stream_.expires_never();
    if (ec) {
      queue_.clear();
      SetWriting(false);
      PeerGone();
      return Close();
    }
    const bool last = queue_.front().last;
    queue_.pop_front();
    if (last) {
      SetWriting(false);
      queue_.clear();
      ReleaseBody();
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

  // (Into the read buffer, whose bytes are no longer wanted: no buffer of its own per connection.)
  void Drain() {
    buffer_.consume(buffer_.size());
    stream_.async_read_some(buffer_.prepare(kDrainBytes), [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) return self->Close();
      self->Drain();
    });
  }

  void RejectAndClose(unsigned status, const std::string& msg, const char* code = "bad_request", int retry_after = 0) {
    // An Ollama route's clients read Ollama's shape, {"error": "<message>"}.
    const auto target = parser_ ? parser_->get().target() : beast::string_view();
    const bool ollama = api::IsOllamaPath(std::string_view(target.data(), target.size()));
    std::string body = ollama ? R"({"error":")" + msg + R"("})"
                              : R"({"error":{"message":")" + msg + R"(","type":")" +
                                    (status >= 500 ? "server_overloaded" : "invalid_request_error") +
                                    R"(","code":")" + code + R"("}})";
    auto res = MakeResponse(status, std::move(body), "application/json");
    if (retry_after > 0) res.set(bhttp::field::retry_after, std::to_string(retry_after));
    RefuseAndClose(std::move(res));
  }

  // A request refused before it is handled (by its head, ServerOptions::
  // check_head, or as malformed): its answer, then the connection closes
  // (what the peer sent after the head is never read).
  void RefuseAndClose(Response res) {
    // What arrived of the refused body goes now, not with the connection
    // after its lingering close: its share of max_body_memory_bytes is given
    // back once the answer is out.
    if (parser_) std::string().swap(parser_->get().body());
    keep_alive_ = false;
    exchange_done_ = false;
    res.keep_alive(false);
    res.prepare_payload();
    Enqueue({std::make_shared<Response>(std::move(res)), {}, true});
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    probe_timer_.cancel();
    if (head_deadline_) head_deadline_->Stop();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
  }

  beast::tcp_stream stream_;
  const std::string peer_;  // the peer's address (set once, read from any thread)
  net::steady_timer probe_timer_;  // checks a half-closed peer for a reset
  std::shared_ptr<ReadDeadline> head_deadline_;  // the head's read timeout (HeadDeadline; made with the first)
  bool reading_head_ = false;      // a request's head is being read (DoRead to OnHeader)
  const std::shared_ptr<Shared> shared_;
  const ServerOptions& opts_;
  const Handler handler_;
  size_t reserved_ = 0;  // body bytes held against the shared budget
  size_t head_fields_ = 0;  // the fields of the request's head, once read (0: its head had none read apart)
  bool head_checked_ = false;  // opts_.check_head passed for the request's head (one with a body)
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<GrowingBody>> parser_;
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
  bool head_method_ = false;  // the exchange answers a HEAD request
  bool peek_outstanding_ = false;
  bool next_pending_ = false;
  bool read_closed_ = false;  // the peer half-closed (EOF while its request ran)
  bool answer_started_ = false;  // bytes of this exchange's answer were queued
  bool waiting_idle_ = false;  // listed in Shared::idle (or just taken off it) while its read waits
};

std::shared_ptr<Session> Shared::TakeIdle() {
  std::lock_guard lk(idle_mu);
  // An entry whose session is ending stays: its destructor takes it off.
  for (auto it = idle.begin(); it != idle.end(); ++it) {
    if (auto s = it->lock()) {
      s->idle_it_.reset();
      idle.erase(it);
      return s;
    }
  }
  return nullptr;
}

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

net::any_io_executor ExchangeImpl::executor() const { return session_->executor(); }
std::string ExchangeImpl::peer_address() const { return session_->peer(); }

// On the session's strand these run at once (a request whose lifecycle runs
// there answers without a hop); from anywhere else they are queued to it.
void ExchangeImpl::Respond(Response res) {
  if (finished_.exchange(true)) return;
  auto s = session_;
  auto r = std::make_shared<Response>(std::move(res));
  net::dispatch(s->executor(), [s, r] { s->Enqueue({r, {}, true}); });
}

void ExchangeImpl::StartStream(Response header) {
  if (finished_) return;  // (answered already: its head would land in the next exchange's)
  header.chunked(!http10_);
  if (http10_) header.set(bhttp::field::connection, "close");
  header.body().clear();
  std::string raw;
  raw.reserve(256);
  raw += std::string(http10_ ? "HTTP/1.0 " : "HTTP/1.1 ") + std::to_string(header.result_int()) + " " +
         std::string(header.reason()) + "\r\n";
  for (const auto& f : header) {
    raw.append(f.name_string().data(), f.name_string().size()).append(": ");
    raw.append(f.value().data(), f.value().size()).append("\r\n");
  }
  raw += "\r\n";
  auto s = session_;
  net::dispatch(s->executor(), [s, raw = std::move(raw), close = http10_]() mutable {
    if (close) s->CloseAfterExchange();
    s->Enqueue({nullptr, std::move(raw), false});
  });
}

void ExchangeImpl::Write(std::string data) {
  if (finished_ || data.empty()) return;
  auto s = session_;
  std::string raw = http10_ ? std::move(data) : ChunkFrame(data);
  *unsent_ += static_cast<int64_t>(raw.size());
  net::dispatch(s->executor(), [s, raw = std::move(raw), u = unsent_]() mutable {
    s->Enqueue({nullptr, std::move(raw), false, std::move(u)});  // dropped unsent: its destructor counts it down
  });
}

void ExchangeImpl::End() {
  if (finished_.exchange(true)) return;
  auto s = session_;
  net::dispatch(s->executor(), [s, end = std::string(http10_ ? "" : "0\r\n\r\n")]() mutable {
    s->Enqueue({nullptr, std::move(end), true});
  });
}

void ExchangeImpl::Abort() {
  if (finished_.exchange(true)) return;
  auto s = session_;
  net::dispatch(s->executor(), [s] {
    s->CloseAfterExchange();
    s->Enqueue({nullptr, std::string(), true});  // completes the exchange with no last chunk; then the close
  });
}

void ExchangeImpl::OnDisconnect(std::function<void()> cb) {
  auto s = session_;
  net::dispatch(s->executor(), [s, cb = std::move(cb), gen = gen_]() mutable {
    s->SetDisconnectCallback(std::move(cb), gen);
  });
}

}  // namespace

// A timer on a loop that fires every second and does nothing. Asio programs
// the loop's timerfd whenever a timer becomes the earliest of the loop, and a
// connection's read and write timeouts (seconds away) each became it: four
// timerfd_settime calls per request. Behind a tick that is always sooner
// they never are, at the price of one wake-up a second per loop. It keeps
// itself alive through its own wait until stopped. Only on loops that one
// thread runs (ServerOptions::one_thread_per_loop): its timer has no strand.
struct LoopTick : std::enable_shared_from_this<LoopTick> {
  explicit LoopTick(net::io_context& loop) : timer(loop) {}
  void Arm() {
    if (stopped) return;
    timer.expires_after(std::chrono::seconds(1));
    timer.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec && !self->stopped) self->Arm();
    });
  }
  void Stop() {
    stopped = true;
    net::post(timer.get_executor(), [self = shared_from_this()] { self->timer.cancel(); });
  }
  net::steady_timer timer;
  std::atomic<bool> stopped{false};
};

struct Server::Impl : std::enable_shared_from_this<Server::Impl> {
  Impl(net::io_context& ioc, ServerOptions o, Handler h, std::vector<net::io_context*> l)
      : loops(std::move(l)), acceptor(net::make_strand(ioc)), retry(acceptor.get_executor()),
        shared(std::make_shared<Shared>(o)), handler(std::move(h)) {
    if (loops.empty()) loops.push_back(&ioc);
  }

  void DoAccept() {
    net::io_context& loop = *loops[next_loop++ % loops.size()];
    const net::any_io_executor where = shared->opts.one_thread_per_loop ? net::any_io_executor(loop.get_executor())
                                                                       : net::any_io_executor(net::make_strand(loop));
    acceptor.async_accept(where, [self = shared_from_this()](beast::error_code ec, tcp::socket s) {
      if (ec == net::error::operation_aborted || !self->acceptor.is_open()) return;
      if (ec) {
        // Out of file descriptors (or another transient failure): the
        // connection stays in the backlog; try again shortly, never spin.
        self->retry.expires_after(std::chrono::milliseconds(50));
        self->retry.async_wait([self](beast::error_code e) {
          if (!e && self->acceptor.is_open()) self->DoAccept();
        });
        return;
      }
      self->Admit(std::move(s));
      self->DoAccept();
    });
  }

  // On the acceptor's strand. Full: the longest-idle keep-alive connection
  // makes room, and the new one is let in once it is closed (its socket is
  // gone; the session's count follows as it ends). One that has begun a
  // request meanwhile stays, and the next idle one is asked; none: a 503.
  void Admit(tcp::socket s) {
    if (shared->connections.load() < shared->opts.max_connections) return Start(std::move(s));
    auto idle = shared->TakeIdle();
    if (!idle) return Refuse(std::move(s));
    auto sock = std::make_shared<tcp::socket>(std::move(s));
    net::post(idle->executor(), [self = shared_from_this(), idle, sock] {
      if (idle->EvictIfIdle()) return self->Start(std::move(*sock));
      net::post(self->acceptor.get_executor(), [self, sock] { self->Admit(std::move(*sock)); });
    });
  }

  void Start(tcp::socket s) {
    beast::error_code ec;
    s.set_option(tcp::no_delay(true), ec);
    if (shared->opts.send_buffer_bytes > 0) {
      s.set_option(net::socket_base::send_buffer_size(shared->opts.send_buffer_bytes), ec);
    }
    std::make_shared<Session>(std::move(s), shared, handler)->Start();
  }

  // Full: a short 503 and close, without a session.
  static void Refuse(tcp::socket s) {
    static const std::string kFull = [] {
      const std::string body =
          R"({"error":{"message":"too many open connections; retry shortly","type":"server_overloaded","code":"too_many_connections"}})";
      return "HTTP/1.1 503 Service Unavailable\r\nServer: spillway\r\nContent-Type: application/json\r\n"
             "Retry-After: 1\r\nConnection: close\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    }();
    auto sock = std::make_shared<tcp::socket>(std::move(s));
    net::async_write(*sock, net::buffer(kFull), [sock](beast::error_code ec, std::size_t) {
      // Closed with its request unread, the socket sent a reset that often
      // destroyed the 503 before the client read it (it saw ECONNRESET, not
      // Retry-After). It lingers as a served connection's refusal does, a
      // bounded number at a time: the cap is there to bound sockets.
      if (!ec && lingering_refusals.fetch_add(1) < kMaxLingeringRefusals) {
        sock->shutdown(tcp::socket::shutdown_send, ec);
        auto linger = std::make_shared<Linger>(std::move(*sock));
        linger->timer.expires_after(std::chrono::seconds(2));
        linger->timer.async_wait([linger](beast::error_code) {
          beast::error_code ignored;
          linger->sock.close(ignored);
        });
        return linger->Drain();
      }
      if (!ec) --lingering_refusals;
      sock->shutdown(tcp::socket::shutdown_both, ec);
      sock->close(ec);
    });
  }

  // A refused connection's last 2 s: what its client still sends is read
  // and dropped; it closes at its end or the timer's.
  static constexpr int kMaxLingeringRefusals = 64;
  static inline std::atomic<int> lingering_refusals{0};
  struct Linger : std::enable_shared_from_this<Linger> {
    explicit Linger(tcp::socket s) : sock(std::move(s)), timer(sock.get_executor()) {}
    ~Linger() { --lingering_refusals; }
    void Drain() {
      sock.async_read_some(net::buffer(discard), [self = shared_from_this()](beast::error_code ec, std::size_t) {
        if (ec) {
          self->timer.cancel();  // (its handler closes the socket)
          return;
        }
        self->Drain();
      });
    }
    tcp::socket sock;
    net::steady_timer timer;
    std::array<char, 4096> discard;
  };

  std::vector<net::io_context*> loops;
  std::vector<std::shared_ptr<LoopTick>> ticks;  // one per loop while listening
  size_t next_loop = 0;  // (on the acceptor's strand)
  tcp::acceptor acceptor;
  net::steady_timer retry;
  std::shared_ptr<Shared> shared;
  Handler handler;
};

Server::Server(net::io_context& ioc, ServerOptions opts, Handler handler, std::vector<net::io_context*> loops)
    : impl_(std::make_shared<Impl>(ioc, std::move(opts), std::move(handler), std::move(loops))) {}

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
  if (impl_->shared->opts.one_thread_per_loop) {  // (the tick's timer has no strand)
    for (auto* loop : impl_->loops) {
      impl_->ticks.push_back(std::make_shared<LoopTick>(*loop));
      net::post(*loop, [tick = impl_->ticks.back()] { tick->Arm(); });  // armed on its own loop
    }
  }
  return Status::Ok();
}

uint16_t Server::port() const {
  beast::error_code ec;
  auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

uint64_t Server::accepted() const { return impl_->shared->accepted.load(); }
uint64_t Server::evicted() const { return impl_->shared->evicted.load(); }
size_t Server::body_bytes_held() const { return impl_->shared->body_bytes.load(); }
size_t Server::writing() const { return impl_->shared->writing.load(); }

void Server::Stop() {
  auto impl = impl_;
  for (auto& tick : impl->ticks) tick->Stop();
  net::dispatch(impl->acceptor.get_executor(), [impl] {
    beast::error_code ec;
    impl->acceptor.close(ec);
    impl->retry.cancel();
  });
}

}  // namespace spillway::http
