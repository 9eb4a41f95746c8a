// libFuzzer target: the HTTP/1.1 request parser as the server runs it (Beast's
// parser with the server's header and body limits, then the server's own
// checks of the head, and the Host helpers the allow-lists use).
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "api/http_server.h"

namespace bhttp = boost::beast::http;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  spillway::http::ServerOptions opts;
  opts.max_body_bytes = 64 << 10;
  bhttp::request_parser<bhttp::string_body> parser;
  parser.body_limit(opts.max_body_bytes);
  parser.header_limit(static_cast<std::uint32_t>(opts.max_header_bytes));
  parser.eager(true);
  boost::beast::error_code ec;
  boost::beast::flat_buffer buf;
  size_t at = 0;
  // Fed in pieces, as reads deliver them; unconsumed bytes stay buffered.
  while (!parser.is_done()) {
    if (at < size) {
      const size_t piece = std::min<size_t>(size - at, 1 + (data[at] % 97));
      auto dst = buf.prepare(piece);
      std::memcpy(dst.data(), data + at, piece);
      buf.commit(piece);
      at += piece;
    }
    ec = {};
    const size_t n = parser.put(buf.data(), ec);
    buf.consume(n);
    if (ec == bhttp::error::need_more) {
      if (at < size) continue;
      ec = {};
      if (parser.got_some()) parser.put_eof(ec);  // the peer closed (as a read's end of file does)
      break;
    }
    if (ec) break;
    if (n == 0 && at >= size) break;
  }
  if (!ec && parser.is_done()) {
    const auto& req = parser.get();
    (void)spillway::http::CheckRequestHead(req);
    if (auto h = req.find(bhttp::field::host); h != req.end()) {
      const std::string host = spillway::http::HostOnly(std::string_view(h->value().data(), h->value().size()));
      (void)spillway::http::IsLoopbackAddress(host);
    }
    (void)req.keep_alive();
    (void)req.target();
  }
  return 0;
}
