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
};

// A finished generation as the HTTP layer reports it.
struct GenerationResult {
  std::string text;
  std::string finish_reason;  // "stop" | "length" | "tool_calls"
  Usage usage;
  // Chat only: calls the model made. The message then has "tool_calls" and
  // its content is `text`, or null when `text` is empty.
  std::vector<ToolCall> tool_calls;
};

nlohmann::json GenerationBody(Endpoint ep, const std::string& id, const std::string& model, int64_t created,
                              const GenerationResult& r);

// One stream chunk. `delta` is new text; `role_first` adds the assistant role
// (first chat chunk); `finish_reason` is set on the last content chunk.
nlohmann::json GenerationChunk(Endpoint ep, const std::string& id, const std::string& model, int64_t created,
                               const std::string& delta, bool role_first,
                               const std::optional<std::string>& finish_reason);
// A chat chunk delivering one whole tool call, the `index`-th of the answer:
// {"tool_calls": [{"index", "id", "type": "function", "function": {"name", "arguments"}}]}.
nlohmann::json ToolCallChunk(const std::string& id, const std::string& model, int64_t created, const ToolCall& call,
                             int index, bool role_first);
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
