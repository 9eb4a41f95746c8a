#include "upstream/connection_pool.h"

namespace spillway::upstream {

std::unique_ptr<http::Connection> ConnectionPool::Take(uint16_t port, bool* reused) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto& v = idle_[port];
    if (!v.empty()) {
      auto c = std::move(v.back());
      v.pop_back();
      *reused = true;
      return c;
    }
  }
  *reused = false;
  return std::make_unique<http::Connection>("127.0.0.1", port);
}

void ConnectionPool::Give(uint16_t port, std::unique_ptr<http::Connection> c) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& v = idle_[port];
  if (v.size() < max_idle_) v.push_back(std::move(c));
}

StatusOr<http::ClientResponse> ConnectionPool::Send(uint16_t port, const std::string& method, const std::string& target,
                                                    const std::string& body, const http::HeaderList& headers,
                                                    std::chrono::milliseconds timeout) {
  bool reused = false;
  auto c = Take(port, &reused);
  auto r = c->Send(method, target, body, headers, timeout);
  if (!r.ok() && reused && r.status().code() == StatusCode::kUnavailable) {
    c = std::make_unique<http::Connection>("127.0.0.1", port);
    r = c->Send(method, target, body, headers, timeout);
  }
  if (r.ok() && r->Header("connection") != "close") Give(port, std::move(c));
  return r;
}

}  // namespace spillway::upstream
