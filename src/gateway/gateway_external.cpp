// External services (config::ExternalConfig): requests proxied to an HTTP
// server Spillway starts or finds running, with the same lifecycle guarantees
// as a worker's: journaled before they are sent, answered after their
// terminal state is journaled (a relayed stream: as it arrives, journaled
// when it ends), cancellable, counted, queued in the service's own line.
//
//   phase     event                                                 journal
//   --------  ----------------------------------------------------  ---------------------
//   received  routed by its model; a place in the service's line    Accept (with its first
//   queued    waits: its turn, the server's start, transient room     attempt when it runs)
//   running   sent (the body byte for byte, its content type)       StartAttempt
//   running   failed before the server could act on it, or the      Requeue, then again
//             service is idempotent: sent again (at most 3 tries)
//   any       answered, failed, cancelled, past its deadline         Finish, then the client
//
// A request that reached a non-idempotent server and failed is never sent
// again, here or after a restart: it fails with 502 and says so.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>

#include <boost/asio/this_coro.hpp>

#include "common/hash.h"
#include "devices/telemetry.h"
#include "gateway/external_route.h"
#include "gateway/gateway.h"
#include "gateway/gateway_internal.h"
#include "gateway/reply_writer.h"
#include "memory/ledger.h"

namespace spillway::gateway {

namespace {

// A room check begun (ExternalLines::BeginRoomCheck): ended once, by End or,
// should the coroutine end another way (an exception, its frame destroyed),
// by the destructor as "not taken". Waiters are woken only when the room was
// taken (a failed check woke the other request waiting for room, whose own
// failed check woke this one: telemetry read back to back); a request
// waiting for the check to end looks again within 20 ms.
class RoomCheck {
 public:
  // `wake`: wakes the requests waiting on the device (of every external service there).
  RoomCheck(ExternalLines& lines, std::function<void()> wake, std::string service)
      : lines_(lines), wake_(std::move(wake)), service_(std::move(service)) {}
  RoomCheck(const RoomCheck&) = delete;
  RoomCheck& operator=(const RoomCheck&) = delete;
  ~RoomCheck() { End(false); }
  void End(bool took) {
    if (ended_) return;
    ended_ = true;
    lines_.EndRoomCheck(service_, took);
    if (took) wake_();
  }

 private:
  ExternalLines& lines_;
  std::function<void()> wake_;
  std::string service_;
  bool ended_ = false;
};

// Only a service with a declared peak on an accelerator has room to check.
bool NeedsRoomCheck(const config::ExternalConfig& svc) { return svc.transient_mib > 0 && svc.device != "cpu"; }

constexpr size_t kMaxAnswerBytes = 64u << 20;  // a buffered (journaled, then sent) answer
constexpr int kMaxExternalAttempts = 3;

// Answers relayed as they arrive (journaled once they end): events, lines, audio.
bool RelayedType(std::string type) {
  for (char& c : type) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));  // (media types ignore case)
  return type.rfind("text/event-stream", 0) == 0 || type.rfind("application/x-ndjson", 0) == 0 ||
         type.rfind("audio/", 0) == 0;
}

// One attempt at an external service: the request sent, its answer relayed
// to the client as it comes (events, lines, audio) or kept whole.
struct ExternalAnswer {
  Status sent;  // the transport's outcome
  int status = 0;
  std::string type, body;  // body: a kept answer (a relayed one is in the reply's store)
  bool relayed = false;
  bool too_large = false;  // past kMaxAnswerBytes: reading stopped
  bool cut = false;        // cancelled while its answer was read: reading stopped
  std::string retry_after;  // the server's Retry-After (a 429 or 503 of its own), passed on
};

boost::asio::awaitable<ExternalAnswer> SendExternal(upstream::ConnectionPool& pool, const Clock& clock,
                                                    const journal::RequestRecord& rec, const config::ExternalConfig& svc,
                                                    uint16_t port, const std::string& path,
                                                    const std::atomic<bool>& cancelled, int64_t deadline_ms,
                                                    const std::function<void()>& on_relay, ReplyWriter& reply,
                                                    const ServedBy& served, upstream::StreamControl& control) {
  ExternalAnswer a;
  http::HeaderList headers = {{"Content-Type", rec.body_type.empty() ? "application/json" : rec.body_type},
                              {"X-Request-Id", rec.id}};
  if (deadline_ms) {  // what is left of it, for a server that heeds it
    const double left_s = static_cast<double>(TimeLeft(deadline_ms, clock.NowMs(), INT64_MAX).count()) / 1000;
    char text[32];
    std::snprintf(text, sizeof text, "%.3f", left_s);
    headers.emplace_back("X-Request-Timeout", text);
  }
  auto on_head = [&](const http::StreamHead& h) {
    a.status = h.status;
    // (101 Switching Protocols, or no HTTP status: nothing of it is read or relayed,
    // and its connection, in another protocol now, is dropped; RunExternal answers 502.)
    if (h.status < 200 || h.status > 599) return false;
    auto t = h.headers.find("content-type");
    a.type = t == h.headers.end() ? "application/octet-stream" : t->second;
    if (auto r = h.headers.find("retry-after"); r != h.headers.end() && r->second.size() <= 64) a.retry_after = r->second;
    // (2xx with a body: a 204 relayed as a chunked stream sent its client a
    // body it must not have, read as the next answer on its connection.)
    a.relayed = RelayedType(a.type) && a.status >= 200 && a.status < 300 && a.status != 204 && a.status != 205;
    if (a.relayed) {
      on_relay();
      reply.BeginRelay(a.status, a.type, served);
      reply.BoundStored(kMaxAnswerBytes);  // relayed whole, kept (journaled) up to the cap
    }
    return true;
  };
  auto on_data = [&](std::string_view d) {
    if (cancelled) {
      a.cut = true;
      return false;
    }
    if (a.body.size() + d.size() > kMaxAnswerBytes) {
      a.too_large = true;
      return false;
    }
    if (a.relayed) {
      reply.Event(std::string(d));
      return true;
    }
    a.body.append(d);
    return true;
  };
  auto paused = [&] { return reply.unsent_bytes() > kMaxUnsentBytes; };
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(svc.request_timeout_s * 1000));
  // X-Request-Timeout bounds the whole attempt, a relayed answer included.
  if (deadline_ms) {
    control.deadline =
        std::chrono::steady_clock::now() + TimeLeft(deadline_ms, clock.NowMs(), kMaxRequestTimeoutMs);
  }
  control.ipv6 = svc.url.rfind("http://[::1]:", 0) == 0;  // (127.0.0.1 and localhost: IPv4)
  a.sent = co_await pool.Stream(port, "POST", path, rec.body, headers, on_head, on_data, timeout, paused, &control);
  co_return a;
}

}  // namespace

std::string ExternalKey(const config::ExternalConfig& e) { return e.name + ".ext"; }

const config::ExternalConfig* ExternalOfKey(const config::GatewayConfig& config, const std::string& key) {
  for (const auto& e : config.externals) {
    if (ExternalKey(e) == key) return &e;
  }
  return nullptr;
}

std::optional<KeyOwner> OwnerOfKey(const config::GatewayConfig& cfg, const std::string& key) {
  KeyOwner o;
  if (FindPlacement(cfg, key, &o.svc, &o.index)) {
    o.service = o.svc->name;
    o.device = o.svc->placements[o.index].device;
    o.residency = &o.svc->residency;
    return o;
  }
  if ((o.external = ExternalOfKey(cfg, key))) {
    o.service = o.external->name;
    o.device = o.external->device;
    o.residency = &o.external->residency;
    return o;
  }
  return std::nullopt;
}

std::optional<uint16_t> Gateway::ExternalPort(const config::ExternalConfig& e) const {
  if (!e.Started()) return e.UrlPort();
  return supervisor_.ReadyPort(ExternalKey(e));
}

std::optional<RequestedFields> Gateway::ExternalFieldsFor(const http::Request& req) const {
  if (config_.externals.empty()) return std::nullopt;
  auto fields = ReadRequestedFields(std::string(req[bhttp::field::content_type]), req.body(), JsonLimitsOf(config_));
  if (!fields.ok()) return std::nullopt;
  // No model named, and no model of Spillway's own serves the route: an
  // external's (ChooseExternal takes the only one, or says several do).
  // It was a 400 ("'model' is required") where one external serves it.
  if (fields->model.empty() ? !config_.services.empty() : !config_.FindExternal(fields->model)) return std::nullopt;
  return std::move(*fields);
}

void Gateway::HandleExternal(http::Request& req, std::shared_ptr<http::Exchange> ex, const std::string& path,
                             std::optional<RequestedFields> fields) {
  const unsigned v = req.version();
  auto fail = [&](const Status& st) { ex->Respond(ErrorResponse(st, v)); };
  const std::string type(req[bhttp::field::content_type]);
  if (!fields) {
    auto read = ReadRequestedFields(type, req.body(), JsonLimitsOf(config_));
    if (!read.ok()) return fail(read.status());
    fields = std::move(*read);
  }
  auto svc = ChooseExternal(config_, path, fields->model);
  if (!svc.ok()) return fail(svc.status());
  auto in = std::make_shared<Incoming>();
  if (Status st = Intake(req, ex->peer_address(), *in); !st.ok()) return fail(st);
  in->rec.service = (*svc)->name;
  // With its query string, forwarded as sent (options some servers take
  // there were dropped) and journaled with it (a re-run after a restart
  // sends it too).
  const std::string target(req.target());
  const size_t query = target.find('?');
  in->rec.endpoint = path + (query == std::string::npos ? "" : target.substr(query));
  in->rec.body_type = type.empty() ? "application/json" : type;
  in->rec.body = req.body();
  // What tells a retry from another request under the same Idempotency-Key
  // (a copy and a hash of the whole upload: only when a key asks for it).
  if (!in->rec.idempotency_key.empty()) {
    in->rec.payload_hash = Sha256Hex(in->rec.endpoint + "\n" + PayloadForHash(in->rec.body_type, in->rec.body));
  }
  // Forwarded untouched: a "stream" that is not true (null, "true", 1) is the server's to judge.
  in->rec.stream = fields->stream;
  in->ex = ex;
  in->version = v;
  in->started_ms = clock_.NowMs();
  if (!external_lines_->Join(in->rec.service, in->rec.id)) {
    const Status full = Status::ResourceExhausted("service '" + in->rec.service + "' has " +
                                                  std::to_string((*svc)->max_queue) + " requests waiting (its max_queue)")
                            .WithRetryAfter(2);
    // A retry under its Idempotency-Key may be a replay of a stored answer,
    // which the line's bound does not concern: it was refused 503 while the
    // line was full. Refused still if it turns out new (its key left free).
    if (in->rec.idempotency_key.empty()) return fail(full);
    (void)external_lines_->Join(in->rec.service, in->rec.id, /*past_bound=*/true);
    in->refused_if_new = full;
  }
  const std::string service = in->rec.service, id = in->rec.id;
  in->queue_slot = std::shared_ptr<void>(nullptr, [this, service, id](void*) { external_lines_->Leave(service, id); });
  Spawn(Process(in), in->ex->executor());
}

boost::asio::awaitable<void> Gateway::RunExternal(journal::RequestRecord rec, std::shared_ptr<http::Exchange> ex,
                                                  std::shared_ptr<Live> live, bool unjournaled) {
  const boost::asio::any_io_executor strand = co_await boost::asio::this_coro::executor;
  const config::ExternalConfig* svc = config_.FindExternal(rec.service);
  const int64_t t0 = clock_.NowMs();
  ReplyWriter reply(std::move(ex), rec.id, 11);
  const bool recovered = !reply.attached();
  bool running = false;    // holds a running place in the service's line
  bool took_room = false;  // ... and was sent with room on the device for its peak
  // A frame that ends by an exception (a bad_alloc building an answer)
  // gives its running place and room back too, as `finish` does: they were
  // held for good, and with concurrency 1 every later request waited.
  struct GiveBackPlace {
    Gateway* g;
    const config::ExternalConfig* svc;
    const std::string& service;
    const bool& running;
    const bool& took_room;
    ~GiveBackPlace() {
      if (!running) return;
      g->external_lines_->Finished(service, "failed", g->clock_.NowMs(), took_room);
      if (svc) g->WakeDevicePeers(*svc);
    }
  } give_back{this, svc, rec.service, running, took_room};
  auto control = live->upstream_control;
  if (!control) control = live->upstream_control = std::make_shared<upstream::StreamControl>();
  // A recovered request was never given a place in line (its client is
  // gone): it gets one whatever max_queue says (all of them join while the
  // server starts; those past the bound never had a turn and failed at 60 s).
  if (recovered && svc) (void)external_lines_->Join(rec.service, rec.id, /*past_bound=*/true);
  struct LeaveLine {
    ExternalLines* lines;
    const std::string& service;
    const std::string& id;
    ~LeaveLine() { lines->Leave(service, id); }
  } leave_line{external_lines_.get(), rec.service, rec.id};

  auto finish = [&](State state, int status, std::string type, std::string body,
                    std::string err) -> boost::asio::awaitable<void> {
    live->queue_slot.reset();
    if (unjournaled) {  // refused before it was journaled: nothing to finish
      co_return;
    }
    const Status ended =
        co_await Journaled([&](auto done) { journal_.FinishAsync(rec.id, state, status, type, body, err, done); });
    // Journal first, then the client, as a generation's (a relayed answer has gone out already).
    if (!ended.ok()) WithholdUnrecorded(ended, rec.id, reply, strand);
    live->Enter(LivePhase::kTerminal, clock_.NowMs());
    if (svc && svc->residency.priority == "interactive") last_interactive_ms_ = clock_.NowMs();
    if (running) external_lines_->Finished(rec.service, Outcome(state), clock_.NowMs(), took_room);
    running = took_room = false;
    // (Its room, and its place: other services on the device may wait for the one, this one's line for the other.)
    if (svc) WakeDevicePeers(*svc);
    else SignalFor(rec.service).Notify();
    const std::string key = svc ? ExternalKey(*svc) : "";
    metrics_.RequestFinished(rec.service, Outcome(state), key, key, (clock_.NowMs() - t0) / 1000.0);
  };
  auto fail = [&](State state, Status st) -> boost::asio::awaitable<void> {
    co_await finish(state, HttpStatusFor(st.code()), "application/json", ErrorText(st, rec.id), st.message());
    // A relayed answer cut short ends as cut: a clean end would pass it for whole.
    if (reply.head_sent()) co_return reply.Abort();
    reply.Error(st);
  };
  if (!svc) co_return co_await fail(State::kFailed, Status::NotFound("service '" + rec.service + "' is no longer configured"));
  // Journaled before anything is sent: the Accept now when this request is new to the journal.
  if (unjournaled) {
    auto accepted = co_await Journaled([&](auto done) {
      journal_.AcceptAsync(rec, [done](StatusOr<journal::AcceptResult> r) { done(r.status()); });
    });
    if (!accepted.ok()) co_return reply.Error(accepted);
    unjournaled = false;
  }
  // (Queued after attempts when the gateway stopped: requeued because none
  // reached the server, so it is sent.)
  if (recovered && rec.attempts > 0 && rec.interrupted && !svc->idempotent) {
    co_return co_await fail(State::kFailed,
                            Status::Unavailable("the gateway restarted while this request was at service '" + svc->name +
                                                "', which is not idempotent: it is not sent again"));
  }
  const std::string key = ExternalKey(*svc);
  const size_t query = rec.endpoint.find('?');  // (the route is the path's; the query goes on as sent)
  const std::string upstream_path = svc->UpstreamPath(rec.endpoint.substr(0, query)) +
                                    (query == std::string::npos ? "" : rec.endpoint.substr(query));
  ServedBy served;
  served.placement = svc->name;
  served.decision = "external";
  int attempts = rec.attempts;
  int failed_after_sending = 0;  // attempts that reached the server and failed (an idempotent service's are sent again)
  int64_t unreached_since = 0;   // when attempts began to fail before reaching the server (0: they do not)
  int unreached = 0;
  std::string last_failure;
  // Cut by the gateway's stop (CutForStop), it ends as the next start would
  // find it (as a generation's: RequestLifecycle::EndForStop). Recovered
  // (no client): left as it is. Not sent this time: refused, to be sent
  // again. Sent to an idempotent server, nothing of its answer relayed: its
  // answer is withheld and the next start sends it again. Otherwise (a
  // server that is not idempotent, an answer relayed in part) it fails.
  auto stopped = [&](bool sent_to_server) -> boost::asio::awaitable<void> {
    const std::string what = kStoppedByGrace;
    if (!reply.attached()) {
      live->queue_slot.reset();
      live->Enter(LivePhase::kTerminal, clock_.NowMs());
      co_return;
    }
    if (!sent_to_server) {
      // (One that had an attempt keeps its Idempotency-Key bound to this end.)
      std::string again = "send it again once it is back";
      if (attempts > 0) again = "send it again (with a new Idempotency-Key if it had one) once it is back";
      co_return co_await fail(State::kFailed, Status::Unavailable(what + " before the request reached service '" +
                                                                  svc->name + "'; " + again)
                                                  .WithRetryAfter(5));
    }
    if (reply.head_sent() || rec.stream || !svc->idempotent) {
      // (No ?: between two strings here: GCC 12 destroys such a temporary twice in a coroutine.)
      std::string why = "its answer was cut";
      if (!reply.head_sent()) why = "a stream is not sent again";
      if (!reply.head_sent() && !svc->idempotent) why = "the service is not idempotent, so it is not sent again";
      co_return co_await fail(State::kFailed, Status::Unavailable(what + " while service '" + svc->name +
                                                                  "' had the request, which it may have acted on; " +
                                                                  why)
                                                  .WithReason(kMayHaveRun));
    }
    live->queue_slot.reset();
    reply.Error(StopWithheld("service '" + svc->name + "' had the request", rec.id, "the next start sends"));
    live->Enter(LivePhase::kTerminal, clock_.NowMs());
    metrics_.RequestFinished(rec.service, Outcome(State::kFailed), ExternalKey(*svc), ExternalKey(*svc),
                             (clock_.NowMs() - t0) / 1000.0);
  };
  while (true) {
    // Its turn, a server that is up, and room on its device for the request's transient peak.
    const StatusOr<uint16_t> port = co_await AwaitExternalTurn(rec, *svc, *live, &running, &took_room);
    if (!port.ok()) {
      if (live->cancel_cause == CancelCause::kStop) co_return co_await stopped(/*sent_to_server=*/false);
      co_return co_await fail(port.status().code() == StatusCode::kCancelled ? State::kCancelled : State::kFailed,
                              port.status());
    }
    if (served.waited_ms == 0) served.waited_ms = clock_.NowMs() - t0;
    live->Enter(LivePhase::kRunning, clock_.NowMs());
    live->Attempting(svc->name, ++attempts);
    served.attempts = attempts;
    if (Status st = co_await Journaled([&](auto done) { journal_.StartAttemptAsync(rec.id, svc->name, "", done); });
        !st.ok()) {
      co_return co_await fail(State::kFailed, st);
    }
    // One attempt: the answer relayed or buffered.
    control->sent = false;
    control->connected = false;
    control->fresh_connection = !svc->idempotent;
    const std::function<void()> streaming = [&] { live->Enter(LivePhase::kStreaming, clock_.NowMs()); };
    const ExternalAnswer a = co_await SendExternal(pool_, clock_, rec, *svc, *port, upstream_path, live->cancelled,
                                                   live->deadline_ms, streaming, reply, served, *control);
    const Status& sent = a.sent;
    const int status = a.status;
    const std::string& type = a.type;
    const std::string& body = a.body;
    const bool relay = a.relayed, too_large = a.too_large;
    // Past this point a request a server that is not idempotent received
    // whole may have been acted on: its error says so (may_have_run, with
    // X-Should-Retry: false, so that an OpenAI SDK does not send it again).
    const bool may_have_run = control->sent && !svc->idempotent;
    if (control->expired()) {  // the deadline's, not the server's failure: not suspected, not sent again
      Status st = DeadlinePassed();
      if (may_have_run) st = st.WithReason(kMayHaveRun);
      co_return co_await fail(State::kFailed, st);
    }
    // (An answer read whole before the stop's cut is the request's answer.)
    const bool whole = sent.ok() && status > 0 && !a.cut && !too_large;
    if ((live->cancelled || sent.code() == StatusCode::kCancelled) &&
        !(whole && live->cancel_cause == CancelCause::kStop)) {
      if (live->cancel_cause == CancelCause::kStop) co_return co_await stopped(control->sent);
      co_return co_await fail(State::kCancelled, Status::Cancelled("request cancelled"));
    }
    if (too_large) {
      // (The server did the work: a 502, not a 503 that says to try again.)
      Status st = Status::BadGateway("the answer of service '" + svc->name + "' exceeds " +
                                     std::to_string(kMaxAnswerBytes >> 20) + " MiB");
      if (may_have_run) st = st.WithReason(kMayHaveRun);
      co_return co_await fail(State::kFailed, st);
    }
    // Not an HTTP answer to a request (101 Switching Protocols, or a status
    // outside 200-599): nothing to relay as one.
    if (sent.ok() && status > 0 && (status < 200 || status > 599)) {
      Status st = Status::BadGateway("service '" + svc->name + "' answered with status " + std::to_string(status) +
                                     ", not a final HTTP answer");
      if (may_have_run) st = st.WithReason(kMayHaveRun);
      co_return co_await fail(State::kFailed, st);
    }
    external_lines_->NoteReach(rec.service, (sent.ok() && status > 0) || control->connected, sent.message(),
                               clock_.NowMs());
    if (sent.ok() && status > 0) {
      if (relay) {
        const State state = State::kCompleted;
        // Past its bound only a note of it is kept: its Idempotency-Key cannot replay it.
        const std::string err = reply.stored_whole() ? "" : std::string(kAnswerNotKept);
        co_await finish(state, status, type, reply.stored(), err);
        co_return reply.EndStream();
      }
      const State state = status < 400 ? State::kCompleted : State::kFailed;
      const std::string err = state == State::kCompleted ? "" : body.substr(0, 1000);
      co_await finish(state, status, type, body, err);
      co_return reply.Answer(status, type, body, &served, a.retry_after);
    }
    // The transport failed. Sent again only when the server cannot have
    // acted on it, or acting twice is harmless, and nothing reached the client.
    last_failure = sent.message();
    if (svc->Started()) supervisor_.Suspect(key);
    if (reply.events_started()) {  // (a request recovered after a restart relays with no client, no head)
      co_return co_await fail(State::kFailed, Status::Unavailable("the answer of service '" + svc->name +
                                                                  "' was cut: " + last_failure));
    }
    if (control->sent && !svc->idempotent) {
      co_return co_await fail(State::kFailed,
                              Status::BadGateway("service '" + svc->name + "' failed after the request reached it (" +
                                                 last_failure + "); it is not idempotent, so it is not sent again")
                                  .WithReason(kMayHaveRun));
    }
    // One that reached the server counts towards the resends; one that
    // never did (refused: the server restarts, its backlog is full) waits,
    // backing off, for as long as the server may take to start.
    std::chrono::milliseconds backoff(200);  // a health check sees it meanwhile
    if (control->sent || control->connected) {
      unreached_since = 0;
      unreached = 0;
      if (++failed_after_sending >= kMaxExternalAttempts) {
        co_return co_await fail(State::kFailed, Status::BadGateway("service '" + svc->name + "' failed " +
                                                                   std::to_string(failed_after_sending) + " times: " +
                                                                   last_failure).WithRetryAfter(5));
      }
    } else {
      const int64_t now = clock_.NowMs();
      if (unreached_since == 0) unreached_since = now;
      // The server's streak, not only this request's: one known down for
      // minutes (a `url` has no health checks to say so) held each new
      // request, with its running place, for a whole start_timeout_s, the
      // line failing one batch of `concurrency` at a time.
      if (const int64_t line_since = external_lines_->Unreachable(rec.service).first; line_since > 0) {
        unreached_since = std::min(unreached_since, line_since);
      }
      if (now - unreached_since > static_cast<int64_t>(svc->start_timeout_s * 1000)) {
        co_return co_await fail(State::kFailed,
                                Status::BadGateway("service '" + svc->name + "' could not be reached for " +
                                                   std::to_string((now - unreached_since) / 1000) +
                                                   " s (its start_timeout_s): " + last_failure).WithRetryAfter(5));
      }
      backoff = std::chrono::milliseconds(std::min<int64_t>(2000, int64_t{200} << std::min(unreached++, 4)));
    }
    Logged(co_await Journaled([&](auto done) { journal_.RequeueAsync(rec.id, last_failure, done); }), "requeue");
    live->Enter(LivePhase::kQueued, clock_.NowMs());
    // Queued again, told why: it waits out its backoff (it read as waiting
    // for a turn, with no reason).
    char in_s[16];
    std::snprintf(in_s, sizeof in_s, "%.1f", backoff.count() / 1000.0);
    live->Waiting("service '" + svc->name + "' " +
                      (control->sent || control->connected ? "failed" : "could not be reached") + " (" +
                      last_failure + "); trying again in " + in_s + " s",
                  backoff.count() / 1000.0);
    // (Cancelled while the requeue was written: its turn's wait says so at once, not after the backoff.)
    if (!live->cancelled) {
      co_await SignalFor(rec.service).Wait(TimeLeft(live->deadline_ms, clock_.NowMs(), backoff.count()));
    }
  }
}

boost::asio::awaitable<StatusOr<uint16_t>> Gateway::AwaitExternalTurn(const journal::RequestRecord& rec,
                                                                      const config::ExternalConfig& svc, Live& live,
                                                                      bool* running, bool* took_room) {
  const std::string key = ExternalKey(svc);
  const int64_t start_wait_ms = static_cast<int64_t>(svc.start_timeout_s * 1000) + kExternalStartSlackMs;
  // Since when its server has been down (this streak): a start is waited
  // for that long, counted from when the server went, not from when the
  // request came (one that waited its turn for minutes, then saw its server
  // unloaded for another, failed as "did not start" at once).
  int64_t down_since = 0;
  // Since when it has waited, the server up, for something other than its
  // turn (the server giving its room away, device memory for its peak):
  // capped at 60 s. Its place in line is bounded by max_queue and its
  // deadline only: a request told "position 12" behind 3-minute
  // transcriptions is not dropped at 60 s.
  int64_t held_since = 0;
  while (true) {
    if (live.cancelled) co_return Status::Cancelled("request cancelled");
    if (live.PastDeadline(clock_.NowMs())) co_return DeadlinePassed();
    // A batch server outside its window is held off the accelerator, and it
    // has no CPU path: told when to come back (a window may be hours away).
    std::string window;
    int opens_in_s = 0;
    if (svc.device != "cpu" && !*running && OutsideWindow(svc.residency, &window, &opens_in_s)) {
      co_return Status::ResourceExhausted("service '" + svc.name + "' is " + window +
                                          " (an external service has no CPU path to serve it meanwhile)")
          .WithRetryAfter(std::max(1, opens_in_s));
    }
    std::string note;
    const std::optional<uint16_t> port = ExternalPort(svc);
    if (port && held_since > 0 && clock_.NowMs() - held_since > kQueueWaitMs) {
      co_return Status::ResourceExhausted("waited " + std::to_string(kQueueWaitMs / 1000) + " s: " + live.WaitState().first)
          .WithRetryAfter(5);
    }
    bool held = false;  // (this round: waiting for something other than its turn)
    if (!port && down_since == 0) down_since = clock_.NowMs();
    if (port) down_since = 0;
    if (!port) {
      supervisor_.Demand(key);  // stopped (on demand, or idle past keep_alive_s): started now
      note = "service '" + svc.name + "' is starting";
      if (clock_.NowMs() - down_since > start_wait_ms) {
        std::string why;
        for (const auto& w : supervisor_.Snapshot()) {
          if (w.key == key) why = w.HowItEnded();
        }
        co_return Status::Unavailable("service '" + svc.name + "' did not start" + (why.empty() ? "" : " (" + why + ")"))
            .WithRetryAfter(5);
      }
    } else if (!*running && Evicting(key)) {
      // It gives its room to another service: nothing new starts on it, so
      // that it goes idle and unloads (then this request starts it again,
      // once there is room).
      note = "service '" + svc.name + "' is unloading to give its room to another service";
      held = true;
    } else if (!*running &&
               !external_lines_->TryStart(rec.service, rec.id, clock_.NowMs(), [&] { return ExternalPort(svc) == port; })) {
      note = "waiting for service '" + svc.name + "' (position " +
             std::to_string(external_lines_->Position(rec.service, rec.id)) + ")";
    } else {
      *running = true;
      live.queue_slot.reset();
      if (*took_room) co_return *port;  // (sent again: it holds its room)
      if (!NeedsRoomCheck(svc)) co_return *port;
      if (!external_lines_->BeginRoomCheck(rec.service)) {
        // (Another request's check is under way, which ends in one telemetry
        // read, or a load's start gate, which may wait seconds for a
        // victim's release. Held: one that never ends is bounded by the 60 s cap.)
        if (held_since == 0) held_since = clock_.NowMs();
        live.Waiting("waiting for service '" + svc.name + "' (another room check on " + svc.device + ")", 0);
        co_await SignalFor(rec.service).Wait(std::chrono::milliseconds(20));
        continue;
      }
      // (The device's telemetry is read on the blocking pool: a driver call may be slow.)
      RoomCheck check(*external_lines_, [this, s = &svc] { WakeDevicePeers(*s); },
                      rec.service);  // (ended however this frame ends)
      const Status room = co_await Blocking([this, s = &svc] { return TransientRoom(*s); });
      check.End(room.ok());
      if (room.ok()) {
        *took_room = true;
        co_return *port;
      }
      note = room.message();
      held = true;
    }
    if (!held) held_since = 0;
    else if (held_since == 0) held_since = clock_.NowMs();
    live.Waiting(note, 0);
    co_await SignalFor(rec.service).Wait(std::chrono::milliseconds(port ? 250 : 100));
  }
}

void Gateway::WakeDevicePeers(const config::ExternalConfig& svc) {
  for (const auto& e : config_.externals) {
    if (e.name == svc.name || (svc.device != "cpu" && e.device == svc.device)) SignalFor(e.name).Notify();
  }
}

// Room on the service's device for one more request's transient peak: the
// device's observed free memory, less its headroom and the peaks of the
// requests already running there (which may not have allocated yet).
Status Gateway::TransientRoom(const config::ExternalConfig& svc) {
  if (!NeedsRoomCheck(svc)) return Status::Ok();
  auto telemetry = Telemetry(svc.device);
  if (!telemetry.ok()) return Status::Ok();  // not observable: nothing to check against
  auto reading = (*telemetry)->Read();
  if (!reading.ok()) return Status::Ok();
  const auto dc = config_.Device(svc.device);
  const uint64_t headroom = HeadroomOf(dc).For(reading->total);
  const uint64_t peak = PeakOf(svc);
  // The peaks of the requests already sent on the device, of this service
  // and of the others there (not of those that wait for room as this one
  // does), less what they hold already: they may not have allocated yet. And what servers still loading
  // there will take beyond what they hold now: the start gate let them
  // load on memory that reads free until they have.
  const auto workers = supervisor_.Snapshot();
  const uint64_t others = SentPeaksOn(svc.device, *reading, workers);
  const uint64_t loading = LoadingBytesOn(svc.device, *reading, workers);
  const uint64_t need = peak + others + loading + headroom;
  if (reading->free >= need) return Status::Ok();
  char note[360];
  std::snprintf(note, sizeof note,
                "waiting for %.0f MiB free on %s: a request's peak of %.0f MiB, %.0f MiB for the peaks of requests "
                "already sent there, %.0f MiB for servers still loading there and %.0f MiB headroom (%.0f MiB free)",
                static_cast<double>(need) / (1 << 20), svc.device.c_str(), static_cast<double>(peak) / (1 << 20),
                static_cast<double>(others) / (1 << 20), static_cast<double>(loading) / (1 << 20),
                static_cast<double>(headroom) / (1 << 20), static_cast<double>(reading->free) / (1 << 20));
  return Status::ResourceExhausted(note);
}

uint64_t Gateway::PeakOf(const config::ExternalConfig& e) const {
  const uint64_t measured = external_lines_->Measured(e.name).second;
  return measured > 0 ? measured : static_cast<uint64_t>(e.transient_mib * 1024 * 1024);
}

uint64_t Gateway::SentPeaksOn(const std::string& device, const devices::DeviceReading& reading,
                              const std::vector<upstream::WorkerView>& workers) const {
  uint64_t bytes = 0;
  for (const auto& [name, takers] : external_lines_->RoomTakersOn(device)) {
    const auto* e = config_.FindExternal(name);
    if (!e) continue;
    uint64_t outstanding = PeakOf(*e) * static_cast<uint64_t>(takers);
    // What its requests hold already (its group's bytes above its size at
    // rest) is in the reading's used memory: not counted a second time.
    for (const auto& w : workers) {
      if (w.key != ExternalKey(*e) || w.pid <= 0) continue;
      const uint64_t held = reading.BytesOfGroup(w.pid), rest = ExternalResidentBytes(*e);
      if (held > rest) outstanding -= std::min(outstanding, held - rest);
    }
    bytes += outstanding;
  }
  return bytes;
}

uint64_t Gateway::LoadingBytesOn(const std::string& device, const devices::DeviceReading& reading,
                                 const std::vector<upstream::WorkerView>& workers) const {
  auto device_of = [&](const std::string& key) -> std::string {
    const config::ServiceConfig* s = nullptr;
    size_t k = 0;
    if (FindPlacement(config_, key, &s, &k)) return s->placements[k].device;
    const auto* e = ExternalOfKey(config_, key);
    return e ? e->device : "";
  };
  uint64_t bytes = 0;
  for (const auto& w : workers) {
    if (w.state != upstream::WorkerState::kStarting || w.pid <= 0 || device_of(w.key) != device) continue;
    const uint64_t expected = ExpectedBytes(w.key), held = reading.BytesOfGroup(w.pid);
    if (expected > held) bytes += expected - held;
  }
  // And the starts the gate let through whose process is not there yet (a
  // supervisor round spawns after its last gate call, which may wait seconds
  // for another's release): they hold nothing yet and will take it all. A
  // request's room check counted on that memory.
  for (const auto& key : PendingStarts(workers)) {
    if (device_of(key) == device) bytes += ExpectedBytes(key);
  }
  return bytes;
}

uint64_t Gateway::ExternalResidentBytes(const config::ExternalConfig& e) const {
  const uint64_t measured = external_lines_->Measured(e.name).first;
  return measured > 0 ? measured : static_cast<uint64_t>(e.resident_mib * 1024 * 1024);
}

json Gateway::ExternalsJson() const {
  const auto workers = supervisor_.Snapshot();
  json out = json::array();
  for (const auto& e : config_.externals) {
    json j = {{"name", e.name}, {"kind", "external"}, {"device", e.device}, {"idempotent", e.idempotent}};
    json routes = json::object();
    for (const auto& [from, to] : e.routes) routes[from] = to;
    j["routes"] = routes;
    pid_t pid = 0;
    uint64_t rss = 0;  // as the supervisor last sampled it
    if (e.Started()) {
      j["residency"] = e.residency.mode;
      j["priority"] = e.residency.priority;
      j["keep_alive_s"] = e.residency.keep_alive_s;
      j["state"] = "stopped";
      for (const auto& w : workers) {
        if (w.key != ExternalKey(e)) continue;
        pid = w.pid;
        rss = w.rss_bytes;
        j["key"] = w.key;
        j["state"] = upstream::WorkerStateName(w.state);
        j["pid"] = w.pid;
        j["port"] = w.port;
        j["starts"] = w.starts;  // loads: each switch onto the device
        j["restarts"] = w.restarts;
        j["last_exit"] = w.last_exit;
        if (!w.last_error.empty()) j["last_error"] = w.last_error;
        if (w.last_start_ms > 0) j["measured_load_s"] = static_cast<double>(w.last_start_ms) / 1000;
        j["log"] = w.log_path;
      }
    } else {
      j["url"] = e.url;
      // Not Spillway's to start or stop, nor health-checked: what its last
      // request found says whether it is there.
      const auto [since, why] = external_lines_->Unreachable(e.name);
      j["state"] = since > 0 ? "unreachable" : "external";
      if (since > 0) {
        j["last_error"] = why;
        j["unreachable_s"] = static_cast<double>(clock_.NowMs() - since) / 1000;
      }
    }
    // Memory: what its process group holds on its device and in host RAM, measured;
    // the declared profile until then.
    uint64_t device_bytes = 0;
    if (pid > 0 && e.device != "cpu") {
      if (auto t = Telemetry(e.device); t.ok()) {
        if (auto r = (*t)->Read(); r.ok()) device_bytes = r->BytesOfGroup(pid);  // (it leads its group)
      }
      if (j["state"] == "ready") external_lines_->Observe(e.name, pid, device_bytes);  // (not while it loads)
    }
    const auto [resident, peak] = external_lines_->Measured(e.name);
    const auto mib = [](double m) { return static_cast<uint64_t>(m * 1024 * 1024); };
    j["memory"] = {{"device_bytes", device_bytes},
                   {"host_rss_bytes", rss},
                   {"resident_bytes", resident > 0 ? resident : mib(e.resident_mib)},
                   {"resident_source", resident > 0 ? "measured" : "declared"},
                   {"transient_peak_bytes", peak > 0 ? peak : mib(e.transient_mib)},
                   {"transient_source", peak > 0 ? "measured" : "declared"}};
    j["requests"] = external_lines_->Json(e.name, clock_.NowMs());
    out.push_back(j);
  }
  return out;
}

}  // namespace spillway::gateway
