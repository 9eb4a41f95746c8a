// Shared by the gateway's implementation files only (not an interface).
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>

#include "api/http_server.h"
#include "api/openai_response.h"
#include "gateway/gateway.h"
#include "gateway/offload.h"
#include "journal/journal.h"

namespace spillway::gateway {

using nlohmann::json;
namespace bhttp = boost::beast::http;
using journal::State;

namespace internal {

inline constexpr int64_t kQueueWaitMs = 60000;  // how long an accepted request may wait for a worker
inline constexpr int kMaxAttempts = 3;          // attempts on worker failures, per request

inline http::Response JsonResponse(unsigned status, const json& body, unsigned version) {
  return http::MakeResponse(status, body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json",
                            version);
}

inline json ErrorJson(const Status& st, const std::string& request_id = "") {
  json j = api::ErrorBody(st);
  if (!request_id.empty()) j["error"]["request_id"] = request_id;
  return j;
}

inline http::Response ErrorResponse(const Status& st, unsigned version, const std::string& request_id = "") {
  auto res = JsonResponse(static_cast<unsigned>(HttpStatusFor(st.code())), ErrorJson(st, request_id), version);
  if (st.retry_after_s() > 0) res.set(bhttp::field::retry_after, std::to_string(st.retry_after_s()));
  if (!request_id.empty()) res.set("X-Request-Id", request_id);
  return res;
}

using http::HostOnly;

inline std::string Outcome(State s) { return journal::StateName(s); }

// A journal write that fails after acceptance is surprising but survivable:
// log it; the request's answer still reaches the client.
inline void Logged(const Status& st, const char* what) {
  if (!st.ok()) std::fprintf(stderr, "spillway: journal %s failed: %s\n", what, st.ToString().c_str());
}

}  // namespace internal

using namespace internal;

// In-memory handle on an accepted request, for cancellation.
struct Gateway::Live {
  std::string id;
  std::string service;
  int64_t deadline_ms = 0;  // 0: none (X-Request-Timeout)
  std::atomic<bool> cancelled{false};
  std::atomic<uint16_t> worker_port{0};
  std::shared_ptr<void> queue_slot;  // its place among max_queue until its first attempt runs
};

// A request as parsed on the connection strand, before the journal.
struct Gateway::Incoming {
  journal::RequestRecord rec;
  std::shared_ptr<http::Exchange> ex;
  unsigned version = 11;
  int64_t started_ms = 0;
  int64_t timeout_ms = 0;
  std::shared_ptr<void> client_slot;  // the client's place among max_requests_per_key
  std::shared_ptr<void> queue_slot;   // its place among max_queue
};

// GCC 12 destroys some temporaries of a co_await expression twice (checked
// with ASan): a closure with non-trivial captures, an aggregate built in
// place, a class value chosen by ?:. In coroutines such values are named
// locals first, and the work passed here captures by reference only (the
// coroutine's frame keeps what it refers to alive).
template <typename F>
boost::asio::awaitable<std::invoke_result_t<F&>> Gateway::Blocking(F f) {
  static_assert(std::is_trivially_destructible_v<F>, "capture by reference only (see above)");
  return Offload(blocking_, std::move(f));
}

// Where one attempt goes.
struct Gateway::Target {
  size_t index = 0;
  std::string key, placement;
  uint16_t port = 0;
  uint32_t cells = 0;        // reserved in the placement's pool (0: none)
  std::string body;          // the request body to send (max_tokens made explicit)
  std::string decision;      // kind
  std::string decision_json; // journaled with the attempt
  std::string limits;        // limits applied on this placement ("" when none), told to the client
  bool holding = false;      // counted in the placement's `active`
  int64_t waited_ms = 0;     // spent waiting for this placement (a delay, the CPU line)
};

}  // namespace spillway::gateway
