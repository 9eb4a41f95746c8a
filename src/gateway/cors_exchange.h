// Cross-origin reads for the pages of `allowed_origins` (CORS): a browser
// lets a page from another origin (a web UI on another port, a browser
// extension) read an answer only when the answer says it may. A request
// from such an origin has passed the Origin allow-list (gateway_access.cpp);
// its answer then carries
//
//   Access-Control-Allow-Origin: <that origin>, Vary: Origin, and
//   Access-Control-Expose-Headers: the headers a page may read (X-Request-Id,
//   Retry-After, Idempotent-Replayed and Spillway's degraded-service headers);
//
// and its preflight (OPTIONS, sent before a POST with a JSON body or an
// Authorization header, itself without a key) is answered 204 with the
// methods and the request headers it may send. The gateway's own page
// (same origin) needs none of it.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "api/http_server.h"
#include "gateway/forwarding_exchange.h"

namespace spillway::gateway {

class CorsExchange final : public ForwardingExchange {
 public:
  CorsExchange(std::shared_ptr<http::Exchange> inner, std::string origin)
      : ForwardingExchange(std::move(inner)), origin_(std::move(origin)) {}

  void Respond(http::Response res) override;
  void StartStream(http::Response header) override;
  // The headers that let a page of `origin` read `res`.
  static void Allow(http::Response& res, const std::string& origin);

 private:
  std::string origin_;
};

// The 204 answer to a preflight from `origin` (an allowed one).
http::Response CorsPreflight(const http::Request& req, const std::string& origin);

}  // namespace spillway::gateway
