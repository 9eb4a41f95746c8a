// Who may call the gateway and whose requests a caller may see: API keys
// (compared in constant time), the Host and Origin allow-lists, request
// ownership, per-key concurrency, request ids.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <mutex>

#include "common/hash.h"
#include "common/secret.h"
#include "gateway/gateway.h"
#include "gateway/gateway_internal.h"

namespace spillway::gateway {

namespace {

bool EqualsIgnoringCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

// The scheme is case-insensitive (RFC 9110 11.1: "bearer" is Bearer), and
// one or more spaces follow it.
std::string_view BearerToken(const http::RequestHead& req) {
  auto auth = req.find(bhttp::field::authorization);
  if (auth == req.end()) return {};
  std::string_view v(auth->value().data(), auth->value().size());
  constexpr std::string_view kBearer = "Bearer";
  if (v.size() <= kBearer.size() || !EqualsIgnoringCase(v.substr(0, kBearer.size()), kBearer) ||
      v[kBearer.size()] != ' ') {
    return {};
  }
  v.remove_prefix(kBearer.size());
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  return v;
}

// A host name as compared: brackets of an IPv6 literal off ("[::1]" is
// "::1"), either case (DNS names are case-insensitive).
bool SameHost(std::string_view a, std::string_view b) {
  auto bare = [](std::string_view h) {
    return h.size() >= 2 && h.front() == '[' && h.back() == ']' ? h.substr(1, h.size() - 2) : h;
  };
  return EqualsIgnoringCase(bare(a), bare(b));
}

// Every key is compared (no early exit), each in constant time.
bool AnyKeyMatches(std::string_view token, const std::vector<std::string>& keys) {
  bool ok = false;
  for (const auto& k : keys) ok |= SecretEquals(token, k);
  return ok && !token.empty();
}

}  // namespace

// Unpredictable: ids are capabilities for GET/DELETE /v1/requests/{id}
// where no keys are set; 64 bits from a cryptographic source. Led by the
// time in seconds (8 hex digits, in order until 2106), so that the journal's
// indexes on the id take new ids at their end: with random ids each request
// of a commit dirtied a page of its own in each (about 2.5 pages per request
// written to the WAL, and its reads), with ordered ones a commit's requests
// share a few.
std::string Gateway::NewRequestId() {
  // "req_", the second as 8 hex digits (ids sort by when they were made), 8 random bytes.
  const auto when = static_cast<uint32_t>(std::max<int64_t>(0, clock_.NowMs() / 1000));
  const unsigned char big_endian[4] = {static_cast<unsigned char>(when >> 24), static_cast<unsigned char>(when >> 16),
                                       static_cast<unsigned char>(when >> 8), static_cast<unsigned char>(when)};
  std::string id;
  id.reserve(4 + 8 + 16);
  id += "req_";
  AppendHex(id, big_endian, sizeof big_endian);
  AppendRandomHex(id, 8);
  return id;
}

std::string Gateway::ClientOf(const http::Request& req) const {
  auto it = req.find(bhttp::field::authorization);
  if (it == req.end()) return "anonymous";
  // One key is one client however its scheme is written ("bearer  k" is
  // "Bearer k"): its places under max_requests_per_key, its requests, its
  // Idempotency-Keys. (The canonical form is what earlier versions hashed.)
  const std::string_view token = BearerToken(req);
  return "key:" + Sha256Hex(token.empty() ? std::string(it->value()) : "Bearer " + std::string(token)).substr(0, 16);
}

Gateway::Caller Gateway::CallerOf(const http::Request& req) const {
  Caller c;
  c.client = ClientOf(req);
  // Without keys every local client is one principal; an operator key sees all.
  c.sees_all = !KeysRequired() || AnyKeyMatches(BearerToken(req), config_.operator_keys);
  return c;
}

bool Gateway::KeysRequired() const { return !config_.api_keys.empty() || !config_.operator_keys.empty(); }

Status Gateway::CheckAccess(const http::RequestHead& req, bool needs_key) const {
  // DNS rebinding: a page served by another host must not reach this API.
  // Browsers always send Host; a request without one is refused too.
  auto host = req.find(bhttp::field::host);
  if (host == req.end()) return Status::PermissionDenied("a Host header is required");
  const std::string h = HostOnly(std::string_view(host->value().data(), host->value().size()));
  bool host_ok = SameHost(h, config_.listen_host);
  for (const auto& a : config_.allowed_hosts) host_ok |= SameHost(a, h);
  if (!host_ok) return Status::PermissionDenied("Host '" + h + "' is not allowed (see allowed_hosts)");
  auto origin = req.find(bhttp::field::origin);
  if (origin != req.end()) {
    // The gateway's own page (the dashboard) sends its own origin: the scheme
    // and the very Host this request names, which passed the allow-list above.
    const std::string_view host_value(host->value().data(), host->value().size());
    const bool allowed = origin->value() == "http://" + std::string(host_value) || !CorsOrigin(req).empty();
    if (!allowed) return Status::PermissionDenied("Origin '" + std::string(origin->value()) + "' is not allowed (see allowed_origins)");
  }
  if (needs_key && KeysRequired()) {
    const std::string_view token = BearerToken(req);
    // Both lists are always compared: the time says nothing about which matched.
    const bool api = AnyKeyMatches(token, config_.api_keys);
    const bool op = AnyKeyMatches(token, config_.operator_keys);
    if (!(api | op)) return Status::Unauthenticated("a valid API key is required (Authorization: Bearer <key>)");
  }
  return Status::Ok();
}

std::string Gateway::CorsOrigin(const http::RequestHead& req) const {
  if (config_.allowed_origins.empty()) return "";
  auto origin = req.find(bhttp::field::origin);
  if (origin == req.end()) return "";
  const std::string_view o(origin->value().data(), origin->value().size());
  for (const auto& a : config_.allowed_origins) {
    if (a == o) return a;
  }
  return "";
}

std::string Gateway::SlotOwner(const std::string& client, const std::string& peer) const {
  if (KeysRequired()) return client;
  return peer.empty() ? "anonymous" : "peer:" + peer;
}

std::shared_ptr<void> Gateway::TakeClientSlot(const std::string& owner) {
  std::lock_guard<std::mutex> lk(mu_);
  int& n = in_flight_by_client_[owner];
  if (n >= config_.max_requests_per_key) return nullptr;
  ++n;
  return std::shared_ptr<void>(new char(0), [this, owner](void* p) {
    delete static_cast<char*>(p);
    std::lock_guard<std::mutex> lk(mu_);
    if (--in_flight_by_client_[owner] <= 0) in_flight_by_client_.erase(owner);
  });
}

}  // namespace spillway::gateway
