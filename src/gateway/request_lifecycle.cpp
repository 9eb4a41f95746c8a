#include "gateway/request_lifecycle.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "common/mutation.h"
#include "gateway/request_admission.h"
#include "protocol/worker_protocol.h"

namespace spillway::gateway {

using nlohmann::json;
using Kind = failover::AttemptOutcome::Kind;
using failover::Action;

RequestLifecycle::RequestLifecycle(Gateway& g, journal::RequestRecord&& rec, std::shared_ptr<http::Exchange> ex,
                                   std::shared_ptr<Gateway::Live> live, bool unjournaled,
                                   boost::asio::any_io_executor strand)
    : g_(g),
      rec_(std::move(rec)),
      live_(std::move(live)),
      unjournaled_(unjournaled),
      recovered_(ex == nullptr),
      strand_(std::move(strand)),
      svc_(g.config_.FindService(rec_.service)),
      t0_(g.clock_.NowMs()),
      path_(protocol::GenerationPath(rec_.endpoint)),
      reply_(std::move(ex), rec_.id, 11),
      placement_(svc_ ? svc_->placements[0].Name() : ""),
      runner_(g.pool_, reply_, progress_, live_->cancelled,
              [this] {
                live_->began = true;
                live_->Enter(LivePhase::kStreaming, g_.clock_.NowMs());
                if (svc_) g_.FirstEvent(rec_.service, rec_.id, target_);
              },
              kMaxUnsentBytes),
      excluded_(svc_ ? svc_->placements.size() : 0, false),
      retry_{0, 0, live_->deadline_ms},
      budget_{kMaxAttempts, svc_ && svc_->admission.fail_fast, kQueueWaitMs} {
  progress_.set_tool_calls_held(reply_.holds_tool_calls());
}

// After the client's answer went out (its send is synchronous when the
// socket takes it: ReplyWriter, http_server.cpp): what only the gateway
// shows of a request's end is done here, off the answer's way.
RequestLifecycle::~RequestLifecycle() {
  Release();
  if (!ended_) return;
  const int64_t now = g_.clock_.NowMs();
  live_->Enter(LivePhase::kTerminal, now);
  if (svc_ && svc_->residency.priority == "interactive") g_.last_interactive_ms_ = now;
  g_.metrics_.RequestFinished(rec_.service, Outcome(*ended_), placement_, placement_key_, (now - t0_) / 1000.0);
}

void RequestLifecycle::Release(bool keep_cpu_turn) {
  if (svc_) g_.ReleaseTarget(rec_.service, rec_.id, &target_, keep_cpu_turn);
}

// A request not in the journal yet (see Process): its Accept is written with
// its first attempt when it is admitted at once, or on its own before
// anything else about it is journaled (a wait, a refusal). Refused (the
// journal cannot write): the client hears why, and nothing else of the request.
void RequestLifecycle::JournalAccept() {
  if (!unjournaled_) return;
  unjournaled_ = false;
  accept_ = PendingStatus::Make(strand_);
  // Refused while the request waits (in line, for a replica): it stops
  // waiting at once. It held its place, then ran on a worker, and only then
  // heard the refusal it could have heard at the start.
  CapacitySignal* signal = svc_ ? &g_.SignalFor(rec_.service) : nullptr;
  g_.journal_.AcceptAsync(rec_, [done = accept_->Completer(), live = live_, signal](StatusOr<journal::AcceptResult> r) {
    const bool refused = !r.ok();
    if (refused) live->accept_refused = true;
    done(r.status());
    if (refused && signal) signal->NotifyAll();
  });
}

bool RequestLifecycle::Deferred(const std::shared_ptr<PendingStatus>& commit) const {
  return commit && commit == accept_ && accept_deferred_;
}

void RequestLifecycle::SyncIfDeferred(const std::shared_ptr<PendingStatus>& commit) {
  if (Deferred(commit) && !commit->result()) g_.journal_.SyncNow();
}

bool RequestLifecycle::AcceptDurable() {
  JournalAccept();
  if (accept_ && accept_->result() && accept_->result()->ok()) accept_.reset();
  return !accept_;
}

boost::asio::awaitable<bool> RequestLifecycle::AcceptRefused() {
  if (AcceptDurable()) co_return false;
  SyncIfDeferred(accept_);
  const Status st = co_await accept_->Wait();
  accept_.reset();
  if (st.ok()) co_return false;
  reply_.Error(st);
  reply_.Detach();
  live_->Enter(LivePhase::kTerminal, g_.clock_.NowMs());
  g_.metrics_.RequestFinished(rec_.service, Outcome(State::kFailed), placement_, placement_key_,
                              (g_.clock_.NowMs() - t0_) / 1000.0);
  co_return true;
}

boost::asio::awaitable<void> RequestLifecycle::Finish(State state, int status, std::string type, std::string body,
                                                      std::string err) {
  // What the attempt held goes back before the client hears its answer: a
  // client's next request, sent the moment it has it, finds the slot and
  // the cells free. (Given back after the send, a next request on another
  // connection found them held while this thread was preempted, and could
  // be sent elsewhere.)
  Release();
  live_->queue_slot.reset();
  if (Deferred(accept_) && !accept_->result()) {
    // The request's record waits in the log for this one, whose sync makes
    // both durable (one fdatasync for the request at FULL); nothing of the
    // request reached anyone before. Refused: the end's record, if written,
    // ends a request the journal never had, and changes nothing.
    auto end = PendingStatus::Make(strand_);
    g_.journal_.FinishAsync(rec_.id, state, status, type, body, err, end->Completer());
    const Status accepted = co_await accept_->Wait();
    accept_.reset();
    const Status ended = co_await end->Wait();
    if (!accepted.ok()) {
      reply_.Error(accepted);
      reply_.Detach();
    } else if (!ended.ok()) {
      g_.WithholdUnrecorded(ended, rec_.id, reply_, strand_);
    }
  } else {
    // (Durable already: no coroutine to run for it. Not `a && co_await b`:
    // no co_await inside a condition's short circuit, as with ?: in GCC 12.)
    if (!AcceptDurable()) {
      if (co_await AcceptRefused()) co_return;  // (ended there, and counted: once, not again below)
    }
    // (As Journaled does, without its coroutine: at NORMAL the record is written at once.)
    auto end = PendingStatus::Make(strand_);
    g_.journal_.FinishAsync(rec_.id, state, status, type, body, err, end->Completer());
    Status ended;
    if (end->result()) {
      ended = *end->result();
    } else {
      ended = co_await end->Wait();
    }
    if (!ended.ok()) g_.WithholdUnrecorded(ended, rec_.id, reply_, strand_);
  }
  // Its phase (terminal) and its count follow the answer (the destructor).
  ended_ = state;
}

boost::asio::awaitable<void> RequestLifecycle::EndStreamWithError(State state, json error_body, std::string why,
                                                                  int refused) {
  const std::string ev = reply_.StoreFinalError(error_body);
  const int recorded = refused == 400 || refused == 413 ? refused : 200;
  co_await Finish(state, recorded, "text/event-stream", reply_.stored(), why);
  reply_.SendFinal(ev);
}

boost::asio::awaitable<void> RequestLifecycle::Fail(State state, Status st) {
  if (state == State::kCancelled && live_->cancel_cause == CancelCause::kStop) co_return co_await EndForStop();
  if (reply_.head_sent()) {
    co_return co_await EndStreamWithError(state, ErrorJson(st, rec_.id), st.message(), HttpStatusFor(st.code()));
  }
  co_await Finish(state, HttpStatusFor(st.code()), "application/json", ErrorText(st, rec_.id), st.message());
  reply_.Error(st);
}

bool RequestLifecycle::PastDeadline() const { return live_->PastDeadline(g_.clock_.NowMs()); }

std::chrono::milliseconds RequestLifecycle::Remaining() const {
  // A deadline bounds the attempt alone; the gateway's bound on an answer is
  // for a request without one (capped by it, X-Request-Timeout: 7200 ended
  // 504 "past its deadline" at an hour, an hour early).
  if (!live_->deadline_ms) return g_.attempt_bounds_.answer;
  return TimeLeft(live_->deadline_ms, g_.clock_.NowMs(), kMaxRequestTimeoutMs);
}

boost::asio::awaitable<void> RequestLifecycle::DeadlineFailure() {
  g_.Cancel(live_);  // stops the worker's generation, frees its slot
  live_->cancelled = true;
  co_await Fail(State::kFailed, DeadlinePassed());
}

// A failed attempt (phase kNone: the worker died or could not be reached)
// counts against the placement's breaker, this request stays away from that
// placement, and a retry is journaled with the policy's reason.
boost::asio::awaitable<failover::RetryDecision> RequestLifecycle::AfterFailure(const AttemptResult& r) {
  const std::string why = (r.outcome.delivered ? "mid-stream: " : "") + r.why;
  failover::RetryDecision d = failover::NextStep(r.outcome, &retry_, budget_, g_.clock_.NowMs());
  if (d.action == Action::kRetryElsewhere && MutationActive("failover-give-up")) {  // deliberate bug, tests only
    d = {Action::kGiveUp, true, d.reason + " (mutation: given up)"};
  }
  g_.board_.AttemptFailed(rec_.service, target_.index, failover::FailureName(r.outcome.phase), why, target_.generation);
  excluded_[target_.index] = true;
  if (d.action == Action::kContinueElsewhere) {
    // Continued only with the model that began it (checked once admission
    // has chosen, see Run); placements of other models are avoided.
    if (live_->only_model.empty()) live_->only_model = svc_->ModelOf(target_.index);
    const std::string& model = live_->only_model;
    for (size_t i = 0; i < excluded_.size(); ++i) excluded_[i] = excluded_[i] || svc_->ModelOf(i) != model;
  }
  if (d.action == Action::kRetryElsewhere || d.action == Action::kContinueElsewhere) {
    const std::string note = why + " (" + d.reason + ")";
    Logged(co_await g_.Journaled([&](auto done) { g_.journal_.RequeueAsync(rec_.id, note, done); }), "requeue");
    live_->Enter(LivePhase::kQueued, g_.clock_.NowMs());
  }
  co_return d;
}

// A full worker (nothing ran) is waited for, within the policy's bound (and
// the request's deadline: past it, the deadline is the answer).
Action RequestLifecycle::AfterBusy() {
  if (live_->cancelled) return Action::kCancelled;
  const failover::AttemptOutcome busy{Kind::kBusy};
  return failover::NextStep(busy, &retry_, budget_, g_.clock_.NowMs()).action;
}

// A declared different fallback model is announced as what it is.
ServedBy RequestLifecycle::Served() const {
  const auto& p = svc_->placements[target_.index];
  ServedBy s;
  s.placement = placement_;
  s.decision = target_.decision;
  s.attempts = attempts_;
  s.limits = target_.limits;
  s.waited_ms = target_.waited_ms;
  if (target_.index != 0) s.degraded = "served by " + placement_ + " (" + p.role + ")";
  if (p.different_model) s.fallback_model = svc_->ModelLabel(target_.index);
  s.estimated_delay_s = first_estimate_s_;
  return s;
}


// A cut stream's last event: the error, and what the client has (to resume from).
json RequestLifecycle::CheckpointError(const Status& st) const {
  json ev = ErrorJson(st, rec_.id);
  ev["error"]["checkpoint"] = {{"tokens_delivered", progress_.tokens().size()},
                               {"text_bytes", progress_.text_bytes()},
                               {"tool_calls_delivered", progress_.tool_calls_delivered()}};
  return ev;
}

// A cut stream that goes no further: `what` happened after the delivered
// tokens, and the client resumes from the checkpoint (`why`: the journal's
// error, what happened itself when empty).
boost::asio::awaitable<void> RequestLifecycle::EndResumable(const std::string& what, std::string why) {
  const Status err = Status::Unavailable(what + " after " + std::to_string(progress_.tokens().size()) +
                                         " delivered tokens; resume from the checkpoint with the request id");
  if (why.empty()) why = err.message();
  co_await EndStreamWithError(State::kFailedResumable, CheckpointError(err), std::move(why));
}

boost::asio::awaitable<void> RequestLifecycle::EndForStop() {
  const std::string what = kStoppedByGrace;
  const int64_t now = g_.clock_.NowMs();
  if (!reply_.attached()) {
    // Recovered at start (a request not streamed; its client is gone): left
    // as it is in the journal, for the next start to run it again, as this
    // one did. Failed here, its Idempotency-Key replayed that failure.
    Release();
    live_->queue_slot.reset();
    live_->Enter(LivePhase::kTerminal, now);
    co_return;
  }
  if (attempts_ == 0) {  // (its key stays free, as after any refusal before an attempt)
    co_return co_await Fail(State::kFailed, Status::Unavailable(what + " before the request ran; send it again once "
                                                                       "it is back").WithRetryAfter(5));
  }
  if (rec_.stream) {
    if (reply_.events_started() && !progress_.tokens().empty()) {
      if (!progress_.tool_calls_delivered()) co_return co_await EndResumable(what);
      const Status err = Status::Unavailable(what + " after " + std::to_string(progress_.tokens().size()) +
                                             " delivered tokens; tool calls were delivered, so it is not replayed "
                                             "past them; resume from the checkpoint with the request id");
      co_return co_await EndStreamWithError(State::kFailedResumable, CheckpointError(err), err.message());
    }
    co_return co_await Fail(State::kFailed, Status::Unavailable(what + " before the stream's first token; send it "
                                                                       "again (with a new Idempotency-Key if it had "
                                                                       "one) once it is back").WithRetryAfter(5));
  }
  // Its record is durable first (a non-streamed request's waits for its
  // end's sync): the next start finds it unfinished and runs it again.
  Release();
  live_->queue_slot.reset();
  if (co_await AcceptRefused()) co_return;
  reply_.Error(StopWithheld("the request ran", rec_.id, "the next start runs"));
  live_->Enter(LivePhase::kTerminal, g_.clock_.NowMs());
  g_.metrics_.RequestFinished(rec_.service, Outcome(State::kFailed), placement_, placement_key_,
                              (g_.clock_.NowMs() - t0_) / 1000.0);
}

namespace {

// A worker's 503 passed on says when to try again: its own Retry-After, or
// 1 s (a stream's refusal carries no header of its own here).
std::string RetryAfterOf(const AttemptResult& r) {
  return !r.retry_after.empty() ? r.retry_after : r.status == 503 ? "1" : "";
}

}  // namespace

// The client hears the worker's error, as an error event when its stream has begun.
boost::asio::awaitable<void> RequestLifecycle::DeliverRefusal(const AttemptResult& r, const ServedBy& served) {
  // Cancelled meanwhile (the worker refused it for that: a continuation's
  // cancel can reach the worker before the request does): it ends as asked.
  if (live_->cancelled) co_return co_await Fail(State::kCancelled, Status::Cancelled("request cancelled"));
  if (r.outcome.delivered) {  // a continuation was refused: end the stream the client has, resumable
    co_return co_await EndResumable("the continuation was refused (" + r.body + ")", r.body);
  }
  if (reply_.head_sent()) {
    const json eb = json::parse(r.body, nullptr, false);
    const json error_event = eb.is_object() ? eb : ErrorJson(Status::Unavailable(r.body), rec_.id);
    co_return co_await EndStreamWithError(r.stream_state, error_event, r.body, r.status);
  }
  co_await Finish(r.stream_state, r.status, "application/json", r.body, r.body);
  reply_.Answer(r.status, "application/json", r.body, &served, RetryAfterOf(r));
}

void RequestLifecycle::OnWait(const std::string& note, double est_s) {
  JournalAccept();  // a request that waits is in the journal meanwhile
  live_->Waiting(note, est_s);
  if (first_estimate_s_ < 0 && !note.empty()) first_estimate_s_ = est_s;
  if (!rec_.stream || !reply_.attached() || note.empty()) return;
  if (accept_ && !(accept_->result() && accept_->result()->ok())) return;  // not before the Accept's commit
  // A stream that waits long (for the CPU path, or for a replica to load)
  // starts early and hears why every wait_comment_s, as SSE comments.
  const int64_t now = g_.clock_.NowMs();
  if (now - last_comment_ms_ < svc_->cpu_path.wait_comment_ms()) return;
  last_comment_ms_ = now;
  reply_.WaitingNote(note, est_s);
}

// Someone else cancelled or ended the request meanwhile (the client hears
// its end), or the journal could not write (its storage, or another
// database error, such as a lock another program holds past the busy
// timeout: 503, Retry-After; a non-streamed request's client hears that a
// restart could run it again): then the request's end is recorded as that
// once the journal writes again.
boost::asio::awaitable<void> RequestLifecycle::CommitRefused(const Status& st) {
  if (co_await AcceptRefused()) co_return;  // (then the attempt was refused for want of its request)
  if (st.code() != StatusCode::kUnavailable) {
    auto r = co_await g_.Blocking([&] { return g_.journal_.Get(rec_.id); });
    if (r.ok() && journal::IsTerminal(r->state)) {
      reply_.Error(Status::Cancelled("request " + std::string(journal::StateName(r->state))));
      live_->Enter(LivePhase::kTerminal, g_.clock_.NowMs());
      co_return;
    }
  }
  // Left queued or running, a retry with its Idempotency-Key heard "in
  // flight" for good, and a restart ran a request its client had been told
  // failed: the end is recorded once the journal writes again.
  // A non-streamed request's client hears that as well, whatever the
  // journal's error (its storage's, or a lock another program held past the
  // busy timeout): told only the error, it sent the request again while a
  // restart could still run the first. (A restart never runs a stream
  // again: it marks it failed_resumable; the journal's refusal is all there
  // is to say.)
  const Status told = !rec_.stream
                          ? Gateway::Unrecorded(st, rec_.id, "its next attempt",
                                                "nothing of that attempt reaches the client")
                          : st;
  const bool sent = reply_.head_sent();
  reply_.Error(told);
  const State end = sent ? State::kFailedResumable : State::kFailed;
  g_.Spawn(g_.RecordEndWhenWritable(rec_.id, end, told), strand_);
  const int64_t now = g_.clock_.NowMs();
  live_->Enter(LivePhase::kTerminal, now);
  g_.metrics_.RequestFinished(rec_.service, Outcome(end), placement_, placement_key_, (now - t0_) / 1000.0);
}

boost::asio::awaitable<void> RequestLifecycle::Answered(const AttemptResult& r, const AttemptSpec& spec) {
  if (r.head_refused) co_return co_await DeliverRefusal(r, spec.served);
  if (rec_.stream) {
    if (r.stream_state == State::kCompleted) {
      g_.AttemptSucceeded(rec_.service, target_);
      g_.RecordThroughput(rec_.service, target_.index, reply_.stored());
    }
    // Ended by the worker's error event: its words (a cancelled stream said
    // "stream ended with an error", where a cancelled answer says it was cancelled).
    const std::string err = r.stream_state == State::kCompleted ? ""
                            : r.stream_state == State::kCancelled ? "request cancelled"
                            : !r.why.empty()                      ? r.why
                                                                  : "stream ended with an error";
    co_await Finish(r.stream_state, 200, "text/event-stream", reply_.stored(), err);
    co_return reply_.EndStream();
  }
  const State state = r.status < 300 ? State::kCompleted : r.status == 499 ? State::kCancelled : State::kFailed;
  std::string body = r.body;
  if (state == State::kCompleted) {
    g_.AttemptSucceeded(rec_.service, target_);
    // A fallback model, the limits applied and inputs cut are said in the
    // answer too (its journaled body: a replay says them again).
    if (!spec.served.fallback_model.empty() || !target_.limits.empty() || !r.truncated_inputs.empty()) {
      json j = json::parse(body, nullptr, false);
      if (j.is_object()) {
        if (!spec.served.fallback_model.empty()) {
          j["model"] = spec.served.fallback_model;
          j["spillway"]["fallback_model"] = spec.served.fallback_model;
        }
        if (!target_.limits.empty()) j["spillway"]["limits"] = target_.limits;
        if (!r.truncated_inputs.empty()) j["spillway"]["truncated_inputs"] = std::atoi(r.truncated_inputs.c_str());
        body = j.dump(-1, ' ', false, json::error_handler_t::replace);
      }
    }
  }
  const std::string err = state == State::kCompleted ? "" : body;  // (a named value: see Blocking's note on GCC 12)
  co_await Finish(state, r.status, r.type, body, err);
  ServedBy served = spec.served;
  served.dropped_messages = r.dropped_messages;
  reply_.Answer(r.status, r.type, body, &served, RetryAfterOf(r), r.truncated_inputs);
  // From the worker's header only (parsing a whole answer, an embedding's
  // vectors, for them cost more than the rest of the gateway's work), once
  // the client has its answer.
  if (state == State::kCompleted && !r.timings.empty()) {
    g_.RecordThroughput(rec_.service, target_.index, "", r.timings);
  }
}

boost::asio::awaitable<void> RequestLifecycle::Run() {
  if (!svc_) {
    co_return co_await Fail(State::kFailed,
                            Status::NotFound("service '" + rec_.service + "' is no longer configured"));
  }
  while (true) {
    if (PastDeadline()) co_return co_await DeadlineFailure();
    if (live_->cancelled) co_return co_await Fail(State::kCancelled, Status::Cancelled("request cancelled"));
    Release(/*keep_cpu_turn=*/busy_retry_);
    live_->worker_port = 0;  // between attempts: no worker holds it (its port may be another program's by now)
    Status rejected;
    last_comment_ms_ = g_.clock_.NowMs();
    std::string reject_decision;
    bool admitted = false;
    {  // (the admission lives here, in this frame, until it is done: no coroutine of its own around it)
      const RequestAdmission::OnWait on_wait = [this](const std::string& note, double est_s) { OnWait(note, est_s); };
      RequestAdmission admission(g_, rec_, *svc_, *live_, excluded_, &target_, &rejected, &reject_decision, on_wait,
                                 /*first=*/attempts_ == 0, /*accepted=*/retry_.failures > 0 || recovered_);
      admitted = co_await admission.Run(strand_);
    }
    if (live_->accept_refused && co_await AcceptRefused()) co_return;  // (what it held goes with the lifecycle)
    if (!admitted) {
      if (!reject_decision.empty()) {
        JournalAccept();
        Logged(co_await g_.Journaled([&](auto done) { g_.journal_.SetDecisionAsync(rec_.id, reject_decision, done); }),
               "decision");
      }
      if (rejected.code() == StatusCode::kDeadlineExceeded) co_return co_await DeadlineFailure();
      if (rejected.code() == StatusCode::kCancelled) co_return co_await Fail(State::kCancelled, rejected);
      if (reply_.events_started() && !progress_.tokens().empty()) {  // a cut stream nothing may continue
        co_return co_await EndResumable("no placement could continue the stream (" + rejected.message() + ")");
      }
      co_return co_await Fail(State::kFailed, rejected);
    }
    // A stream goes on only with the model that began it: another model's
    // tokens would splice two models' text into one answer (its token ids
    // replayed into another vocabulary, a coincidental byte match). Checked
    // on the placement admission chose (which may fall back to one it
    // avoids, when nothing else can take the request).
    if (!svc_->Serves(target_.index, live_->only_model)) {
      co_return co_await EndResumable("no placement of the model that began the stream could continue it");
    }
    live_->queue_slot.reset();  // running now: no longer among the waiting
    live_->Enter(LivePhase::kRunning, g_.clock_.NowMs());
    // A worker that answered "busy" is retried within the attempt already
    // journaled: waiting writes nothing (it used to write an attempt every 10 ms).
    const bool same_attempt = busy_retry_ && target_.placement == placement_;
    if (busy_retry_ && !same_attempt) {
      Logged(co_await g_.Journaled([&](auto done) { g_.journal_.RequeueAsync(rec_.id, "worker busy", done); }),
             "requeue");
    }
    busy_retry_ = false;
    placement_ = target_.placement;
    placement_key_ = target_.key;
    const std::string key = target_.key;
    // The attempt is journaled before anything of it reaches the client and
    // before anything else about it is journaled. A non-streamed attempt's
    // commit runs while it is sent (the worker computes meanwhile) and is
    // awaited before its outcome is acted on; a stream's is awaited first,
    // since its events reach the client as they come.
    std::shared_ptr<PendingStatus> commit;
    std::function<void()> write_commit;  // asks for the commit (once); set with `commit`
    if (!same_attempt) {  // (same_attempt: still running attempt `attempts_` on `placement_`)
      commit = PendingStatus::Make(strand_);
      const bool accept = unjournaled_;  // admitted at once: the request and its attempt in one commit
      if (accept) {
        unjournaled_ = false;
        accept_ = commit;
        // A non-streamed request shows nothing before its end: its record
        // waits for the end's to share one sync (Finish). (With an
        // idempotency key it is a transaction of its own, not a log record.)
        accept_deferred_ = !rec_.stream && rec_.idempotency_key.empty();
      }
      write_commit = [this, accept, done = commit->Completer(), asked = false]() mutable {
        if (std::exchange(asked, true)) return;
        if (accept) {
          g_.journal_.AcceptAndStartAsync(rec_, placement_, target_.decision_json, std::move(done), accept_deferred_);
        } else {
          g_.journal_.StartAttemptAsync(rec_.id, placement_, target_.decision_json, std::move(done));
        }
      };
      // A small non-streamed attempt's commit is asked for once the worker has
      // the request, while it computes: its writing is off the request's way
      // (nothing reaches the client before the commit, awaited below). A
      // stream's goes first: its events reach the client as they come. So
      // does any commit while the journal refuses writes, and a large body's
      // (one the log may never hold, refused at once): such an attempt is
      // never sent. (The first request to find a disk full is: its answer is
      // thrown away.)
      if (rec_.stream || live_->cancelled || rec_.body.size() > kOverlappedCommitMaxBody ||
          !g_.journal_.Refusal().ok()) {
        write_commit();
      }
    }
    // Refused at once (a log that cannot write, a record it can never hold):
    // not sent, so that no worker spends its generation on an answer that
    // would be thrown away.
    if (commit && commit->result() && !commit->result()->ok()) {
      const Status st = *commit->result();
      co_return co_await CommitRefused(st);
    }
    if (commit && rec_.stream) {
      if (const Status st = co_await commit->Wait(); !st.ok()) co_return co_await CommitRefused(st);
      commit.reset();
    }
    if (!same_attempt) live_->Attempting(placement_, ++attempts_);
    if (attempts_ > 1 && MutationActive("fallback-drop-seed")) {  // deliberate bug, for tests only
      json b = json::parse(target_.body, nullptr, false);
      if (b.is_object()) b.erase("seed");
      target_.body = b.dump();
    }
    live_->worker_port = target_.port;
    if (live_->cancelled) {
      if (commit) {
        write_commit();
        SyncIfDeferred(commit);
        if (const Status st = co_await commit->Wait(); !st.ok()) co_return co_await CommitRefused(st);
      }
      continue;
    }

    AttemptSpec spec;
    spec.port = target_.port;
    spec.path = path_;
    // (Moved, not copied: a long chat's body was copied once more per attempt.
    // Nothing reads it from the target after this; the next admission sets it again.)
    spec.body = std::move(target_.body);
    spec.headers = g_.supervisor_.AuthHeaders();
    spec.headers.emplace_back("X-Request-Id", rec_.id);
    spec.stream = rec_.stream;
    spec.timeout = Remaining();
    spec.bounded = live_->deadline_ms != 0;
    spec.silence = g_.attempt_bounds_.stream_silence;
    spec.served = Served();
    spec.role = svc_->placements[target_.index].role;
    spec.cancel_cause = &live_->cancel_cause;
    if (write_commit && !rec_.stream) spec.on_sent = [&write_commit] { write_commit(); };
    const AttemptResult r = co_await runner_.Run(spec);
    if (write_commit) write_commit();  // (not sent: it could not be written to the worker)
    // The worker's answer waits for the commit that covers it; refused, the
    // answer is dropped (nothing of it reached the client). A deferred
    // Accept followed by the request's answer is awaited in Finish, synced
    // with the end's record.
    if (commit && !(Deferred(commit) && r.outcome.kind == Kind::kAnswered && !r.head_refused)) {
      SyncIfDeferred(commit);
      if (const Status st = co_await commit->Wait(); !st.ok()) co_return co_await CommitRefused(st);
    }

    switch (r.outcome.kind) {
      case Kind::kCancelled:
        co_return co_await Fail(State::kCancelled, Status::Cancelled("request cancelled"));
      case Kind::kBusy: {
        const Action a = AfterBusy();
        if (a == Action::kDeadline) co_return co_await DeadlineFailure();
        if (a == Action::kCancelled) co_return co_await Fail(State::kCancelled, Status::Cancelled("request cancelled"));
        if (a == Action::kWaitAndResend) {
          busy_retry_ = true;
          co_await g_.SignalFor(rec_.service).Wait(std::chrono::milliseconds(50));  // until a slot frees
          continue;
        }
        break;  // waited long enough: its 503 is the answer
      }
      case Kind::kFailed: {
        // A worker that timed out because the deadline passed is not the worker's failure.
        if (r.deadline || (r.unreachable && PastDeadline())) co_return co_await DeadlineFailure();
        // Past one of the gateway's own bounds (AttemptBounds: an hour's
        // answer without a deadline; a stream silent for 600 s, a huge
        // prompt on the CPU): the worker still answers its health checks (a
        // hung one is replaced by them), so it is no crash of the
        // placement's. It was taken for one: its breaker tripped, and the
        // request ran again from scratch, three times, before its 503.
        if (r.timed_out) {
          g_.Cancel(live_);  // stops the worker's generation, frees its slot
          live_->cancelled = true;
          const auto seconds = [](std::chrono::milliseconds d) {
            const int64_t ms = d.count();
            return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
          };
          const std::string bound =
              rec_.stream ? "sent nothing for " + seconds(spec.silence) + " (the gateway's bound on a stream's silence)"
                          : "gave no answer within " + seconds(g_.attempt_bounds_.answer) +
                                " (the gateway's bound on a request without X-Request-Timeout)";
          // A stream the client has tokens of (a continuation replaying many
          // on a slow placement) ends resumable, with its checkpoint, as any
          // cut stream that goes no further: it ended failed, with none. So
          // does one past delivered tool calls (the checkpoint says they were).
          if (reply_.events_started() && !progress_.tokens().empty()) {
            co_return co_await EndResumable(
                "the worker " + bound +
                (progress_.tool_calls_delivered() ? " (tool calls were delivered: it is not replayed past them)" : ""));
          }
          co_return co_await Fail(State::kFailed, Status::DeadlineExceeded("the worker " + bound + ": " + r.why));
        }
        if (r.unreachable) g_.supervisor_.Suspect(key);
        const auto d = co_await AfterFailure(r);
        if (d.action == Action::kDeadline) co_return co_await DeadlineFailure();
        if (d.action == Action::kRetryElsewhere || d.action == Action::kContinueElsewhere) continue;
        if (r.head_refused) co_return co_await DeliverRefusal(r, spec.served);
        if (!rec_.stream && r.unreachable) {
          co_return co_await Fail(State::kFailed, Status::Unavailable("the worker failed " +
                                                                      std::to_string(retry_.failures) + " times: " +
                                                                      r.why).WithRetryAfter(5));
        }
        if (!rec_.stream) {  // the worker's own account of its failure is the answer
          co_await Finish(State::kFailed, r.status, "application/json", r.body, r.body);
          co_return reply_.Answer(r.status, "application/json", r.body, &spec.served, RetryAfterOf(r));
        }
        // A stream cut where no placement may continue it: never past delivered tool calls.
        const Status err = Status::Unavailable(
            "the stream failed (" + r.why + ") after " + std::to_string(progress_.tokens().size()) +
            " delivered tokens; " +
            (progress_.tool_calls_delivered() ? "tool calls were delivered, so it is not replayed past them"
                                              : "no placement could continue it") +
            "; resume from the checkpoint with the request id");
        if (!r.outcome.delivered) co_return co_await Fail(State::kFailed, err);
        co_return co_await EndStreamWithError(State::kFailedResumable, CheckpointError(err), err.message());
      }
      case Kind::kAnswered:
        break;
    }
    // The worker's answer (or a busy worker's 503, waited out) is the request's.
    co_return co_await Answered(r, spec);
  }
}

}  // namespace spillway::gateway
