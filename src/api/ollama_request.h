// Ollama API request bodies (/api/chat, /api/generate, /api/embed,
// /api/embeddings) translated into the OpenAI-shaped bodies the gateway
// already admits, journals and fails over: an Ollama request takes exactly the
// path an OpenAI one does, and its answer is translated back
// (api/ollama_response.h).
//
// Ollama's defaults apply: `stream` is true unless false is given; unset
// sampler options take the service's defaults, as an OpenAI request's do.
// What Spillway cannot honour is refused with a 400 naming the field (images,
// a `template` or `context` override, `suffix`, mirostat and other samplers
// at anything but their neutral value); load-time options (num_ctx, num_gpu,
// num_thread...) are accepted and not applied: the service's placement
// decides them. Errors are kInvalidArgument naming the field as Ollama spells
// it ("options.num_predict").
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace spillway::api {

enum class OllamaRoute { kChat, kGenerate, kEmbed, kEmbeddings };

// An Ollama route (/api/...): routed to the Ollama API, and its errors take
// Ollama's shape ({"error": "<message>"}) whatever refuses it.
inline bool IsOllamaPath(std::string_view target) { return target.substr(0, 5) == "/api/"; }

// One Ollama request, translated.
struct OllamaCall {
  OllamaRoute route = OllamaRoute::kChat;
  std::string model;          // as the client named it ("chat", "chat:latest"): echoed in the answer
  bool stream = true;         // Ollama's default; embeddings never stream
  std::string endpoint;       // the gateway's: "chat" | "completion" | "embedding"
  nlohmann::json openai;      // the OpenAI-shaped body ("model" is the client's name until the gateway resolves it)
  // keep_alive as given, in seconds (negative: forever); unset when absent.
  std::optional<double> keep_alive_s;
  // Nothing to generate (an empty prompt, no messages, an empty legacy
  // embeddings prompt): Ollama only loads the model; Spillway answers at once.
  bool load_only = false;
  // OpenAI field -> Ollama field, for naming a field in the OpenAI parser's
  // errors as the client sent it ("max_tokens" -> "options.num_predict").
  std::vector<std::pair<std::string, std::string>> renamed;
};

// The levels of nesting a translation may add to the client's body: a
// "format" schema becomes response_format.json_schema.schema.
inline constexpr int kTranslationDepth = 2;

// Translates a parsed Ollama body. kInvalidArgument names the Ollama field.
StatusOr<OllamaCall> TranslateOllamaRequest(OllamaRoute route, const nlohmann::json& body);

// keep_alive: a number of seconds, or a Go duration string ("5m", "1h30m",
// "300ms", "-1"); negative means forever, 0 unload when idle.
StatusOr<double> ParseKeepAlive(const nlohmann::json& value);  // clamped to +-kMaxKeepAliveS
inline constexpr double kMaxKeepAliveS = 1e9;

// An error of the OpenAI parser, with the fields the translation renamed
// spelled as the client sent them.
Status OllamaFieldNames(const Status& st, const OllamaCall& call);

// "name:latest" names the service "name" (Ollama's default tag).
std::string WithoutLatestTag(const std::string& model);

}  // namespace spillway::api
