// OpenAI response bodies and stream chunks, and the error body. The only place
// that knows their JSON shapes.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "api/openai_request.h"
#include "common/status.h"

namespace spillway::api {

enum class Endpoint { kChat, kCompletion };

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  // Of prompt_tokens, those found in the worker's cache instead of computed
  // (OpenAI's usage.prompt_tokens_details.cached_tokens, as llama-server
  // writes it); < 0: not said.
  int cached_tokens = -1;
};

// A chat answer read by the model's own format: content, the reasoning
// ("reasoning_content", llama-server's field) and the calls it made.
struct AssistantMessage {
  std::string content;
  std::string reasoning_content;
  std::vector<ToolCall> tool_calls;
};

// One step of a streamed chat answer, as llama-server sends it: new reasoning
// text, new content, or one tool call's new part (its id and name when they
// first appear, then pieces of its arguments).
struct ChatDelta {
  std::string reasoning_content;
  std::string content;
  int tool_call_index = -1;  // -1: no tool call in this delta
  ToolCall tool_call;        // id/name empty when unchanged; arguments: the new piece
};

// One generated token's log probability and the most likely alternatives
// (from the model's distribution before sampling, as llama-server reports).
struct TokenLogprob {
  std::string token;
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;
};

// A finished generation as the HTTP layer reports it.
struct GenerationResult {
  std::string text;           // completions: the text; chat: message.content when `message` is unset
  std::string finish_reason;  // "stop" | "length" | "tool_calls"
  Usage usage;
  // Chat: the parsed answer. "tool_calls" when it made calls, content null
  // when it has none, "reasoning_content" when the model reasoned.
  std::optional<AssistantMessage> message;
  const std::vector<TokenLogprob>* logprobs = nullptr;  // set when the request asked for them
};

nlohmann::json GenerationBody(Endpoint ep, const std::string& id, const std::string& model, int64_t created,
                              const GenerationResult& r);

// One stream chunk. `delta` is new text; `role_first` adds the assistant role
// (first chat chunk); `finish_reason` is set on the last content chunk.
nlohmann::json GenerationChunk(Endpoint ep, const std::string& id, const std::string& model, int64_t created,
                               const std::string& delta, bool role_first,
                               const std::optional<std::string>& finish_reason);
// A chat chunk carrying one ChatDelta (llama-server's delta shape).
nlohmann::json DeltaChunk(const std::string& id, const std::string& model, int64_t created, const ChatDelta& delta,
                          bool role_first);
// OpenAI's "logprobs" object of a choice: chat {"content": [...]}, completions
// {"tokens", "token_logprobs", "top_logprobs", "text_offset"} (`text_offset0`:
// where the first token's text starts).
nlohmann::json LogprobsJson(Endpoint ep, const std::vector<TokenLogprob>& lp, size_t text_offset0 = 0);
// The usage-only chunk sent when stream_options.include_usage is set.
nlohmann::json UsageChunk(Endpoint ep, const std::string& id, const std::string& model, int64_t created,
                          const Usage& usage);

nlohmann::json EmbeddingsBody(const std::string& model, const std::vector<std::vector<float>>& vectors,
                              int prompt_tokens, bool base64 = false);

// {"error":{"message","type","code","param"}}; adds "phase" for allocation failures.
nlohmann::json ErrorBody(const Status& status);

std::string SseEvent(const nlohmann::json& payload);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

}  // namespace spillway::api
