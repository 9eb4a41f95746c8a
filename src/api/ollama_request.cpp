#include "api/ollama_request.h"

#include <cctype>
#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace spillway::api {

using nlohmann::json;

namespace {

Status Bad(const std::string& field, const std::string& what) {
  return Status::InvalidArgument("'" + field + "' " + what);
}

bool Given(const json& body, const char* field) {
  auto it = body.find(field);
  return it != body.end() && !it->is_null();
}

Status OptionalString(const json& body, const char* field, std::string* out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return Status::Ok();
  if (!it->is_string()) return Bad(field, "must be a string");
  *out = it->get<std::string>();
  return Status::Ok();
}

// Options Ollama passes to the sampler, copied under the OpenAI name the
// gateway's parser checks (range errors are renamed back by OllamaFieldNames).
struct SamplerOption {
  const char* ollama;
  const char* openai;
};
constexpr SamplerOption kSamplerOptions[] = {
    {"temperature", "temperature"},         {"top_p", "top_p"},
    {"top_k", "top_k"},                     {"min_p", "min_p"},
    {"repeat_penalty", "repeat_penalty"},   {"presence_penalty", "presence_penalty"},
    {"frequency_penalty", "frequency_penalty"},
};

// Samplers Spillway does not implement: accepted at their neutral value only.
struct Neutral {
  const char* name;
  double value;
};
constexpr Neutral kNeutralOnly[] = {{"typical_p", 1.0}, {"tfs_z", 1.0}, {"mirostat", 0.0}};

// Decided by the service's placement, not per request: accepted, not applied.
constexpr const char* kLoadTimeOptions[] = {"num_ctx",  "num_batch", "num_gpu",  "main_gpu", "use_mmap",  "use_mlock",
                                            "num_thread", "numa",    "low_vram", "f16_kv",   "vocab_only", "num_keep",
                                            "logits_all", "embedding_only", "penalize_newline", "mirostat_tau",
                                            "mirostat_eta", "num_gqa"};

Status TranslateOptions(const json& body, OllamaCall* call) {
  auto it = body.find("options");
  if (it == body.end() || it->is_null()) return Status::Ok();
  if (!it->is_object()) return Bad("options", "must be an object");
  const json& o = *it;
  json& out = call->openai;
  for (const auto& s : kSamplerOptions) {
    if (!Given(o, s.ollama)) continue;
    if (!o[s.ollama].is_number()) return Bad(std::string("options.") + s.ollama, "must be a number");
    out[s.openai] = o[s.ollama];
    call->renamed.emplace_back(s.openai, std::string("options.") + s.ollama);
  }
  for (const auto& n : kNeutralOnly) {
    if (!Given(o, n.name)) continue;
    if (!o[n.name].is_number() || o[n.name].get<double>() != n.value) {
      return Bad(std::string("options.") + n.name, "is not supported by Spillway (only its neutral value " +
                                                       json(n.value).dump() +
                                                       "); the request was refused rather than served without it");
    }
  }
  // An integer option may be written 128.0 (Ollama's decoder takes it, as
  // the OpenAI parser takes max_tokens: 1000.0).
  auto whole = [&](const char* name) -> std::optional<int64_t> {
    const json& n = o[name];
    if (n.is_number_integer() && !(n.is_number_unsigned() && n.get<uint64_t>() > uint64_t{INT64_MAX})) {
      return n.get<int64_t>();
    }
    if (n.is_number_float()) {
      const double d = n.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return static_cast<int64_t>(d);
    }
    return std::nullopt;
  };
  // -1: infinite, -2: fill the context, 0: no limit either (Ollama's runner
  // stops at num_predict only when it is positive); all leave the service's default.
  if (Given(o, "num_predict")) {
    const auto n = whole("num_predict");
    if (!n) return Bad("options.num_predict", "must be an integer");
    const int64_t v = *n;
    if (v > 0) {
      out["max_tokens"] = v;
      call->renamed.emplace_back("max_tokens", "options.num_predict");
    } else if (v != 0 && v != -1 && v != -2) {
      return Bad("options.num_predict", "must be positive, 0 or -1 (no limit) or -2 (fill the context)");
    }
  }
  if (Given(o, "seed")) {  // a negative seed is Ollama's "random"
    const bool huge = o["seed"].is_number_unsigned() && o["seed"].get<uint64_t>() > uint64_t{INT64_MAX};
    const auto n = huge ? std::optional<int64_t>(0) : whole("seed");
    if (!n) return Bad("options.seed", "must be an integer below 2^64");
    if (*n >= 0) {
      out["seed"] = huge ? o["seed"] : json(*n);
      call->renamed.emplace_back("seed", "options.seed");
    }
  }
  if (Given(o, "repeat_last_n")) {  // -1: the whole context, 0: off
    const auto n = whole("repeat_last_n");
    if (!n || *n < -1) return Bad("options.repeat_last_n", "must be -1 (the whole context), 0 (off) or a count of tokens");
    if (*n >= 0) {
      out["repeat_last_n"] = *n;
      call->renamed.emplace_back("repeat_last_n", "options.repeat_last_n");
    }
  }
  if (Given(o, "stop")) {
    out["stop"] = o["stop"];
    call->renamed.emplace_back("stop", "options.stop");
  }
  for (const char* name : kLoadTimeOptions) {
    if (Given(o, name) && !(o[name].is_number() || o[name].is_boolean())) {
      return Bad(std::string("options.") + name, "must be a number or a boolean");
    }
  }
  return Status::Ok();
}

// "format": "json" or a JSON Schema object -> response_format.
Status TranslateFormat(const json& body, json* out) {
  auto it = body.find("format");
  if (it == body.end() || it->is_null() || (it->is_string() && it->get_ref<const std::string&>().empty())) {
    return Status::Ok();
  }
  if (it->is_string() && *it == "json") {
    (*out)["response_format"] = {{"type", "json_object"}};
  } else if (it->is_object()) {
    (*out)["response_format"] = {{"type", "json_schema"},
                                 {"json_schema", {{"name", "ollama_format"}, {"schema", *it}, {"strict", true}}}};
  } else {
    return Bad("format", "must be \"json\" or a JSON Schema object");
  }
  return Status::Ok();
}

// "think": true separates the reasoning, false turns it off, "low" |
// "medium" | "high" sets the effort (GPT-OSS).
Status TranslateThink(const json& body, json* out) {
  auto it = body.find("think");
  if (it == body.end() || it->is_null()) return Status::Ok();
  if (it->is_boolean()) {
    if (it->get<bool>()) (*out)["reasoning_format"] = "auto";
    else (*out)["reasoning_effort"] = "none";
  } else if (it->is_string() && (*it == "low" || *it == "medium" || *it == "high")) {
    (*out)["reasoning_format"] = "auto";
    (*out)["reasoning_effort"] = *it;
  } else {
    return Bad("think", "must be a boolean or one of low, medium, high");
  }
  return Status::Ok();
}

// Fields Spillway cannot honour: refused when set to anything but empty.
Status RefuseNonEmpty(const json& body, const char* field, const std::string& why) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return Status::Ok();
  if ((it->is_string() || it->is_array() || it->is_object()) && it->empty()) return Status::Ok();
  if (it->is_string() && it->get_ref<const std::string&>().empty()) return Status::Ok();
  return Bad(field, "is not supported by Spillway: " + why);
}

// Ollama's tool calls carry no ids and object arguments; OpenAI's carry ids
// and a JSON string. Tool results name the function (`tool_name`); each is
// matched to the earliest unanswered call of that name.
Status TranslateMessages(const json& messages, json* out) {
  if (!messages.is_array()) return Bad("messages", "must be an array");
  json result = json::array();
  std::vector<std::pair<std::string, std::string>> pending;  // (id, name) of unanswered calls
  int next_id = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string field = "messages[" + std::to_string(i) + "]";
    const json& m = messages[i];
    if (!m.is_object()) return Bad(field, "must be an object");
    SPILLWAY_RETURN_IF_ERROR(RefuseNonEmpty(m, "images", "it serves text models (" + field + ".images)"));
    json msg = json::object();
    for (const char* k : {"role", "content"}) {
      if (m.contains(k)) msg[k] = m[k];
    }
    if (!msg.contains("content") || msg["content"].is_null()) msg["content"] = "";
    // An assistant's reasoning, echoed back in the history (ollama-python's
    // messages.append(response.message)): llama.cpp's chat layer reads it as
    // reasoning_content and hands it to templates that keep it (gpt-oss's
    // reasoning before a tool call).
    std::string thinking;
    SPILLWAY_RETURN_IF_ERROR(OptionalString(m, "thinking", &thinking));
    if (!thinking.empty() && msg.value("role", json()) == "assistant") msg["reasoning_content"] = thinking;
    if (auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
      if (!calls->is_array()) return Bad(field + ".tool_calls", "must be an array");
      json oc = json::array();
      pending.clear();
      for (size_t c = 0; c < calls->size(); ++c) {
        const json& call = (*calls)[c];
        const std::string cf = field + ".tool_calls[" + std::to_string(c) + "]";
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) {
          return Bad(cf + ".function", "must be an object");
        }
        json fn = call["function"];
        if (auto a = fn.find("arguments"); a != fn.end() && a->is_object()) {
          *a = a->dump(-1, ' ', false, json::error_handler_t::replace);
        }
        fn.erase("index");
        std::string id = call.contains("id") && call["id"].is_string() ? call["id"].get<std::string>()
                                                                       : "call_" + std::to_string(next_id++);
        const std::string name = fn.contains("name") && fn["name"].is_string() ? fn["name"].get<std::string>() : "";
        pending.emplace_back(id, name);
        oc.push_back({{"id", id}, {"type", "function"}, {"function", fn}});
      }
      msg["tool_calls"] = oc;
    }
    if (msg.value("role", json()) == "tool") {
      // Its call: the one its tool_call_id names (LangChain's ChatOllama
      // sends that, and results may come in another order than the calls),
      // else the first open one of its tool_name, else the first open one.
      std::string tool_name, call_id;
      SPILLWAY_RETURN_IF_ERROR(OptionalString(m, "tool_name", &tool_name));
      SPILLWAY_RETURN_IF_ERROR(OptionalString(m, "tool_call_id", &call_id));
      auto p = std::find_if(pending.begin(), pending.end(), [&](const auto& c) { return !call_id.empty() && c.first == call_id; });
      if (p == pending.end()) {
        p = std::find_if(pending.begin(), pending.end(), [&](const auto& c) { return tool_name.empty() || c.second == tool_name; });
      }
      // Its function's name for the template (Kimi-K2's, StepFun's print
      // it; Ollama's templates have .ToolName): its own, else its call's.
      const std::string named = !tool_name.empty() ? tool_name : p != pending.end() ? p->second : "";
      if (!named.empty()) msg["name"] = named;
      if (p != pending.end()) {
        msg["tool_call_id"] = p->first;
        pending.erase(p);
      }
    }
    result.push_back(std::move(msg));
  }
  (*out)["messages"] = std::move(result);
  return Status::Ok();
}

// "truncate" as Ollama reads it: true unless false is given (null: unset).
Status TranslateTruncate(const json& body, json* openai) {
  if (Given(body, "truncate") && !body["truncate"].is_boolean()) return Bad("truncate", "must be a boolean");
  (*openai)["truncate"] = Given(body, "truncate") ? body["truncate"].get<bool>() : true;
  return Status::Ok();
}

Status TranslateGenerate(const json& body, OllamaCall* call) {
  SPILLWAY_RETURN_IF_ERROR(RefuseNonEmpty(body, "images", "it serves text models"));
  SPILLWAY_RETURN_IF_ERROR(RefuseNonEmpty(body, "template", "prompts use the model's own chat template"));
  SPILLWAY_RETURN_IF_ERROR(
      RefuseNonEmpty(body, "context", "it does not return or take token contexts; send the conversation to /api/chat"));
  SPILLWAY_RETURN_IF_ERROR(RefuseNonEmpty(body, "suffix", "fill-in-the-middle is not implemented"));
  std::string prompt, system;
  SPILLWAY_RETURN_IF_ERROR(OptionalString(body, "prompt", &prompt));
  SPILLWAY_RETURN_IF_ERROR(OptionalString(body, "system", &system));
  bool raw = false;
  if (Given(body, "raw")) {
    if (!body["raw"].is_boolean()) return Bad("raw", "must be a boolean");
    raw = body["raw"].get<bool>();
  }
  call->load_only = prompt.empty();
  // (Ollama's own words: a system prompt needs the template raw leaves out.)
  if (raw && !system.empty()) {  // (a non-empty template or context is refused above)
    return Status::InvalidArgument("raw mode does not support template, system, or context");
  }
  if (raw) {  // no template: the prompt as given
    call->endpoint = "completion";
    call->openai["prompt"] = prompt;
    return Status::Ok();
  }
  call->endpoint = "chat";
  json messages = json::array();
  if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  messages.push_back({{"role", "user"}, {"content", prompt}});
  call->openai["messages"] = std::move(messages);
  return TranslateThink(body, &call->openai);
}

Status TranslateEmbed(const json& body, OllamaCall* call) {
  call->endpoint = "embedding";
  call->stream = false;
  if (call->route == OllamaRoute::kEmbeddings) {  // legacy: one "prompt", one "embedding"
    std::string prompt;
    SPILLWAY_RETURN_IF_ERROR(OptionalString(body, "prompt", &prompt));
    call->load_only = prompt.empty();
    call->openai["input"] = prompt;
    return Status::Ok();
  }
  // No input (absent, null, "" or []) loads the model, as Ollama does: 200, no embeddings.
  const json input = Given(body, "input") ? body["input"] : json("");
  if (!input.is_string() && !input.is_array()) return Bad("input", "must be a string or an array of strings");
  call->load_only = input.empty() || (input.is_string() && input.get_ref<const std::string&>().empty());
  call->openai["input"] = input;
  // Ollama's default: an input past the model's context is cut, not refused.
  SPILLWAY_RETURN_IF_ERROR(TranslateTruncate(body, &call->openai));
  if (Given(body, "dimensions")) return Bad("dimensions", "is not supported by Spillway: vectors have the model's width");
  return Status::Ok();
}

}  // namespace

namespace {

StatusOr<double> KeepAliveSeconds(const json& value) {
  if (value.is_number()) {
    const double v = value.get<double>();
    if (!std::isfinite(v)) return Bad("keep_alive", "must be a finite number of seconds");
    return v;
  }
  if (!value.is_string()) return Bad("keep_alive", "must be a number of seconds or a duration such as \"5m\"");
  const std::string s = value.get<std::string>();
  // A bare number in a string is seconds ("-1", "300").
  char* end = nullptr;
  const double plain = std::strtod(s.c_str(), &end);
  if (!s.empty() && end && *end == '\0' && std::isfinite(plain)) return plain;
  // Go's time.ParseDuration: [-]{number unit}+, units h m s ms us µs ns.
  size_t i = 0;
  double sign = 1, total = 0;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) sign = s[i++] == '-' ? -1 : 1;
  if (i == s.size() || s.size() > 64) return Bad("keep_alive", "is not a duration such as \"5m\" or \"1h30m\"");
  while (i < s.size()) {
    const size_t start = i;
    while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
    if (i == start) return Bad("keep_alive", "is not a duration such as \"5m\" or \"1h30m\"");
    const double n = std::strtod(s.substr(start, i - start).c_str(), nullptr);
    const size_t u = i;
    while (i < s.size() && !std::isdigit(static_cast<unsigned char>(s[i])) && s[i] != '.') ++i;
    const std::string unit = s.substr(u, i - u);
    double scale = 0;
    if (unit == "h") scale = 3600;
    else if (unit == "m") scale = 60;
    else if (unit == "s") scale = 1;
    else if (unit == "ms") scale = 1e-3;
    else if (unit == "us" || unit == "\xC2\xB5s") scale = 1e-6;
    else if (unit == "ns") scale = 1e-9;
    else return Bad("keep_alive", "has an unknown unit '" + unit.substr(0, 8) + "' (use h, m, s, ms, us or ns)");
    total += n * scale;
  }
  return sign * total;
}

}  // namespace

StatusOr<double> ParseKeepAlive(const json& value) {
  auto k = KeepAliveSeconds(value);
  if (!k.ok()) return k;
  // Past about 31 years it is "for ever" (and the gateway's millisecond
  // clock arithmetic stays far from overflowing).
  return std::clamp(*k, -kMaxKeepAliveS, kMaxKeepAliveS);
}

StatusOr<OllamaCall> TranslateOllamaRequest(OllamaRoute route, const json& body) {
  if (!body.is_object()) return Status::InvalidArgument("the request body must be a JSON object");
  OllamaCall call;
  call.route = route;
  call.openai = json::object();
  // "name" is /api/show's and older clients' spelling of "model".
  SPILLWAY_RETURN_IF_ERROR(OptionalString(body, "model", &call.model));
  if (call.model.empty()) return Bad("model", "is required");
  call.openai["model"] = call.model;
  if (Given(body, "stream")) {
    if (!body["stream"].is_boolean()) return Bad("stream", "must be a boolean");
    call.stream = body["stream"].get<bool>();
  }
  if (Given(body, "keep_alive")) {
    auto k = ParseKeepAlive(body["keep_alive"]);
    if (!k.ok()) return k.status();
    call.keep_alive_s = *k;
  }
  switch (route) {
    case OllamaRoute::kChat: {
      call.endpoint = "chat";
      // (null, as Ollama reads it: no messages, a load)
      SPILLWAY_RETURN_IF_ERROR(TranslateMessages(Given(body, "messages") ? body["messages"] : json::array(), &call.openai));
      call.load_only = call.openai["messages"].empty();
      if (Given(body, "tools")) call.openai["tools"] = body["tools"];
      // Ollama's default: a conversation past the context loses its oldest
      // messages (never a system message or the last one), not refused.
      SPILLWAY_RETURN_IF_ERROR(TranslateTruncate(body, &call.openai));
      SPILLWAY_RETURN_IF_ERROR(TranslateThink(body, &call.openai));
      break;
    }
    case OllamaRoute::kGenerate:
      SPILLWAY_RETURN_IF_ERROR(TranslateGenerate(body, &call));
      break;
    case OllamaRoute::kEmbed:
    case OllamaRoute::kEmbeddings:
      SPILLWAY_RETURN_IF_ERROR(TranslateEmbed(body, &call));
      return call;  // sampler options and formats mean nothing to an embedding
  }
  call.openai["stream"] = call.stream;
  // The final chunk's usage carries the counts Ollama reports.
  if (call.stream) call.openai["stream_options"] = {{"include_usage", true}};
  SPILLWAY_RETURN_IF_ERROR(TranslateOptions(body, &call));
  SPILLWAY_RETURN_IF_ERROR(TranslateFormat(body, &call.openai));
  // (The longer first: a name is matched as a prefix.)
  call.renamed.emplace_back("response_format.json_schema.schema", "format");
  call.renamed.emplace_back("response_format", "format");
  return call;
}

Status OllamaFieldNames(const Status& st, const OllamaCall& call) {
  if (st.code() != StatusCode::kInvalidArgument) return st;
  const std::string& m = st.message();
  for (const auto& [openai, ollama] : call.renamed) {
    const std::string quoted = "'" + openai;
    if (m.rfind(quoted, 0) == 0 && m.size() > quoted.size() && (m[quoted.size()] == '\'' || m[quoted.size()] == '.')) {
      return Status::InvalidArgument("'" + ollama + m.substr(quoted.size()));
    }
  }
  return st;
}

std::string WithoutLatestTag(const std::string& model) {
  static const std::string kLatest = ":latest";
  if (model.size() > kLatest.size() && model.compare(model.size() - kLatest.size(), kLatest.size(), kLatest) == 0) {
    return model.substr(0, model.size() - kLatest.size());
  }
  return model;
}

}  // namespace spillway::api
