// The floor of a reverse proxy built as Spillway is (one Asio event loop on
// one thread, loopback, a kept-alive upstream connection per client
// connection), for bench/gateway_overhead: it forwards each request and
// answer byte for byte and does nothing else (no HTTP parser beyond the
// framing, no journal, no admission). What Spillway adds beyond what this
// adds is the gateway's own work, not the cost of a proxy hop.
//   bare_proxy LISTEN_PORT UPSTREAM_PORT
// Bodies: Content-Length, and chunked answers (ended by their last chunk),
// whose bytes go on as they come.
#include <utility>  // before Asio's awaitable.hpp (Boost 1.74)

#include <boost/asio.hpp>

#include <strings.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

// The length of the first whole message in `b`, or 0 while it is not whole.
size_t WholeMessage(const std::string& b) {
  const size_t head = b.find("\r\n\r\n");
  if (head == std::string::npos) return 0;
  const std::string h = b.substr(0, head);
  auto field = [&](const char* name) {
    for (size_t at = h.find("\r\n"); at != std::string::npos; at = h.find("\r\n", at + 2)) {
      if (strncasecmp(h.c_str() + at + 2, name, std::strlen(name)) == 0) return at + 2 + std::strlen(name);
    }
    return std::string::npos;
  };
  if (const size_t te = field("transfer-encoding:"); te != std::string::npos) {  // chunked: up to the last chunk
    const size_t end = b.find("\r\n0\r\n\r\n", head);
    return end == std::string::npos ? 0 : end + 7;
  }
  const size_t cl = field("content-length:");
  const size_t length = cl == std::string::npos ? 0 : std::strtoul(h.c_str() + cl, nullptr, 10);
  return b.size() >= head + 4 + length ? head + 4 + length : 0;
}

struct Session : std::enable_shared_from_this<Session> {
  Session(tcp::socket c, asio::io_context& io) : client(std::move(c)), upstream(io) {}
  tcp::socket client, upstream;
  std::string from_client, from_upstream;
  char chunk[65536];

  void Start(uint16_t port) {
    boost::system::error_code ec;
    upstream.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port), ec);
    if (ec) return;
    upstream.set_option(tcp::no_delay(true));
    client.set_option(tcp::no_delay(true));
    Read(client, from_client, [](Session& s, std::string m) { s.Forward(s.upstream, m, &Session::ReadAnswer); });
  }

  // The answer's bytes go on as they come (a stream's events too); its
  // framing says when it is whole, and the client's next request is read.
  void ReadAnswer() {
    if (const size_t n = WholeMessage(from_upstream)) {
      from_upstream.erase(0, n);
      return Read(client, from_client, [](Session& s, std::string m) { s.Forward(s.upstream, m, &Session::ReadAnswer); });
    }
    upstream.async_read_some(asio::buffer(chunk), [self = shared_from_this()](boost::system::error_code ec, size_t n) {
      if (ec) return;
      self->from_upstream.append(self->chunk, n);
      self->Forward(self->client, std::string(self->chunk, n), &Session::ReadAnswer);
    });
  }
  // One whole message from `from` (what is buffered first), then `then`.
  void Read(tcp::socket& from, std::string& buffered, void (*then)(Session&, std::string)) {
    if (const size_t n = WholeMessage(buffered)) {
      std::string m = buffered.substr(0, n);
      buffered.erase(0, n);
      return then(*this, std::move(m));
    }
    from.async_read_some(asio::buffer(chunk), [self = shared_from_this(), &from, &buffered, then](
                                                  boost::system::error_code ec, size_t n) {
      if (ec) return;
      buffered.append(self->chunk, n);
      self->Read(from, buffered, then);
    });
  }
  void Forward(tcp::socket& to, const std::string& m, void (Session::*then)()) {
    boost::system::error_code ec;
    asio::write(to, asio::buffer(m), ec);  // (small messages: loopback sockets take them whole)
    if (!ec) (this->*then)();
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: bare_proxy LISTEN_PORT UPSTREAM_PORT\n");
    return 2;
  }
  const auto listen_port = static_cast<uint16_t>(std::atoi(argv[1]));
  const auto upstream_port = static_cast<uint16_t>(std::atoi(argv[2]));
  asio::io_context io(1);
  tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), listen_port));
  std::function<void()> accept = [&] {
    acceptor.async_accept([&](boost::system::error_code ec, tcp::socket s) {
      if (!ec) std::make_shared<Session>(std::move(s), io)->Start(upstream_port);
      accept();
    });
  };
  accept();
  io.run();
}
