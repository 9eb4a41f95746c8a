// The clients of `spillway chaos`: one request each, recorded as the client saw it.
#include <nlohmann/json.hpp>

#include <atomic>
#include <functional>
#include <thread>

#include "chaos/run.h"

namespace spillway::chaos {

std::string ServiceOf(const std::string& kind) {
  return kind == "embedding" ? "embed" : kind == "search" ? "search" : "chat";
}

json Run::BodyFor(const PlannedRequest& p) const {
  const std::string text = PromptText(p.seed ^ std::hash<std::string>{}(p.id), p.prompt_words);
  if (p.kind == "embedding" || p.kind == "search") return {{"model", ServiceOf(p.kind)}, {"input", text}};
  json b = {{"model", "chat"}, {"max_tokens", p.max_tokens}, {"seed", p.seed}, {"temperature", 0.8}, {"stream", p.stream}};
  if (p.stream) b["stream_options"] = {{"include_usage", true}};
  if (p.kind == "completion") {
    b["prompt"] = text;
  } else {
    b["messages"] = json::array({{{"role", "user"}, {"content", text}}});
  }
  if (p.kind == "agent") {
    b["tools"] = json::array({{{"type", "function"},
                               {"function", {{"name", "increment"},
                                             {"description", "adds one to the harness's counter"},
                                             {"parameters", {{"type", "object"}, {"properties", json::object()}}}}}}});
    b["tool_choice"] = "required";
    b["parallel_tool_calls"] = false;  // one call per agent request: the counter counts them
  }
  return b;
}

RequestRecord Run::Send(const PlannedRequest& p) {
  RequestRecord r;
  r.id = p.id;
  r.scenario = s_.name;
  r.service = ServiceOf(p.kind);
  r.kind = p.kind;
  r.stream = p.stream;
  r.deterministic = p.kind == "completion" || p.kind == "chat";
  r.sent_ms = SinceStart();
  const json body = BodyFor(p);
  const std::string path = p.kind == "embedding" || p.kind == "search" ? "/v1/embeddings"
                           : p.kind == "completion" ? "/v1/completions"
                                                    : "/v1/chat/completions";
  const uint16_t port = port_.load();
  const auto t0 = Steady::now();
  auto ms_since = [&] { return std::chrono::duration_cast<std::chrono::milliseconds>(Steady::now() - t0).count(); };
  std::thread canceller;
  std::atomic<bool> finished{false};
  // Joined however Send ends: an answer of an unexpected shape throws from a
  // json accessor below, and a joinable thread destroyed in the unwinding
  // called std::terminate (the harness's own catch never ran).
  struct JoinCanceller {
    std::thread& t;
    std::atomic<bool>& finished;
    ~JoinCanceller() {
      finished = true;
      if (t.joinable()) t.join();
    }
  } join_canceller{canceller, finished};
  if (p.cancel_after_ms >= 0 && target_ != Target::kLlamaServer) {
    canceller = std::thread([&, port] {
      for (int64_t waited = 0; waited < p.cancel_after_ms && !finished; waited += 10) SleepMs(10);
      if (finished) return;
      auto d = http::Fetch("127.0.0.1", port, "DELETE", "/v1/requests/" + p.id, "", {}, std::chrono::seconds(5));
      if (d.ok() && d->status == 200) r.cancelled_by_client = true;
    });
  }
  int tools = 0;
  auto run_tools = [&](const json& calls) {
    for (const auto& c : calls) {
      if (c.contains("function") && c["function"].value("name", "") == "increment") ++tools;
    }
  };
  const http::HeaderList headers = {{"X-Request-Id", p.id}};
  if (!p.stream) {
    auto res = http::Fetch("127.0.0.1", port, "POST", path, body.dump(), headers, std::chrono::seconds(120));
    r.latency_ms = ms_since();
    if (!res.ok()) {
      r.first_error = res.status().message();
    } else {
      r.http_status = res->status;
      r.acknowledged = !res->Header("x-request-id").empty() || target_ == Target::kLlamaServer;
      r.placement = res->Header("x-spillway-placement");
      r.degraded_signal = !res->Header("x-spillway-degraded").empty() || !res->Header("x-spillway-fallback-model").empty();
      json j = json::parse(res->body, nullptr, false);
      r.connection_survived = !j.is_discarded();
      if (j.is_object() && j.contains("usage") && j["usage"].is_object()) {
        r.completion_tokens = j["usage"].value("completion_tokens", -1);
      }
      if (res->status != 200) {
        r.first_error = j.is_object() && j.contains("error") ? j["error"].value("message", res->body) : res->body;
      } else if (j.is_object() && j.contains("choices") && !j["choices"].empty()) {
        const auto& c = j["choices"][0];
        if (c.contains("text")) r.output = c.value("text", "");
        if (c.contains("message")) {
          const auto& m = c["message"];
          if (m.contains("content") && m["content"].is_string()) r.output = m["content"];
          if (m.contains("tool_calls") && m["tool_calls"].is_array()) {
            run_tools(m["tool_calls"]);
            r.output += m["tool_calls"].dump();
          }
        }
      } else if (j.is_object() && j.contains("data")) {
        r.output = "embedding[" + std::to_string(j["data"][0]["embedding"].size()) + "]";
      }
    }
  } else {
    std::string pending;
    bool done = false;
    auto st = http::StreamFetch(
        "127.0.0.1", port, "POST", path, body.dump(), headers,
        [&](const http::StreamHead& h) {
          r.http_status = h.status;
          auto id = h.headers.find("x-request-id");
          r.acknowledged = (id != h.headers.end() && !id->second.empty()) || (target_ == Target::kLlamaServer && h.status == 200);
          if (auto pl = h.headers.find("x-spillway-placement"); pl != h.headers.end()) r.placement = pl->second;
          r.degraded_signal |= h.headers.count("x-spillway-degraded") > 0 || h.headers.count("x-spillway-fallback-model") > 0;
          return true;
        },
        [&](std::string_view data) {
          pending.append(data);
          size_t pos;
          while ((pos = pending.find("\n\n")) != std::string::npos) {
            const std::string ev = pending.substr(0, pos);
            pending.erase(0, pos + 2);
            if (r.http_status != 200) {
              r.first_error += ev;
              continue;
            }
            if (ev.rfind(":", 0) == 0) {
              if (ev.find("spillway") != std::string::npos) r.degraded_signal = true;
              continue;
            }
            if (ev.rfind("data: ", 0) != 0) continue;
            const std::string payload = ev.substr(6);
            if (payload == "[DONE]") {
              done = true;
              continue;
            }
            json j = json::parse(payload, nullptr, false);
            if (!j.is_object()) continue;
            if (j.contains("usage") && j["usage"].is_object()) r.completion_tokens = j["usage"].value("completion_tokens", -1);
            if (j.contains("error") && r.first_error.empty()) {
              r.first_error = j["error"].is_object() ? j["error"].value("message", payload) : payload;
            }
            if (j.contains("choices") && !j["choices"].empty()) {
              const auto& c = j["choices"][0];
              std::string piece;
              if (c.contains("text") && c["text"].is_string()) piece = c["text"];
              if (c.contains("delta")) {
                const auto& d = c["delta"];
                if (d.contains("content") && d["content"].is_string()) piece = d["content"];
                if (d.contains("tool_calls") && d["tool_calls"].is_array()) {
                  run_tools(d["tool_calls"]);
                  r.output += d["tool_calls"].dump();
                  if (r.ttft_ms < 0) r.ttft_ms = ms_since();
                }
              }
              if (!piece.empty() && r.ttft_ms < 0) r.ttft_ms = ms_since();
              r.output += piece;
            }
          }
          return true;
        },
        std::chrono::seconds(120));
    // A refused stream's body is plain JSON, no event: what is left of it is its error.
    if (r.http_status != 200 && !pending.empty()) r.first_error += pending;
    r.latency_ms = ms_since();
    r.connection_survived = st.ok() && done;
    if (!st.ok() && r.first_error.empty()) r.first_error = st.message();
    if (!done && r.first_error.empty() && r.http_status == 200) r.first_error = "the stream ended without [DONE]";
    if (r.http_status != 200 && r.http_status != 0) {
      json j = json::parse(r.first_error, nullptr, false);
      if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
          j["error"]["message"].is_string()) {
        r.first_error = j["error"]["message"].get<std::string>();
      }
      if (r.first_error.empty()) r.first_error = "HTTP " + std::to_string(r.http_status);
    }
  }
  finished = true;
  if (canceller.joinable()) canceller.join();  // (before the result is read)
  r.tool_executions = tools;
  return r;
}


}  // namespace spillway::chaos
