#include "api/openai_request.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

#include "api/openai_tools.h"

namespace spillway::api {

using nlohmann::json;

namespace {

Status Bad(const std::string& field, const std::string& what) {
  return Status::InvalidArgument("'" + field + "' " + what);
}

// Reads an optional number field in [lo, hi]; null counts as absent.
template <typename T>
Status OptionalNumber(const json& body, const char* field, double lo, double hi, std::optional<T>* out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return Status::Ok();
  if (!it->is_number()) return Bad(field, "must be a number");
  if constexpr (std::is_integral_v<T>) {
    if (it->is_number_float()) {
      double d = it->get<double>();
      if (d != std::floor(d)) return Bad(field, "must be an integer");
    }
  }
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) {
    return Bad(field, "must be between " + json(lo).dump() + " and " + json(hi).dump());
  }
  *out = static_cast<T>(v);
  return Status::Ok();
}

Status OptionalBool(const json& body, const char* field, bool* out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return Status::Ok();
  if (!it->is_boolean()) return Bad(field, "must be a boolean");
  *out = it->get<bool>();
  return Status::Ok();
}

Status ParseModel(const json& body, std::string* model) {
  auto it = body.find("model");
  if (it == body.end() || it->is_null()) return Status::Ok();
  if (!it->is_string()) return Bad("model", "must be a string");
  *model = it->get<std::string>();
  if (model->size() > 256) return Bad("model", "is longer than 256 characters");
  return Status::Ok();
}

Status ParseGeneration(const json& body, GenerationRequest* g) {
  SPILLWAY_RETURN_IF_ERROR(ParseModel(body, &g->model));
  SPILLWAY_RETURN_IF_ERROR(OptionalBool(body, "stream", &g->stream));
  SPILLWAY_RETURN_IF_ERROR(OptionalBool(body, "ignore_eos", &g->ignore_eos));
  if (auto it = body.find("spillway_resume"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return Bad("spillway_resume", "must be an object");
    auto t = it->find("tokens");
    if (t == it->end() || !t->is_array() || t->size() > kMaxTokensCap) {
      return Bad("spillway_resume", "needs 'tokens', an array of token ids");
    }
    for (const auto& x : *t) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX) {
        return Bad("spillway_resume", "tokens must be non-negative integers");
      }
      g->resume_tokens.push_back(static_cast<int32_t>(x.get<int64_t>()));
    }
    auto b = it->find("text_bytes");
    if (b != it->end() && (!b->is_number_unsigned() || b->get<uint64_t>() > (1ull << 40))) {
      return Bad("spillway_resume", "text_bytes must be a non-negative integer");
    }
    if (b != it->end()) g->resume_text_bytes = b->get<uint64_t>();
  }
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return Bad("stream_options", "must be an object");
    SPILLWAY_RETURN_IF_ERROR(OptionalBool(*it, "include_usage", &g->include_usage));
  }
  // max_completion_tokens is the newer name; max_tokens wins if both are set.
  SPILLWAY_RETURN_IF_ERROR(OptionalNumber(body, "max_completion_tokens", 1, kMaxTokensCap, &g->max_tokens));
  SPILLWAY_RETURN_IF_ERROR(OptionalNumber(body, "max_tokens", 1, kMaxTokensCap, &g->max_tokens));
  if (auto it = body.find("n"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() != 1) return Bad("n", "must be 1 (one choice per request)");
  }
  auto& s = g->sampling;
  SPILLWAY_RETURN_IF_ERROR(OptionalNumber(body, "temperature", 0, 2, &s.temperature));
  SPILLWAY_RETURN_IF_ERROR(OptionalNumber(body, "top_p", 0, 1, &s.top_p));
  SPILLWAY_RETURN_IF_ERROR(OptionalNumber(body, "top_k", 0, 100000, &s.top_k));
  SPILLWAY_RETURN_IF_ERROR(OptionalNumber(body, "min_p", 0, 1, &s.min_p));
  SPILLWAY_RETURN_IF_ERROR(OptionalNumber(body, "repeat_penalty", 0.01, 10, &s.repeat_penalty));
  SPILLWAY_RETURN_IF_ERROR(OptionalNumber(body, "repeat_last_n", 0, 8192, &s.repeat_last_n));
  SPILLWAY_RETURN_IF_ERROR(OptionalNumber(body, "frequency_penalty", -2, 2, &s.frequency_penalty));
  SPILLWAY_RETURN_IF_ERROR(OptionalNumber(body, "presence_penalty", -2, 2, &s.presence_penalty));
  // 0xFFFFFFFF is llama.cpp's "random seed" sentinel, so it is excluded.
  SPILLWAY_RETURN_IF_ERROR(OptionalNumber(body, "seed", 0, 4294967294.0, &s.seed));

  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      g->stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      if (it->size() > kMaxStopStrings) return Bad("stop", "may hold at most 4 strings");
      for (const auto& s : *it) {
        if (!s.is_string()) return Bad("stop", "must be a string or an array of strings");
        g->stop.push_back(s.get<std::string>());
      }
    } else {
      return Bad("stop", "must be a string or an array of strings");
    }
    for (const auto& s : g->stop) {
      if (s.empty()) return Bad("stop", "strings must not be empty");
      if (s.size() > kMaxStopLength) return Bad("stop", "strings must be at most 256 bytes");
    }
  }
  return Status::Ok();
}

StatusOr<std::string> ContentText(const json& content, size_t index) {
  const std::string field = "messages[" + std::to_string(index) + "].content";
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (content.is_array()) {
    std::string text;
    for (const auto& part : content) {
      if (!part.is_object()) return Bad(field, "parts must be objects");
      auto type = part.find("type");
      if (type == part.end() || !type->is_string()) return Bad(field, "parts need a string 'type'");
      if (*type != "text") return Bad(field, "part type '" + type->get<std::string>() + "' is not supported (text only)");
      auto t = part.find("text");
      if (t == part.end() || !t->is_string()) return Bad(field, "text parts need a string 'text'");
      text += t->get<std::string>();
    }
    return text;
  }
  return Bad(field, "must be a string or an array of text parts");
}

}  // namespace

StatusOr<ChatRequest> ParseChatRequest(const json& body) {
  ChatRequest r;
  SPILLWAY_RETURN_IF_ERROR(ParseGeneration(body, &r.gen));
  auto it = body.find("messages");
  if (it == body.end()) return Bad("messages", "is required");
  if (!it->is_array() || it->empty()) return Bad("messages", "must be a non-empty array");
  if (it->size() > kMaxMessages) return Bad("messages", "has more than 4096 entries");
  size_t i = 0;
  for (const auto& m : *it) {
    const std::string field = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return Bad(field, "must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return Bad(field + ".role", "must be a string");
    const std::string rs = role->get<std::string>();
    if (rs != "system" && rs != "user" && rs != "assistant" && rs != "tool" && rs != "developer") {
      return Bad(field + ".role", "must be one of system, developer, user, assistant, tool");
    }
    ChatMessage msg;
    msg.role = rs == "developer" ? "system" : rs;
    SPILLWAY_RETURN_IF_ERROR(ParseMessageToolFields(m, field, &msg));
    auto content = m.find("content");
    // An assistant message that called functions may leave content out.
    if (content == m.end() && msg.tool_calls.empty()) return Bad(field + ".content", "is required");
    if (content != m.end()) {
      auto text = ContentText(*content, i);
      if (!text.ok()) return text.status();
      msg.content = std::move(*text);
    }
    r.messages.push_back(std::move(msg));
    ++i;
  }
  SPILLWAY_RETURN_IF_ERROR(ParseToolFields(body, &r));
  return r;
}

StatusOr<CompletionRequest> ParseCompletionRequest(const json& body) {
  CompletionRequest r;
  SPILLWAY_RETURN_IF_ERROR(ParseGeneration(body, &r.gen));
  auto it = body.find("prompt");
  if (it == body.end()) return Bad("prompt", "is required");
  if (it->is_string()) {
    r.prompt = it->get<std::string>();
  } else if (it->is_array() && it->size() == 1 && (*it)[0].is_string()) {
    r.prompt = (*it)[0].get<std::string>();
  } else if (it->is_array() && !it->empty() && (*it)[0].is_number()) {
    if (it->size() > kMaxPromptTokens) return Bad("prompt", "has more than 1048576 tokens");
    r.prompt_tokens.reserve(it->size());
    for (const auto& t : *it) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX) {
        return Bad("prompt", "token arrays must hold non-negative integers");
      }
      r.prompt_tokens.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
  } else {
    return Bad("prompt", "must be a string, an array of one string, or an array of token ids");
  }
  return r;
}

StatusOr<EmbeddingRequest> ParseEmbeddingRequest(const json& body) {
  EmbeddingRequest r;
  SPILLWAY_RETURN_IF_ERROR(ParseModel(body, &r.model));
  if (auto f = body.find("encoding_format"); f != body.end() && !f->is_null()) {
    if (!f->is_string() || (*f != "float" && *f != "base64")) return Bad("encoding_format", "must be 'float' or 'base64'");
    r.base64 = *f == "base64";
  }
  auto it = body.find("input");
  if (it == body.end()) return Bad("input", "is required");
  if (it->is_string()) {
    r.inputs.push_back(it->get<std::string>());
  } else if (it->is_array()) {
    if (it->empty()) return Bad("input", "must not be empty");
    if (it->size() > kMaxEmbeddingInputs) return Bad("input", "may hold at most 2048 strings");
    r.input_was_array = true;
    for (const auto& s : *it) {
      if (!s.is_string()) return Bad("input", "must be a string or an array of strings (token arrays are not supported)");
      r.inputs.push_back(s.get<std::string>());
    }
  } else {
    return Bad("input", "must be a string or an array of strings");
  }
  for (const auto& s : r.inputs) {
    if (s.empty()) return Bad("input", "strings must not be empty");
  }
  return r;
}

}  // namespace spillway::api
