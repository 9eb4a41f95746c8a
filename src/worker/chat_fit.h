// What a conversation keeps when it is longer than the context and its
// request says "truncate" (Ollama's /api/chat rule, on there by default):
// its oldest messages are left out, never a system message and never its
// last message. Ollama keeps the longest tail that fits; so does this, with
// one more rule: a kept tail begins at a user's message (no tool result
// without the call it answers, no answer without its question, which some
// templates refuse), or, when no such tail fits, is the last message alone.
#pragma once

#include <functional>
#include <optional>

#include <nlohmann/json.hpp>

namespace spillway::worker {

struct KeptMessages {
  nlohmann::json messages;  // the system messages before the tail, then the tail
  int dropped = 0;          // messages left out (never a system message)
};

// `messages`: the request's array (already checked by api::ParseChatRequest).
// `fits(candidate)`: whether that array's prompt fits (the caller renders and
// counts it; a candidate its template refuses does not fit). The whole
// conversation is taken not to fit. The tails that begin at a user's message
// are tried by bisection (a shorter one never takes more room), so a
// conversation of n messages is rendered about log2(n) times; the last
// message alone only when none of them fits. nullopt: nothing fits.
std::optional<KeptMessages> KeepLatestThatFit(const nlohmann::json& messages,
                                              const std::function<bool(const nlohmann::json&)>& fits);

// The conversation without its `dropped` oldest messages that are not system
// messages (as KeepLatestThatFit counted them for another worker of the
// service: every placement then reads the same prompt). The last message is
// always kept.
KeptMessages WithoutOldest(const nlohmann::json& messages, int dropped);

}  // namespace spillway::worker
