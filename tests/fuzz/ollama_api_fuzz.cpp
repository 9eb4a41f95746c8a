// libFuzzer target: Ollama's API both ways. A body as the gateway parses it
// (limits, then the translation for each route, then the OpenAI parser on
// what it made), and the same bytes as an OpenAI stream and answer
// translated back (the stream split at an input-chosen point).
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

#include "api/json_limits.h"
#include "api/ollama_request.h"
#include "api/ollama_response.h"
#include "api/openai_request.h"

using namespace spillway::api;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const OllamaRoute routes[] = {OllamaRoute::kChat, OllamaRoute::kGenerate, OllamaRoute::kEmbed, OllamaRoute::kEmbeddings};
  const OllamaReplyContext ctx{routes[size % 4], "m", 0};
  OllamaStreamTranslator stream(ctx);
  const size_t cut = size ? data[0] % (size + 1) : 0;
  (void)stream.Feed(std::string_view(text).substr(0, cut), 1);
  (void)stream.Feed(std::string_view(text).substr(cut), 2);
  (void)stream.Finish(3);
  (void)OllamaError(text);

  JsonLimits limits;
  limits.max_depth = 16 + (size % 64);
  auto body = ParseJsonBody(text, limits);
  if (!body.ok()) return 0;
  (void)OllamaAnswer(ctx, *body, 5);
  for (OllamaRoute route : routes) {
    auto call = TranslateOllamaRequest(route, *body);
    if (!call.ok()) continue;
    (void)call->openai.dump();
    call->openai["model"] = "m";
    const spillway::Status st = call->endpoint == "chat"         ? ParseChatRequest(call->openai).status()
                      : call->endpoint == "completion" ? ParseCompletionRequest(call->openai).status()
                                                       : ParseEmbeddingRequest(call->openai).status();
    (void)OllamaFieldNames(st, *call);
  }
  return 0;
}
