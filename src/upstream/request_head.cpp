// A request's head to a worker or an external server, written straight into
// one string (request_head.h).
#include "upstream/request_head.h"

#include <boost/beast/core/string.hpp>

#include <algorithm>
#include <string_view>

namespace spillway::upstream {

namespace {

bool Same(std::string_view a, std::string_view b) {
  return boost::beast::iequals(boost::beast::string_view(a.data(), a.size()), boost::beast::string_view(b.data(), b.size()));
}

}  // namespace

std::string RequestHead(uint16_t port, const std::string& method, const std::string& target, size_t body_size,
                        const http::HeaderList& headers, bool v6) {
  // One pass, no list of fields: a given field is written unless a later one
  // of its name replaces it (so each name sits where its last one came, as
  // Beast's set() leaves it); Host and User-Agent lead unless given.
  const auto given = [&](std::string_view name) {
    return std::any_of(headers.begin(), headers.end(), [&](const auto& h) { return Same(h.first, name); });
  };
  const auto replaced = [&](size_t i) {
    for (size_t j = i + 1; j < headers.size(); ++j) {
      if (Same(headers[j].first, headers[i].first)) return true;
    }
    return false;
  };
  const std::string host = given("Host") ? "" : http::HostHeader(v6 ? "::1" : "127.0.0.1", port);
  const bool agent = !given("User-Agent");
  const std::string length =
      body_size > 0 || method == "POST" || method == "PUT" || method == "OPTIONS" ? std::to_string(body_size) : "";
  std::string out;
  size_t size = method.size() + target.size() + host.size() + length.size() + 128;
  for (const auto& [k, v] : headers) size += k.size() + v.size() + 4;
  out.reserve(size);
  out.append(method).append(" ").append(target).append(" HTTP/1.1\r\n");
  if (!host.empty()) out.append("Host: ").append(host).append("\r\n");
  if (agent) out.append("User-Agent: spillway\r\n");
  bool typed = false;
  for (size_t i = 0; i < headers.size(); ++i) {
    const auto& [k, v] = headers[i];
    // (The body that follows is always body_size bytes, as they are.)
    if (replaced(i) || Same(k, "Content-Length") || Same(k, "Transfer-Encoding")) continue;
    typed |= Same(k, "Content-Type");
    out.append(k).append(": ").append(v).append("\r\n");
  }
  if (body_size > 0 && !typed) out.append("Content-Type: application/json\r\n");
  if (!length.empty()) out.append("Content-Length: ").append(length).append("\r\n");
  out.append("\r\n");
  return out;
}

}  // namespace spillway::upstream
