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

// One entry of "logit_bias": `bias` is added to the token's logit before any
// other sampler sees it (-infinity, from llama-server's `false`, bans it).
struct TokenBias {
  int32_t token = 0;  // not checked against a vocabulary here: the worker does that
  float bias = 0;
  bool operator==(const TokenBias&) const = default;
};

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
  std::vector<TokenBias> logit_bias;  // at most kMaxLogitBias entries, each token once
};

// "response_format": the answer must be JSON. The worker turns the schema
// into a grammar (llama.cpp's JSON-schema-to-grammar), so it is honoured, not
// hoped for.
enum class ResponseFormatType { kText, kJsonObject, kJsonSchema };
struct ResponseFormat {
  ResponseFormatType type = ResponseFormatType::kText;
  std::string schema;  // compact JSON text: json_schema's "schema", or json_object's optional "schema"
  std::string name;    // json_schema's "name"
  bool strict = false; // json_schema's "strict" (the grammar enforces the schema either way)
};

struct GenerationRequest {
  std::string model;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::optional<int32_t> max_tokens;
  std::vector<std::string> stop;
  SamplingRequest sampling;
  bool ignore_eos = false;     // benchmarks: generate exactly max_tokens
  ResponseFormat response_format;
  // Chat: "logprobs": true and "top_logprobs": 0..20. Completions: "logprobs": 0..5
  // (the legacy integer), which sets both.
  bool logprobs = false;
  int32_t top_logprobs = 0;
  std::string user;            // OpenAI's end-user id: accepted, logged nowhere, not used
  // "spillway_resume": {"tokens": [...], "text_bytes": N}: continue a stream
  // cut on another placement (set by the gateway).
  std::vector<int32_t> resume_tokens;
  uint64_t resume_text_bytes = 0;
  // "spillway_fit_context": true: max_tokens is an upper bound, lowered to
  // the room beside the prompt in the context instead of refused (set by the
  // gateway for an Ollama request: num_predict is that there).
  bool fit_context = false;
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
  std::string name;         // [A-Za-z0-9_.-]{1,64}
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
  std::optional<bool> parallel_tool_calls;  // unset: as the template allows (llama-server's rule)
  // llama-server's "reasoning_format": none | auto | deepseek | deepseek-legacy; "" = the worker's default.
  std::string reasoning_format;
  // llama-server's "chat_template_kwargs" (values as JSON text) and OpenAI's
  // "reasoning_effort" ("none" turns thinking off, others go to the template).
  std::vector<std::pair<std::string, std::string>> chat_template_kwargs;
  std::string reasoning_effort;
  // "truncate": true (Ollama's /api/chat default; an extension here): a
  // conversation longer than the context loses its oldest messages, never
  // its system messages nor its last one, rather than being refused.
  bool truncate = false;
  // "spillway_drop_messages" (internal, the gateway's): leave out exactly this
  // many of the oldest messages that are not system messages, as the worker
  // that counted the prompt for admission did, so that every placement reads
  // the same prompt.
  std::optional<int32_t> drop_messages;
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
  // "truncate": true (a Spillway extension, under text-embeddings-inference's
  // name; Ollama's /api/embed sends it by default): an input longer than the
  // model takes is cut to what it takes (its end token kept) instead of
  // refused; usage.prompt_tokens counts what was embedded.
  bool truncate = false;
};

// Limits on request shape (the JSON itself is bounded by api/json_limits.h) (not on model capacity, which the worker checks).
inline constexpr int32_t kMaxTokensCap = 1 << 20;
// More than OpenAI's 4: Ollama takes any number (a Modelfile's stop list,
// copied by clients, often has 5 to 10), llama-server too.
inline constexpr size_t kMaxStopStrings = 16;
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
inline constexpr size_t kMaxSchemaBytes = 64 << 10;       // response_format's schema, as JSON text
inline constexpr int32_t kMaxTopLogprobs = 20;            // OpenAI's limit
inline constexpr int32_t kMaxChoices = 1;                 // "n": one choice per request
inline constexpr size_t kMaxLogitBias = 1024;             // "logit_bias" entries (OpenAI allows 300)
inline constexpr double kMaxAbsLogitBias = 100;           // OpenAI's range: -100..100

// Fields of llama-server or of older OpenAI APIs that change sampling and
// that Spillway does not implement: a request that sets one (to anything but
// null or its neutral value) is refused with a 400 naming it, never silently
// served without it.
extern const char* const kUnsupportedSamplingFields[];

StatusOr<ChatRequest> ParseChatRequest(const nlohmann::json& body);
StatusOr<CompletionRequest> ParseCompletionRequest(const nlohmann::json& body);
StatusOr<EmbeddingRequest> ParseEmbeddingRequest(const nlohmann::json& body);
// A "seed" below 0 (-1 is "random" to many UIs): no seed, for the gateway to pin one.
bool IsNegativeSeed(const nlohmann::json& body);

}  // namespace spillway::api
