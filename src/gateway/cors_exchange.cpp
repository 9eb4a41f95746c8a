#include "gateway/cors_exchange.h"

#include <algorithm>
#include <cctype>
#include <string_view>

namespace spillway::gateway {

namespace bhttp = boost::beast::http;

namespace {

constexpr const char* kExposed =
    "X-Request-Id, Retry-After, Idempotent-Replayed, X-Spillway-Placement, X-Spillway-Decision, "
    "X-Spillway-Degraded, X-Spillway-Fallback-Model, X-Spillway-Limits, X-Spillway-Estimated-Delay, "
    "X-Spillway-Attempts, X-Spillway-Queued-Ms, X-Spillway-Timings, X-Spillway-Keep-Alive, "
    "X-Spillway-Truncated-Inputs, X-Spillway-Dropped-Messages";
constexpr const char* kRequestHeaders =
    "Authorization, Content-Type, Idempotency-Key, X-Request-Id, X-Request-Timeout";

}  // namespace

void CorsExchange::Allow(http::Response& res, const std::string& origin) {
  res.set(bhttp::field::access_control_allow_origin, origin);
  res.set(bhttp::field::vary, "Origin");
  res.set(bhttp::field::access_control_expose_headers, kExposed);
}

void CorsExchange::Respond(http::Response res) {
  Allow(res, origin_);
  inner_->Respond(std::move(res));
}

void CorsExchange::StartStream(http::Response header) {
  Allow(header, origin_);
  inner_->StartStream(std::move(header));
}

http::Response CorsPreflight(const http::Request& req, const std::string& origin) {
  http::Response res{bhttp::status::no_content, req.version()};
  res.set(bhttp::field::access_control_allow_origin, origin);
  res.set(bhttp::field::vary, "Origin");
  res.set(bhttp::field::access_control_allow_methods, "GET, POST, DELETE, OPTIONS");
  // The headers the page asks to send (SDKs send their own, such as the
  // OpenAI SDK's X-Stainless-*), when they are plain header names; the ones
  // Spillway reads otherwise.
  const auto asked = req.find(bhttp::field::access_control_request_headers);
  const std::string_view names = asked == req.end() ? std::string_view() : std::string_view(asked->value().data(), asked->value().size());
  const bool plain = !names.empty() && names.size() <= 1024 && std::all_of(names.begin(), names.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == ',' || c == ' ';
  });
  res.set(bhttp::field::access_control_allow_headers, plain ? std::string(names) : std::string(kRequestHeaders));
  res.set(bhttp::field::access_control_max_age, "600");
  res.keep_alive(req.keep_alive());
  return res;
}

}  // namespace spillway::gateway
