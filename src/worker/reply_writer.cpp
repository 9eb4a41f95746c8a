#include "worker/reply_writer.h"

#include "common/utf8.h"

namespace spillway::worker {

using nlohmann::json;

StreamReply::StreamReply(ReplyHeader header, std::optional<ChatSyntax> chat) : h_(std::move(header)) {
  if (chat) chat_.emplace(std::move(*chat), h_.id);
}

std::string StreamReply::Send(json chunk) {
  first_ = false;
  return api::SseEvent(chunk);
}

// One event per delta; the pending ids (and logprobs) ride on the last one.
std::string StreamReply::Events(const std::vector<api::ChatDelta>& deltas) {
  std::string out;
  for (size_t i = 0; i < deltas.size(); ++i) {
    json chunk = h_.ep == api::Endpoint::kChat
                     ? api::DeltaChunk(h_.id, h_.model, h_.created, deltas[i], first_)
                     : api::GenerationChunk(h_.ep, h_.id, h_.model, h_.created, deltas[i].content, first_, std::nullopt);
    if (i + 1 == deltas.size()) {
      if (!unsent_ids_.empty()) chunk["spillway"]["tokens"] = unsent_ids_;
      if (logprobs_) chunk["choices"][0]["logprobs"] = api::LogprobsJson(h_.ep, unsent_logprobs_, text_offset_);
      unsent_ids_.clear();
      unsent_logprobs_.clear();
    }
    if (h_.ep == api::Endpoint::kCompletion) text_offset_ += deltas[i].content.size();
    out += Send(std::move(chunk));
  }
  return out;
}

std::string StreamReply::Text(std::string_view text, const std::vector<int32_t>& ids,
                              const std::vector<api::TokenLogprob>& logprobs) {
  unsent_ids_.insert(unsent_ids_.end(), ids.begin(), ids.end());
  if (!logprobs.empty()) logprobs_ = true;
  unsent_logprobs_.insert(unsent_logprobs_.end(), logprobs.begin(), logprobs.end());
  if (chat_) return Events(chat_->Append(text));
  if (text.empty()) return "";  // the ids go out with the next event
  // Invalid bytes (a random or broken model's) go out as U+FFFD, each one
  // here, not by the JSON writer's own rule: what the client counts is then
  // what a continuation counts again (Replayed). The engine hands text in
  // whole characters, so chunk by chunk is the same as all at once.
  api::ChatDelta d;
  d.content = ValidUtf8(text);
  return Events({d});
}

Status StreamReply::Replayed(std::string_view text, uint64_t delivered_bytes) {
  // What was delivered began the message, its role with it: a continuation's
  // first delta carried the role again (clients that begin a message at each
  // role split the answer in two).
  first_ = false;
  uint64_t counted = text.size();
  if (chat_) {
    chat_->Replayed(text);
    counted = chat_->message().content.size();
  } else {
    counted = text_offset_ = ValidUtf8(text).size();  // as Text() sent it
  }
  if (counted != delivered_bytes) {
    return Status::Unavailable("the continuation is not reproducible: its replayed tokens make " + std::to_string(counted) +
                               " bytes of content, " + std::to_string(delivered_bytes) + " were delivered");
  }
  return Status::Ok();
}

std::string StreamReply::Finish(const std::string& finish_reason, json meta, const api::Usage* usage) {
  std::string out = chat_ ? Events(chat_->Finish()) : "";
  const bool calls = chat_ && !chat_->message().tool_calls.empty();
  const std::string reason = calls && finish_reason == "stop" ? "tool_calls" : finish_reason;
  json last = api::GenerationChunk(h_.ep, h_.id, h_.model, h_.created, "", first_, reason);
  if (!unsent_ids_.empty()) last["spillway"]["tokens"] = unsent_ids_;
  if (logprobs_ && !unsent_logprobs_.empty()) {
    last["choices"][0]["logprobs"] = api::LogprobsJson(h_.ep, unsent_logprobs_, text_offset_);
  }
  unsent_ids_.clear();
  unsent_logprobs_.clear();
  for (auto& [k, v] : meta.items()) last["spillway"][k] = v;
  out += Send(std::move(last));
  if (usage) out += api::SseEvent(api::UsageChunk(h_.ep, h_.id, h_.model, h_.created, *usage));
  return out;
}

json WholeReply(const ReplyHeader& h, const std::string& text, const std::string& finish_reason,
                const api::Usage& usage, const ChatSyntax* chat, const std::vector<api::TokenLogprob>* logprobs) {
  api::GenerationResult g{chat ? text : ValidUtf8(text), finish_reason, usage, std::nullopt, logprobs};  // (as streamed)
  if (chat) {
    g.message = ParseAnswer(*chat, text, h.id);
    if (!g.message->tool_calls.empty() && finish_reason == "stop") g.finish_reason = "tool_calls";
  }
  return api::GenerationBody(h.ep, h.id, h.model, h.created, g);
}

}  // namespace spillway::worker
