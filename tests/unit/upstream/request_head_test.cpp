// RequestHead writes the head Beast wrote for the same request built field
// by field (the message the connection pool used to build and serialize).
#include <gtest/gtest.h>

#include <boost/beast/http.hpp>

#include "api/http_wire.h"
#include "upstream/request_head.h"

namespace spillway::upstream {
namespace {

namespace bhttp = boost::beast::http;

// What the pool sent before: a Beast request, its head as Beast writes it.
std::string BeastHead(uint16_t port, const std::string& method, const std::string& target, const std::string& body,
                      const http::HeaderList& headers, bool v6) {
  bhttp::request<bhttp::string_body> req{bhttp::string_to_verb(method), target, 11};
  req.set(bhttp::field::host, http::HostHeader(v6 ? "::1" : "127.0.0.1", port));
  req.set(bhttp::field::user_agent, "spillway");
  for (const auto& [k, v] : headers) req.set(k, v);
  if (!body.empty() && req.find(bhttp::field::content_type) == req.end()) {
    req.set(bhttp::field::content_type, "application/json");
  }
  req.body() = body;
  req.prepare_payload();
  req.keep_alive(true);
  return http::WireHead(req);
}

TEST(RequestHeadTest, IsTheHeadBeastWritesForTheSameRequest) {
  struct Case {
    std::string method, target, body;
    http::HeaderList headers;
    bool v6 = false;
  };
  const std::vector<Case> cases = {
      {"POST", "/v1/completions", R"({"prompt":"x"})", {{"Authorization", "Bearer s"}, {"X-Request-Id", "req_1"}}},
      {"POST", "/v1/completions", "", {}},  // an empty POST: Content-Length 0
      {"PUT", "/x", "", {}},
      {"GET", "/health", "", {{"Authorization", "Bearer s"}}},  // no body, no length
      {"DELETE", "/v1/slots/3?x=1", "", {}},
      {"GET", "/info", "", {}, true},  // [::1]
      {"POST", "/v1/audio/transcriptions", "--b\r\n\r\n--b--", {{"Content-Type", "multipart/form-data; boundary=b"}}},
      {"POST", "/r", "{}", {{"content-type", "text/plain"}, {"X-A", "1"}, {"x-a", "2"}}},  // a later name replaces
      {"POST", "/r", "{}", {{"host", "example:1"}, {"USER-AGENT", "other"}}},                // ours too
      {"POST", "/r", "abc", {{"Content-Length", "99"}}},  // the body's length wins
      {"GET", "/r", "", {{"Content-Length", "5"}}},       // and none without a body
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.method + " " + c.target);
    EXPECT_EQ(RequestHead(8080, c.method, c.target, c.body.size(), c.headers, c.v6),
              BeastHead(8080, c.method, c.target, c.body, c.headers, c.v6));
  }
}

}  // namespace
}  // namespace spillway::upstream
