// OpenAI answers from a generation's text: one body, or the SSE events of a
// stream. With tool use (a ToolCallParser), <tool_call> blocks become tool
// calls: in a stream each call is one delta chunk, sent once its closing tag
// has been generated, and the finish reason becomes "tool_calls".
//
// Token ids: every id handed to StreamReply::Text() goes out exactly once, as
// "spillway": {"tokens": [...]} on the next event written (content, call or
// final chunk), so a gateway continuing the stream elsewhere knows them all.
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
#include "worker/tool_call_parser.h"

namespace spillway::worker {

struct ReplyHeader {
  api::Endpoint ep = api::Endpoint::kChat;
  std::string id;     // the request id; also seeds tool call ids
  std::string model;
  int64_t created = 0;
};

class StreamReply {
 public:
  // `tools` is set for chat requests whose tool calls are parsed.
  StreamReply(ReplyHeader header, std::optional<ToolCallParser> tools);

  // SSE events for newly generated text; "" when all of it is held back.
  std::string Text(std::string_view text, const std::vector<int32_t>& ids);
  // The closing events: held-back text, the final chunk (`meta` under
  // "spillway"), and the usage chunk when `usage` is set. Not "[DONE]".
  std::string Finish(const std::string& finish_reason, nlohmann::json meta, const api::Usage* usage);

 private:
  std::string Events(const std::vector<ToolCallPiece>& pieces);
  std::string Send(nlohmann::json chunk);

  ReplyHeader h_;
  std::optional<ToolCallParser> tools_;
  std::vector<int32_t> unsent_ids_;
  bool first_ = true;
  int calls_sent_ = 0;
};

// The non-streamed body (without "spillway"). `tool_names` (null: no tool
// use) are the functions whose calls are split out of `text`.
nlohmann::json WholeReply(const ReplyHeader& h, const std::string& text, const std::string& finish_reason,
                          const api::Usage& usage, const std::vector<std::string>* tool_names);

}  // namespace spillway::worker
