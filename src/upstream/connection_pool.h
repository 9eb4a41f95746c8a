// Kept-alive loopback connections to workers, reused across requests (a new
// TCP connection per request costs more than everything else the gateway
// does). Thread-safe; each connection is used by one thread at a time.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "api/http_client.h"

namespace spillway::upstream {

class ConnectionPool {
 public:
  explicit ConnectionPool(size_t max_idle_per_port = 32) : max_idle_(max_idle_per_port) {}

  // Sends on an idle connection to `port` (or a new one). A reused connection
  // that the worker has closed in the meantime fails before any answer; the
  // request is then sent once more on a fresh connection.
  StatusOr<http::ClientResponse> Send(uint16_t port, const std::string& method, const std::string& target,
                                      const std::string& body, const http::HeaderList& headers,
                                      std::chrono::milliseconds timeout);

 private:
  std::unique_ptr<http::Connection> Take(uint16_t port, bool* reused);
  void Give(uint16_t port, std::unique_ptr<http::Connection> c);

  const size_t max_idle_;
  std::mutex mu_;
  std::map<uint16_t, std::vector<std::unique_ptr<http::Connection>>> idle_;
};

}  // namespace spillway::upstream
