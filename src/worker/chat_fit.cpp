#include "worker/chat_fit.h"

#include <vector>

namespace spillway::worker {

using nlohmann::json;

namespace {

bool HasRole(const json& m, const char* role) {
  const auto r = m.find("role");
  return r != m.end() && r->is_string() && *r == role;
}

bool IsSystem(const json& m) { return HasRole(m, "system") || HasRole(m, "developer"); }

KeptMessages Tail(const json& messages, size_t start) {
  KeptMessages k;
  k.messages = json::array();
  for (size_t i = 0; i < start; ++i) {
    if (IsSystem(messages[i])) {
      k.messages.push_back(messages[i]);
    } else {
      ++k.dropped;
    }
  }
  for (size_t i = start; i < messages.size(); ++i) k.messages.push_back(messages[i]);
  return k;
}

}  // namespace

std::optional<KeptMessages> KeepLatestThatFit(const json& messages, const std::function<bool(const json&)>& fits) {
  if (!messages.is_array() || messages.empty()) return std::nullopt;
  const size_t n = messages.size();
  // Where a kept tail may begin, oldest first: a user's message with some
  // message other than a system message before it (else the tail is the
  // whole conversation, which does not fit).
  std::vector<size_t> starts;
  bool leaves_out = false;
  for (size_t i = 0; i < n; ++i) {
    if (leaves_out && HasRole(messages[i], "user")) starts.push_back(i);
    leaves_out |= !IsSystem(messages[i]);
  }
  // The first start whose tail fits: the longest such tail.
  size_t lo = 0, hi = starts.size();
  std::optional<KeptMessages> best;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    KeptMessages k = Tail(messages, starts[mid]);
    if (fits(k.messages)) {
      best = std::move(k);
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  if (best) return best;
  // None: the last message alone (when it is not one of those tried, and
  // something comes before it).
  if ((!starts.empty() && starts.back() == n - 1) || Tail(messages, n - 1).dropped == 0) return std::nullopt;
  KeptMessages last = Tail(messages, n - 1);
  if (fits(last.messages)) return last;
  return std::nullopt;
}

KeptMessages WithoutOldest(const json& messages, int dropped) {
  if (!messages.is_array() || messages.empty() || dropped <= 0) return {messages, 0};
  size_t start = 0;
  int left_out = 0;
  while (start + 1 < messages.size() && left_out < dropped) {
    if (!IsSystem(messages[start])) ++left_out;
    ++start;
  }
  return Tail(messages, start);
}

}  // namespace spillway::worker
