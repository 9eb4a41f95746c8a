// OpenAI request bodies parsed into plain structs, with every number bounded.
//
// The gateway and the worker both parse with these functions, so a body that
// one accepts the other accepts too. Unknown fields are ignored (SDKs send
// many); known fields of the wrong type or out of range are errors naming the
// field (StatusCode::kInvalidArgument -> HTTP 400).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace spillway::api {

// Sampler settings a client may set; unset ones take the placement's defaults.
struct SamplingRequest {
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int32_t> top_k;
  std::optional<float> min_p;
  std::optional<float> repeat_penalty;
  std::optional<int32_t> repeat_last_n;
  std::optional<float> frequency_penalty;
  std::optional<float> presence_penalty;
  std::optional<uint32_t> seed;
};

struct GenerationRequest {
  std::string model;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::optional<int32_t> max_tokens;
  std::vector<std::string> stop;
  SamplingRequest sampling;
  bool ignore_eos = false;     // benchmarks: generate exactly max_tokens
  // "spillway_resume": {"tokens": [...], "text_bytes": N}: continue a stream
  // cut on another placement (set by the gateway).
  std::vector<int32_t> resume_tokens;
  uint64_t resume_text_bytes = 0;
};

struct ChatMessage {
  std::string role;
  std::string content;
};

struct ChatRequest {
  GenerationRequest gen;
  std::vector<ChatMessage> messages;
};

struct CompletionRequest {
  GenerationRequest gen;
  std::string prompt;                 // text, or
  std::vector<int32_t> prompt_tokens; // token ids (OpenAI's integer-array prompt), used as given
};

struct EmbeddingRequest {
  std::string model;
  std::vector<std::string> inputs;
  bool input_was_array = false;
  bool base64 = false;  // encoding_format "base64": little-endian float32, base64 (the OpenAI SDKs' default)
};

// Limits on request shape (not on model capacity, which the worker checks).
inline constexpr int32_t kMaxTokensCap = 1 << 20;
inline constexpr size_t kMaxStopStrings = 4;
inline constexpr size_t kMaxStopLength = 256;
inline constexpr size_t kMaxMessages = 4096;
inline constexpr size_t kMaxEmbeddingInputs = 2048;
inline constexpr size_t kMaxPromptTokens = 1 << 20;

// Parses raw body text; malformed JSON is an error naming the offset.
StatusOr<nlohmann::json> ParseJsonBody(const std::string& body);

StatusOr<ChatRequest> ParseChatRequest(const nlohmann::json& body);
StatusOr<CompletionRequest> ParseCompletionRequest(const nlohmann::json& body);
StatusOr<EmbeddingRequest> ParseEmbeddingRequest(const nlohmann::json& body);

}  // namespace spillway::api
