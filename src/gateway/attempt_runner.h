// Runs one attempt of a request on one worker and says how it ended, typed:
// the lifecycle (request_lifecycle.h) hands the outcome to the pure retry policy
// (failover/retry_policy.h) and acts on its decision. The runner decides
// nothing about retries, the journal or breakers.
//
//   outcome     when                                                  carries
//   ----------  ----------------------------------------------------  ------------------------------
//   kAnswered   the worker answered (success or the request's own      status, type, body; a stream's
//               error: 400, a cancel's 499...)                         terminal state
//   kBusy       every slot or KV cell of the worker was taken          the worker's answer (its 503)
//   kFailed     an allocation failure or a lost device (its phase),    why; the worker's answer when
//               a worker that died or could not be reached (kNone)     it gave one; whether a stream
//                                                                      had started
//   kCancelled  the request was cancelled before the worker answered   -
//
// A stream is relayed to the client as its events arrive (through the
// ReplyWriter), its head with the first event, so a failure before the first
// token moves elsewhere unseen. A continuation (StreamProgress has delivered
// tokens) sends them along (`spillway_resume`): the worker there replays them
// with the same seeded sampler and emits only what is new. While the client
// reads slowly, the worker is not read (backpressure).
#pragma once

#include <utility>  // before Asio's awaitable.hpp (Boost 1.74)

#include <boost/asio/awaitable.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>

#include "api/http_client.h"
#include "gateway/attempt_bounds.h"
#include "gateway/cancel_cause.h"
#include "failover/retry_policy.h"
#include "failover/stream_progress.h"
#include "gateway/reply_writer.h"
#include "journal/journal.h"
#include "upstream/connection_pool.h"

namespace spillway::gateway {

struct AttemptSpec {
  uint16_t port = 0;
  std::string path;  // the worker's generation route
  std::string body;
  http::HeaderList headers;
  bool stream = false;
  // How long the attempt may take: a non-streamed answer's wait, or (when
  // `bounded`) a stream's whole relaying too.
  std::chrono::milliseconds timeout = AttemptBounds{}.answer;
  bool bounded = false;  // `timeout` is what the request's deadline leaves
  std::chrono::milliseconds silence = AttemptBounds{}.stream_silence;  // a stream's
  ServedBy served;
  std::string role;  // of the placement: primary, hybrid, fallback
  // A non-streamed attempt's: runs once the request is written whole to the
  // worker, while it computes (ConnectionPool::Send).
  std::function<void()> on_sent;
  // The request's: once the gateway's stop has cut it (CancelCause::kStop),
  // the worker's own "cancelled" event is not relayed (the request's end says why).
  const std::atomic<CancelCause>* cancel_cause = nullptr;
};

struct AttemptResult {
  failover::AttemptOutcome outcome;
  std::string why;           // kFailed: what failed
  bool unreachable = false;  // kFailed: the worker could not be reached or died (the supervisor checks it)
  bool deadline = false;     // kFailed: stopped at the request's deadline (not the worker's failure)
  // kFailed: no answer (a stream: no byte) within the attempt's bound: the
  // request's deadline (then `deadline` too), or one of the gateway's own
  // (AttemptBounds), which says nothing of the worker's health.
  bool timed_out = false;
  // The worker's answer (kAnswered, kBusy; kFailed when it sent one).
  int status = 0;
  std::string type = "application/json";
  std::string body;
  std::string retry_after;
  std::string timings;  // a non-streamed answer's protocol::kTimingsHeader ("" when it has none)
  std::string truncated_inputs;  // an embeddings answer's protocol::kTruncatedInputsHeader ("": none)
  std::string dropped_messages;  // a chat answer's protocol::kDroppedMessagesHeader ("": none)
  // kAnswered, a stream: how it ended (completed, or the worker's error event:
  // failed or cancelled), and whether its head was refused (no event came).
  journal::State stream_state = journal::State::kCompleted;
  bool head_refused = false;
};

class AttemptRunner {
 public:
  // `cancelled`: the request's flag; `on_first_event`: called when each
  // streamed attempt's first event reaches the client (a continuation's
  // too: the placement it was continued on answers).
  AttemptRunner(upstream::ConnectionPool& pool, ReplyWriter& reply, failover::StreamProgress& progress,
                const std::atomic<bool>& cancelled, std::function<void()> on_first_event, size_t max_unsent_bytes);

  boost::asio::awaitable<AttemptResult> Run(const AttemptSpec& spec);

 private:
  boost::asio::awaitable<AttemptResult> Send(const AttemptSpec& spec);
  boost::asio::awaitable<AttemptResult> Relay(const AttemptSpec& spec);

  upstream::ConnectionPool& pool_;
  ReplyWriter& reply_;
  failover::StreamProgress& progress_;
  const std::atomic<bool>& cancelled_;
  std::function<void()> on_first_event_;
  size_t max_unsent_bytes_;
  // The messages the stream's first worker left out (its head's
  // protocol::kDroppedMessagesHeader): a continuation leaves out as many, on
  // whatever placement it runs.
  std::string dropped_messages_;
};

}  // namespace spillway::gateway
