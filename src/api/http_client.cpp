#include "api/http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <cctype>
#include <optional>

#include "api/growing_body.h"

namespace spillway::http {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

std::string HostHeader(const std::string& host, uint16_t port) {
  const bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

struct Connection::Impl {
  std::string host;
  uint16_t port;
  // Made on first use: creating one takes file descriptors, and may fail
  // (a status here, never an exception out of a caller's thread).
  std::optional<net::io_context> ioc;
  std::optional<beast::tcp_stream> stream;
  beast::flat_buffer buffer;

  Status Connect(std::chrono::milliseconds timeout) {
    beast::error_code ec;
    auto addr = net::ip::make_address(host, ec);
    if (ec) return Status::InvalidArgument("not a numeric address: " + host);
    try {
      if (!ioc) ioc.emplace();
    } catch (const std::exception& e) {
      return Status::Unavailable("connect to " + host + ":" + std::to_string(port) + ": " + e.what());
    }
    stream.emplace(*ioc);
    stream->expires_after(timeout);
    // Through RunOp, so that the timeout holds (a synchronous connect to a
    // host that drops packets waited out the kernel's SYN retries, ~2 min).
    ec = RunOp([&](auto done) {
      stream->async_connect(tcp::endpoint(addr, port), [done](beast::error_code e) mutable { done(e, 0); });
    });
    if (ec) {
      stream.reset();
      return Status::Unavailable("connect to " + host + ":" + std::to_string(port) + ": " + ec.message());
    }
    stream->socket().set_option(tcp::no_delay(true), ec);
    return Status::Ok();
  }

  // Synchronous operations on a tcp_stream honour expires_after only through
  // the async path, so each step runs the io_context until it completes.
  template <typename Op>
  beast::error_code RunOp(Op&& op) {
    beast::error_code result = net::error::would_block;
    op([&](beast::error_code ec, std::size_t) { result = ec; });
    ioc->restart();
    ioc->run();
    return result;
  }

  StatusOr<ClientResponse> Send(const std::string& method, const std::string& target, const std::string& body,
                                const HeaderList& headers, std::chrono::milliseconds timeout) {
    if (!stream) SPILLWAY_RETURN_IF_ERROR(Connect(timeout));
    bhttp::request<bhttp::string_body> req{bhttp::string_to_verb(method), target, 11};
    req.set(bhttp::field::host, HostHeader(host, port));
    req.set(bhttp::field::user_agent, "spillway");
    bool has_ct = false;
    for (const auto& [k, v] : headers) {
      req.set(k, v);
      if (beast::iequals(k, "content-type")) has_ct = true;
    }
    if (!body.empty() && !has_ct) req.set(bhttp::field::content_type, "application/json");
    req.body() = body;
    req.prepare_payload();
    req.keep_alive(true);

    stream->expires_after(timeout);
    auto ec = RunOp([&](auto h) { bhttp::async_write(*stream, req, h); });
    bhttp::response_parser<GrowingBody> parser;  // (a declared length is not reserved at once)
    parser.body_limit(1ull << 32);
    // A server may answer early (413) and stop reading: a failed write is
    // followed by a read, which returns that answer when there is one.
    const bool write_failed = static_cast<bool>(ec);
    if (!ec || ec == net::error::broken_pipe || ec == net::error::connection_reset) {
      auto rec = RunOp([&](auto h) { bhttp::async_read(*stream, buffer, parser, h); });
      if (!rec || !write_failed) ec = rec;
    }
    if (ec) {
      stream.reset();
      buffer.clear();
      if (ec == beast::error::timeout) return Status::DeadlineExceeded(method + " " + target + ": timed out");
      return Status::Unavailable(method + " " + target + ": " + ec.message());
    }
    auto res = parser.release();
    ClientResponse out;
    out.status = res.result_int();
    for (const auto& f : res) {
      std::string name(f.name_string());
      for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      out.headers[name] = std::string(f.value());
    }
    out.body = std::move(res.body());
    if (!res.keep_alive()) {
      stream.reset();
      buffer.clear();
    }
    return out;
  }
};

Connection::Connection(std::string host, uint16_t port) : impl_(std::make_unique<Impl>()) {
  impl_->host = std::move(host);
  impl_->port = port;
}
Connection::~Connection() = default;

StatusOr<ClientResponse> Connection::Send(const std::string& method, const std::string& target,
                                          const std::string& body, const HeaderList& headers,
                                          std::chrono::milliseconds timeout) {
  return impl_->Send(method, target, body, headers, timeout);
}

StatusOr<ClientResponse> Fetch(const std::string& host, uint16_t port, const std::string& method,
                               const std::string& target, const std::string& body, const HeaderList& headers,
                               std::chrono::milliseconds timeout) {
  Connection c(host, port);
  return c.Send(method, target, body, headers, timeout);
}

Status StreamFetch(const std::string& host, uint16_t port, const std::string& method, const std::string& target,
                   const std::string& body, const HeaderList& headers,
                   const std::function<bool(const StreamHead&)>& on_head,
                   const std::function<bool(std::string_view)>& on_data, std::chrono::milliseconds idle_timeout) {
  std::optional<net::io_context> ioc_holder;
  try {
    ioc_holder.emplace();  // takes file descriptors: may fail when they run out
  } catch (const std::exception& e) {
    return Status::Unavailable("connect to " + host + ":" + std::to_string(port) + ": " + e.what());
  }
  net::io_context& ioc = *ioc_holder;
  beast::error_code ec;
  auto addr = net::ip::make_address(host, ec);
  if (ec) return Status::InvalidArgument("not a numeric address: " + host);
  beast::tcp_stream stream(ioc);
  auto run = [&](auto&& start) {
    beast::error_code result = net::error::would_block;
    start([&](beast::error_code e, std::size_t = 0) { result = e; });
    ioc.restart();
    ioc.run();
    return result;
  };
  stream.expires_after(std::chrono::seconds(10));
  ec = run([&](auto h) { stream.async_connect(tcp::endpoint(addr, port), [h](beast::error_code e) mutable { h(e); }); });
  if (ec) return Status::Unavailable("connect to " + host + ":" + std::to_string(port) + ": " + ec.message());
  bhttp::request<bhttp::string_body> req{bhttp::string_to_verb(method), target, 11};
  req.set(bhttp::field::host, HostHeader(host, port));
  for (const auto& [k, v] : headers) req.set(k, v);
  if (!body.empty() && req.find(bhttp::field::content_type) == req.end()) {
    req.set(bhttp::field::content_type, "application/json");
  }
  req.body() = body;
  req.prepare_payload();
  stream.expires_after(idle_timeout);
  ec = run([&](auto h) { bhttp::async_write(stream, req, h); });
  if (ec) return Status::Unavailable(method + " " + target + ": " + ec.message());
  beast::flat_buffer buffer;
  bhttp::response_parser<bhttp::buffer_body> parser;
  // Not boost::none: Boost 1.74 compares the length against an empty optional and fails.
  parser.body_limit(std::uint64_t{1} << 40);
  ec = run([&](auto h) { bhttp::async_read_header(stream, buffer, parser, h); });
  if (ec) return Status::Unavailable(method + " " + target + ": " + ec.message());
  StreamHead head;
  head.status = parser.get().result_int();
  for (const auto& f : parser.get()) {
    std::string name(f.name_string());
    for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    head.headers[name] = std::string(f.value());
  }
  if (!on_head(head)) return Status::Ok();
  char chunk[16384];
  while (!parser.is_done()) {
    parser.get().body().data = chunk;
    parser.get().body().size = sizeof chunk;
    stream.expires_after(idle_timeout);
    ec = run([&](auto h) { bhttp::async_read_some(stream, buffer, parser, h); });
    if (ec == bhttp::error::need_buffer) ec = {};
    if (ec) {
      if (ec == beast::error::timeout) return Status::DeadlineExceeded(method + " " + target + ": no data in time");
      return Status::Unavailable(method + " " + target + ": " + ec.message());
    }
    const size_t n = sizeof chunk - parser.get().body().size;
    if (n > 0 && !on_data(std::string_view(chunk, n))) return Status::Ok();
  }
  return Status::Ok();
}

std::vector<std::string> ParseSseData(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find('\n', pos);
    if (end == std::string::npos) end = body.size();
    std::string_view line(body.data() + pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.rfind("data:", 0) == 0) {
      line.remove_prefix(5);
      if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
      out.emplace_back(line);
    }
    pos = end + 1;
  }
  return out;
}

uint16_t FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  uint16_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

}  // namespace spillway::http
