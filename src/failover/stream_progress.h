// What a client has received of a streamed answer, event by event: the token
// ids (from the worker's `spillway.tokens`), the text bytes, and whether tool
// calls were delivered. It decides whether a cut stream may be continued
// elsewhere: never past delivered tool calls (an agent may already have run
// them; docs/DESIGN.md invariant 2).
//
// Pure: parses SSE event payloads only. Not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "protocol/worker_protocol.h"

namespace spillway::failover {

class StreamProgress {
 public:
  enum class Event { kChunk, kDone, kError, kOther };
  // Records one SSE event (the text up to and including its blank line).
  // For an error event, *error_phase gets its "phase" ("" when none).
  Event Observe(const std::string& event, std::string* error_phase);

  const std::vector<int32_t>& tokens() const { return tokens_; }
  uint64_t text_bytes() const { return text_bytes_; }
  bool tool_calls_delivered() const { return tool_calls_ && !tool_calls_held_; }
  // A chunk with a finish_reason has come: the answer is whole (what may
  // follow it is a usage chunk and [DONE]).
  bool finished() const { return finished_; }
  // The client's side gathers tool calls for the stream's end (Ollama's
  // translation): relayed, they have not reached the client yet.
  void set_tool_calls_held(bool held) { tool_calls_held_ = held; }
  // The error event of the stream, when one came (the worker ends a stream
  // that failed or was cancelled with one).
  const std::optional<protocol::WorkerError>& last_error() const { return last_error_; }
  // A new attempt begins: an earlier attempt's error is not this one's.
  void ClearError() { last_error_.reset(); }
  // Something was delivered whose token ids have not come yet: the worker
  // puts a step's ids on the last of the events that step produced (its
  // reasoning, then its text; one tool call's last arguments, then the
  // next's start), so a stream cut between them delivered text no id
  // stands for.
  bool ids_pending() const { return ids_pending_; }
  // A continuation can reproduce what was delivered: token ids are known for
  // all of it and no side effect (tool call) has gone out. (Cut with ids
  // pending, a continuation replayed the ids it had and generated the rest
  // of that step again: its reasoning twice, a tool call's arguments twice.)
  bool Continuable() const {
    return !tool_calls_delivered() && !(text_bytes_ > 0 && tokens_.empty()) && !ids_pending_;
  }

 private:
  std::vector<int32_t> tokens_;
  uint64_t text_bytes_ = 0;
  bool tool_calls_ = false;
  bool finished_ = false;
  bool tool_calls_held_ = false;
  bool ids_pending_ = false;
  std::optional<protocol::WorkerError> last_error_;
};

}  // namespace spillway::failover
