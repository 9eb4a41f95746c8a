// The one writer of a request's reply to its client: response headers, the
// stream's events and SSE comments, error answers. The lifecycle (request_lifecycle.h)
// decides what to say and journals it first; this says it, consistently:
//
//   - every answer carries X-Request-Id; one that a placement served carries
//     where (X-Spillway-Placement, -Decision, -Attempts) and how degraded
//     (-Degraded, -Fallback-Model, -Limits, -Queued-Ms);
//   - a stream that waits long starts early with its reason and estimated
//     delay, and hears every later note as an SSE comment (ignored by
//     clients); once started, errors end it as an error event, never as a
//     second status line;
//   - it keeps what the stream carried (`stored()`), for the journal.
//
// No client (a request recovered after a crash): everything is stored, nothing
// is sent. Not thread-safe: one per request, used on the request's strand.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "api/http_server.h"
#include "common/status.h"

namespace spillway::gateway {

// Who served an answer, as its headers say.
struct ServedBy {
  std::string placement;       // "cpu:0/99"
  std::string decision;        // admission's kind: admit, shrink, reroute...
  int attempts = 0;
  std::string limits;          // limits applied on that placement ("" when none)
  int64_t waited_ms = 0;       // spent waiting for it
  std::string degraded;        // "served by cpu:0/99 (fallback)" when not the primary
  std::string fallback_model;  // a declared different model, announced as such
  double estimated_delay_s = -1;  // what it was told when it first had to wait (-1: it did not wait)
  std::string dropped_messages;   // a chat's oldest messages the worker left out to fit ("": none)
};

class ReplyWriter {
 public:
  ReplyWriter(std::shared_ptr<http::Exchange> ex, std::string request_id, unsigned version);

  bool attached() const { return ex_ != nullptr; }
  // Nothing more reaches the client (its answer was given elsewhere).
  void Detach() { ex_.reset(); }
  // The client has a stream's head (it may have gone out while waiting).
  bool head_sent() const { return head_sent_; }
  // The answer's events have begun (BeginStream), with a client or without.
  bool events_started() const { return events_started_; }
  // The stream's events so far, as journaled with its terminal state.
  const std::string& stored() const;
  // Bytes written to the client and not yet sent (a slow reader).
  size_t unsent_bytes() const;
  bool disconnected() const;
  // The client's exchange gathers a stream's tool calls for its end (http::Exchange).
  bool holds_tool_calls() const { return ex_ && ex_->holds_tool_calls(); }

  // A stream that waits: its head goes out with the reason and the estimated
  // delay (the first time), then the note as a comment.
  void WaitingNote(const std::string& note, double est_delay_s);
  // The answer's events begin: the stream's head, saying who serves it; when
  // the head already went out while waiting, a comment says where it runs now.
  void BeginStream(const ServedBy& served, const std::string& role);
  // An external service's answer relayed as it arrives (its own status and
  // content type; its bytes follow as Event()s, stored as they are).
  void BeginRelay(int status, const std::string& type, const ServedBy& served);
  // A stream continued on `served` after its attempt failed midway: said
  // in a comment, with the limits that placement applies, and in the stored
  // stream's served-by record (its replay's head says it).
  void ContinuedOn(const ServedBy& served);
  // An SSE comment (": spillway: <text>"), not stored.
  void Comment(const std::string& text);
  // One event of the answer: stored, and written.
  void Event(const std::string& event);
  // What Event() stores is bounded (default: not): past `max_bytes` the
  // events still reach the client, and stored() holds only a note of how
  // many bytes were relayed (an external server's long relayed answer).
  void BoundStored(size_t max_bytes) { max_stored_ = max_bytes; }
  bool stored_whole() const { return relayed_bytes_ <= max_stored_; }
  // Adds a final error event (and [DONE]) to what is stored, to be journaled;
  // `SendFinal` then writes it and ends the stream.
  std::string StoreFinalError(const nlohmann::json& error_body);
  void SendFinal(const std::string& final_events);
  void EndStream();
  // Ends the stream as cut (the client's connection closes without the
  // chunked body's end: a relayed answer cut short must not look whole),
  // and sends nothing more.
  void Abort();

  // A whole answer (not a stream): the worker's, with who served it.
  // `truncated_inputs`: how many of an embeddings request's inputs the
  // worker cut (protocol::kTruncatedInputsHeader, said to the client too).
  void Answer(int status, const std::string& type, const std::string& body, const ServedBy* served,
              const std::string& retry_after = "", const std::string& truncated_inputs = "");
  // An error of the gateway's own: an answer, or, once a stream has begun,
  // its last event (a relayed answer's stream ends as cut, see Abort).
  void Error(const Status& st);

  static void Describe(http::Response& res, const ServedBy& served);
  // A degraded stream (a fallback, limits) is stored beginning with an SSE
  // comment that says who served it, so that a replay of it (an
  // Idempotency-Key) tells its client what the stream's head did. This
  // reads it back from what was stored (nullopt: none, or not a stream).
  static std::optional<ServedBy> StoredServedBy(std::string_view stored);
  // A whole answer replayed (an Idempotency-Key) says again what its
  // `spillway` object records of how it was cut: the inputs of an embedding
  // (protocol::kTruncatedInputsHeader), the messages of a chat
  // (kDroppedMessagesHeader), as the first answer's headers did.
  static void DescribeStoredCuts(http::Response& res, std::string_view stored);

 private:
  // The stored stream's served-by record (": spillway-served {...}" at its
  // head, read by StoredServedBy), put there or replaced.
  void StoreServed(const ServedBy& served);
  std::shared_ptr<http::Exchange> ex_;
  std::string id_;
  unsigned version_;
  bool head_sent_ = false;
  bool events_started_ = false;
  bool relay_ = false;  // the head is a relayed answer's (BeginRelay)
  mutable std::string stored_;  // (past max_stored_: the note, written when asked for)
  size_t max_stored_ = SIZE_MAX;
  size_t relayed_bytes_ = 0;
};

}  // namespace spillway::gateway
