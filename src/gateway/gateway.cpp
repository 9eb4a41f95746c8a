#include "gateway/gateway.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <thread>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/this_coro.hpp>

#include "api/http_client.h"
#include "api/json_text.h"
#include "api/openai_request.h"
#include "api/openai_response.h"
#include "admission/admission.h"
#include "common/hash.h"
#include "common/mutation.h"
#include "common/survive.h"
#include "failover/retry_policy.h"
#include "failover/stream_progress.h"
#include "gateway/attempt_runner.h"
#include "gateway/gateway_internal.h"
#include "gateway/reply_writer.h"
#include "gateway/readiness.h"
#include "protocol/worker_protocol.h"

namespace spillway::gateway {


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

void Gateway::Start(boost::asio::any_io_executor io, std::vector<journal::RequestRecord> recovered) {
  io_ = std::move(io);
  StartEvents();  // before the first transition: the journal tells the incident log
  for (auto& rec : recovered) {
    auto live = std::make_shared<Live>();
    live->id = rec.id;
    live->service = rec.service;
    live->client = rec.client;
    if (config_.FindExternal(rec.service)) live->upstream_control = std::make_shared<upstream::StreamControl>();
    {
      std::lock_guard<std::mutex> lk(mu_);
      live_[live->id] = live;
    }
    // Nothing answers a client: the result waits in the journal.
    Spawn([](Gateway* g, journal::RequestRecord r, std::shared_ptr<Live> l) -> boost::asio::awaitable<void> {
      co_await g->Run(r, nullptr, l);
      std::lock_guard<std::mutex> lk(g->mu_);
      g->live_.erase(r.id);
    }(this, std::move(rec), live));
  }
}

void Gateway::Shutdown() {
  StopEvents();  // ends the event streams (they hold I/O objects)
  status_pool_.join();
  blocking_.join();
  journal_.Flush();  // no commit's completion is left to reach a strand after this
  pool_.Clear();
  for (auto& [name, signal] : signals_) signal->NotifyAll();
}

void Gateway::Spawn(boost::asio::awaitable<void> task, boost::asio::any_io_executor where) {
  if (!where) where = boost::asio::make_strand(*io_);
  boost::asio::co_spawn(where, std::move(task), [](std::exception_ptr e) {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      std::fprintf(stderr, "spillway: a request's lifecycle failed: %s\n", x.what());
    } catch (...) {
      std::fprintf(stderr, "spillway: a request's lifecycle failed\n");
    }
  });
}

void Gateway::PostBlocking(std::function<void()> f) {
  boost::asio::post(blocking_, [f = std::move(f)] { RunSurviving("spillway: a blocking task", f); });
}

void Gateway::PostStatus(std::function<void()> f) {
  boost::asio::post(status_pool_, [f = std::move(f)] { RunSurviving("spillway: a status task", f); });
}

CapacitySignal& Gateway::SignalFor(const std::string& service) { return *signals_.at(service); }

void Gateway::WorkerReady(const std::string& key) {
  if (const auto* e = ExternalOfKey(config_, key)) signals_.at(e->name)->Notify();
  for (const auto& s : config_.services) {
    for (size_t i = 0; i < s.placements.size(); ++i) {
      if (WorkerKey(s, i) == key) signals_.at(s.name)->Notify();
    }
  }
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
      if (!supervised) why.push_back(s.placements[i].Name() + ": not started (see /v1/status)");
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
  const bool ready = missing.empty() && journal.ok();
  return JsonResponse(ready ? 200 : 503, {{"ready", ready}, {"not_ready", missing}, {"reasons", reasons}}, v);
}

void Gateway::Handle(http::Request req, std::shared_ptr<http::Exchange> ex) {
  const std::string target(req.target());
  const std::string path = target.substr(0, target.find('?'));
  const unsigned v = req.version();
  const auto method = req.method();
  const bool open_route = path == "/healthz" || path == "/readyz" || IsUiPath(path);  // the page asks for a key itself
  if (Status st = CheckAccess(req, !open_route); !st.ok()) return ex->Respond(ErrorResponse(st, v));
  if (IsUiPath(path) && method == bhttp::verb::get) return ex->Respond(UiResponse(path, v));
  if (path == "/v1/events" && method == bhttp::verb::get) return HandleEvents(CallerOf(req), std::move(ex), v);
  if (path == "/v1/requests" && method == bhttp::verb::get) return HandleRequestList(CallerOf(req), std::move(ex), v);

  if (path == "/healthz") return ex->Respond(JsonResponse(200, {{"status", "ok"}}, v));
  if (path == "/readyz") {
    // The journal's health may probe the disk: off the I/O threads.
    return PostStatus([this, ex, v] { ex->Respond(ReadyResponse(v)); });
  }
  if (path == "/metrics" && method == bhttp::verb::get) {
    // It reads device telemetry (a ledger's lock, NVML): off the I/O threads.
    return PostStatus([this, ex, v] { ex->Respond(http::MakeResponse(200, RenderMetrics(), "text/plain; version=0.0.4", v)); });
  }
  if (path == "/v1/status" && method == bhttp::verb::get) return HandleStatusView(CallerOf(req), std::move(ex), v);
  if (path == "/v1/models" && method == bhttp::verb::get) {
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
  if (path.rfind(kRequests, 0) == 0 && (method == bhttp::verb::get || method == bhttp::verb::delete_)) {
    // Journal reads and a cancel's commit: off the I/O threads.
    return PostBlocking([this, id = path.substr(kRequests.size()), cancel = method == bhttp::verb::delete_,
                         caller = CallerOf(req), ex = std::move(ex), v] { HandleRequestQuery(id, cancel, caller, ex, v); });
  }
  if (path.rfind("/api/", 0) == 0) return HandleOllama(req, std::move(ex), path);
  const char* endpoint = path == "/v1/chat/completions" ? "chat"
                         : path == "/v1/completions"    ? "completion"
                         : path == "/v1/embeddings"     ? "embedding"
                                                        : nullptr;
  if (endpoint) {
    if (method != bhttp::verb::post) return ex->Respond(ErrorResponse(Status::InvalidArgument("use POST for " + path), v));
    if (RoutesToExternal(req, path)) return HandleExternal(req, std::move(ex), path);
    return HandleGeneration(req, std::move(ex), endpoint);
  }
  for (const auto& route : config::ExternalRoutes()) {
    if (path == route) return HandleExternal(req, std::move(ex), path);
  }
  ex->Respond(ErrorResponse(Status::NotFound("no route for " + std::string(req.method_string()) + " " + path), v));
}

StatusOr<json> Gateway::ParseBody(const http::Request& req) const {
  api::JsonLimits limits;
  limits.max_depth = static_cast<size_t>(config_.json_max_depth);
  return api::ParseJsonBody(req.body(), limits);
}

Status Gateway::Intake(const http::Request& req, Incoming& in) {
  auto idem = req.find("idempotency-key");
  std::string key;
  if (idem != req.end()) {
    key = std::string(idem->value());
    if (key.empty() || key.size() > 255) return Status::InvalidArgument("Idempotency-Key must be 1 to 255 characters");
  }
  in.rec.id = NewRequestId();
  // A client may name its request (X-Request-Id), so it knows the id before
  // any answer arrives; a reused id is refused by the journal (409).
  if (auto rid = req.find("x-request-id"); rid != req.end()) {
    const std::string given(rid->value());
    const bool valid = !given.empty() && given.size() <= 128 &&
                       given.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.:") ==
                           std::string::npos;
    if (!valid) return Status::InvalidArgument("X-Request-Id must be 1 to 128 of [A-Za-z0-9._:-]");
    in.rec.id = given;
    in.own_id = false;
  }
  in.rec.client = ClientOf(req);
  in.client_slot = TakeClientSlot(in.rec.client);
  if (!in.client_slot) {
    return Status::RateLimited("this client already has " + std::to_string(config_.max_requests_per_key) +
                               " requests in flight (max_requests_per_key)").WithRetryAfter(1);
  }
  in.rec.idempotency_key = key;
  if (auto t = req.find("x-request-timeout"); t != req.end()) {
    const std::string text(t->value());
    char* end = nullptr;
    const double secs = std::strtod(text.c_str(), &end);
    if (text.empty() || *end || !(secs > 0) || secs > 86400) {
      return Status::InvalidArgument("X-Request-Timeout must be seconds in (0, 86400]");
    }
    in.timeout_ms = static_cast<int64_t>(secs * 1000);
  }
  return Status::Ok();
}

void Gateway::HandleGeneration(http::Request& req, std::shared_ptr<http::Exchange> ex, const std::string& endpoint) {
  const unsigned v = req.version();
  auto fail = [&](const Status& st) { ex->Respond(ErrorResponse(st, v)); };
  auto body = ParseBody(req);
  if (!body.ok()) return fail(body.status());
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
  auto in = std::make_shared<Incoming>();
  if (Status st = Intake(req, *in); !st.ok()) return fail(st);
  in->rec.service = svc->name;
  in->rec.endpoint = endpoint;
  in->rec.stream = stream;
  // What tells a retry from another request under the same Idempotency-Key;
  // nothing compares it for a request without one.
  if (!in->rec.idempotency_key.empty()) in->rec.payload_hash = Sha256Hex(endpoint + "\n" + body->dump());
  // An unseeded generation gets its seed here, journaled with the body, so
  // that a replay on another placement (or after a crash) samples the same
  // tokens the first attempt would have.
  // Internal fields (a continuation's delivered tokens) come only from the
  // gateway itself: a client's are dropped before the journal sees them.
  bool rewritten = body->erase("spillway_resume") > 0;
  std::optional<uint32_t> seed;
  const bool has_seed = body->contains("seed");
  if (endpoint != "embedding" && (!has_seed || (*body)["seed"].is_null())) {
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
  if (auto f = body->find("spillway_timeout_s"); f != body->end()) {
    if (!f->is_number() || !(f->get<double>() > 0) || f->get<double>() > 86400) {
      return fail(Status::InvalidArgument("spillway_timeout_s must be seconds in (0, 86400]"));
    }
    const auto ms = static_cast<int64_t>(f->get<double>() * 1000);
    in->timeout_ms = in->timeout_ms ? std::min(in->timeout_ms, ms) : ms;
  }
  in->ex = ex;
  in->version = v;
  in->started_ms = clock_.NowMs();
  // Accepted requests that have not started their first attempt are bounded.
  if (waiting_.fetch_add(1) >= config_.max_queue) {
    --waiting_;
    return fail(Status::ResourceExhausted("the gateway queue is full (" + std::to_string(config_.max_queue) +
                                          " requests waiting)").WithRetryAfter(2));
  }
  // And the service's own bound: a flood of one service's requests never
  // fills the queue every service shares.
  std::atomic<int>& mine = *waiting_by_service_.at(svc->name);
  if (svc->max_queue > 0 && mine.fetch_add(1) >= svc->max_queue) {
    --mine;
    --waiting_;
    return fail(Status::ResourceExhausted("service '" + svc->name + "' has " + std::to_string(svc->max_queue) +
                                          " requests waiting (its max_queue)").WithRetryAfter(2));
  }
  if (svc->max_queue <= 0) ++mine;
  in->queue_slot = std::shared_ptr<void>(nullptr, [this, &mine](void*) {
    --waiting_;
    --mine;
  });
  Spawn(Process(in), ex->executor());
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
  auto live = std::make_shared<Live>();
  live->id = in->rec.id;
  live->service = in->rec.service;
  live->client = in->rec.client;
  live->queue_slot = std::move(in->queue_slot);
  if (config_.FindExternal(in->rec.service)) live->upstream_control = std::make_shared<upstream::StreamControl>();
  live->Enter(LivePhase::kQueued, clock_.NowMs());
  if (in->timeout_ms) live->deadline_ms = in->started_ms + in->timeout_ms;
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
  StatusOr<journal::AcceptResult> accepted = journal::AcceptResult{journal::AcceptOutcome::kNew, in->rec};
  if (unjournaled) {
    // A journal that refuses new requests refuses this one before it runs.
    if (Status st = journal_.Refusal(); !st.ok()) co_return in->ex->Respond(ErrorResponse(st, v));
    accepted.value().existing.created_ms = accepted.value().existing.updated_ms = clock_.NowMs();
  } else {
    accepted = co_await Blocking([&] { return journal_.Accept(in->rec); });
  }
  if (!accepted.ok()) co_return in->ex->Respond(ErrorResponse(accepted.status(), v));
  const auto& old = accepted->existing;
  switch (accepted->outcome) {
    case journal::AcceptOutcome::kNew: break;
    case journal::AcceptOutcome::kMismatch:
      co_return in->ex->Respond(ErrorResponse(
          Status::Unprocessable("Idempotency-Key was used with a different request body (request " + old.id + ")"), v));
    case journal::AcceptOutcome::kInFlight:
      co_return in->ex->Respond(ErrorResponse(
          Status::Conflict("a request with this Idempotency-Key is still running (request " + old.id + ")").WithRetryAfter(1),
          v, old.id));
    case journal::AcceptOutcome::kReplay: {
      auto res = http::MakeResponse(static_cast<unsigned>(old.result_status ? old.result_status : 500), old.result_body,
                                    old.result_type.empty() ? "application/json" : old.result_type, v);
      res.set("X-Request-Id", old.id);
      res.set("Idempotent-Replayed", "true");
      co_return in->ex->Respond(std::move(res));
    }
  }
  std::weak_ptr<Live> weak = live;
  in->ex->OnDisconnect([this, weak] {
    if (auto l = weak.lock()) Cancel(l);
  });
  co_await Run(accepted->existing, in->ex, live, unjournaled);
}

boost::asio::awaitable<void> Gateway::Run(journal::RequestRecord rec, std::shared_ptr<http::Exchange> ex,
                                          std::shared_ptr<Live> live, bool unjournaled) {
  CountRequest(rec.service);
  if (config_.FindExternal(rec.service)) co_return co_await RunExternal(std::move(rec), std::move(ex), live, unjournaled);
  const boost::asio::any_io_executor strand = co_await boost::asio::this_coro::executor;
  const config::ServiceConfig* svc = config_.FindService(rec.service);
  const int64_t t0 = clock_.NowMs();
  const std::string path = protocol::GenerationPath(rec.endpoint);
  ReplyWriter reply(std::move(ex), rec.id, 11);
  std::string placement = svc ? svc->placements[0].Name() : "";
  Target target;
  // What an attempt holds (cells, its place on the CPU path) goes back whatever the outcome.
  auto release = [&] {
    if (svc) ReleaseTarget(rec.service, rec.id, &target);
  };
  struct Releaser {
    std::function<void()> f;
    ~Releaser() { f(); }
  } releaser{release};
  // A request not in the journal yet (see Process): its Accept is written
  // with its first attempt when it is admitted at once, or on its own before
  // anything else about it is journaled (a wait, a refusal). `accept` is that
  // write, awaited before anything of the request reaches the client.
  // Refused (the journal cannot write): the client hears why, and nothing
  // else of the request.
  std::shared_ptr<PendingStatus> accept;
  auto journal_accept = [&] {
    if (!unjournaled) return;
    unjournaled = false;
    accept = PendingStatus::Make(strand);
    journal_.AcceptAsync(rec, [done = accept->Completer()](StatusOr<journal::AcceptResult> r) { done(r.status()); });
  };
  auto accept_refused = [&]() -> boost::asio::awaitable<bool> {
    journal_accept();
    if (!accept) co_return false;
    const Status st = co_await accept->Wait();
    accept.reset();
    if (st.ok()) co_return false;
    reply.Error(st);
    reply.Detach();
    co_return true;
  };
  // The one place a request ends: the journal first, then (by the caller) the client.
  auto finish = [&](State state, int status, std::string type, std::string body,
                    std::string err) -> boost::asio::awaitable<void> {
    release();
    live->queue_slot.reset();
    if (!co_await accept_refused()) {
      Logged(co_await Journaled([&](auto done) { journal_.FinishAsync(rec.id, state, status, type, body, err, done); }),
             "finish");
    }
    live->Enter(LivePhase::kTerminal, clock_.NowMs());
    if (svc && svc->residency.priority == "interactive") last_interactive_ms_ = clock_.NowMs();
    metrics_.RequestFinished(rec.service, Outcome(state), placement, (clock_.NowMs() - t0) / 1000.0);
  };
  // A stream the client already has (it may have started while waiting) ends with an error event.
  auto end_stream_with_error = [&](State state, json error_body, std::string why) -> boost::asio::awaitable<void> {
    const std::string ev = reply.StoreFinalError(error_body);
    co_await finish(state, 200, "text/event-stream", reply.stored(), why);
    reply.SendFinal(ev);
  };
  auto fail = [&](State state, Status st) -> boost::asio::awaitable<void> {
    const json body = ErrorJson(st, rec.id);
    if (reply.head_sent()) co_return co_await end_stream_with_error(state, body, st.message());
    co_await finish(state, HttpStatusFor(st.code()), "application/json", body.dump(), st.message());
    reply.Error(st);
  };
  if (!svc) co_return co_await fail(State::kFailed, Status::NotFound("service '" + rec.service + "' is no longer configured"));
  // What the client already has of a stream, across attempts.
  failover::StreamProgress progress;

  auto past_deadline = [&] { return live->deadline_ms && clock_.NowMs() >= live->deadline_ms; };
  auto remaining = [&] {
    return std::chrono::milliseconds(live->deadline_ms ? std::max<int64_t>(1, live->deadline_ms - clock_.NowMs())
                                                       : int64_t{3600} * 1000);
  };
  auto deadline_failure = [&]() -> boost::asio::awaitable<void> {
    Cancel(live);  // stops the worker's generation, frees its slot
    live->cancelled = true;
    co_await fail(State::kFailed, Status::DeadlineExceeded("the request did not finish within its X-Request-Timeout"));
  };
  std::vector<bool> excluded(svc->placements.size(), false);
  int attempts = 0;
  double first_estimate_s = -1;  // the wait estimate when the request first had to wait
  bool busy_retry = false;  // the last send found the worker busy; its attempt stays open
  // What happens after an attempt is the pure policy's decision (failover/retry_policy.h).
  failover::RetryState retry{0, t0, live->deadline_ms};
  const failover::RetryBudget budget{kMaxAttempts, svc->admission.fail_fast, kQueueWaitMs};
  using Kind = failover::AttemptOutcome::Kind;
  using failover::Action;
  // A failed attempt (phase kNone: the worker died or could not be reached)
  // counts against the placement's breaker, this request stays away from that
  // placement, and a retry is journaled with the policy's reason.
  auto after_failure = [&](const AttemptResult& r) -> boost::asio::awaitable<failover::RetryDecision> {
    const std::string why = (r.outcome.delivered ? "mid-stream: " : "") + r.why;
    const failover::RetryDecision d = failover::NextStep(r.outcome, &retry, budget, clock_.NowMs());
    board_.AttemptFailed(rec.service, target.index, failover::FailureName(r.outcome.phase), why);
    excluded[target.index] = true;
    if (d.action == Action::kRetryElsewhere || d.action == Action::kContinueElsewhere) {
      const std::string note = why + " (" + d.reason + ")";
      Logged(co_await Journaled([&](auto done) { journal_.RequeueAsync(rec.id, note, done); }), "requeue");
      live->Enter(LivePhase::kQueued, clock_.NowMs());
    }
    co_return d;
  };
  // A full worker (nothing ran) is waited for, within the policy's bound
  // (and the request's deadline: past it, the deadline is the answer).
  auto after_busy = [&] {
    if (live->cancelled) return Action::kCancelled;
    const failover::AttemptOutcome busy{Kind::kBusy};
    return failover::NextStep(busy, &retry, budget, clock_.NowMs()).action;
  };
  // Who serves this attempt, as the answer's headers say. A declared
  // different fallback model is announced as what it is.
  auto served_by = [&] {
    const auto& p = svc->placements[target.index];
    ServedBy s;
    s.placement = placement;
    s.decision = target.decision;
    s.attempts = attempts;
    s.limits = target.limits;
    s.waited_ms = target.waited_ms;
    if (target.index != 0) s.degraded = "served by " + placement + " (" + p.role + ")";
    if (p.different_model) s.fallback_model = svc->ModelLabel(target.index);
    s.estimated_delay_s = first_estimate_s;
    return s;
  };
  // A stream the worker refused before its first event: the client hears the
  // worker's error, as an error event when its stream has begun.
  auto deliver_refusal = [&](const AttemptResult& r) -> boost::asio::awaitable<void> {
    if (r.outcome.delivered) {  // a continuation was refused: end the stream the client has
      co_return co_await end_stream_with_error(
          State::kFailedResumable, ErrorJson(Status::Unavailable("the continuation was refused: " + r.body), rec.id), r.body);
    }
    if (reply.head_sent()) {
      const json eb = json::parse(r.body, nullptr, false);
      const json error_event = eb.is_object() ? eb : ErrorJson(Status::Unavailable(r.body), rec.id);
      co_return co_await end_stream_with_error(r.stream_state, error_event, r.body);
    }
    co_await finish(r.stream_state, r.status, "application/json", r.body, r.body);
    reply.Answer(r.status, "application/json", r.body, nullptr);
  };
  AttemptRunner runner(pool_, reply, progress, live->cancelled,
                       [&] { live->Enter(LivePhase::kStreaming, clock_.NowMs()); }, kMaxUnsentBytes);
  while (true) {
    if (past_deadline()) co_return co_await deadline_failure();
    if (live->cancelled) co_return co_await fail(State::kCancelled, Status::Cancelled("request cancelled"));
    release();
    Status rejected;
    // A stream that waits long (for the CPU path, or for a replica to load)
    // starts early and hears why every wait_comment_s, as SSE comments.
    const int64_t comment_ms = static_cast<int64_t>(svc->cpu_path.wait_comment_s * 1000);
    int64_t last_comment_ms = clock_.NowMs();
    auto on_wait = [&](const std::string& note, double est_s) {
      journal_accept();  // a request that waits is in the journal meanwhile
      live->Waiting(note, est_s);
      if (first_estimate_s < 0 && !note.empty()) first_estimate_s = est_s;
      if (!rec.stream || !reply.attached() || note.empty()) return;
      if (accept && !(accept->result() && accept->result()->ok())) return;  // not before the Accept's commit
      const int64_t now = clock_.NowMs();
      if (now - last_comment_ms < comment_ms) return;
      last_comment_ms = now;
      reply.WaitingNote(note, est_s);
    };
    std::string reject_decision;
    if (!co_await Admit(rec, *svc, *live, excluded, &target, &rejected, &reject_decision, on_wait)) {
      if (!reject_decision.empty()) {
        journal_accept();
        Logged(co_await Journaled([&](auto done) { journal_.SetDecisionAsync(rec.id, reject_decision, done); }),
               "decision");
      }
      if (rejected.code() == StatusCode::kDeadlineExceeded) co_return co_await deadline_failure();
      if (rejected.code() == StatusCode::kCancelled) co_return co_await fail(State::kCancelled, rejected);
      co_return co_await fail(State::kFailed, rejected);
    }
    live->queue_slot.reset();  // running now: no longer among the waiting
    live->Enter(LivePhase::kRunning, clock_.NowMs());
    // A worker that answered "busy" is retried within the attempt already
    // journaled: waiting writes nothing (it used to write an attempt every 10 ms).
    const bool same_attempt = busy_retry && target.placement == placement;
    if (busy_retry && !same_attempt) {
      Logged(co_await Journaled([&](auto done) { journal_.RequeueAsync(rec.id, "worker busy", done); }), "requeue");
    }
    busy_retry = false;
    placement = target.placement;
    const std::string key = target.key;
    // The attempt is journaled before anything of it reaches the client and
    // before anything else about it is journaled. A non-streamed attempt's
    // commit runs while it is sent (the worker computes meanwhile) and is
    // awaited before its outcome is acted on; a stream's is awaited first,
    // since its events reach the client as they come.
    std::shared_ptr<PendingStatus> commit;
    if (!same_attempt) {  // (same_attempt: still running attempt `attempts` on `placement`)
      commit = PendingStatus::Make(strand);
      if (unjournaled) {  // admitted at once: the request and its attempt in one commit
        unjournaled = false;
        accept = commit;
        journal_.AcceptAndStartAsync(rec, placement, target.decision_json, commit->Completer());
      } else {
        journal_.StartAttemptAsync(rec.id, placement, target.decision_json, commit->Completer());
      }
    }
    // A refused commit: the journal cannot write (503, Retry-After; the
    // request stays queued in the journal and is run again after a restart),
    // or someone else cancelled or ended the request meanwhile.
    auto commit_refused = [&](const Status& st) -> boost::asio::awaitable<void> {
      if (co_await accept_refused()) co_return;  // (then the attempt was refused for want of its request)
      if (st.code() == StatusCode::kUnavailable) co_return reply.Error(st);
      if (reply.attached()) {
        auto r = co_await Blocking([&] { return journal_.Get(rec.id); });
        reply.Error(Status::Cancelled("request " + (r.ok() ? std::string(journal::StateName(r->state)) : "ended")));
      }
    };
    if (commit && rec.stream) {
      if (const Status st = co_await commit->Wait(); !st.ok()) co_return co_await commit_refused(st);
      commit.reset();
    }
    if (!same_attempt) ++attempts;
    if (attempts > 1 && MutationActive("fallback-drop-seed")) {  // deliberate bug, for tests only
      json b = json::parse(target.body, nullptr, false);
      if (b.is_object()) b.erase("seed");
      target.body = b.dump();
    }
    live->worker_port = target.port;
    if (live->cancelled) {
      if (commit) {
        if (const Status st = co_await commit->Wait(); !st.ok()) co_return co_await commit_refused(st);
      }
      continue;
    }

    AttemptSpec spec;
    spec.port = target.port;
    spec.path = path;
    spec.body = target.body;
    spec.headers = supervisor_.AuthHeaders();
    spec.headers.emplace_back("X-Request-Id", rec.id);
    spec.stream = rec.stream;
    spec.timeout = remaining();
    spec.served = served_by();
    spec.role = svc->placements[target.index].role;
    const AttemptResult r = co_await runner.Run(spec);
    if (commit) {  // the worker's answer waits for the commit that covers it
      // Refused: the worker's answer is dropped (nothing of it reached the client).
      if (const Status st = co_await commit->Wait(); !st.ok()) co_return co_await commit_refused(st);
    }

    switch (r.outcome.kind) {
      case Kind::kCancelled:
        co_return co_await fail(State::kCancelled, Status::Cancelled("request cancelled"));
      case Kind::kBusy: {
        const Action a = after_busy();
        if (a == Action::kDeadline) co_return co_await deadline_failure();
        if (a == Action::kCancelled) co_return co_await fail(State::kCancelled, Status::Cancelled("request cancelled"));
        if (a == Action::kWaitAndResend) {
          busy_retry = true;
          co_await SignalFor(rec.service).Wait(std::chrono::milliseconds(50));  // until a slot frees
          continue;
        }
        break;  // waited long enough: its 503 is the answer
      }
      case Kind::kFailed: {
        // A worker that timed out because the deadline passed is not the worker's failure.
        if (r.unreachable && past_deadline()) co_return co_await deadline_failure();
        if (r.unreachable) supervisor_.Suspect(key);
        const auto d = co_await after_failure(r);
        if (d.action == Action::kDeadline) co_return co_await deadline_failure();
        if (d.action == Action::kRetryElsewhere || d.action == Action::kContinueElsewhere) continue;
        if (r.head_refused) co_return co_await deliver_refusal(r);
        if (!rec.stream && r.unreachable) {
          co_return co_await fail(State::kFailed, Status::Unavailable("the worker failed " + std::to_string(retry.failures) +
                                                                      " times: " + r.why).WithRetryAfter(5));
        }
        if (!rec.stream) {  // the worker's own account of its failure is the answer
          co_await finish(State::kFailed, r.status, "application/json", r.body, r.body);
          co_return reply.Answer(r.status, "application/json", r.body, nullptr);
        }
        // A stream cut where no placement may continue it: never past delivered tool calls.
        const Status err = Status::Unavailable(
            "the stream failed (" + r.why + ") after " + std::to_string(progress.tokens().size()) + " delivered tokens; " +
            (progress.tool_calls_delivered() ? "tool calls were delivered, so it is not replayed past them"
                                             : "no placement could continue it") +
            "; resume from the checkpoint with the request id");
        if (!r.outcome.delivered) co_return co_await fail(State::kFailed, err);
        json ev = ErrorJson(err, rec.id);
        ev["error"]["checkpoint"] = {{"tokens_delivered", progress.tokens().size()},
                                    {"text_bytes", progress.text_bytes()},
                                    {"tool_calls_delivered", progress.tool_calls_delivered()}};
        co_return co_await end_stream_with_error(State::kFailedResumable, ev, err.message());
      }
      case Kind::kAnswered:
        break;
    }
    // The worker's answer (or a busy worker's 503, waited out) is the request's.
    if (r.head_refused) co_return co_await deliver_refusal(r);
    if (rec.stream) {
      if (r.stream_state == State::kCompleted) {
        board_.AttemptSucceeded(rec.service, target.index);
        RecordThroughput(rec.service, target.index, reply.stored());
      }
      const std::string err = r.stream_state == State::kCompleted ? "" : "stream ended with an error";
      co_await finish(r.stream_state, 200, "text/event-stream", reply.stored(), err);
      co_return reply.EndStream();
    }
    const State state = r.status < 300 ? State::kCompleted : r.status == 499 ? State::kCancelled : State::kFailed;
    std::string body = r.body;
    if (state == State::kCompleted) {
      board_.AttemptSucceeded(rec.service, target.index);
      // From the worker's header only: parsing a whole answer (an embedding's
      // vectors) for them cost more than the rest of the gateway's work.
      if (!r.timings.empty()) RecordThroughput(rec.service, target.index, "", r.timings);
      // A fallback model and the limits applied are said in the answer too.
      if (!spec.served.fallback_model.empty() || !target.limits.empty()) {
        json j = json::parse(body, nullptr, false);
        if (j.is_object()) {
          if (!spec.served.fallback_model.empty()) {
            j["model"] = spec.served.fallback_model;
            j["spillway"]["fallback_model"] = spec.served.fallback_model;
          }
          if (!target.limits.empty()) j["spillway"]["limits"] = target.limits;
          body = j.dump(-1, ' ', false, json::error_handler_t::replace);
        }
      }
    }
    const std::string err = state == State::kCompleted ? "" : body;  // (a named value: see Blocking's note on GCC 12)
    co_await finish(state, r.status, r.type, body, err);
    co_return reply.Answer(r.status, r.type, body, &spec.served, r.retry_after);
  }
}

void Gateway::Cancel(const std::shared_ptr<Live>& live) {
  if (live->cancelled.exchange(true)) return;
  // A request waiting for capacity hears it now, wherever it stands in its line.
  if (auto it = signals_.find(live->service); it != signals_.end()) it->second->NotifyAll();
  if (live->upstream_control) return live->upstream_control->Abort();  // its connection closes: the server sees it
  if (const uint16_t port = live->worker_port.load(); port && io_) {
    // Best effort, without blocking the caller (an I/O thread): a worker that
    // is gone has nothing left to cancel.
    Spawn([](Gateway* g, uint16_t p, std::string id) -> boost::asio::awaitable<void> {
      (void)co_await g->pool_.Send(p, "DELETE", std::string(protocol::kCancelPrefix) + id, "", g->supervisor_.AuthHeaders(),
                                   std::chrono::seconds(2));
    }(this, port, live->id));
  }
}

}  // namespace spillway::gateway
