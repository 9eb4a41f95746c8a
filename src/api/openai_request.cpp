#include "api/openai_request.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

#include "api/json_member.h"
#include "api/openai_logit_bias.h"
#include "api/openai_tools.h"

namespace spillway::api {

using nlohmann::json;

// name, then its neutral value as JSON text ("" = only null is neutral).
const char* const kUnsupportedSamplingFields[] = {
    "best_of", "1", "echo", "false", "suffix", "\"\"", "mirostat", "0",
    "typical_p", "1", "typ_p", "1", "tfs_z", "1", "top_n_sigma", "-1", "xtc_probability", "0",
    "dry_multiplier", "0", "dynatemp_range", "0", "grammar", "\"\"", "json_schema", "", "n_probs", "0",
    "samplers", "", "functions", "", "function_call", "",
    "n_predict", "-1",  // (llama-server's max_tokens, which it lets win: use max_tokens)
    nullptr};

namespace {

Status Bad(const std::string& field, const std::string& what) {
  return Status::InvalidArgument("'" + field + "' " + what);
}

// Reads an optional number field in [lo, hi]; null counts as absent.
template <typename T>
Status OptionalNumber(const json& body, const char* field, double lo, double hi, std::optional<T>* out) {
  const json* it = GivenMember(body, field);
  if (!it) return Status::Ok();
  if (!it->is_number()) return Bad(field, "must be a number");
  if constexpr (std::is_integral_v<T>) {
    if (it->is_number_float()) {
      double d = it->get<double>();
      if (d != std::floor(d)) return Bad(field, "must be an integer");
    }
  }
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) {
    // (An integer field's bounds as integers: "between 1 and 1048576", not 1.0 and 1048576.0.)
    auto text = [](double x) {
      return std::is_integral_v<T> ? std::to_string(static_cast<long long>(x)) : json(x).dump();
    };
    return Bad(field, "must be between " + text(lo) + " and " + text(hi));
  }
  *out = static_cast<T>(v);
  return Status::Ok();
}

// OpenAI's and Ollama's seeds are 64-bit, llama.cpp's 32 (0xFFFFFFFF its
// "random"): a larger one is taken modulo 2^32 - 1, the same each time (a
// seed of 2^32 or more was refused). Not negative here (IsNegativeSeed).
Status ParseSeed(const json& body, std::optional<uint32_t>* out) {
  const json* it = GivenMember(body, "seed");
  if (!it) return Status::Ok();
  uint64_t v = 0;
  if (it->is_number_unsigned()) {
    v = it->get<uint64_t>();
  } else if (it->is_number_integer()) {
    v = static_cast<uint64_t>(it->get<int64_t>());
  } else if (it->is_number_float()) {
    const double d = it->get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || d < 0) return Bad("seed", "must be an integer");
    if (d >= 18446744073709551616.0) return Bad("seed", "must be below 2^64 (it is taken modulo 2^32 - 1)");
    v = static_cast<uint64_t>(d);
  } else {
    return Bad("seed", "must be an integer");
  }
  *out = static_cast<uint32_t>(v % 4294967295u);
  return Status::Ok();
}

Status OptionalBool(const json& body, const char* field, bool* out) {
  const json* it = GivenMember(body, field);
  if (!it) return Status::Ok();
  if (!it->is_boolean()) return Bad(field, "must be a boolean");
  *out = it->get<bool>();
  return Status::Ok();
}

Status ParseModel(const json& body, std::string* model) {
  const json* it = GivenMember(body, "model");
  if (!it) return Status::Ok();
  if (!it->is_string()) return Bad("model", "must be a string");
  *model = it->get<std::string>();
  if (model->size() > 256) return Bad("model", "is longer than 256 characters");
  return Status::Ok();
}

Status RefuseUnsupportedSampling(const json& body) {
  for (const char* const* f = kUnsupportedSamplingFields; *f; f += 2) {
    const json* it = GivenMember(body, f[0]);
    if (!it) continue;
    if (*f[1] && *it == json::parse(f[1])) continue;
    return Bad(f[0], "is not supported by Spillway; the request was refused rather than served without it");
  }
  return Status::Ok();
}

Status ParseResponseFormat(const json& body, ResponseFormat* out) {
  const json* it = GivenMember(body, "response_format");
  if (!it) return Status::Ok();
  static const char* kShape = "must be {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}";
  if (!it->is_object()) return Bad("response_format", kShape);
  auto type = it->find("type");
  if (type == it->end() || !type->is_string()) return Bad("response_format.type", kShape);
  auto schema_text = [&](const json& schema, const std::string& field) -> Status {
    if (!schema.is_object()) return Bad(field, "must be a JSON Schema object");
    out->schema = schema.dump(-1, ' ', false, json::error_handler_t::replace);
    if (out->schema.size() > kMaxSchemaBytes) {
      return Bad(field, "is larger than " + std::to_string(kMaxSchemaBytes) + " bytes");
    }
    return Status::Ok();
  };
  if (*type == "text") {
    out->type = ResponseFormatType::kText;
  } else if (*type == "json_object") {
    out->type = ResponseFormatType::kJsonObject;
    if (const json* s = GivenMember(*it, "schema")) {
      SPILLWAY_RETURN_IF_ERROR(schema_text(*s, "response_format.schema"));
    }
  } else if (*type == "json_schema") {
    out->type = ResponseFormatType::kJsonSchema;
    auto js = it->find("json_schema");
    if (js == it->end() || !js->is_object()) return Bad("response_format.json_schema", "must be an object with a 'schema'");
    if (const json* n = GivenMember(*js, "name")) {
      if (!n->is_string() || n->get_ref<const std::string&>().size() > 64) {
        return Bad("response_format.json_schema.name", "must be a string of at most 64 characters");
      }
      out->name = n->get<std::string>();
    }
    SPILLWAY_RETURN_IF_ERROR(OptionalBool(*js, "strict", &out->strict));
    auto s = js->find("schema");
    if (s == js->end() || s->is_null()) return Bad("response_format.json_schema.schema", "is required");
    SPILLWAY_RETURN_IF_ERROR(schema_text(*s, "response_format.json_schema.schema"));
  } else {
    return Bad("response_format.type", "must be 'text', 'json_object' or 'json_schema'");
  }
  return Status::Ok();
}

// Chat: "logprobs": bool, "top_logprobs": 0..20. Completions: "logprobs": 0..5.
Status ParseLogprobs(const json& body, bool chat, GenerationRequest* g) {
  const json* it = GivenMember(body, "logprobs");
  if (chat) {
    SPILLWAY_RETURN_IF_ERROR(OptionalBool(body, "logprobs", &g->logprobs));
    std::optional<int32_t> top;
    SPILLWAY_RETURN_IF_ERROR(OptionalNumber(body, "top_logprobs", 0, kMaxTopLogprobs, &top));
    if (top && !g->logprobs) return Bad("top_logprobs", "requires 'logprobs': true");
    g->top_logprobs = top.value_or(0);
    return Status::Ok();
  }
  if (!it) return Status::Ok();
  if (it->is_boolean()) return Bad("logprobs", "must be an integer from 0 to 5 on /v1/completions");
  std::optional<int32_t> n;
  SPILLWAY_RETURN_IF_ERROR(OptionalNumber(body, "logprobs", 0, 5, &n));
  g->logprobs = n.has_value();
  g->top_logprobs = n.value_or(0);
  return Status::Ok();
}

// llama-server's chat extensions: "reasoning_format", "chat_template_kwargs",
// and OpenAI's "reasoning_effort".
Status ParseReasoningFields(const json& body, ChatRequest* r) {
  if (const json* it = GivenMember(body, "reasoning_format")) {
    if (!it->is_string() || (*it != "none" && *it != "auto" && *it != "deepseek" && *it != "deepseek-legacy")) {
      return Bad("reasoning_format", "must be one of none, auto, deepseek, deepseek-legacy");
    }
    r->reasoning_format = it->get<std::string>();
  }
  if (const json* it = GivenMember(body, "reasoning_effort")) {
    if (!it->is_string() || it->get_ref<const std::string&>().size() > 32) {
      return Bad("reasoning_effort", "must be a string such as none, low, medium or high");
    }
    r->reasoning_effort = it->get<std::string>();
  }
  if (const json* it = GivenMember(body, "chat_template_kwargs")) {
    if (!it->is_object() || it->size() > 64) return Bad("chat_template_kwargs", "must be an object of at most 64 entries");
    for (const auto& [k, v] : it->items()) {
      if (k == "enable_thinking" && !v.is_boolean()) {
        return Bad("chat_template_kwargs.enable_thinking", "must be a boolean");
      }
      r->chat_template_kwargs.emplace_back(k, v.dump(-1, ' ', false, json::error_handler_t::replace));
    }
  }
  return Status::Ok();
}

Status ParseGeneration(const json& body, GenerationRequest* g) {
  SPILLWAY_RETURN_IF_ERROR(ParseModel(body, &g->model));
  SPILLWAY_RETURN_IF_ERROR(OptionalBool(body, "stream", &g->stream));
  SPILLWAY_RETURN_IF_ERROR(OptionalBool(body, "ignore_eos", &g->ignore_eos));
  SPILLWAY_RETURN_IF_ERROR(OptionalBool(body, "spillway_fit_context", &g->fit_context));
  if (const json* it = GivenMember(body, "spillway_resume")) {
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
  if (const json* it = GivenMember(body, "stream_options")) {
    if (!it->is_object()) return Bad("stream_options", "must be an object");
    if (!g->stream) return Bad("stream_options", "is only allowed when 'stream' is true (as on OpenAI's API)");
    SPILLWAY_RETURN_IF_ERROR(OptionalBool(*it, "include_usage", &g->include_usage));
  }
  // max_completion_tokens is the newer name; max_tokens wins if both are set.
  SPILLWAY_RETURN_IF_ERROR(OptionalNumber(body, "max_completion_tokens", 1, kMaxTokensCap, &g->max_tokens));
  SPILLWAY_RETURN_IF_ERROR(OptionalNumber(body, "max_tokens", 1, kMaxTokensCap, &g->max_tokens));
  if (const json* it = GivenMember(body, "n")) {
    if (!it->is_number() || it->get<double>() != kMaxChoices) {  // (1.0 too, as every integer field)
      return Bad("n", "must be 1: Spillway generates one choice per request (send n requests, with different "
                      "seeds, for n choices)");
    }
  }
  SPILLWAY_RETURN_IF_ERROR(RefuseUnsupportedSampling(body));
  SPILLWAY_RETURN_IF_ERROR(ParseResponseFormat(body, &g->response_format));
  // Once the JSON is complete, its grammar allows only the end, which
  // ignore_eos forbids: the sampler would fail after the whole generation.
  if (g->ignore_eos && g->response_format.type != ResponseFormatType::kText) {
    return Bad("ignore_eos", "cannot be combined with a JSON response_format (the answer ends where the JSON does)");
  }
  if (const json* it = GivenMember(body, "user")) {
    if (!it->is_string() || it->get_ref<const std::string&>().size() > 256) {
      return Bad("user", "must be a string of at most 256 bytes");
    }
    g->user = it->get<std::string>();
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
  // A negative seed (-1: many UIs' "random") is no seed, as in the Ollama
  // API: the gateway pins one in its place.
  if (!IsNegativeSeed(body)) SPILLWAY_RETURN_IF_ERROR(ParseSeed(body, &s.seed));
  SPILLWAY_RETURN_IF_ERROR(ParseLogitBias(body, &s.logit_bias));

  if (const json* it = GivenMember(body, "stop")) {
    if (it->is_string()) {
      g->stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      if (it->size() > kMaxStopStrings) return Bad("stop", "may hold at most " + std::to_string(kMaxStopStrings) + " strings");
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
  SPILLWAY_RETURN_IF_ERROR(ParseLogprobs(body, /*chat=*/true, &r.gen));
  SPILLWAY_RETURN_IF_ERROR(ParseReasoningFields(body, &r));
  const json* it = Member(body, "messages");
  if (!it) return Bad("messages", "is required");
  if (!it->is_array() || it->empty()) return Bad("messages", "must be a non-empty array");
  if (it->size() > kMaxMessages) return Bad("messages", "has more than 4096 entries");
  size_t i = 0;
  for (const auto& m : *it) {
    const std::string field = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return Bad(field, "must be an object");
    const json* role = Member(m, "role");
    if (!role || !role->is_string()) return Bad(field + ".role", "must be a string");
    const std::string rs = role->get<std::string>();
    if (rs != "system" && rs != "user" && rs != "assistant" && rs != "tool" && rs != "developer") {
      return Bad(field + ".role", "must be one of system, developer, user, assistant, tool");
    }
    ChatMessage msg;
    msg.role = rs == "developer" ? "system" : rs;
    SPILLWAY_RETURN_IF_ERROR(ParseMessageToolFields(m, field, &msg));
    const json* content = Member(m, "content");
    // An assistant message that called functions may leave content out.
    if (!content && msg.tool_calls.empty()) return Bad(field + ".content", "is required");
    if (content) {
      auto text = ContentText(*content, i);
      if (!text.ok()) return text.status();
      msg.content = std::move(*text);
    }
    r.messages.push_back(std::move(msg));
    ++i;
  }
  SPILLWAY_RETURN_IF_ERROR(ParseToolFields(body, &r));
  SPILLWAY_RETURN_IF_ERROR(OptionalBool(body, "truncate", &r.truncate));
  if (const json* d = GivenMember(body, "spillway_drop_messages")) {
    if (!d->is_number_integer() || d->get<int64_t>() < 0 || d->get<int64_t>() > static_cast<int64_t>(kMaxMessages)) {
      return Bad("spillway_drop_messages", "must be a whole number of messages");
    }
    r.drop_messages = d->get<int32_t>();
  }
  return r;
}

StatusOr<CompletionRequest> ParseCompletionRequest(const json& body) {
  CompletionRequest r;
  SPILLWAY_RETURN_IF_ERROR(ParseGeneration(body, &r.gen));
  SPILLWAY_RETURN_IF_ERROR(ParseLogprobs(body, /*chat=*/false, &r.gen));
  const json* it = Member(body, "prompt");
  if (!it) return Bad("prompt", "is required");
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

bool IsNegativeSeed(const json& body) {
  const json* it = Member(body, "seed");
  return it && it->is_number() && it->get<double>() < 0;
}

StatusOr<EmbeddingRequest> ParseEmbeddingRequest(const json& body) {
  EmbeddingRequest r;
  SPILLWAY_RETURN_IF_ERROR(ParseModel(body, &r.model));
  // Accepted and ignored, a client's vector store would get vectors of
  // another width than it asked for and fail later, far from the cause.
  if (GivenMember(body, "dimensions")) {
    return Bad("dimensions", "is not supported by Spillway: vectors have the model's width");
  }
  if (const json* f = GivenMember(body, "encoding_format")) {
    if (!f->is_string() || (*f != "float" && *f != "base64")) return Bad("encoding_format", "must be 'float' or 'base64'");
    r.base64 = *f == "base64";
  }
  SPILLWAY_RETURN_IF_ERROR(OptionalBool(body, "truncate", &r.truncate));
  const json* it = Member(body, "input");
  if (!it) return Bad("input", "is required");
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
