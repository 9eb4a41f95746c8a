// OpenAI-shaped answers and streams (what the gateway's lifecycle produces)
// translated into Ollama's: whole answers, NDJSON stream lines, errors. The
// only place that knows Ollama's answer shapes. Pure: the times are
// parameters (unix milliseconds).
//
//   chat        {"model","created_at","message":{"role","content","thinking"?,"tool_calls"?},"done",...}
//   generate    {"model","created_at","response","thinking"?,"done",...}
//   final       "done": true, "done_reason" ("stop" | "length"), "total_duration",
//               "load_duration", "prompt_eval_count", "prompt_eval_duration",
//               "eval_count", "eval_duration" (nanoseconds), and "spillway"
//               (who served it, as the OpenAI answer says)
//   embed       {"model","embeddings":[[...]],"total_duration","load_duration","prompt_eval_count"}
//   embeddings  {"embedding":[...]}
//   error       {"error":"message"}, a stream's last line included
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "api/ollama_request.h"
#include "common/status.h"

namespace spillway::api {

struct OllamaReplyContext {
  OllamaRoute route = OllamaRoute::kChat;
  std::string model;       // as the client named it
  int64_t started_ms = 0;  // when the request arrived (total_duration)
};

// RFC 3339 in UTC with nanoseconds, as Ollama writes created_at.
std::string OllamaTimestamp(int64_t unix_ms);

// A whole answer (chat.completion, text_completion or an embeddings list).
// kInternal when `openai` is not one.
StatusOr<nlohmann::json> OllamaAnswer(const OllamaReplyContext& ctx, const nlohmann::json& openai, int64_t now_ms);

// The answer to a request with nothing to generate (an empty prompt):
// done_reason "load" ("unload": it asked keep_alive 0 of a model that
// unloads), or an empty embedding.
nlohmann::json OllamaLoadAnswer(const OllamaReplyContext& ctx, int64_t now_ms, bool unload = false);

// An OpenAI error body ({"error":{"message":...}}) as Ollama's {"error":"..."};
// anything else is carried as its text.
nlohmann::json OllamaError(std::string_view openai_error_body);

// An OpenAI SSE stream (any split of its bytes) into Ollama NDJSON lines. Not
// thread-safe: one per stream.
class OllamaStreamTranslator {
 public:
  explicit OllamaStreamTranslator(OllamaReplyContext ctx) : ctx_(std::move(ctx)) {}

  // The lines for what `sse` completes (comments are dropped: NDJSON has none).
  std::string Feed(std::string_view sse, int64_t now_ms);
  // The stream ended: an error line when it ended without its final line ("" otherwise).
  std::string Finish(int64_t now_ms);
  // Said in the final line's "spillway" (who served the stream), beside the worker's own.
  void Annotate(const std::string& key, const std::string& value) { notes_[key] = value; }
  bool done() const { return done_; }

 private:
  std::string Event(const std::string& payload, int64_t now_ms);
  std::string Line(const nlohmann::json& j) const;
  nlohmann::json Base(int64_t now_ms) const;
  std::string FinalLines(int64_t now_ms);

  struct PendingCall {
    std::string id, name, arguments;
  };
  OllamaReplyContext ctx_;
  std::string pending_;
  bool done_ = false;
  std::string finish_reason_;
  nlohmann::json usage_ = nlohmann::json::object();
  nlohmann::json spillway_ = nlohmann::json::object();  // the final chunk's, without its token ids
  nlohmann::json notes_ = nlohmann::json::object();     // the gateway's (Annotate)
  std::map<int, PendingCall> calls_;                      // tool calls arrive in pieces; sent whole
};

}  // namespace spillway::api
