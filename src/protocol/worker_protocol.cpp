#include "protocol/worker_protocol.h"

#include <climits>
#include <charconv>
#include <system_error>

#include "common/json_members.h"

namespace spillway::protocol {

using nlohmann::json;

std::string GenerationPath(std::string_view endpoint) {
  if (endpoint == "chat") return "/v1/chat/completions";
  if (endpoint == "completion") return "/v1/completions";
  return "/v1/embeddings";
}

const char* HealthName(Health h) {
  switch (h) {
    case Health::kOk: return "ok";
    case Health::kDeviceLost: return "device_lost";
    case Health::kStalled: return "stalled";
    case Health::kError: return "error";
  }
  return "error";
}

json HealthReport::ToJson() const {
  json j = {{"status", HealthName(state)}, {"stalled_ms", stalled_ms}};
  if (!error.empty()) j["error"] = error;
  return j;
}

HealthReport HealthReport::FromBody(std::string_view body) {
  HealthReport r;
  json j = json::parse(body, nullptr, false);
  if (!j.is_object() || !j.contains("status") || !j["status"].is_string()) return r;
  const std::string s = j["status"];
  for (Health h : {Health::kOk, Health::kDeviceLost, Health::kStalled, Health::kError}) {
    if (s == HealthName(h)) r.state = h;
  }
  if (j.contains("stalled_ms") && j["stalled_ms"].is_number_integer()) r.stalled_ms = j["stalled_ms"];
  if (j.contains("error") && j["error"].is_string()) r.error = j["error"];
  return r;
}

std::optional<StatusCode> ParseStatusCode(std::string_view name) {
  for (int c = 0; c <= static_cast<int>(StatusCode::kInternal); ++c) {
    if (name == StatusCodeName(static_cast<StatusCode>(c))) return static_cast<StatusCode>(c);
  }
  return std::nullopt;
}

std::optional<FailurePhase> ParseFailurePhase(std::string_view name) {
  for (FailurePhase p : {FailurePhase::kNone, FailurePhase::kLoad, FailurePhase::kKv, FailurePhase::kCompute,
                         FailurePhase::kDevice}) {
    if (name == FailurePhaseName(p)) return p;
  }
  return std::nullopt;
}

namespace {

// The codes the HTTP layer (api/http_server.cpp) answers with before a
// request reaches the worker's handlers: an overloaded worker is busy (the
// gateway waits and resends), not failing.
std::optional<StatusCode> HttpLayerCode(const std::string& code) {
  if (code == "server_busy" || code == "too_many_connections") return StatusCode::kResourceExhausted;
  if (code == "body_too_large") return StatusCode::kPayloadTooLarge;
  if (code == "bad_request") return StatusCode::kInvalidArgument;
  return std::nullopt;
}

WorkerError FromErrorObject(int http_status, const json& e) {
  WorkerError w;
  w.http_status = http_status;
  if (e.contains("message") && e["message"].is_string()) w.message = e["message"];
  if (e.contains("code") && e["code"].is_string()) {
    const std::string code = e["code"].get<std::string>();
    w.code = ParseStatusCode(code).value_or(HttpLayerCode(code).value_or(StatusCode::kInternal));
    // A reason in "code" (api::ErrorBody), the code's name in "status".
    if (auto named = e.contains("status") && e["status"].is_string() ? ParseStatusCode(e["status"].get<std::string>())
                                                                     : std::nullopt) {
      w.code = *named;
      w.reason = code;
    }
  }
  if (e.contains("phase") && e["phase"].is_string()) w.phase = ParseFailurePhase(e["phase"].get<std::string>()).value_or(FailurePhase::kNone);
  return w;
}

}  // namespace

Status WorkerError::ToStatus() const {
  Status st(code, message);
  st.WithPhase(phase).WithReason(reason);
  return st;
}

std::optional<WorkerError> ParseWorkerError(int http_status, std::string_view body) {
  if (http_status >= 200 && http_status < 300) return std::nullopt;
  json j = json::parse(body, nullptr, false);
  WorkerError w;
  if (j.is_object() && j.contains("error") && j["error"].is_object()) {
    w = FromErrorObject(http_status, j["error"]);
  } else {
    w.http_status = http_status;
    w.message = std::string(body.substr(0, 500));
  }
  if (http_status == 499 && w.code == StatusCode::kInternal) w.code = StatusCode::kCancelled;
  if (http_status == 500 && w.phase == FailurePhase::kNone) w.phase = FailurePhase::kCompute;
  return w;
}

std::optional<WorkerError> ParseStreamError(const json& payload) {
  if (!payload.is_object() || !payload.contains("error") || !payload["error"].is_object()) return std::nullopt;
  return FromErrorObject(200, payload["error"]);
}

std::optional<Timings> Timings::FromJson(const json& j) {
  if (!j.is_object()) return std::nullopt;
  auto num = [&](const char* k) { return j.contains(k) && j[k].is_number() ? j[k].get<double>() : 0.0; };
  return Timings{num("prompt_ms"), num("generation_ms"), num("prompt_tokens"), num("generated_tokens"),
                 num("cached_tokens")};
}

std::string Timings::ToHeader() const {
  std::string out;
  auto add = [&](const char* key, double v) {
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest round-trip form
    out.append(out.empty() ? "" : ";").append(key).append("=").append(buf, r.ptr);
  };
  add("prompt_ms", prompt_ms);
  add("generation_ms", generation_ms);
  add("prompt_tokens", prompt_tokens);
  add("generated_tokens", generated_tokens);
  if (cached_tokens > 0) add("cached_tokens", cached_tokens);
  return out;
}

std::optional<Timings> Timings::FromHeader(std::string_view value) {
  Timings t;
  while (!value.empty()) {
    const size_t end = value.find(';');
    const std::string_view item = value.substr(0, end);
    value = end == std::string_view::npos ? std::string_view() : value.substr(end + 1);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) return std::nullopt;
    const std::string_view key = item.substr(0, eq), num = item.substr(eq + 1);
    double v = 0;
    const auto r = std::from_chars(num.data(), num.data() + num.size(), v);
    if (r.ec != std::errc() || r.ptr != num.data() + num.size()) return std::nullopt;
    if (key == "prompt_ms") t.prompt_ms = v;
    else if (key == "generation_ms") t.generation_ms = v;
    else if (key == "prompt_tokens") t.prompt_tokens = v;
    else if (key == "generated_tokens") t.generated_tokens = v;
    else if (key == "cached_tokens") t.cached_tokens = v;  // other keys: a later worker's, ignored
  }
  return t;
}

json Timings::ToJson() const {
  return {{"prompt_ms", prompt_ms}, {"generation_ms", generation_ms}, {"prompt_tokens", prompt_tokens},
          {"generated_tokens", generated_tokens}, {"cached_tokens", cached_tokens}};
}

namespace {

// A JSON text's "spillway"."timings", read as it is parsed
// (common/json_members.h): a whole document of a stream's last event (its
// placement, fingerprint, text) cost more than the rest of the stream's own
// handling at its end. What Timings::FromJson would make of it (a later
// duplicate key winning, as in a parsed document): `found` when "timings"
// is an object; a member that is not a number counts 0.
enum class TimingsRole {
  kOther, kDocument, kTop, kSpillway, kTimings, kPromptMs, kGenerationMs, kPromptTokens, kGeneratedTokens,
  kCachedTokens
};

struct TimingsFacts : JsonMembers<TimingsFacts, TimingsRole> {
  using Role = TimingsRole;
  bool top_object = false, spillway_object = false, found = false;
  Timings t{};

  Role Member(Role object, const std::string& k) {
    if (object == Role::kTop && k == "spillway") {
      spillway_object = found = false;
      return Role::kSpillway;
    }
    if (object == Role::kSpillway && k == "timings") {
      found = false;
      return Role::kTimings;
    }
    if (object != Role::kTimings) return Role::kOther;
    const Role field = k == "prompt_ms"          ? Role::kPromptMs
                       : k == "generation_ms"    ? Role::kGenerationMs
                       : k == "prompt_tokens"    ? Role::kPromptTokens
                       : k == "generated_tokens" ? Role::kGeneratedTokens
                       : k == "cached_tokens"    ? Role::kCachedTokens
                                                 : Role::kOther;
    if (double* f = Field(field)) *f = 0;  // (given again, and not as a number: 0, as FromJson reads it)
    return field;
  }
  Role Opened(Role at, bool object) {
    if (!object) return Role::kOther;
    switch (at) {
      case Role::kDocument: top_object = true; return Role::kTop;
      case Role::kSpillway: spillway_object = true; return Role::kSpillway;
      case Role::kTimings: found = true; t = Timings{}; return Role::kTimings;
      default: return Role::kOther;
    }
  }
  void Integer(Role at, int64_t v) { Number(at, static_cast<double>(v)); }
  void Unsigned(Role at, uint64_t v) { Number(at, static_cast<double>(v)); }
  void Float(Role at, double v) { Number(at, v); }

 private:
  double* Field(Role r) {
    switch (r) {
      case Role::kPromptMs: return &t.prompt_ms;
      case Role::kGenerationMs: return &t.generation_ms;
      case Role::kPromptTokens: return &t.prompt_tokens;
      case Role::kGeneratedTokens: return &t.generated_tokens;
      case Role::kCachedTokens: return &t.cached_tokens;
      default: return nullptr;
    }
  }
  void Number(Role at, double v) {
    if (double* f = Field(at)) *f = v;
  }
};

// nullopt when the text is not JSON (`parsed` false) or has no timings.
std::optional<Timings> TimingsIn(std::string_view text, bool* parsed) {
  TimingsFacts f;
  *parsed = json::sax_parse(text, &f);
  if (!*parsed || !f.top_object || !f.spillway_object || !f.found) return std::nullopt;
  return f.t;
}

}  // namespace

std::optional<Timings> TimingsOf(std::string_view body) {
  bool parsed = false;
  if (!body.empty() && body.front() != 'd') {  // (not an event stream, which begins "data:")
    auto t = TimingsIn(body, &parsed);
    if (parsed) return t;
  }
  // The last event that carries them, looked for line by line from the end
  // (the worker sends them in its final chunk): a long stream's text is
  // neither copied nor split, and only a line naming them is parsed.
  size_t end = body.size();
  while (end > 0) {
    const size_t nl = body.rfind('\n', end - 1);
    const size_t start = nl == std::string_view::npos ? 0 : nl + 1;
    std::string_view line = body.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.rfind("data:", 0) == 0 && line.find("\"timings\"") != std::string_view::npos) {
      line.remove_prefix(5);
      if (auto t = TimingsIn(line, &parsed)) return t;
    }
    if (start == 0) break;
    end = start - 1;
  }
  return std::nullopt;
}

std::optional<TokenizeReply> TokenizeReply::FromJson(const json& j) {
  if (!j.is_object() || !j.contains("prompt_tokens") || !j["prompt_tokens"].is_number_integer()) return std::nullopt;
  // (Never throws, as WorkerInfo's: a field of another type, or out of range, is not a reply.)
  auto whole = [&](const char* k, int64_t* out) {
    auto it = j.find(k);
    if (it == j.end()) return true;
    if (!it->is_number_integer()) return false;
    *out = it->get<int64_t>();
    return *out >= 0 && *out <= INT32_MAX;
  };
  int64_t prompt = 0, ctx = 0, max_tokens = 0, dropped = 0, cached = 0;
  if (!whole("prompt_tokens", &prompt) || !whole("ctx", &ctx) || !whole("default_max_tokens", &max_tokens) ||
      !whole("dropped_messages", &dropped) || !whole("cached_tokens", &cached)) {
    return std::nullopt;
  }
  TokenizeReply r;
  r.prompt_tokens = static_cast<int>(prompt);
  r.ctx = static_cast<int>(ctx);
  r.default_max_tokens = static_cast<int>(max_tokens);
  r.dropped_messages = static_cast<int>(dropped);
  r.cached_tokens = static_cast<int>(std::min(cached, prompt));
  return r;
}

json TokenizeReply::ToJson() const {
  json j = {{"prompt_tokens", prompt_tokens}, {"ctx", ctx}, {"default_max_tokens", default_max_tokens}};
  if (dropped_messages > 0) j["dropped_messages"] = dropped_messages;
  if (cached_tokens > 0) j["cached_tokens"] = cached_tokens;
  return j;
}

std::optional<WorkerInfo> WorkerInfo::FromJson(const json& j) {
  if (!j.is_object()) return std::nullopt;
  WorkerInfo w;
  if (j.contains("protocol_version") && j["protocol_version"].is_number_integer()) w.protocol_version = j["protocol_version"];
  if (j.contains("pid") && j["pid"].is_number_integer()) w.pid = j["pid"];
  if (j.contains("fingerprint")) w.fingerprint = j["fingerprint"];
  if (j.contains("placement")) w.placement = j["placement"];
  const auto object = [&](const char* k) { return j.contains(k) && j[k].is_object(); };
  if (object("fingerprint") && j["fingerprint"].contains("id") && j["fingerprint"]["id"].is_string()) {
    w.fingerprint_id = j["fingerprint"]["id"];
  }
  if (object("context")) {
    const json& c = j["context"];
    if (c.contains("created") && c["created"].is_boolean()) w.context_created = c["created"];
    if (c.contains("last_create_ms") && c["last_create_ms"].is_number()) w.last_context_ms = c["last_create_ms"].get<double>();
  }
  if (object("memory")) {
    w.memory = j["memory"];
    const json& m = j["memory"];
    if (m.contains("buffers") && m["buffers"].is_array()) {
      for (const auto& b : m["buffers"]) {
        if (!b.is_object() || !b.contains("name") || !b["name"].is_string() || !b.contains("total") ||
            !b["total"].is_number_unsigned()) {
          continue;
        }
        w.buffers.push_back({b["name"].get<std::string>(), b["total"].get<uint64_t>(), IsHostBuffer(b)});
      }
    }
  }
  if (object("slots")) {
    const json& sl = j["slots"];
    const auto count = [&](const char* k) -> std::optional<int> {
      if (!sl.contains(k) || !sl[k].is_number_integer()) return std::nullopt;
      return sl[k].get<int>();
    };
    if (auto t = count("total"), b = count("busy"), q = count("queued"); t && b && q) w.slots = Slots{*t, *b, *q};
  }
  if (object("prefix_reuse")) w.prefix_reuse = j["prefix_reuse"];
  if (object("rendered_prompts")) w.rendered_prompts = j["rendered_prompts"];
  if (object("prompt_tokens")) w.prompt_tokens = j["prompt_tokens"];
  return w;
}

Status CheckCompatible(const WorkerInfo& info) {
  if (info.protocol_version == kWorkerProtocolVersion) return Status::Ok();
  return Status::Unavailable("the worker speaks protocol version " + std::to_string(info.protocol_version) +
                             ", this gateway version " + std::to_string(kWorkerProtocolVersion) +
                             ": spillway and spillway-worker come from different builds (rebuild both)");
}

}  // namespace spillway::protocol
