#include "api/openai_response.h"

#include <cstdint>
#include <cstring>

namespace spillway::api {

using nlohmann::json;

namespace {

// Little-endian float32 bytes, base64-encoded (what OpenAI returns for
// encoding_format "base64").
std::string Base64Floats(const std::vector<float>& v) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes(v.size() * 4, '\0');
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &v[i], 4);
    for (int b = 0; b < 4; ++b) bytes[i * 4 + b] = static_cast<char>((u >> (8 * b)) & 0xff);
  }
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const uint32_t n = (static_cast<uint8_t>(bytes[i]) << 16) |
                       (i + 1 < bytes.size() ? static_cast<uint8_t>(bytes[i + 1]) << 8 : 0) |
                       (i + 2 < bytes.size() ? static_cast<uint8_t>(bytes[i + 2]) : 0);
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(n >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[n & 63] : '=';
  }
  return out;
}

json UsageJson(const Usage& u) {
  json out = {{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens}};
  if (u.cached_tokens >= 0) out["prompt_tokens_details"] = {{"cached_tokens", u.cached_tokens}};
  return out;
}

json ToolCallJson(const ToolCall& c) {
  return {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}

json Envelope(Endpoint ep, bool chunk, const std::string& id, const std::string& model, int64_t created) {
  const char* object = ep == Endpoint::kChat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return {{"id", id}, {"object", object}, {"created", created}, {"model", model}};
}

}  // namespace

json GenerationBody(Endpoint ep, const std::string& id, const std::string& model, int64_t created,
                    const GenerationResult& r) {
  json body = Envelope(ep, false, id, model, created);
  json choice = {{"index", 0}, {"finish_reason", r.finish_reason}, {"logprobs", nullptr}};
  if (r.logprobs) choice["logprobs"] = LogprobsJson(ep, *r.logprobs);
  if (ep == Endpoint::kChat) {
    const AssistantMessage m = r.message.value_or(AssistantMessage{r.text, "", {}});
    choice["message"] = {{"role", "assistant"}, {"content", m.content}};
    if (!m.reasoning_content.empty()) choice["message"]["reasoning_content"] = m.reasoning_content;
    if (!m.tool_calls.empty()) {
      if (m.content.empty()) choice["message"]["content"] = nullptr;
      json calls = json::array();
      for (const auto& c : m.tool_calls) calls.push_back(ToolCallJson(c));
      choice["message"]["tool_calls"] = std::move(calls);
    }
  } else {
    choice["text"] = r.text;
  }
  body["choices"] = json::array({choice});
  body["usage"] = UsageJson(r.usage);
  return body;
}

json GenerationChunk(Endpoint ep, const std::string& id, const std::string& model, int64_t created,
                     const std::string& delta, bool role_first, const std::optional<std::string>& finish_reason) {
  json body = Envelope(ep, true, id, model, created);
  json choice = {{"index", 0}, {"logprobs", nullptr}};
  choice["finish_reason"] = finish_reason ? json(*finish_reason) : json(nullptr);
  if (ep == Endpoint::kChat) {
    json d = json::object();
    if (role_first) d["role"] = "assistant";
    if (!delta.empty() || role_first) d["content"] = delta;
    choice["delta"] = d;
  } else {
    choice["text"] = delta;
  }
  body["choices"] = json::array({choice});
  return body;
}

json DeltaChunk(const std::string& id, const std::string& model, int64_t created, const ChatDelta& delta,
                bool role_first) {
  json body = Envelope(Endpoint::kChat, true, id, model, created);
  json d = json::object();
  if (role_first) {
    d["role"] = "assistant";
    d["content"] = nullptr;
  }
  if (!delta.reasoning_content.empty()) d["reasoning_content"] = delta.reasoning_content;
  if (!delta.content.empty()) d["content"] = delta.content;
  if (delta.tool_call_index >= 0) {
    json c = {{"index", delta.tool_call_index}};
    if (!delta.tool_call.id.empty()) {
      c["id"] = delta.tool_call.id;
      c["type"] = "function";
    }
    json fn = json::object();
    if (!delta.tool_call.name.empty()) fn["name"] = delta.tool_call.name;
    if (!delta.tool_call.arguments.empty()) fn["arguments"] = delta.tool_call.arguments;
    if (!fn.empty()) c["function"] = std::move(fn);
    d["tool_calls"] = json::array({std::move(c)});
  }
  body["choices"] = json::array({{{"index", 0}, {"delta", std::move(d)}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
  return body;
}

namespace {
json Bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}
}  // namespace

json LogprobsJson(Endpoint ep, const std::vector<TokenLogprob>& lp, size_t text_offset0) {
  if (ep == Endpoint::kChat) {
    json content = json::array();
    for (const auto& t : lp) {
      json top = json::array();
      for (const auto& [tok, l] : t.top) top.push_back({{"token", tok}, {"logprob", l}, {"bytes", Bytes(tok)}});
      content.push_back({{"token", t.token}, {"logprob", t.logprob}, {"bytes", Bytes(t.token)}, {"top_logprobs", top}});
    }
    return {{"content", std::move(content)}};
  }
  json tokens = json::array(), logprobs = json::array(), tops = json::array(), offsets = json::array();
  size_t offset = text_offset0;
  for (const auto& t : lp) {
    tokens.push_back(t.token);
    logprobs.push_back(t.logprob);
    json top = json::object();
    for (const auto& [tok, l] : t.top) top[tok] = l;
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += t.token.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", logprobs}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json UsageChunk(Endpoint ep, const std::string& id, const std::string& model, int64_t created, const Usage& usage) {
  json body = Envelope(ep, true, id, model, created);
  body["choices"] = json::array();
  body["usage"] = UsageJson(usage);
  return body;
}

json EmbeddingsBody(const std::string& model, const std::vector<std::vector<float>>& vectors, int prompt_tokens,
                    bool base64) {
  json data = json::array();
  for (size_t i = 0; i < vectors.size(); ++i) {
    json e = base64 ? json(Base64Floats(vectors[i])) : json(vectors[i]);
    data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", std::move(e)}});
  }
  return {{"object", "list"},
          {"data", std::move(data)},
          {"model", model},
          {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}};
}

json ErrorBody(const Status& status) {
  json err = {{"message", status.message()},
              {"type", OpenAiErrorType(status.code())},
              {"code", status.reason().empty() ? StatusCodeName(status.code()) : status.reason()},
              {"param", nullptr}};
  // With a reason in "code", the code's name is said beside it (the worker
  // protocol reads it back: protocol::ParseWorkerError).
  if (!status.reason().empty()) err["status"] = StatusCodeName(status.code());
  if (status.phase() != FailurePhase::kNone) err["phase"] = FailurePhaseName(status.phase());
  return {{"error", std::move(err)}};
}

std::string SseEvent(const json& payload) {
  return "data: " + payload.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace spillway::api
