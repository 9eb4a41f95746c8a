// Reads a chat answer with llama.cpp's chat parsers (`common`'s
// common_chat_parse, the parser the template's ChatPlan names): content,
// reasoning_content and tool calls, in every model's own format.
//
// Streaming works as llama-server's does: after each piece of text the whole
// answer so far is parsed as partial and the difference to the previous parse
// becomes deltas (reasoning, content, one tool call's name/id/arguments). A
// parser holds text back while it cannot tell what it is (a tool-call marker
// that may be starting), so every delta is final.
//
// Continuation: Replayed() takes the text an earlier attempt delivered (the
// replayed tokens' text) and parses it without making deltas, so the deltas
// that follow continue that answer exactly where the client's copy ends.
//
// Tool call ids are ToolCallId(request_id, index): a replay makes the same ids.
// Not thread-safe (one per request). Pure logic over llama.cpp's parsers.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "api/openai_response.h"

struct common_chat_parser_params;

namespace spillway::worker {

// How to read an answer; made by ChatTemplates::Render. Default: all content.
struct ChatSyntax {
  std::shared_ptr<const common_chat_parser_params> params;
};

// "call_" + the first 24 hex digits of sha256(request_id ":" index).
std::string ToolCallId(const std::string& request_id, int index);

class ChatOutput {
 public:
  ChatOutput(ChatSyntax syntax, std::string request_id);
  ~ChatOutput();

  // Appends generated text; returns the deltas it made final, in order.
  std::vector<api::ChatDelta> Append(std::string_view text);
  // A continuation: `text` was delivered by an earlier attempt.
  void Replayed(std::string_view text);
  // Generation ended, with `rest` the text not appended yet: the last deltas
  // (the answer parsed as complete).
  std::vector<api::ChatDelta> Finish(std::string_view rest = {});

  // The answer so far (after Finish(): the whole answer).
  const api::AssistantMessage& message() const { return msg_; }

 private:
  std::vector<api::ChatDelta> Parse(bool partial);

  ChatSyntax syntax_;
  std::string request_id_;
  std::string text_;
  api::AssistantMessage msg_;
  struct State;
  std::unique_ptr<State> state_;  // common's message, for its diffs
};

// A whole answer at once (non-streamed replies).
api::AssistantMessage ParseAnswer(const ChatSyntax& syntax, const std::string& text, const std::string& request_id);

}  // namespace spillway::worker
