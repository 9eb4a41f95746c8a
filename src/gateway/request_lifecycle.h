// One generation request's life once it is accepted (Gateway::Run builds
// one per request, in the request's coroutine, on its client connection's
// loop): admission, attempts, failover, and its one end.
//
//   phase        event                                              next         journal
//   -----------  -------------------------------------------------  -----------  -----------
//   received     parsed and checked, within max_queue               queued       Accept
//   queued       no placement can take it now                       queued       -  (its place in the service's line, capacity_signal.h)
//   queued       admitted on placement P (its cells reserved)       running      StartAttempt (attempt k on P)
//   running      the worker is full (nothing ran)                   running      -  (same attempt, waits for a slot)
//   running      the first event of a stream reaches the client     streaming    -
//   running,     failed; the retry policy says run again or          queued       Requeue
//   streaming    continue elsewhere (failover/retry_policy.h)
//   queued       a cut stream admitted on another model's placement, terminal     Finish (failed_resumable)
//                or its continuation refused by the worker
//   any          answered, given up, cancelled or past its deadline  terminal     Finish, then the client
//   any          cut by the gateway's stop (its grace passed):        terminal     Finish, or none: a
//                EndForStop                                                       non-streamed one that
//                                                                                 ran stays running
//
// Each transition that matters after a crash is journaled before it takes
// effect. A request ends in exactly one place (Finish: the journal's
// terminal state first, then the caller answers the client); Fail,
// EndStreamWithError, DeadlineFailure and DeliverRefusal are the ways there.
// An attempt is run by an AttemptRunner (attempt_runner.h), which returns a
// typed outcome; the pure retry policy (failover/retry_policy.h) says what
// follows; the client hears everything through one ReplyWriter
// (reply_writer.h). What an attempt holds (cells, its place in the CPU
// line) goes back whatever the outcome (the destructor too), which wakes the
// requests waiting for that capacity (before the client hears the answer:
// its next request finds it free). What only the gateway shows of the end,
// the request's terminal phase, its count in the metrics and the
// placement's measured throughput, follows the answer's send.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "failover/retry_policy.h"
#include "failover/stream_progress.h"
#include "gateway/attempt_runner.h"
#include "gateway/gateway.h"
#include "gateway/gateway_internal.h"
#include "gateway/reply_writer.h"

namespace spillway::gateway {

class RequestLifecycle {
 public:
  // `unjournaled`: its Accept is not written yet (see Gateway::Process); the
  // lifecycle writes it with its first attempt, or before it first waits.
  RequestLifecycle(Gateway& g, journal::RequestRecord&& rec, std::shared_ptr<http::Exchange> ex,
                   std::shared_ptr<Gateway::Live> live, bool unjournaled, boost::asio::any_io_executor strand);
  ~RequestLifecycle();
  RequestLifecycle(const RequestLifecycle&) = delete;
  RequestLifecycle& operator=(const RequestLifecycle&) = delete;

  // Runs the request to its end.
  boost::asio::awaitable<void> Run();

 private:
  using State = journal::State;

  // Gives back what the current attempt holds (after a busy worker, not its
  // turn in the CPU line: it is sent again first).
  void Release(bool keep_cpu_turn = false);
  // Writes the Accept of a request not journaled yet (once).
  void JournalAccept();
  // Awaits that Accept; true when the journal refused it (the client has heard why).
  boost::asio::awaitable<bool> AcceptRefused();
  // The request's Accept is durable (or it has none to wait for), known
  // without waiting; false: AcceptRefused() tells.
  bool AcceptDurable();
  // The one place a request ends: the journal first, then (by the caller) the client.
  boost::asio::awaitable<void> Finish(State state, int status, std::string type, std::string body, std::string err);
  // A stream the client already has (it may have started while waiting) ends with an error event.
  // `refused`: the status its error would have had before the head went
  // out; recorded (400 and 413 only: refused as invalid, it did not run)
  // so that its Idempotency-Key is left free for the corrected request, as
  // for one refused before its head.
  boost::asio::awaitable<void> EndStreamWithError(State state, nlohmann::json error_body, std::string why,
                                                  int refused = 200);
  boost::asio::awaitable<void> Fail(State state, Status st);
  bool PastDeadline() const;
  std::chrono::milliseconds Remaining() const;
  boost::asio::awaitable<void> DeadlineFailure();
  // After a failed attempt: the policy's decision, the breaker told, a retry journaled.
  boost::asio::awaitable<failover::RetryDecision> AfterFailure(const AttemptResult& r);
  // After a busy worker (nothing ran): wait and resend, or give up.
  failover::Action AfterBusy();
  // Who serves this attempt, as the answer's headers say.
  ServedBy Served() const;
  // A stream the worker refused before its first event.
  // `served`: who refused it, said in its head as any answer's (X-Spillway-*).
  boost::asio::awaitable<void> DeliverRefusal(const AttemptResult& r, const ServedBy& served);
  nlohmann::json CheckpointError(const Status& st) const;
  boost::asio::awaitable<void> EndResumable(const std::string& what, std::string why = "");
  // Cancelled by the gateway's stop (Gateway::CutForStop), as a restart
  // would find it: one that never ran is refused (503, Retry-After); a
  // stream ends resumable, with its checkpoint (failed_resumable); a
  // non-streamed one that ran has its answer withheld (503, answer_withheld)
  // and stays running in the journal, so that the next start runs it again.
  boost::asio::awaitable<void> EndForStop();
  // Called by admission before every round spent waiting.
  void OnWait(const std::string& note, double est_s);
  // A refused attempt commit: the journal cannot write, or the request was ended meanwhile.
  boost::asio::awaitable<void> CommitRefused(const Status& st);
  // The answer of an attempt that completed (or a busy worker's, waited out).
  boost::asio::awaitable<void> Answered(const AttemptResult& r, const AttemptSpec& spec);

  Gateway& g_;
  journal::RequestRecord rec_;
  std::shared_ptr<Gateway::Live> live_;
  bool unjournaled_;
  // Recovered from the journal after a restart (no client): the gateway took
  // it on before, as it did a request with an attempt (RequestAdmission's `accepted`).
  const bool recovered_;
  const boost::asio::any_io_executor strand_;
  const config::ServiceConfig* const svc_;
  const int64_t t0_;
  const std::string path_;
  ReplyWriter reply_;
  std::string placement_, placement_key_;  // the last attempt's placement: its name, its key (chat.1)
  Gateway::Target target_;
  // The Accept of a request not journaled yet (see JournalAccept), awaited
  // before anything of the request reaches the client.
  std::shared_ptr<PendingStatus> accept_;
  // The Accept's commit-log record does not ask for a sync of its own
  // (journal.h, AcceptAndStartAsync's defer_sync): Finish's record shares
  // its sync; whoever needs it before then asks for it (SyncIfDeferred).
  bool accept_deferred_ = false;
  bool Deferred(const std::shared_ptr<PendingStatus>& commit) const;  // that Accept's commit
  void SyncIfDeferred(const std::shared_ptr<PendingStatus>& commit);
  // What the client already has of a stream, across attempts.
  failover::StreamProgress progress_;
  AttemptRunner runner_;
  std::vector<bool> excluded_;  // placements that failed this request
  int attempts_ = 0;
  double first_estimate_s_ = -1;  // the wait estimate when the request first had to wait
  bool busy_retry_ = false;       // the last send found the worker busy; its attempt stays open
  // How Finish recorded its end: the destructor, after the answer went
  // out, marks it terminal and counts it (none: the way that ended it did).
  std::optional<State> ended_;
  // What happens after an attempt is the pure policy's decision.
  failover::RetryState retry_;
  const failover::RetryBudget budget_;
  // A stream that waits long starts early and hears why every wait_comment_s.
  int64_t last_comment_ms_ = 0;
};

}  // namespace spillway::gateway
