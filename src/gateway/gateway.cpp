#include "gateway/gateway.h"

#include "gateway/cors_exchange.h"
#include "gateway/reply_writer.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <set>
#include <string_view>
#include <thread>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/version.hpp>

#include "api/http_client.h"
#include "api/json_member.h"
#include "api/json_text.h"
#include "api/ollama_request.h"
#include "api/openai_request.h"
#include "api/openai_response.h"
#include "api/openai_tools.h"
#include "admission/admission.h"
#include "common/hash.h"
#include "common/survive.h"
#include "gateway/gateway_internal.h"
#include "gateway/request_lifecycle.h"
#include "gateway/readiness.h"
#include "protocol/worker_protocol.h"

namespace spillway::gateway {

namespace {

// A request id in a path: `s` with each %XX replaced by its byte, when that
// gives an id's characters ([A-Za-z0-9._:-]); else `s` as it is (found by no
// request either way, and no byte a JSON error could not hold).
std::string PercentDecoded(std::string_view s) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out += static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  for (const char c : out) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' || c == '-')) return std::string(s);
  }
  return out;
}

// A deadline of `secs` (in (0, 86400]) in whole milliseconds, rounded up:
// a tiny one is 1 ms, never 0 (which means none).
int64_t TimeoutMs(double secs) { return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(secs * 1000))); }

}  // namespace

Gateway::Gateway(const config::GatewayConfig& config, journal::Journal& journal, upstream::Workers& supervisor,
                 const Clock& clock, std::map<std::string, PlacementAdmission> admissions)
    : config_(config),
      journal_(journal),
      supervisor_(supervisor),
      clock_(clock),
      rng_(std::random_device{}()),
      board_(config, admissions, clock) {
  for (const auto& s : config_.services) signals_[s.name] = std::make_unique<CapacitySignal>();
  for (const auto& e : config_.externals) signals_[e.name] = std::make_unique<CapacitySignal>();
  for (const auto& s : config_.services) waiting_by_service_[s.name] = std::make_unique<std::atomic<int>>(0);
  external_lines_ = std::make_unique<ExternalLines>(config_.externals, clock_.NowMs());
  supervisor_.SetIdleCheck([this](const std::string& key) { return IdleReplica(key); });
  supervisor_.SetOnExit([this](const std::string& key, const std::string& why) { WorkerExited(key, why); });
}

// The supervisor asks this gateway about idle replicas: it stops first.
Gateway::~Gateway() {
  supervisor_.Stop();
  Shutdown();
}

std::shared_ptr<Gateway::Live> Gateway::MakeLive(const journal::RequestRecord& rec, int64_t now_ms) const {
  auto live = std::make_shared<Live>();
  live->id = rec.id;
  live->service = rec.service;
  live->client = rec.client;
  live->endpoint = rec.endpoint;
  live->stream = rec.stream;
  live->created_ms = now_ms;
  live->deadline_ms = rec.deadline_ms;
  if (config_.FindExternal(rec.service)) live->upstream_control = std::make_shared<upstream::StreamControl>();
  live->Enter(LivePhase::kQueued, clock_.NowMs());
  return live;
}

void Gateway::Start(boost::asio::any_io_executor io, std::vector<journal::RequestRecord> recovered) {
  io_ = std::move(io);
  // The previous runs' last events, oldest kept first (read once, here).
  if (auto ev = journal_.RecentEvents(static_cast<int>(kRecentEvents)); ev.ok()) {
    for (auto e = ev->rbegin(); e != ev->rend(); ++e) {
      json d = json::parse(e->detail, nullptr, false);
      KeepEvent(d.is_object() ? std::move(d) : json::object(), e->at_ms);
    }
  }
  StartEvents();  // before the first transition: the journal tells the incident log
  // The model files' headers, read here (not on an I/O thread): an Ollama
  // request's capabilities are then read from this cache (OllamaCapable).
  for (const auto& svc : config_.services) {
    if (!svc.model.empty()) (void)model_summaries_.Get(svc.model);
  }
  for (auto& rec : recovered) {
    auto live = MakeLive(rec, rec.created_ms);
    live->Attempting(rec.placement, rec.attempts);
    // It waits like any other: counted against max_queue (never refused by it).
    if (auto it = waiting_by_service_.find(rec.service); it != waiting_by_service_.end()) {
      ++waiting_;
      ++*it->second;
      live->queue_slot = QueuePlace(*it->second);
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      live_[live->id] = live;
    }
    // Nothing answers a client: the result waits in the journal.
    Spawn([](Gateway* g, journal::RequestRecord r, std::shared_ptr<Live> l) -> boost::asio::awaitable<void> {
      const std::string id = r.id;
      co_await g->Run(std::move(r), nullptr, l);
      std::lock_guard<std::mutex> lk(g->mu_);
      g->live_.erase(id);
    }(this, std::move(rec), live));
  }
}

std::shared_ptr<void> Gateway::QueuePlace(std::atomic<int>& service_waiting) {
  return std::shared_ptr<void>(nullptr, [this, &service_waiting](void*) {
    --waiting_;
    --service_waiting;
  });
}

void Gateway::Shutdown() {
  StopEvents();  // ends the event streams (they hold I/O objects)
  status_pool_.join();
  blocking_.join();
  journal_.Flush();  // no commit's completion is left to reach a strand after this
  pool_.Clear();
  for (auto& [name, signal] : signals_) signal->NotifyAll();
}

namespace {

void LifecycleFailed(std::exception_ptr e) {
  if (!e) return;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    std::fprintf(stderr, "spillway: a request's lifecycle failed: %s\n", x.what());
  } catch (...) {
    std::fprintf(stderr, "spillway: a request's lifecycle failed\n");
  }
}

#if BOOST_VERSION == 107400
// What co_spawn's entry point does, less its first step: co_spawn first
// posts the coroutine's start (a round of the event loop, with an
// epoll_wait of its own, before a request reaches its worker; some 10 us
// of a request's way here: bench/path_timeline). The work guard keeps the
// loop running while the task waits for something that is not an I/O
// object's (a commit's completion, posted from the journal's thread).
boost::asio::awaitable<void> Guarded(boost::asio::awaitable<void> task, boost::asio::any_io_executor where) {
  auto work = boost::asio::detail::make_co_spawn_work_guard(where);
  std::exception_ptr e;
  try {
    co_await std::move(task);
  } catch (...) {
    e = std::current_exception();
  }
  LifecycleFailed(e);
}
#endif

}  // namespace

void Gateway::Spawn(boost::asio::awaitable<void> task, boost::asio::any_io_executor where) {
  if (!where) where = boost::asio::make_strand(*io_);
  boost::asio::co_spawn(where, std::move(task), LifecycleFailed);
}

// Boost 1.74's co_spawn (Debian's) posts a coroutine's start; Asio's own
// thread of execution runs it here instead, up to its first wait (for a
// request: its send to the worker). Its caller must expect that: the task
// may answer, or fail, before StartHere returns. Another Boost, or not on
// `where`'s loop thread: co_spawn.
void Gateway::StartHere(boost::asio::awaitable<void> task, boost::asio::any_io_executor where) {
#if BOOST_VERSION == 107400
  // Only on the loop `where` is, from its own thread (an HTTP session's);
  // anything else (a strand, a test's caller) is posted as before.
  const auto* loop = where ? where.target<boost::asio::io_context::executor_type>() : nullptr;
  if (loop && loop->running_in_this_thread()) {
    boost::asio::detail::awaitable_handler<boost::asio::any_io_executor, void>(Guarded(std::move(task), where), where)
        .launch();
    return;
  }
#endif
  Spawn(std::move(task), std::move(where));
}

void Gateway::PostBlocking(std::function<void()> f) {
  boost::asio::post(blocking_.get_executor(), [f = std::move(f)] { RunSurviving("spillway: a blocking task", f); });
}

void Gateway::PostStatus(std::function<void()> f) {
  boost::asio::post(status_pool_.get_executor(), [f = std::move(f)] { RunSurviving("spillway: a status task", f); });
}

CapacitySignal& Gateway::SignalFor(const std::string& service) { return *signals_.at(service); }

void Gateway::WorkerReady(const std::string& key) {
  board_.WorkerReady(key);  // (a new process: the next request probes it)
  if (const auto* e = ExternalOfKey(config_, key)) signals_.at(e->name)->Notify();
  const config::ServiceConfig* s = nullptr;
  size_t i = 0;
  if (FindPlacement(config_, key, &s, &i)) signals_.at(s->name)->Notify();
}

http::Response Gateway::ReadyResponse(unsigned v) {
  json missing = json::array(), reasons = json::object();
  const auto workers = supervisor_.Snapshot();
  for (const auto& s : config_.services) {
    bool ready = false;
    json why = json::array();
    for (size_t i = 0; i < s.placements.size(); ++i) {
      // An on-demand replica that is stopped starts when a request needs it.
      ready |= supervisor_.ReadyPort(WorkerKey(s, i)).has_value() || supervisor_.OnDemand(WorkerKey(s, i));
      bool supervised = false;
      for (const auto& w : workers) {
        if (w.key != WorkerKey(s, i)) continue;
        supervised = true;
        std::string r = s.placements[i].Name() + ": " + upstream::WorkerStateName(w.state);
        if (!w.last_exit.empty()) r += " after " + w.last_exit;
        if (!w.last_error.empty()) r += ": " + w.last_error;
        why.push_back(r);
      }
      if (!supervised) {
        // Not admitted at start (a model file missing under --keep-going, no room on its device): why.
        const auto& adm = board_.placement(s.name, i).admission;
        why.push_back(s.placements[i].Name() + ": not started" +
                      (!adm.admitted && !adm.reason.empty() ? " (" + adm.reason + ")" : " (see /v1/status)"));
      }
    }
    if (!ready) {
      missing.push_back(s.name);
      reasons[s.name] = why;
    }
  }
  // An external server Spillway starts on demand (or stopped when idle) starts when asked.
  for (const auto& e : config_.externals) {
    if (!e.Started() || e.residency.mode != "pinned" || ExternalPort(e)) continue;
    missing.push_back(e.name);
    reasons[e.name] = json::array({"its server is not ready (see /v1/status externals)"});
  }
  // A journal that cannot write refuses every new request (503): not ready
  // either, whatever the workers. (Health probes the disk when a retry is due.)
  const Status journal = journal_.Health();
  if (!journal.ok()) reasons["journal"] = json::array({journal.message()});
  // Stopping (SIGTERM): a load balancer sends new requests elsewhere.
  if (stopping_) reasons["gateway"] = json::array({"stopping: it takes no new request, those under way finish"});
  const bool ready = missing.empty() && journal.ok() && !stopping_;
  return JsonResponse(ready ? 200 : 503, {{"ready", ready}, {"not_ready", missing}, {"reasons", reasons}}, v);
}

std::optional<http::Response> Gateway::AccessRefusal(const http::RequestHead& req) const {
  const std::string target(req.target());
  const std::string path = target.substr(0, target.find('?'));
  const bool open_route = path == "/healthz" || path == "/readyz" || IsUiPath(path);  // the page asks for a key itself
  // A page of an allowed origin reads the answer (CORS, cors_exchange.h); its
  // preflight carries no key.
  const std::string cors = CorsOrigin(req);
  const bool preflight = !cors.empty() && req.method() == bhttp::verb::options;
  // A body is never open: its memory comes from the budget all bodies share,
  // which callers without a key must not be able to hold (POST /healthz, a
  // forged preflight with a body).
  const auto length = req.find(bhttp::field::content_length);
  const bool with_body = req.count(bhttp::field::transfer_encoding) > 0 ||
                         (length != req.end() && length->value() != "0");
  const Status st = CheckAccess(req, with_body || (!open_route && !preflight));
  if (st.ok()) return std::nullopt;
  auto res = api::IsOllamaPath(path) ? OllamaErrorResponse(st, req.version()) : ErrorResponse(st, req.version());
  if (st.code() == StatusCode::kUnauthenticated) res.set(bhttp::field::www_authenticate, "Bearer");  // (RFC 9110 11.6.1)
  if (!cors.empty()) CorsExchange::Allow(res, cors);
  return res;
}

void Gateway::Handle(http::Request req, std::shared_ptr<http::Exchange> ex) {
  const std::string target(req.target());
  const std::string path = target.substr(0, target.find('?'));
  const unsigned v = req.version();
  const auto method = req.method();
  // (Checked already by the server when the request has a body: serve's check_head.)
  if (!ex->head_checked()) {
    if (auto refusal = AccessRefusal(req)) return ex->Respond(std::move(*refusal));
  }
  const std::string cors = CorsOrigin(req);
  const bool preflight = !cors.empty() && method == bhttp::verb::options;
  if (!cors.empty() && !preflight) ex = std::make_shared<CorsExchange>(std::move(ex), cors);
  if (preflight) return ex->Respond(CorsPreflight(req, cors));
  // A HEAD is answered as its GET, head alone (the HTTP server drops the body).
  const bool get = method == bhttp::verb::get || method == bhttp::verb::head;
  if (IsUiPath(path) && get) return ex->Respond(UiResponse(path, v));
  if (path == "/v1/events" && method == bhttp::verb::get) return HandleEvents(CallerOf(req), std::move(ex), v);
  if (path == "/v1/requests" && get) return HandleRequestList(CallerOf(req), std::move(ex), v);

  if (path == "/healthz" && get) return ex->Respond(JsonResponse(200, {{"status", "ok"}}, v));
  if (path == "/readyz" && get) {
    // The journal's health may probe the disk: off the I/O threads.
    return PostStatus([this, ex, v] { ex->Respond(ReadyResponse(v)); });
  }
  if (path == "/metrics" && get) {
    // It reads device telemetry (a ledger's lock, NVML): off the I/O threads.
    return PostStatus([this, ex, v] { ex->Respond(http::MakeResponse(200, RenderMetrics(), "text/plain; version=0.0.4", v)); });
  }
  if (path == "/v1/status" && get) return HandleStatusView(CallerOf(req), std::move(ex), v);
  if (path == "/v1/models" && get) {
    json data = json::array();
    for (const auto& s : config_.services) {
      data.push_back({{"id", s.name}, {"object", "model"}, {"created", 0}, {"owned_by", "spillway"}});
    }
    for (const auto& e : config_.externals) {
      json routes = json::array();
      for (const auto& r : e.routes) routes.push_back(r.first);
      data.push_back({{"id", e.name}, {"object", "model"}, {"created", 0}, {"owned_by", "external"}, {"routes", routes}});
    }
    return ex->Respond(JsonResponse(200, {{"object", "list"}, {"data", data}}, v));
  }
  static const std::string kRequests = "/v1/requests/";
  if (path.rfind(kRequests, 0) == 0 && (get || method == bhttp::verb::delete_)) {
    // Journal reads and a cancel's commit: off the I/O threads.
    // (Percent-decoded: a page encodes an id's ':' as %3A, and found no request.)
    return PostBlocking([this, id = PercentDecoded(path.substr(kRequests.size())), cancel = method == bhttp::verb::delete_,
                         caller = CallerOf(req), ex = std::move(ex), v] { HandleRequestQuery(id, cancel, caller, ex, v); });
  }
  if (api::IsOllamaPath(path)) return HandleOllama(req, std::move(ex), path);
  const char* endpoint = path == "/v1/chat/completions" ? "chat"
                         : path == "/v1/completions"    ? "completion"
                         : path == "/v1/embeddings"     ? "embedding"
                                                        : nullptr;
  // (Asked with another method, a route falls through to its 405: AllowedMethods.)
  if (endpoint && method == bhttp::verb::post) {
    if (auto fields = ExternalFieldsFor(req)) return HandleExternal(req, std::move(ex), path, std::move(fields));
    return HandleGeneration(req, std::move(ex), endpoint);
  }
  for (const auto& route : config::ExternalRoutes()) {
    if (path == route && method == bhttp::verb::post) return HandleExternal(req, std::move(ex), path);
  }
  if (const char* allow = AllowedMethods(path)) return ex->Respond(MethodNotAllowed(req.method_string(), path, allow, false, v));
  ex->Respond(ErrorResponse(Status::NotFound("no route for " + std::string(req.method_string()) + " " + path), v));
}

const char* internal::AllowedMethods(const std::string& path) {
  static const std::set<std::string> kPost = {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/api/chat",
                                              "/api/generate",        "/api/embed",      "/api/embeddings", "/api/show"};
  static const std::set<std::string> kGet = {"/v1/models", "/v1/status", "/v1/requests", "/metrics", "/healthz",
                                             "/readyz",    "/api/tags",  "/api/ps",      "/api/version"};
  if (kPost.count(path)) return "POST";
  for (const auto& route : config::ExternalRoutes()) {
    if (path == route) return "POST";
  }
  if (kGet.count(path) || IsUiPath(path)) return "GET, HEAD";
  if (path == "/v1/events") return "GET";  // (a stream: no HEAD)
  if (path.rfind("/v1/requests/", 0) == 0) return "GET, HEAD, DELETE";
  return nullptr;
}

api::JsonLimits internal::JsonLimitsOf(const config::GatewayConfig& config) {
  api::JsonLimits limits;
  limits.max_depth = static_cast<size_t>(config.json_max_depth);
  return limits;
}

StatusOr<json> Gateway::ParseBody(const http::Request& req, int extra_depth) const {
  api::JsonLimits limits = JsonLimitsOf(config_);
  limits.max_depth += static_cast<size_t>(extra_depth);
  return api::ParseJsonBody(req.body(), limits);
}

size_t Gateway::LiveRequests() const {
  std::lock_guard<std::mutex> lk(mu_);
  return live_.size();
}

size_t Gateway::CutForStop() {
  std::vector<std::shared_ptr<Live>> cut;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& [id, live] : live_) cut.push_back(live);
  }
  for (const auto& live : cut) Cancel(live, CancelCause::kStop);
  return cut.size();
}

Status Gateway::Intake(const http::Request& req, const std::string& peer, Incoming& in) {
  if (stopping_) return StoppingRefusal();
  // Sent twice, which one names the request is anyone's guess (the first
  // was taken, the second ignored in silence).
  for (const char* once : {"idempotency-key", "x-request-id", "x-request-timeout"}) {
    if (req.count(once) > 1) return Status::InvalidArgument(std::string("the header ") + once + " was sent more than once");
  }
  auto idem = req.find("idempotency-key");
  std::string key;
  if (idem != req.end()) {
    key = std::string(idem->value());
    if (key.empty() || key.size() > 255) return Status::InvalidArgument("Idempotency-Key must be 1 to 255 characters");
  }
  // A client may name its request (X-Request-Id), so it knows the id before
  // any answer arrives; a reused id is refused by the journal (409).
  if (auto rid = req.find("x-request-id"); rid == req.end()) {
    in.rec.id = NewRequestId();
  } else {
    const std::string given(rid->value());
    const bool valid = !given.empty() && given.size() <= 128 &&
                       given.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.:") ==
                           std::string::npos;
    if (!valid) return Status::InvalidArgument("X-Request-Id must be 1 to 128 of [A-Za-z0-9._:-]");
    in.rec.id = given;
    in.own_id = false;
  }
  in.rec.client = ClientOf(req);
  in.client_slot = TakeClientSlot(SlotOwner(in.rec.client, peer));
  if (!in.client_slot) {
    return Status::RateLimited(std::string(KeysRequired() ? "this API key" : "this client address") + " already has " +
                               std::to_string(config_.max_requests_per_key) +
                               " requests in flight (max_requests_per_key)").WithRetryAfter(1);
  }
  in.rec.idempotency_key = key;
  if (auto t = req.find("x-request-timeout"); t != req.end()) {
    const std::string text(t->value());
    // Decimal seconds only (strtod also took "0x10" as 16, "1e3", "inf").
    const bool decimal = !text.empty() && text.find_first_not_of("0123456789.") == std::string::npos &&
                         std::count(text.begin(), text.end(), '.') <= 1 && text != ".";
    char* end = nullptr;
    const double secs = decimal ? std::strtod(text.c_str(), &end) : 0;
    if (!decimal || *end || !(secs > 0) || secs * 1000 > kMaxRequestTimeoutMs) {
      return Status::InvalidArgument("X-Request-Timeout must be seconds in (0, 86400]");
    }
    in.timeout_ms = TimeoutMs(secs);
  }
  return Status::Ok();
}

void Gateway::HandleGeneration(http::Request& req, std::shared_ptr<http::Exchange> ex, const std::string& endpoint,
                               std::function<void()> on_accepted, int extra_depth) {
  const unsigned v = req.version();
  auto fail = [&](const Status& st) { ex->Respond(ErrorResponse(st, v)); };
  auto body = ParseBody(req, extra_depth);
  if (!body.ok()) return fail(body.status());
  // Internal fields (a continuation's delivered tokens) come only from the
  // gateway itself: a client's are dropped before anything reads them (a
  // malformed one was refused with 400, a well-formed one dropped).
  auto drop = [&](const char* name) { return api::Member(*body, name) && body->erase(name) > 0; };
  bool rewritten = drop("spillway_resume");
  rewritten |= drop("spillway_drop_messages");
  // Validate with the same parsers the worker uses, so bad input never
  // reaches the journal.
  std::string model;
  bool stream = false;
  std::optional<int32_t> max_tokens;
  if (endpoint == "chat") {
    auto r = api::ParseChatRequest(*body);
    if (!r.ok()) return fail(r.status());
    model = r->gen.model;
    stream = r->gen.stream;
    max_tokens = r->gen.max_tokens;
  } else if (endpoint == "completion") {
    auto r = api::ParseCompletionRequest(*body);
    if (!r.ok()) return fail(r.status());
    model = r->gen.model;
    stream = r->gen.stream;
    max_tokens = r->gen.max_tokens;
  } else {
    auto r = api::ParseEmbeddingRequest(*body);
    if (!r.ok()) return fail(r.status());
    model = r->model;
  }
  if (model.empty()) return fail(Status::InvalidArgument("'model' is required: it names a service (GET /v1/models)"));
  const config::ServiceConfig* svc = config_.FindService(model);
  if (!svc) return fail(Status::NotFound("no service named '" + model + "' (GET /v1/models lists them)"));
  if (max_tokens && *max_tokens > svc->max_tokens) {
    return fail(Status::InvalidArgument("'max_tokens' " + std::to_string(*max_tokens) + " exceeds the cap of service '" +
                                        svc->name + "' (" + std::to_string(svc->max_tokens) + ")"));
  }
  // Admission re-serializes the body for the worker, which may make it
  // longer than it came (nlohmann writes 1e9 as 1000000000.0: a body of
  // short floats grows threefold): one that would outgrow what a worker
  // takes is refused now, not by the worker after admission. (Measured only
  // for a large body: a small one cannot grow that far.)
  if (req.body().size() > config_.WorkerMaxBodyBytes() / 4) {
    const size_t forwarded = body->dump(-1, ' ', false, json::error_handler_t::replace).size();
    if (forwarded > config_.WorkerMaxBodyBytes()) {
      return fail(Status::PayloadTooLarge("the request as forwarded to the model (" + std::to_string(forwarded) +
                                          " bytes: its numbers written out in full) exceeds what a worker takes (" +
                                          std::to_string(config_.WorkerMaxBodyBytes()) + " bytes)"));
    }
  }
  auto in = std::make_shared<Incoming>();
  if (Status st = Intake(req, ex->peer_address(), *in); !st.ok()) return fail(st);
  in->rec.service = svc->name;
  in->rec.endpoint = endpoint;
  in->rec.stream = stream;
  // What tells a retry from another request under the same Idempotency-Key;
  // nothing compares it for a request without one.
  if (!in->rec.idempotency_key.empty()) in->rec.payload_hash = Sha256Hex(endpoint + "\n" + body->dump());
  // An unseeded generation gets its seed here, journaled with the body, so
  // that a replay on another placement (or after a crash) samples the same
  // tokens the first attempt would have.
  // As llama.cpp's chat layer in the worker reads it (a null it would refuse after admission is "unset").
  if (endpoint == "chat") rewritten |= api::NormalizeChatForWorker(&*body);
  std::optional<uint32_t> seed;
  const json* given_seed = api::Member(*body, "seed");
  const bool has_seed = given_seed != nullptr;
  if (endpoint != "embedding" && (!has_seed || given_seed->is_null() || api::IsNegativeSeed(*body))) {
    std::lock_guard<std::mutex> lk(mu_);
    seed = static_cast<uint32_t>(rng_() % 0xFFFFFFFFull);
  }
  // Only a seed to add (no such member at all): into the text as it came,
  // not a re-serialization of the whole body (a long chat's prompt).
  std::optional<std::string> seeded;
  if (seed && !rewritten && !has_seed) seeded = api::WithFirstMember(req.body(), "seed", std::to_string(*seed));
  if (seeded) {
    in->rec.body = std::move(*seeded);
  } else {
    if (seed) (*body)["seed"] = *seed;
    in->rec.body = rewritten || seed ? body->dump() : req.body();
  }
  // The same deadline as a body field, for clients that cannot set headers (the earlier of the two wins).
  if (const json* f = api::Member(*body, "spillway_timeout_s")) {
    if (!f->is_number() || !(f->get<double>() > 0) || f->get<double>() * 1000 > kMaxRequestTimeoutMs) {
      return fail(Status::InvalidArgument("spillway_timeout_s must be seconds in (0, 86400]"));
    }
    const int64_t ms = TimeoutMs(f->get<double>());
    in->timeout_ms = in->timeout_ms ? std::min(in->timeout_ms, ms) : ms;
  }
  in->ex = ex;
  in->version = v;
  in->started_ms = clock_.NowMs();
  in->on_accepted = std::move(on_accepted);
  // Accepted requests that have not started their first attempt are bounded.
  // Each other service keeps a share of that bound (max_queue / 2n of n
  // services) that this one's requests cannot take: a flood of one busy
  // service filled the queue every service shares, and every other
  // service's requests, idle ones too, got 503.
  int kept = 0;
  if (waiting_by_service_.size() > 1) {
    // (No floor: a max_queue under 2n keeps nothing, and never all of itself.)
    const int share = config_.max_queue / (2 * static_cast<int>(waiting_by_service_.size()));
    for (const auto& [name, n] : waiting_by_service_) {
      if (name != svc->name) kept += std::max(0, share - n->load());
    }
  }
  if (waiting_.fetch_add(1) + kept >= config_.max_queue) {
    --waiting_;
    return ex->Respond(ErrorResponse(Status::ResourceExhausted(
                                         "the gateway queue is full (" + std::to_string(config_.max_queue) +
                                         " requests waiting" +
                                         (kept ? ", " + std::to_string(kept) + " places of them kept for other services" : "") +
                                         ")")
                                         .WithRetryAfter(2),
                                     v, in->rec.id));
  }
  // And the service's own bound: a flood of one service's requests never
  // fills the queue every service shares.
  std::atomic<int>& mine = *waiting_by_service_.at(svc->name);
  if (svc->max_queue > 0 && mine.fetch_add(1) >= svc->max_queue) {
    --mine;
    --waiting_;
    return ex->Respond(ErrorResponse(Status::ResourceExhausted("service '" + svc->name + "' has " +
                                                               std::to_string(svc->max_queue) +
                                                               " requests waiting (its max_queue)")
                                         .WithRetryAfter(2),
                                     v, in->rec.id));
  }
  if (svc->max_queue <= 0) ++mine;
  in->queue_slot = QueuePlace(mine);
  // Started here, not posted: nothing of HandleGeneration's callers (the
  // HTTP session's handler, the Ollama translation) comes after this call.
  StartHere(Process(in), ex->executor());
}

boost::asio::awaitable<void> Gateway::Process(std::shared_ptr<Incoming> in) {
  const unsigned v = in->version;
  // A request with nothing to look up first (no idempotency key, an id of
  // the gateway's own making) goes on before the journal has it: Run writes
  // its Accept together with its first attempt when it is admitted at once
  // (one commit, overlapped with the worker's computing), and awaits that
  // commit before anything of the request reaches the client, so a client
  // never hears of a request the journal does not hold. Any other request
  // learns its Accept's outcome first (replay, conflict...).
  const bool unjournaled = in->rec.idempotency_key.empty() && in->own_id;
  // Live here before any row of it is written: a cancel that reads its row
  // finds it (DELETE /v1/requests/{id} reads the journal, then looks here).
  // An id some request here already uses is not taken over: its Accept is
  // refused below.
  // Journaled with the request: a restart keeps its deadline.
  if (in->timeout_ms) in->rec.deadline_ms = in->started_ms + in->timeout_ms;
  auto live = MakeLive(in->rec, in->started_ms);
  live->queue_slot = std::move(in->queue_slot);
  bool registered = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    registered = live_.emplace(live->id, live).second;
  }
  struct Unregister {
    Gateway* g;
    const std::shared_ptr<Live>& live;
    bool registered;
    ~Unregister() {
      if (!registered) return;
      std::lock_guard<std::mutex> lk(g->mu_);
      if (auto it = g->live_.find(live->id); it != g->live_.end() && it->second == live) g->live_.erase(it);
    }
  } unregister{this, live, registered};
  // An id a request here still runs under: refused before the journal sees
  // it (were this one's Accept to land first, its row would never end).
  if (!registered) {
    co_return in->ex->Respond(ErrorResponse(
        Status::Conflict("request id '" + in->rec.id + "' is in use by a request still running").WithRetryAfter(1), v,
        in->rec.id));
  }
  // The record Run takes: this one's own, or the journal's after its Accept.
  journal::RequestRecord* record = &in->rec;
  StatusOr<journal::AcceptResult> accepted = Status::Internal("not accepted yet");  // (both branches set it)
  if (unjournaled) {
    // A journal that refuses new requests refuses this one before it runs.
    if (Status st = journal_.Refusal(); !st.ok()) co_return in->ex->Respond(ErrorResponse(st, v, live->id));
    in->rec.created_ms = in->rec.updated_ms = clock_.NowMs();
    accepted = journal::AcceptResult{journal::AcceptOutcome::kNew, {}};  // (the record stays in `in`, not moved twice)
  } else {
    // Awaited, not run on the blocking pool: a keyed request holds no
    // thread while its transaction waits for the disk.
    auto result = std::make_shared<StatusOr<journal::AcceptResult>>(Status::Internal("not accepted"));
    (void)co_await Journaled([&](auto done) {
      journal_.AcceptAsync(std::move(in->rec), [result, done](StatusOr<journal::AcceptResult> r) {  // (its last use)
        *result = std::move(r);
        done(Status::Ok());
      });
    });
    accepted = std::move(*result);
    if (accepted.ok()) record = &accepted->existing;
  }
  if (!accepted.ok()) co_return in->ex->Respond(ErrorResponse(accepted.status(), v, live->id));
  const auto& old = accepted->existing;
  switch (accepted->outcome) {
    case journal::AcceptOutcome::kNew: break;
    case journal::AcceptOutcome::kMismatch:
      co_return in->ex->Respond(ErrorResponse(
          Status::Unprocessable("Idempotency-Key was used with a different request body (request " + old.id + ")"), v,
          old.id));  // (the request the key belongs to: this one's id was never recorded)
    case journal::AcceptOutcome::kInFlight:
      co_return in->ex->Respond(ErrorResponse(
          Status::Conflict("a request with this Idempotency-Key is still running (request " + old.id + ")").WithRetryAfter(1),
          v, old.id));
    case journal::AcceptOutcome::kReplay: {
      if (old.error == kAnswerNotKept) {
        co_return in->ex->Respond(ErrorResponse(
            Status::Conflict("the answer of request " + old.id + " was relayed whole but is too long to keep, so this "
                             "Idempotency-Key cannot replay it: send the request again with a new key"),
            v, old.id));
      }
      auto res = http::MakeResponse(static_cast<unsigned>(old.result_status ? old.result_status : 500), old.result_body,
                                    old.result_type.empty() ? "application/json" : old.result_type, v);
      res.set("X-Request-Id", old.id);
      res.set("Idempotent-Replayed", "true");
      // A degraded stream says again who served it (a whole answer's body does).
      if (auto served = ReplyWriter::StoredServedBy(old.result_body)) ReplyWriter::Describe(res, *served);
      ReplyWriter::DescribeStoredCuts(res, old.result_body);
      co_return in->ex->Respond(std::move(res));
    }
  }
  if (!in->refused_if_new.ok()) {
    // New after all: refused before any attempt, its end recorded (its key
    // binds nothing then: a retry may run).
    const Status st = in->refused_if_new;
    const std::string text = ErrorText(st, live->id);
    const Status ended = co_await Journaled([&](auto done) {
      journal_.FinishAsync(live->id, journal::State::kFailed, HttpStatusFor(st.code()), "application/json", text,
                           st.message(), done);
    });
    live->Enter(LivePhase::kTerminal, clock_.NowMs());
    if (!ended.ok()) {
      // Its Accept is on disk, its end is not: a restart would run it, and
      // its key answered "in flight" meanwhile. Told so, and its end
      // recorded once the journal writes again, as any unrecorded end.
      Logged(ended, "finish");
      const Status told = Unrecorded(ended, live->id, "that it was refused (" + st.message() + ")", "it has not run");
      Spawn(RecordEndWhenWritable(live->id, journal::State::kFailed, told), co_await boost::asio::this_coro::executor);
      co_return in->ex->Respond(ErrorResponse(told, v, live->id));
    }
    co_return in->ex->Respond(ErrorResponse(st, v, live->id));
  }
  if (in->on_accepted) in->on_accepted();
  std::weak_ptr<Live> weak = live;
  in->ex->OnDisconnect([this, weak] {
    if (auto l = weak.lock()) Cancel(l);
  });
  co_await Run(std::move(*record), in->ex, live, unjournaled);  // (`in` and `accepted` outlive it: this frame awaits it)
}

boost::asio::awaitable<void> Gateway::Run(journal::RequestRecord&& rec, std::shared_ptr<http::Exchange> ex,
                                          std::shared_ptr<Live> live, bool unjournaled) {
  // Interactive work while this frame lives, whatever ends it (OutsideWindow).
  struct Running {
    std::atomic<int>* n;
    ~Running() {
      if (n) --*n;
    }
  } running{CountRequest(rec.service) ? &interactive_running_ : nullptr};
  if (running.n) ++*running.n;
  if (config_.FindExternal(rec.service)) co_return co_await RunExternal(std::move(rec), std::move(ex), live, unjournaled);
  // Lives in this coroutine's frame until the request has ended.
  RequestLifecycle lifecycle(*this, std::move(rec), std::move(ex), std::move(live), unjournaled,
                             co_await boost::asio::this_coro::executor);
  co_await lifecycle.Run();
}

Status Gateway::Unrecorded(const Status& why, const std::string& id, std::string_view what,
                           std::string_view withheld) {
  return Status::Unavailable("the journal could not record " + std::string(what) + " (" + why.message() + "); " +
                             std::string(withheld) + ". " +
                             NotEndedAdvice("a restart before its end is recorded runs", id))
      .WithRetryAfter(std::max(why.retry_after_s(), 5))
      .WithReason(kAnswerWithheld);
}

void Gateway::WithholdUnrecorded(const Status& why, const std::string& id, ReplyWriter& reply,
                                 boost::asio::any_io_executor where) {
  Logged(why, "finish");
  const Status told = Unrecorded(why, id, "how the request ended", "its answer is withheld, since a crash could lose it");
  const bool sent = reply.head_sent();
  if (!sent) {
    reply.Error(told);
    reply.Detach();  // what the caller would have sent next is not sent
  } else {
    reply.Abort();  // a stream: it ends as cut, as it is recorded (its events went out already)
  }
  // Recorded as what the client heard (a stream: as cut, to resume); until
  // then its row says running, and a retry with its Idempotency-Key hears
  // it is in flight.
  Spawn(RecordEndWhenWritable(id, sent ? journal::State::kFailedResumable : journal::State::kFailed, told),
        std::move(where));
}

boost::asio::awaitable<void> Gateway::RecordEndWhenWritable(std::string id, journal::State state, Status told) {
  const std::string body = ErrorText(told, id);
  boost::asio::steady_timer timer(co_await boost::asio::this_coro::executor);
  while (true) {
    timer.expires_after(std::chrono::milliseconds(journal_.unwritable_retry_ms()));
    boost::system::error_code ec;
    co_await timer.async_wait(boost::asio::redirect_error(boost::asio::use_awaitable, ec));
    const Status st = co_await Journaled([&](auto done) {
      // (The status its client was told: 503 for a journal that could not write; a stream's other database error: 500.)
      journal_.FinishAsync(id, state, HttpStatusFor(told.code()), "application/json", body, told.message(), done);
    });
    if (st.ok()) co_return;
  }
}

void Gateway::Cancel(const std::shared_ptr<Live>& live, CancelCause cause) {
  CancelCause none = CancelCause::kNone;
  live->cancel_cause.compare_exchange_strong(none, cause);  // (before the flag: who sees it sees why)
  if (live->cancelled.exchange(true)) return;
  // A request waiting for capacity hears it now, wherever it stands in its
  // line, or as a plain waiter (a retry); a running one frees what it holds
  // when its attempt ends.
  if (live->phase.load() == LivePhase::kQueued) {
    if (auto it = signals_.find(live->service); it != signals_.end()) {
      it->second->WakeOne(live->LineWaiter());
      it->second->Notify();
    }
  }
  if (live->upstream_control) return live->upstream_control->Abort();  // its connection closes: the server sees it
  // Only to a worker that is there on that port: the DELETE carries the
  // workers' secret, and a dead worker's port may be another program's now.
  const uint16_t port = live->worker_port.load();
  bool worker_there = false;
  if (port) {
    for (const auto& w : supervisor_.Snapshot()) worker_there |= w.port == port && w.state == upstream::WorkerState::kReady;
  }
  if (worker_there && io_) {
    // Best effort, without blocking the caller (an I/O thread): a worker that
    // is gone has nothing left to cancel.
    Spawn([](Gateway* g, uint16_t p, std::string id) -> boost::asio::awaitable<void> {
      (void)co_await g->pool_.Send(p, "DELETE", std::string(protocol::kCancelPrefix) + id, "", g->supervisor_.AuthHeaders(),
                                   std::chrono::seconds(2));
    }(this, port, live->id));
  }
}

}  // namespace spillway::gateway
