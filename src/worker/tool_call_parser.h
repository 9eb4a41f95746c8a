// Finds Hermes-style tool calls in generated text while it streams:
//
//   <tool_call>
//   {"name": "get_weather", "arguments": {"city": "Paris"}}
//   </tool_call>
//
// Text outside the blocks is content. Pure logic, no llama.cpp; the streamed
// and the non-streamed answer are built by the same object, so they agree.
//
// Held back until it is decided: a suffix that may begin "<tool_call>", a
// block until its closing tag, and trailing whitespace until non-whitespace
// text follows (whitespace next to a call is dropped). So the content
// delivered before the first call is always a prefix of the generated text,
// which is what a continuation counts (Job::resume_text_bytes).
//
// A block that is not a JSON object naming a declared function stays content,
// verbatim; a block still open at the end, too.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/openai_request.h"

namespace spillway::worker {

inline constexpr std::string_view kToolCallOpen = "<tool_call>";
inline constexpr std::string_view kToolCallClose = "</tool_call>";

// Content text or one whole call.
struct ToolCallPiece {
  std::string content;
  std::optional<api::ToolCall> call;
};

class ToolCallParser {
 public:
  // `names`: the declared functions. `request_id` seeds the call ids.
  ToolCallParser(std::vector<std::string> names, std::string request_id);

  // Appends generated text; returns what became final, in order.
  std::vector<ToolCallPiece> Append(std::string_view text);
  // Generation ended: returns everything still held back that is content.
  std::vector<ToolCallPiece> Finish();

  int calls() const { return calls_; }

 private:
  void EmitContent(std::string text, std::vector<ToolCallPiece>* out);

  std::vector<std::string> names_;
  std::string request_id_;
  std::string buf_;       // undecided text (after the last piece)
  bool in_block_ = false; // buf_ is the inside of an open block
  std::string held_ws_;   // trailing whitespace of the content so far
  int calls_ = 0;
};

// The inside of one block as a call (id not set); nullopt when it is not a
// JSON object with a "name" among `names` and object "arguments" (or none).
std::optional<api::ToolCall> ParseToolCallBody(std::string_view body, const std::vector<std::string>& names);

// "call_" + the first 24 hex digits of sha256(request_id ":" index): a replay
// of the request gets the same ids.
std::string ToolCallId(const std::string& request_id, int index);

// Splits a whole generated text: its content and calls.
struct SplitText {
  std::string content;
  std::vector<api::ToolCall> calls;
};
SplitText SplitToolCalls(std::string_view text, const std::vector<std::string>& names, const std::string& request_id);

}  // namespace spillway::worker
