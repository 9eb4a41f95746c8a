#include "worker/rendered_prompts.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <string_view>

namespace spillway::worker {

namespace {

// Members a chat template never reads, which the gateway changes between its
// count and the run (or a retry changes): left out of the key. (The messages
// go in as rendered.)
constexpr std::array<std::string_view, 7> kNotRendered = {
    "messages", "max_tokens", "max_completion_tokens", "seed",
    "spillway_fit_context", "spillway_drop_messages", "spillway_resume"};

// What an entry holds, about (the answer's parser, which a template's
// tools enlarge, counted by its grammar's size: it is built from the same).
size_t BytesOf(const std::string& key, const ChatPlan& plan, const std::vector<int32_t>& tokens) {
  size_t n = key.size() + plan.prompt.size() + 2 * plan.grammar.gbnf.size() + 512;
  n += (tokens.size() + plan.preserved_tokens.size() + plan.grammar.trigger_tokens.size() +
        plan.grammar.prefill.size()) * sizeof(int32_t);
  for (const auto& s : plan.stops) n += s.size() + 32;
  for (const auto& s : plan.grammar.trigger_patterns) n += s.size() + 32;
  return n;
}

}  // namespace

RenderedPrompts::RenderedPrompts(const Clock& clock, size_t max_entries, size_t max_bytes, int64_t ttl_ms)
    : clock_(clock), max_entries_(max_entries), max_bytes_(max_bytes), ttl_ms_(ttl_ms) {}

std::string RenderedPrompts::KeyOf(const nlohmann::json& body, const nlohmann::json& messages) {
  if (!body.is_object()) return "";
  std::string key = messages.dump();
  key += '{';
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (std::find(kNotRendered.begin(), kNotRendered.end(), it.key()) != kNotRendered.end()) continue;
    if (key.back() != '{') key += ',';
    key += nlohmann::json(it.key()).dump();
    key += ':';
    key += it.value().dump();
  }
  key += '}';
  return key;
}

std::string RenderedPrompts::KeyOfText(const std::string& text) {
  return "T" + text;  // (a chat's key begins with its messages' array: '[')
}

void RenderedPrompts::DropExpiredLocked(int64_t now) {
  for (size_t i = 0; i < entries_.size();) {
    if (now - entries_[i].stored_ms >= ttl_ms_ || now < entries_[i].stored_ms) {
      bytes_ -= entries_[i].bytes;
      if (i + 1 != entries_.size()) entries_[i] = std::move(entries_.back());
      entries_.pop_back();
    } else {
      ++i;
    }
  }
}

std::shared_ptr<const RenderedPrompt> RenderedPrompts::Find(const std::string& key) {
  if (!enabled()) return nullptr;
  std::lock_guard lk(mu_);
  if (!key.empty()) {
    DropExpiredLocked(clock_.NowMs());
    for (auto& e : entries_) {
      if (e.key == key) {
        e.used = ++uses_;
        ++hits_;
        return e.value;
      }
    }
  }
  ++misses_;
  return nullptr;
}

void RenderedPrompts::Put(const std::string& key, const ChatPlan& plan, const std::vector<int32_t>& tokens) {
  if (key.empty() || !enabled()) return;
  const size_t bytes = BytesOf(key, plan, tokens);
  if (bytes > max_bytes_ / 4) return;
  // (Copied, and the key too, before the lock: others' Find need not wait for that.)
  Entry fresh{key, std::make_shared<const RenderedPrompt>(RenderedPrompt{plan, tokens}), 0, 0, bytes};
  std::vector<Entry> gone;  // (freed after the lock)
  std::lock_guard lk(mu_);
  const int64_t now = clock_.NowMs();
  DropExpiredLocked(now);
  for (auto& e : entries_) {
    if (e.key == key) {  // (rendered twice at once: the later one stays)
      bytes_ = bytes_ - e.bytes + bytes;
      std::swap(e.value, fresh.value);  // (the earlier one freed after the lock)
      e.stored_ms = now;
      e.used = ++uses_;
      e.bytes = bytes;
      return;
    }
  }
  while (!entries_.empty() && (entries_.size() >= max_entries_ || bytes_ + bytes > max_bytes_)) {
    auto lru = std::min_element(entries_.begin(), entries_.end(),
                                [](const Entry& a, const Entry& b) { return a.used < b.used; });
    bytes_ -= lru->bytes;
    gone.push_back(std::move(*lru));
    if (lru + 1 != entries_.end()) *lru = std::move(entries_.back());
    entries_.pop_back();
  }
  fresh.stored_ms = now;
  fresh.used = ++uses_;
  entries_.push_back(std::move(fresh));
  bytes_ += bytes;
}

RenderedPrompts::Stats RenderedPrompts::stats() {
  std::lock_guard lk(mu_);
  DropExpiredLocked(clock_.NowMs());
  return Stats{hits_, misses_, entries_.size(), bytes_};
}

}  // namespace spillway::worker
