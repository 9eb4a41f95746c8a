// Chat prompts a worker rendered lately, with their tokens, for a moment
// (and completions' prompts, tokenized).
//
// A chat reaches a worker twice when its gateway counts it first (a service
// of more than one placement: admission needs the prompt's size before it
// chooses): once to /v1/worker/tokenize, once to run. Each time the chat
// template renders the conversation and the tokenizer cuts it, in llama.cpp's
// own code: about 11 ms for a 2,000-token conversation on this project's
// machine, so the count doubled a long chat's preparation. A retry of the same
// request, or a client's "regenerate" (the same conversation, another seed),
// renders it once more again. The second time now finds the first one's.
//
// The key is what a rendering reads: the messages rendered (the
// conversation, or the tail of it that a "truncate" keeps) and the request's
// other members as JSON (in order, as nlohmann writes them), without those a
// template never reads and that change between the count and the run or from
// one try to the next: max_tokens, max_completion_tokens, seed, and the
// gateway's own spillway_fit_context, spillway_drop_messages and
// spillway_resume. Everything else stays in it (tools, tool_choice,
// response_format, stream, the template's kwargs...), so a body that may
// render otherwise misses. An entry lives `ttl_ms` (a template may print
// today's date: a rendering is reused only briefly), and the cache holds at
// most `max_entries` entries and about `max_bytes` (keys, prompts and tokens),
// the least recently used leaving first; one past a quarter of `max_bytes` is
// not kept. Thread-safe.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/clock.h"
#include "worker/chat_template.h"

namespace spillway::worker {

struct RenderedPrompt {
  ChatPlan plan;
  std::vector<int32_t> tokens;
};

class RenderedPrompts {
 public:
  struct Stats {
    uint64_t hits = 0, misses = 0;
    size_t entries = 0, bytes = 0;
  };

  // max_entries 0: nothing kept (every Find misses, uncounted).
  RenderedPrompts(const Clock& clock, size_t max_entries, size_t max_bytes, int64_t ttl_ms);

  // The key of a chat body (an object) rendering `messages` (its own, or a
  // tail of them). "" for a body that is not an object (never kept).
  static std::string KeyOf(const nlohmann::json& body, const nlohmann::json& messages);

  // The key of a completion's prompt text (kept are its tokens alone: no
  // template renders it, and nothing else of the body changes them). Never
  // a chat's key.
  static std::string KeyOfText(const std::string& text);

  // The rendering kept for `key`, or null (counted as a miss). An empty key
  // always misses.
  std::shared_ptr<const RenderedPrompt> Find(const std::string& key);
  // Keeps a copy (none of one past a quarter of max_bytes).
  void Put(const std::string& key, const ChatPlan& plan, const std::vector<int32_t>& tokens);

  bool enabled() const { return max_entries_ > 0; }
  Stats stats();  // (what expired is let go first)

 private:
  struct Entry {
    std::string key;
    std::shared_ptr<const RenderedPrompt> value;
    int64_t stored_ms = 0;
    uint64_t used = 0;  // the use counter's value at its last use (least: next to leave)
    size_t bytes = 0;
  };
  void DropExpiredLocked(int64_t now);

  const Clock& clock_;
  const size_t max_entries_, max_bytes_;
  const int64_t ttl_ms_;
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
  uint64_t uses_ = 0;
  size_t bytes_ = 0;
  uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace spillway::worker
