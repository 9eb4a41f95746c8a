// OpenAI answers from a generation's text: one body, or the SSE events of a
// stream. A chat answer is read by the model's own format (ChatOutput):
// content, reasoning_content and tool calls, streamed as llama-server streams
// them; the finish reason becomes "tool_calls" when the answer made calls.
//
// Token ids: every id handed to StreamReply::Text() goes out exactly once, as
// "spillway": {"tokens": [...]} on the last event written for it (or a later
// one, when its text made no delta yet), so a gateway that holds an id has
// every delta of the text up to that token: what a continuation relies on.
//
// Not thread-safe: the engine calls a job's callbacks from its one thread.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/openai_response.h"
#include "common/status.h"
#include "worker/chat_output.h"

namespace spillway::worker {

struct ReplyHeader {
  api::Endpoint ep = api::Endpoint::kChat;
  std::string id;     // the request id; also seeds tool call ids
  std::string model;
  int64_t created = 0;
};

class StreamReply {
 public:
  // `chat` is set for chat requests (how to read the answer).
  StreamReply(ReplyHeader header, std::optional<ChatSyntax> chat);

  // SSE events for newly generated text; "" when all of it is held back.
  // `logprobs` (when asked for) are those of `ids`.
  std::string Text(std::string_view text, const std::vector<int32_t>& ids,
                   const std::vector<api::TokenLogprob>& logprobs = {});
  // A continuation: `text` of the replayed tokens, which an earlier attempt
  // delivered; `delivered_bytes` is what the client counted of it (content,
  // or completion text). kUnavailable when the two disagree.
  Status Replayed(std::string_view text, uint64_t delivered_bytes);
  // The closing events: held-back text, the final chunk (`meta` under
  // "spillway"), and the usage chunk when `usage` is set. Not "[DONE]".
  std::string Finish(const std::string& finish_reason, nlohmann::json meta, const api::Usage* usage);

 private:
  std::string Events(const std::vector<api::ChatDelta>& deltas);
  std::string Send(nlohmann::json chunk);

  ReplyHeader h_;
  std::optional<ChatOutput> chat_;
  std::vector<int32_t> unsent_ids_;
  std::vector<api::TokenLogprob> unsent_logprobs_;
  bool logprobs_ = false;
  size_t text_offset_ = 0;  // completions: bytes of text sent (logprobs' text_offset)
  bool first_ = true;
};

// The non-streamed body (without "spillway"). `chat` (chat requests) reads
// the answer; `logprobs` when asked for.
nlohmann::json WholeReply(const ReplyHeader& h, const std::string& text, const std::string& finish_reason,
                          const api::Usage& usage, const ChatSyntax* chat,
                          const std::vector<api::TokenLogprob>* logprobs = nullptr);

}  // namespace spillway::worker
