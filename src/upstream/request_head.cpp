// A request's head to a worker or an external server, written straight into
// one string (request_head.h).
#include "upstream/request_head.h"

#include <boost/beast/core/string.hpp>

#include <algorithm>
#include <string_view>
#include <utility>
#include <vector>

namespace spillway::upstream {

namespace {

bool Same(std::string_view a, std::string_view b) {
  return boost::beast::iequals(boost::beast::string_view(a.data(), a.size()), boost::beast::string_view(b.data(), b.size()));
}

}  // namespace

std::string RequestHead(uint16_t port, const std::string& method, const std::string& target, size_t body_size,
                        const http::HeaderList& headers, bool v6) {
  std::vector<std::pair<std::string_view, std::string_view>> fields;
  fields.reserve(headers.size() + 4);
  const std::string host = http::HostHeader(v6 ? "::1" : "127.0.0.1", port);
  auto set = [&](std::string_view name, std::string_view value) {
    std::erase_if(fields, [&](const auto& f) { return Same(f.first, name); });
    fields.emplace_back(name, value);
  };
  set("Host", host);
  set("User-Agent", "spillway");
  for (const auto& [k, v] : headers) set(k, v);
  const bool typed = std::any_of(fields.begin(), fields.end(), [](const auto& f) { return Same(f.first, "Content-Type"); });
  if (body_size > 0 && !typed) fields.emplace_back("Content-Type", "application/json");
  std::erase_if(fields, [](const auto& f) { return Same(f.first, "Content-Length") || Same(f.first, "Transfer-Encoding"); });
  const std::string length = std::to_string(body_size);
  if (body_size > 0 || method == "POST" || method == "PUT" || method == "OPTIONS") fields.emplace_back("Content-Length", length);
  std::string out;
  size_t size = method.size() + target.size() + 16;
  for (const auto& [k, v] : fields) size += k.size() + v.size() + 4;
  out.reserve(size);
  out.append(method).append(" ").append(target).append(" HTTP/1.1\r\n");
  for (const auto& [k, v] : fields) out.append(k).append(": ").append(v).append("\r\n");
  out.append("\r\n");
  return out;
}

}  // namespace spillway::upstream
