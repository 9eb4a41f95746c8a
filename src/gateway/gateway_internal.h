// Shared by the gateway's implementation files only (not an interface).
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <utility>
#include <string>
#include <string_view>

#include "api/http_server.h"
#include "api/json_limits.h"
#include "api/openai_response.h"
#include "devices/telemetry.h"
#include "gateway/cancel_cause.h"
#include "gateway/gateway.h"
#include "gateway/offload.h"
#include "journal/journal.h"

namespace spillway::gateway {

using nlohmann::json;
namespace bhttp = boost::beast::http;
using journal::State;

namespace internal {

inline constexpr int64_t kQueueWaitMs = 60000;  // how long an accepted request may wait for a worker
// How much longer than its start_timeout_s a request waits for an external server to start.
inline constexpr int64_t kExternalStartSlackMs = 5000;
inline constexpr int kMaxAttempts = 3;          // attempts on worker failures, per request
inline constexpr int64_t kMaxRequestTimeoutMs = int64_t{86400} * 1000;  // X-Request-Timeout's bound
inline constexpr size_t kMaxUnsentBytes = 256 << 10;  // of a stream to a slow reader, before the relay pauses
// A non-streamed request body up to this size has its first record written while the worker computes
// (RequestLifecycle::Run); a larger one's first, so that one the journal refuses is never sent.
inline constexpr size_t kOverlappedCommitMaxBody = 64 << 10;

// How long a request with X-Request-Timeout's `deadline_ms` (unix ms; 0:
// none) may still wait or run: at most `cap_ms`, less when its deadline
// comes sooner, never under 1 ms (0 would read as "no bound").
inline std::chrono::milliseconds TimeLeft(int64_t deadline_ms, int64_t now_ms, int64_t cap_ms) {
  if (deadline_ms) cap_ms = std::max<int64_t>(1, std::min(cap_ms, deadline_ms - now_ms));
  return std::chrono::milliseconds(cap_ms);
}

// A service's line here, in the order its requests began to wait (ties by
// id): GET /v1/requests/{id}'s queue.position and the live list's position
// both count by it.
inline bool WaitsAhead(int64_t since_a, const std::string& id_a, int64_t since_b, const std::string& id_b) {
  return since_a < since_b || (since_a == since_b && id_a < id_b);
}

// The journaled error of a completed request whose answer was relayed but
// is too long to keep: an Idempotency-Key does not replay it.
inline constexpr std::string_view kAnswerNotKept = "answer not kept: relayed past its bound";

// What a request past its deadline ends with (504), waiting or running.
inline Status DeadlinePassed() {
  return Status::DeadlineExceeded(
      "the request did not finish within its deadline (its X-Request-Timeout, or its body's spillway_timeout_s)");
}

inline http::Response JsonResponse(unsigned status, const json& body, unsigned version) {
  return http::MakeResponse(status, body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json",
                            version);
}

inline json ErrorJson(const Status& st, const std::string& request_id = "") {
  json j = api::ErrorBody(st);
  if (!request_id.empty()) j["error"]["request_id"] = request_id;
  return j;
}

// ErrorJson as text (a message may carry a process's bytes: never a throw).
inline std::string ErrorText(const Status& st, const std::string& request_id = "") {
  return ErrorJson(st, request_id).dump(-1, ' ', false, json::error_handler_t::replace);
}

// What a client whose answer is withheld may do: the journal keeps request
// `id` unfinished, and `reruns` ("the next start runs") it again.
inline std::string NotEndedAdvice(std::string_view reruns, const std::string& id) {
  return "The journal still holds the request as not ended, and " + std::string(reruns) + " it again: GET /v1/requests/" +
         id + " says how it ends; send it again (with a new Idempotency-Key if it had one) only once that says failed";
}

// The gateway's stop cut a request (its grace passed: Gateway::CutForStop).
inline constexpr const char kStoppedByGrace[] = "the gateway stopped (its shutdown_grace_s passed)";

// A request the stop cut after it reached its worker (or server, `where`):
// its answer is withheld, and the next start `reruns` it.
inline Status StopWithheld(std::string_view where, const std::string& id, std::string_view reruns) {
  return Status::Unavailable(std::string(kStoppedByGrace) + " while " + std::string(where) +
                             "; its answer is withheld. " + NotEndedAdvice(reruns, id))
      .WithRetryAfter(5)
      .WithReason(kAnswerWithheld);
}

inline http::Response ErrorResponse(const Status& st, unsigned version, const std::string& request_id = "") {
  auto res = JsonResponse(static_cast<unsigned>(HttpStatusFor(st.code())), ErrorJson(st, request_id), version);
  if (st.retry_after_s() > 0) res.set(bhttp::field::retry_after, std::to_string(st.retry_after_s()));
  if (!request_id.empty()) res.set("X-Request-Id", request_id);
  // The OpenAI SDKs send a 5xx again on their own, as a new request, unless
  // told not to: a withheld answer's request may still run again.
  if (st.reason() == kAnswerWithheld || st.reason() == kServiceUnavailable || st.reason() == kMayHaveRun) {
    res.set("X-Should-Retry", "false");
  }
  return res;
}

// Ollama's error shape, {"error": "<message>"}: what its clients read
// (the ollama npm client throws errorData.error as the message).
inline http::Response OllamaErrorResponse(const Status& st, unsigned version) {
  auto res = JsonResponse(static_cast<unsigned>(HttpStatusFor(st.code())), {{"error", st.message()}}, version);
  if (st.retry_after_s() > 0) res.set(bhttp::field::retry_after, std::to_string(st.retry_after_s()));
  return res;
}

// A known route asked with a method it does not take: a 405 that names the
// methods it takes (RFC 9110 15.5.6: Allow), in the API's own error shape.
// (Ollama's router answers 405 too.) `allow` as the Allow header lists them.
inline http::Response MethodNotAllowed(boost::beast::string_view method, const std::string& path, const char* allow, bool ollama,
                                       unsigned version) {
  const Status st =
      Status::InvalidArgument(std::string(method) + " is not allowed on " + path + " (it takes " + allow + ")");
  auto res = ollama ? OllamaErrorResponse(st, version) : ErrorResponse(st, version);
  res.result(bhttp::status::method_not_allowed);
  res.set(bhttp::field::allow, allow);
  return res;
}

using http::HostOnly;

// A telemetry reader per device and thread (readers are not thread-safe;
// opening one maps a ledger or loads NVML, too slow to repeat every second).
StatusOr<devices::DeviceTelemetry*> Telemetry(const std::string& device);

inline std::string Outcome(State s) { return journal::StateName(s); }

// A placement as /v1/status shows it: whether its breaker ("breaker") or
// its device's ("device_breaker") is open.
inline bool BreakerIsOpen(const json& p, const char* which) {
  return p.contains(which) && p[which].is_object() && p[which].value("state", "") == "open";
}

// Whether either takes nothing now (a device's failures stop every placement on it).
inline bool BreakerOpen(const json& p) { return BreakerIsOpen(p, "breaker") || BreakerIsOpen(p, "device_breaker"); }

// Whether it may take requests at all now: admitted, not held back, no
// breaker open (its worker's state aside).
inline bool MayTakeRequests(const json& p) {
  return p.value("admitted", true) && !BreakerOpen(p) && (!p.contains("held_back") || p["held_back"].is_null());
}

// Whether it serves now: it may take requests and its worker is ready, or
// it is on demand and stopped (the next request starts it). One on demand
// that starts or backs off is waited for instead (LoadsForItsRequests).
inline bool ServesNow(const json& p) {
  const std::string state = p.value("state", std::string("stopped"));  // (no worker record yet: not started)
  return MayTakeRequests(p) && (state == "ready" || (p.value("on_demand", false) && state == "stopped"));
}
inline bool LoadsForItsRequests(const json& p) {
  return MayTakeRequests(p) && p.value("on_demand", false) && !ServesNow(p);
}

// The methods a route of the gateway's takes, as an Allow header lists them
// (nullptr: no such route). HEAD with every GET.
const char* AllowedMethods(const std::string& path);

// The bounds every request body is checked against (json_max_depth).
api::JsonLimits JsonLimitsOf(const config::GatewayConfig& config);

// A journal write that fails after acceptance is surprising but survivable:
// log it; the request's answer still reaches the client.
inline void Logged(const Status& st, const char* what) {
  if (!st.ok()) std::fprintf(stderr, "spillway: journal %s failed: %s\n", what, st.ToString().c_str());
}

}  // namespace internal

using namespace internal;

// A request's phase in this gateway (Live::phase): its lifecycle, with the
// table of its states and transitions, is in gateway/request_lifecycle.h.
enum class LivePhase { kQueued, kRunning, kStreaming, kTerminal };
inline const char* LivePhaseName(LivePhase p) {
  switch (p) {
    case LivePhase::kQueued: return "queued";
    case LivePhase::kRunning: return "running";
    case LivePhase::kStreaming: return "streaming";
    case LivePhase::kTerminal: return "terminal";
  }
  return "unknown";
}

// In-memory handle on an accepted request: its phase, for cancellation.
struct Gateway::Live {
  // What the request is, as the journal has it (or will): set before it is
  // registered, never changed. /v1/status and /v1/requests list live
  // requests from here, never from the journal (which a stalled disk holds).
  std::string id;
  std::string service;
  std::string client;       // who sent it (who may cancel it before its first row)
  std::string endpoint;
  bool stream = false;
  int64_t created_ms = 0;
  int64_t deadline_ms = 0;  // 0: none (X-Request-Timeout)
  // Its prompt's tokens, counted by admission's first round (a worker's
  // /tokenize) and kept for the rounds after it: a busy worker's retry, every
  // 50 ms, sent the whole body to be counted again. -1: not counted yet.
  // (The request's own strand only.)
  int prompt_tokens = -1;
  // A chat with "truncate": its oldest messages the counting worker left out
  // for the context of the first admitted placement of its model, or a
  // smaller one's when that cannot take it (RequestAdmission::RecountCells;
  // prompt_tokens counts what is left), pinned in the body each placement of
  // that model gets; and that model (ServiceConfig::ModelOf).
  int dropped_messages = 0;
  std::string counted_model;
  uint32_t counted_cells = 0;  // the context it was cut for (fit_cells; 0: not cut)
  // Of prompt_tokens, those the counting worker (of placement counted_at)
  // said a run there now would find in its cache (prefix reuse): a run
  // there computes only the rest.
  int cached_tokens = 0;
  size_t counted_at = SIZE_MAX;
  bool recount_refused = false;  // counted again once, and that count stood no better (RecountCells)
  // A stream cut after its first token goes on only with the model that
  // began it (ServiceConfig::ModelOf; empty: any). Admission holds back the
  // service's placements of another model, not only avoids them while
  // another may take it: the one that failed is waited for while it comes
  // back (with a different-model fallback beside it, the stream was ended
  // at once). (Its own strand only.)
  std::string only_model;
  // A stream's first event reached its client: a continuation reads the
  // prompt it began with (never counted again). (Its own strand only.)
  bool began = false;
  std::atomic<bool> cancelled{false};
  std::atomic<CancelCause> cancel_cause{CancelCause::kNone};  // (Gateway::Cancel)
  // Its Accept, journaled on its own while it waited, was refused (the
  // journal cannot write): it stops waiting, and its client hears why.
  std::atomic<bool> accept_refused{false};
  std::atomic<uint16_t> worker_port{0};
  std::atomic<LivePhase> phase{LivePhase::kQueued};
  std::atomic<int64_t> phase_since_ms{0};
  std::shared_ptr<void> queue_slot;  // its place among max_queue until its first attempt runs
  // An external service's request: closes its upstream connection when cancelled (set before it runs).
  std::shared_ptr<upstream::StreamControl> upstream_control;
  bool PastDeadline(int64_t now_ms) const { return deadline_ms && now_ms >= deadline_ms; }
  void Enter(LivePhase p, int64_t now_ms) {
    phase = p;
    phase_since_ms = now_ms;
    if (p == LivePhase::kTerminal) {
      std::lock_guard<std::mutex> lk(wait_mu);  // (a waiter checks the phase under it: no wake is lost)
      ended.notify_all();
    }
  }
  // Until its end is journaled (it entered kTerminal), at most `bound`: a
  // cancel of a waiting request answers with its end (see HandleRequestQuery).
  bool WaitEnded(std::chrono::milliseconds bound) const {
    std::unique_lock<std::mutex> lk(wait_mu);
    return ended.wait_for(lk, bound, [&] { return phase.load() == LivePhase::kTerminal; });
  }
  // While it waits: why, and when it is expected to start (each round of admission says).
  void Waiting(const std::string& note, double est_wait_s) {
    std::lock_guard<std::mutex> lk(wait_mu);
    wait_note = note;
    wait_est_s = est_wait_s;
  }
  std::pair<std::string, double> WaitState() const {
    std::lock_guard<std::mutex> lk(wait_mu);
    return {wait_note, wait_est_s};
  }
  // Its place in its service's line while it has one (CapacitySignal::Handle):
  // a cancel wakes it alone, not the whole line.
  void SetLineWaiter(std::shared_ptr<void> h) {
    std::lock_guard<std::mutex> lk(wait_mu);
    line_waiter = std::move(h);
  }
  std::shared_ptr<void> LineWaiter() const {
    std::lock_guard<std::mutex> lk(wait_mu);
    return line_waiter;
  }
  // Its attempts so far, and where the last one runs (or ran).
  void Attempting(const std::string& on, int n) {
    std::lock_guard<std::mutex> lk(wait_mu);
    placement = on;
    attempts = n;
  }
  std::pair<std::string, int> AttemptState() const {
    std::lock_guard<std::mutex> lk(wait_mu);
    return {placement, attempts};
  }

 private:
  mutable std::mutex wait_mu;
  mutable std::condition_variable ended;
  std::string wait_note;
  double wait_est_s = 0;
  std::shared_ptr<void> line_waiter;
  std::string placement;
  int attempts = 0;
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
  bool own_id = true;                 // the id is the gateway's (no X-Request-Id): it cannot clash
  std::function<void()> on_accepted;  // once the journal took it as new (not refused, not a replay)
  // Refused if its Accept says it is new (an external line that was full:
  // a keyed retry may be a replay, which the line's bound does not concern).
  Status refused_if_new;
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

template <typename F>
boost::asio::awaitable<Status> Gateway::Journaled(F start) {
  static_assert(std::is_trivially_destructible_v<F>, "capture by reference only (see above)");
  auto pending = PendingStatus::Make(co_await boost::asio::this_coro::executor);
  start(pending->Completer());
  // Written at once (journal NORMAL: the log's write is its durability):
  // no wait, and no coroutine of Wait's to run for it.
  if (const auto& now = pending->result()) {
    Status st = *now;
    co_return st;
  }
  co_return co_await pending->Wait();
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
  uint64_t generation = 0;   // of the worker process it was taken on (PlacementBoard::Placement::generation)
  int64_t waited_ms = 0;     // spent waiting for this placement (a delay, the CPU line)
};

}  // namespace spillway::gateway
