// libFuzzer target: a request body as the gateway and the worker parse it
// (limits first, then the chat, completion and embedding parsers, tools
// included), and what they do with an accepted one (dump it again).
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

#include "api/json_limits.h"
#include "api/openai_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  spillway::api::JsonLimits limits;
  limits.max_depth = 16 + (size % 64);
  auto body = spillway::api::ParseJsonBody(text, limits);
  if (!body.ok()) return 0;
  (void)body->dump();  // recursive: must be safe on anything the limits let through
  if (auto chat = spillway::api::ParseChatRequest(*body); chat.ok()) {
    for (const auto& t : chat->tools) (void)spillway::api::CheckJsonLimits(t.parameters, limits);
    for (const auto& m : chat->messages) {
      for (const auto& c : m.tool_calls) (void)spillway::api::CheckJsonLimits(c.arguments, limits);
    }
  }
  (void)spillway::api::ParseCompletionRequest(*body);
  (void)spillway::api::ParseEmbeddingRequest(*body);
  return 0;
}
