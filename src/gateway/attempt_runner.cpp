#include "gateway/attempt_runner.h"

#include <nlohmann/json.hpp>

#include "api/openai_response.h"
#include "common/mutation.h"
#include "protocol/worker_protocol.h"

namespace spillway::gateway {

using Kind = failover::AttemptOutcome::Kind;
using nlohmann::json;

AttemptRunner::AttemptRunner(upstream::ConnectionPool& pool, ReplyWriter& reply, failover::StreamProgress& progress,
                             const std::atomic<bool>& cancelled, std::function<void()> on_first_event,
                             size_t max_unsent_bytes)
    : pool_(pool),
      reply_(reply),
      progress_(progress),
      cancelled_(cancelled),
      on_first_event_(std::move(on_first_event)),
      max_unsent_bytes_(max_unsent_bytes) {}

// (Not a coroutine: the one it returns is the attempt's, a frame less on its way.)
boost::asio::awaitable<AttemptResult> AttemptRunner::Run(const AttemptSpec& spec) {
  if (spec.stream) return Relay(spec);
  return Send(spec);
}

namespace {

AttemptResult Failed(FailurePhase phase, std::string why, bool unreachable) {
  AttemptResult r;
  r.outcome.kind = Kind::kFailed;
  r.outcome.phase = phase;
  r.why = std::move(why);
  r.unreachable = unreachable;
  return r;
}

AttemptResult Simple(Kind kind) {
  AttemptResult r;
  r.outcome.kind = kind;
  return r;
}

}  // namespace

boost::asio::awaitable<AttemptResult> AttemptRunner::Send(const AttemptSpec& spec) {
  auto r = co_await pool_.Send(spec.port, "POST", spec.path, spec.body, spec.headers, spec.timeout, spec.on_sent);
  // The worker died or stopped answering: nothing was delivered, so it is safe to run again.
  if (!r.ok()) {
    AttemptResult f = Failed(FailurePhase::kNone, r.status().message(), true);
    f.timed_out = r.status().code() == StatusCode::kDeadlineExceeded;
    f.deadline = spec.bounded && f.timed_out;
    co_return f;
  }
  const auto err = protocol::ParseWorkerError(r->status, r->body);
  if (err && err->placement_failure()) {
    // An allocation failure or a lost device: the worker's answer is kept in
    // case no other placement may take the request.
    AttemptResult f = Failed(err->phase, "phase " + std::string(FailurePhaseName(err->phase)) + ": " + r->body, false);
    f.status = r->status;
    f.body = r->body;
    co_return f;
  }
  // Cancelled meanwhile: whatever the worker said short of an answer, it ends cancelled.
  if (cancelled_ && r->status != 200) co_return Simple(Kind::kCancelled);
  // A busy worker's answer is kept too: it is the answer when waiting ends.
  AttemptResult a = Simple(err && err->busy() ? Kind::kBusy : Kind::kAnswered);
  a.status = r->status;
  if (!r->Header("content-type").empty()) a.type = r->Header("content-type");
  a.body = std::move(r->body);
  a.retry_after = r->Header("retry-after");
  a.timings = r->Header("x-spillway-timings");
  a.truncated_inputs = r->Header("x-spillway-truncated-inputs");
  a.dropped_messages = r->Header("x-spillway-dropped-messages");
  co_return a;
}

boost::asio::awaitable<AttemptResult> AttemptRunner::Relay(const AttemptSpec& spec) {
  std::string body = spec.body;
  const bool continuing = !progress_.tokens().empty();
  if (continuing) {
    json b = json::parse(spec.body, nullptr, false);
    b["spillway_resume"] = {{"tokens", progress_.tokens()}, {"text_bytes", progress_.text_bytes()}};
    if (!dropped_messages_.empty() && b.is_object() && !b.contains("spillway_drop_messages")) {
      b["spillway_drop_messages"] = std::atoi(dropped_messages_.c_str());
    }
    body = b.dump();
  }
  int status = 0;
  bool head_ok = false, noted = false;
  std::string pending, error_body, failed_phase;
  std::string refused;  // a continuation's error event: the worker would not continue the stream
  int relayed = 0;
  bool answering = false;  // this attempt's first event reached the client
  // [DONE] relayed: the client has the whole answer. A transport error after
  // it (the worker gone before its last chunk's terminator, a deadline
  // passing while a slow reader drains) is no failure of the stream's: it
  // was, and a continuation replayed its end or an error followed [DONE].
  bool done_relayed = false;
  // Cancelled while a slow reader held the relay back: what the worker wrote
  // before it stopped is not relayed (the client would go on receiving it,
  // and the slot stay taken, for as long as the reader took to drain it).
  bool stopped_for_cancel = false;
  // A slow reader: much is unsent to the client.
  auto backlogged = [&] { return reply_.unsent_bytes() > max_unsent_bytes_; };
  ServedBy served = spec.served;  // (and what the worker's head says: messages it dropped)
  auto begin = [&] {
    if (!reply_.events_started()) reply_.BeginStream(served, spec.role);
    if (answering) return;
    answering = true;
    if (on_first_event_) on_first_event_();
  };
  // Returns false to stop reading (a failure to act on).
  auto on_event = [&](const std::string& event) {
    std::string phase;
    const auto kind = progress_.Observe(event, &phase);
    if (kind == failover::StreamProgress::Event::kError && !phase.empty()) {
      failed_phase = phase;
      return false;  // an allocation failure or a lost device: move
    }
    if (kind == failover::StreamProgress::Event::kError && spec.cancel_cause &&
        spec.cancel_cause->load() == CancelCause::kStop && progress_.last_error()->cancelled()) {
      stopped_for_cancel = true;  // (the lifecycle's end says the gateway stopped)
      return false;
    }
    // A continuation the worker ends with an error of its own before any
    // new event (it could not reproduce what was delivered) is a refused
    // continuation, as one refused before its first event is: the stream ends resumable, with its
    // checkpoint, not with the worker's error passed on as the request's.
    if (kind == failover::StreamProgress::Event::kError && continuing && relayed == 0 && !cancelled_ &&
        !progress_.last_error()->cancelled()) {
      refused = event;
      return false;
    }
    begin();
    if (!noted) {
      // A continuation says where it went on and its limits there (a
      // fallback model's note alone left the new placement's limits unsaid).
      if (continuing) reply_.ContinuedOn(spec.served);
      else if (!spec.served.fallback_model.empty()) reply_.Comment("served by the fallback model " + spec.served.fallback_model);
      noted = true;
    }
    if (++relayed == 3 && MutationActive("relay-drop-chunk")) return true;  // deliberate bug, for tests only
    reply_.Event(event);
    if (kind == failover::StreamProgress::Event::kDone) done_relayed = true;
    return true;
  };
  progress_.ClearError();
  // A deadline bounds the whole relay: a worker that keeps writing (or
  // stalls) past it is cut then, not after its last token.
  upstream::StreamControl control;
  if (spec.bounded) control.deadline = std::chrono::steady_clock::now() + spec.timeout;
  const Status st = co_await pool_.Stream(
      spec.port, "POST", spec.path, body, spec.headers,
      [&](const http::StreamHead& h) {
        status = h.status;
        head_ok = status == 200;
        if (head_ok) {
          const auto d = h.headers.find("x-spillway-dropped-messages");
          if (d != h.headers.end()) served.dropped_messages = d->second;
          if (!continuing) dropped_messages_ = d != h.headers.end() ? d->second : "";  // (this attempt's, none included)
        }
        return true;
      },
      [&](std::string_view data) {
        if (!head_ok) {
          error_body.append(data);
          return true;
        }
        if (cancelled_ && backlogged()) {
          stopped_for_cancel = true;
          return false;
        }
        pending.append(data);
        size_t pos;
        while ((pos = pending.find("\n\n")) != std::string::npos) {
          const std::string event = pending.substr(0, pos + 2);
          pending.erase(0, pos + 2);
          if (!on_event(event)) return false;
        }
        return true;
      },
      spec.silence,
      // Not read while the client is behind (once cancelled it reads on, to stop).
      [&] { return !cancelled_ && reply_.attached() && !reply_.disconnected() && backlogged(); },
      spec.bounded ? &control : nullptr);
  if (stopped_for_cancel) co_return Simple(Kind::kCancelled);
  const bool delivered = reply_.events_started();
  if (!head_ok && st.ok()) {
    // The worker refused the stream before its first event.
    if (cancelled_ && !delivered) co_return Simple(Kind::kCancelled);
    const auto err = protocol::ParseWorkerError(status, error_body);
    AttemptResult a = err && err->placement_failure() ? Failed(err->phase, error_body, false)
                      : err && err->busy()               ? Simple(Kind::kBusy)
                                                         : Simple(Kind::kAnswered);
    a.outcome.delivered = delivered;
    a.outcome.continuable = progress_.Continuable();
    a.status = status;
    a.body = std::move(error_body);
    a.head_refused = true;
    a.stream_state = status == 499 ? journal::State::kCancelled : journal::State::kFailed;
    co_return a;
  }
  if (!refused.empty()) {
    AttemptResult a = Simple(Kind::kAnswered);
    a.head_refused = true;  // (as DeliverRefusal takes a continuation refused at its head)
    a.outcome.delivered = delivered;
    a.status = 200;
    a.body = progress_.last_error()->message;
    co_return a;
  }
  // The worker gone after its answer's last chunk (its finish_reason
  // relayed) but before [DONE]: the client has the whole answer. A
  // continuation would replay its end, a second finish_reason (or, ended
  // for its length, refuse with an error after a whole answer).
  const bool finish_relayed = !done_relayed && progress_.finished() && !st.ok() && failed_phase.empty();
  if ((!st.ok() && !done_relayed && !finish_relayed) || !failed_phase.empty()) {
    // The worker failed or vanished: before the first token a fresh run,
    // after it a continuation (the policy decides).
    const FailurePhase phase = failed_phase.empty() ? FailurePhase::kNone
                                                    : protocol::ParseFailurePhase(failed_phase).value_or(FailurePhase::kCompute);
    AttemptResult f = Failed(phase, !failed_phase.empty() ? "phase " + failed_phase : st.message(), !st.ok());
    f.deadline = control.expired();
    f.timed_out = failed_phase.empty() && st.code() == StatusCode::kDeadlineExceeded;
    f.outcome.delivered = delivered;
    f.outcome.continuable = progress_.Continuable();
    co_return f;
  }
  if (finish_relayed) {
    reply_.Event(std::string(api::kSseDone));  // (a cut event's part, in pending, is not the client's)
  } else if (!pending.empty()) {
    reply_.Event(pending);
  }
  begin();
  // The worker ends a stream with an error event when it failed or was cancelled.
  AttemptResult a = Simple(Kind::kAnswered);
  a.status = 200;
  a.type = "text/event-stream";
  const auto& stream_error = progress_.last_error();
  a.stream_state = !stream_error ? journal::State::kCompleted
                   : (cancelled_ || stream_error->cancelled()) ? journal::State::kCancelled
                                                               : journal::State::kFailed;
  if (stream_error) a.why = stream_error->message;  // (the journal's error for the request)
  co_return a;
}

}  // namespace spillway::gateway
