// A blocking HTTP/1.1 client on Boost.Beast for loopback calls: the gateway's
// control calls to workers, health checks, tests and benchmarks. One call, one
// connection unless a Connection is reused.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string_view>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace spillway::http {

struct ClientResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;                            // chunked bodies arrive de-chunked
  const std::string& Header(const std::string& lower_name) const {
    static const std::string kNone;
    auto it = headers.find(lower_name);
    return it == headers.end() ? kNone : it->second;
  }
};

using HeaderList = std::vector<std::pair<std::string, std::string>>;

// The Host header for `host` (a name or an address) and `port`: an IPv6
// address in brackets ("[::1]:8480"; "::1:8480" was read as host "").
std::string HostHeader(const std::string& host, uint16_t port);

// Opens a connection, sends one request and reads the whole response.
// Transport failures (refused, reset, timeout) return kUnavailable or
// kDeadlineExceeded; any HTTP status is a successful call.
StatusOr<ClientResponse> Fetch(const std::string& host, uint16_t port, const std::string& method,
                               const std::string& target, const std::string& body = "",
                               const HeaderList& headers = {},
                               std::chrono::milliseconds timeout = std::chrono::seconds(60));

// A kept-alive connection for many sequential requests (benchmarks, probes).
class Connection {
 public:
  Connection(std::string host, uint16_t port);
  ~Connection();
  StatusOr<ClientResponse> Send(const std::string& method, const std::string& target, const std::string& body = "",
                                const HeaderList& headers = {},
                                std::chrono::milliseconds timeout = std::chrono::seconds(60));

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Sends one request and hands the response body to `on_data` piece by piece
// as it arrives (chunked bodies de-chunked): for relaying SSE streams.
// `on_head` sees status and headers first. Either callback returning false
// stops reading. `idle_timeout` bounds each wait for more data.
struct StreamHead {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
};
Status StreamFetch(const std::string& host, uint16_t port, const std::string& method, const std::string& target,
                   const std::string& body, const HeaderList& headers,
                   const std::function<bool(const StreamHead&)>& on_head,
                   const std::function<bool(std::string_view)>& on_data,
                   std::chrono::milliseconds idle_timeout = std::chrono::seconds(600));

// Parses a text/event-stream body into the payloads of its "data:" lines.
std::vector<std::string> ParseSseData(const std::string& body);

// A loopback TCP port free right now (0: none found), for a server that
// takes a port number rather than binding port 0 itself. Another process
// may take it before that server binds it: its start then fails.
uint16_t FreeLoopbackPort();

}  // namespace spillway::http
