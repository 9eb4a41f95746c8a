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

#include "api/json_limits.h"  // ParseJsonBody: every body is parsed within limits
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

// One call of a function: in an assistant message of the history (request)
// or in an answer (response).
struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text, as OpenAI carries it
};

struct ChatMessage {
  std::string role;                  // system | user | assistant | tool ("developer" becomes "system")
  std::string content;               // "" for null content
  std::vector<ToolCall> tool_calls;  // assistant messages that called functions
  std::string tool_call_id;          // role "tool": the call this message answers
};

// A function the model may call: "tools": [{"type": "function", "function": {...}}].
struct ToolFunction {
  std::string name;         // [A-Za-z0-9_-]{1,64}
  std::string description;
  std::string parameters;   // its JSON Schema (an object) as compact JSON text; "" when not given
};

// "tool_choice": "none" | "auto" | "required" | {"type": "function", "function": {"name": N}}.
enum class ToolChoice { kNone, kAuto, kRequired, kFunction };

struct ChatRequest {
  GenerationRequest gen;
  std::vector<ChatMessage> messages;
  std::vector<ToolFunction> tools;
  // Unset: kAuto when tools are given, else kNone. kRequired and kFunction
  // need tools (and kFunction a name among them).
  ToolChoice tool_choice = ToolChoice::kNone;
  std::string tool_choice_name;  // kFunction: the function that must be called
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

// Limits on request shape (the JSON itself is bounded by api/json_limits.h) (not on model capacity, which the worker checks).
inline constexpr int32_t kMaxTokensCap = 1 << 20;
inline constexpr size_t kMaxStopStrings = 4;
inline constexpr size_t kMaxStopLength = 256;
inline constexpr size_t kMaxMessages = 4096;
inline constexpr size_t kMaxEmbeddingInputs = 2048;
inline constexpr size_t kMaxPromptTokens = 1 << 20;
inline constexpr size_t kMaxTools = 128;
inline constexpr size_t kMaxToolDescription = 8192;       // bytes
inline constexpr size_t kMaxToolParameters = 64 << 10;    // bytes of the schema's JSON text
inline constexpr size_t kMaxToolProperties = 64;          // top-level properties of one schema
inline constexpr size_t kMaxToolCallsPerMessage = 128;
inline constexpr size_t kMaxToolArguments = 1 << 20;      // bytes of one call's arguments

StatusOr<ChatRequest> ParseChatRequest(const nlohmann::json& body);
StatusOr<CompletionRequest> ParseCompletionRequest(const nlohmann::json& body);
StatusOr<EmbeddingRequest> ParseEmbeddingRequest(const nlohmann::json& body);

}  // namespace spillway::api
