#include "api/ollama_response.h"

#include <algorithm>
#include <cstdio>
#include <ctime>

#include "api/json_limits.h"

namespace spillway::api {

using nlohmann::json;

namespace {

constexpr int64_t kNsPerMs = 1'000'000;

// Readers that never throw: what the worker (or a stored answer) says is read
// for what it is, and anything else counts as absent.
const json& Field(const json& j, const char* key) {
  static const json kNull;
  if (!j.is_object()) return kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}
std::string Text(const json& j, const char* key, const std::string& otherwise = "") {
  const json& v = Field(j, key);
  return v.is_string() ? v.get<std::string>() : otherwise;
}
template <typename T>
T Number(const json& j, const char* key, T otherwise) {
  const json& v = Field(j, key);
  return v.is_number() ? v.get<T>() : otherwise;
}
json Object(const json& j, const char* key) {
  const json& v = Field(j, key);
  return v.is_object() ? v : json::object();
}

std::string DoneReason(const std::string& finish_reason) {
  return finish_reason == "length" ? "length" : "stop";  // "tool_calls" is Ollama's "stop"
}

// Ollama's tool calls: arguments as a JSON object, always (Ollama's
// clients decode a map). A call whose arguments are not one (cut short by
// num_predict, or not JSON) is not a call: its text goes to `*content`, as
// Ollama's own parser hands back text it could not parse.
json ToolCallsJson(const json& openai_calls, std::string* content) {
  json out = json::array();
  for (const auto& c : openai_calls) {
    const json fn = Object(c, "function");
    json args = json::object();
    if (auto a = fn.find("arguments"); a != fn.end() && a->is_string()) {
      // (At most 512 levels deep, far past any tool's schema: arguments a
      // model nested a million deep overflowed the stack of whatever copied
      // or dumped them.)
      const std::string& text = a->get_ref<const std::string&>();
      json parsed = text.empty() ? json::object()
                    : CheckJsonLimits(text, DepthOnly(512)) == JsonShape::kOk ? json::parse(text, nullptr, false)
                                                                              : json();
      if (!parsed.is_object()) {
        // The call as text: {"name": ..., "arguments": <what the model wrote>}.
        *content += R"({"name":)" + json(Text(fn, "name")).dump(-1, ' ', false, json::error_handler_t::replace) +
                    R"(,"arguments":)" + a->get<std::string>() + "}";
        continue;
      }
      args = std::move(parsed);
    } else if (a != fn.end() && a->is_object()) {
      args = *a;
    }
    json call = {{"function", {{"name", Text(fn, "name")}, {"arguments", args}}}};
    if (Field(c, "id").is_string()) call["id"] = c["id"];
    out.push_back(std::move(call));
  }
  return out;
}

// Counts and durations (ns) from the usage and the worker's timings.
void AddStats(json& out, const OllamaReplyContext& ctx, const json& usage, const json& spillway, int64_t now_ms) {
  const json timings = Object(spillway, "timings");
  out["total_duration"] = std::max<int64_t>(0, now_ms - ctx.started_ms) * kNsPerMs;
  out["load_duration"] = 0;
  out["prompt_eval_count"] = Number(usage, "prompt_tokens", Number(timings, "prompt_tokens", int64_t{0}));
  out["prompt_eval_duration"] = static_cast<int64_t>(Number(timings, "prompt_ms", 0.0) * kNsPerMs);
  if (ctx.route == OllamaRoute::kEmbed) return;
  out["eval_count"] = Number(usage, "completion_tokens", Number(timings, "generated_tokens", int64_t{0}));
  out["eval_duration"] = static_cast<int64_t>(Number(timings, "generation_ms", 0.0) * kNsPerMs);
}

json WithoutTokens(json spillway) {
  if (spillway.is_object()) spillway.erase("tokens");
  return spillway;
}

}  // namespace

std::string OllamaTimestamp(int64_t unix_ms) {
  const std::time_t secs = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%09lldZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<long long>(unix_ms % 1000) * kNsPerMs);
  return buf;
}

StatusOr<json> OllamaAnswer(const OllamaReplyContext& ctx, const json& openai, int64_t now_ms) {
  if (!openai.is_object()) return Status::Internal("the answer is not a JSON object");
  if (ctx.route == OllamaRoute::kEmbed || ctx.route == OllamaRoute::kEmbeddings) {
    auto data = openai.find("data");
    if (data == openai.end() || !data->is_array()) return Status::Internal("the answer has no embeddings");
    json vectors = json::array();
    for (const auto& d : *data) {
      const json& v = Field(d, "embedding");
      vectors.push_back(v.is_array() ? v : json::array());
    }
    if (ctx.route == OllamaRoute::kEmbeddings) {
      return json{{"embedding", vectors.empty() ? json::array() : vectors[0]}};
    }
    json out = {{"model", ctx.model}, {"embeddings", vectors}};
    AddStats(out, ctx, Object(openai, "usage"), json::object(), now_ms);
    return out;
  }
  auto choices = openai.find("choices");
  if (choices == openai.end() || !choices->is_array() || choices->empty() || !(*choices)[0].is_object()) {
    return Status::Internal("the answer has no choices");
  }
  const json& choice = (*choices)[0];
  const json message = Object(choice, "message");
  const std::string content = Text(message, "content", Text(choice, "text"));
  const std::string thinking = Text(message, "reasoning_content");
  json out = {{"model", ctx.model}, {"created_at", OllamaTimestamp(now_ms)}};
  if (ctx.route == OllamaRoute::kChat) {
    json m = {{"role", "assistant"}, {"content", content}};
    if (!thinking.empty()) m["thinking"] = thinking;
    if (Field(message, "tool_calls").is_array()) {
      std::string text;
      m["tool_calls"] = ToolCallsJson(message["tool_calls"], &text);
      m["content"] = content + text;
      if (m["tool_calls"].empty()) m.erase("tool_calls");
    }
    out["message"] = std::move(m);
  } else {
    out["response"] = content;
    if (!thinking.empty()) out["thinking"] = thinking;
  }
  out["done"] = true;
  out["done_reason"] = DoneReason(Text(choice, "finish_reason", "stop"));
  const json spillway = WithoutTokens(Object(openai, "spillway"));
  AddStats(out, ctx, Object(openai, "usage"), spillway, now_ms);
  if (!spillway.empty()) out["spillway"] = spillway;
  return out;
}

json OllamaLoadAnswer(const OllamaReplyContext& ctx, int64_t now_ms, bool unload) {
  if (ctx.route == OllamaRoute::kEmbeddings) return {{"embedding", json::array()}};
  if (ctx.route == OllamaRoute::kEmbed) return {{"model", ctx.model}, {"embeddings", json::array()}};
  json out = {{"model", ctx.model}, {"created_at", OllamaTimestamp(now_ms)}};
  if (ctx.route == OllamaRoute::kChat) out["message"] = {{"role", "assistant"}, {"content", ""}};
  else out["response"] = "";
  out["done"] = true;
  out["done_reason"] = unload ? "unload" : "load";
  return out;
}

json OllamaError(std::string_view openai_error_body) {
  const json j = json::parse(openai_error_body, nullptr, false);
  if (j.is_object()) {
    if (auto e = j.find("error"); e != j.end()) {
      if (e->is_string()) return {{"error", *e}};
      if (e->is_object() && e->contains("message") && (*e)["message"].is_string()) return {{"error", (*e)["message"]}};
    }
  }
  return {{"error", std::string(openai_error_body.substr(0, 4096))}};
}

json OllamaStreamTranslator::Base(int64_t now_ms) const {
  return {{"model", ctx_.model}, {"created_at", OllamaTimestamp(now_ms)}};
}

std::string OllamaStreamTranslator::Line(const json& j) const {
  return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string OllamaStreamTranslator::Feed(std::string_view sse, int64_t now_ms) {
  pending_.append(sse);
  std::string out;
  // Events are taken from `from` on, and what they used is cut once at the
  // end: erased one by one, a whole stored stream fed at once (a replay)
  // moved the rest of it for each event (seconds for a few MB).
  size_t from = 0, pos;
  while ((pos = pending_.find("\n\n", from)) != std::string::npos) {
    const std::string event = pending_.substr(from, pos - from);
    from = pos + 2;
    // An event's data lines, joined ("data: x" or "data:x"); comments and
    // other fields are dropped.
    std::string payload;
    size_t start = 0;
    while (start <= event.size()) {
      size_t end = event.find('\n', start);
      if (end == std::string::npos) end = event.size();
      const std::string_view line(event.data() + start, end - start);
      if (line.rfind("data:", 0) == 0) {
        std::string_view d = line.substr(5);
        if (!d.empty() && d[0] == ' ') d.remove_prefix(1);
        if (!payload.empty()) payload += '\n';
        payload.append(d);
      }
      start = end + 1;
    }
    if (!payload.empty()) out += Event(payload, now_ms);
  }
  pending_.erase(0, from);
  return out;
}

std::string OllamaStreamTranslator::Event(const std::string& payload, int64_t now_ms) {
  if (done_) return "";
  if (payload == "[DONE]") return FinalLines(now_ms);
  const json j = json::parse(payload, nullptr, false);
  if (!j.is_object()) return "";
  if (j.contains("error")) {  // Ollama's mid-stream error: one line, the status unchanged
    done_ = true;
    json line = OllamaError(payload);
    // A resumable end's checkpoint (what was delivered) and the request's id
    // go on in the line's "spillway", as the final line's notes do: the
    // message tells the client to resume from them.
    if (const auto e = j.find("error"); e->is_object()) {
      for (const char* key : {"checkpoint", "request_id"}) {
        if (auto v = e->find(key); v != e->end()) line["spillway"][key] = *v;
      }
    }
    return Line(line);
  }
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) usage_ = *u;
  if (auto s = j.find("spillway"); s != j.end() && s->is_object()) {
    if (json w = WithoutTokens(*s); !w.empty()) spillway_ = std::move(w);  // the final chunk's meta
  }
  auto choices = j.find("choices");
  if (choices == j.end() || !choices->is_array() || choices->empty() || !(*choices)[0].is_object()) return "";
  const json& choice = (*choices)[0];
  if (auto f = choice.find("finish_reason"); f != choice.end() && f->is_string()) finish_reason_ = *f;
  const json delta = Object(choice, "delta");
  const std::string content = Text(delta, "content", Text(choice, "text"));
  const std::string thinking = Text(delta, "reasoning_content");
  if (auto calls = delta.find("tool_calls"); calls != delta.end() && calls->is_array()) {
    for (const auto& c : *calls) {
      const int index = Number(c, "index", 0);
      if (index < 0 || index > 1024 || (!calls_.count(index) && calls_.size() >= 128)) continue;  // bounded
      PendingCall& p = calls_[index];
      p.id = Text(c, "id", p.id);
      const json fn = Object(c, "function");
      p.name += Text(fn, "name");
      p.arguments += Text(fn, "arguments");
    }
  }
  if (content.empty() && thinking.empty()) return "";
  json line = Base(now_ms);
  if (ctx_.route == OllamaRoute::kChat) {
    line["message"] = {{"role", "assistant"}, {"content", content}};
    if (!thinking.empty()) line["message"]["thinking"] = thinking;
  } else {
    line["response"] = content;
    if (!thinking.empty()) line["thinking"] = thinking;
  }
  line["done"] = false;
  return Line(line);
}

std::string OllamaStreamTranslator::FinalLines(int64_t now_ms) {
  done_ = true;
  std::string out;
  if (!calls_.empty()) {  // whole calls, before the final line (as Ollama sends them)
    json openai_calls = json::array();
    for (const auto& [index, c] : calls_) {
      openai_calls.push_back({{"id", c.id}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    }
    std::string text;
    json tool_calls = ToolCallsJson(openai_calls, &text);
    json line = Base(now_ms);
    line["message"] = {{"role", "assistant"}, {"content", text}};
    if (!tool_calls.empty()) line["message"]["tool_calls"] = std::move(tool_calls);
    line["done"] = false;
    out += Line(line);
  }
  json last = Base(now_ms);
  if (ctx_.route == OllamaRoute::kChat) last["message"] = {{"role", "assistant"}, {"content", ""}};
  else last["response"] = "";
  last["done"] = true;
  last["done_reason"] = DoneReason(finish_reason_);
  AddStats(last, ctx_, usage_, spillway_, now_ms);
  json meta = spillway_;
  meta.update(notes_);
  if (!meta.empty()) last["spillway"] = std::move(meta);
  return out + Line(last);
}

std::string OllamaStreamTranslator::Finish(int64_t now_ms) {
  (void)now_ms;
  if (done_) return "";
  done_ = true;
  return Line({{"error", "the stream ended before its final event"}});
}

}  // namespace spillway::api
