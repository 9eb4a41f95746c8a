#include "worker/reply_writer.h"

namespace spillway::worker {

using nlohmann::json;

StreamReply::StreamReply(ReplyHeader header, std::optional<ToolCallParser> tools)
    : h_(std::move(header)), tools_(std::move(tools)) {}

std::string StreamReply::Send(json chunk) {
  if (!unsent_ids_.empty()) {
    chunk["spillway"]["tokens"] = unsent_ids_;
    unsent_ids_.clear();
  }
  first_ = false;
  return api::SseEvent(chunk);
}

std::string StreamReply::Events(const std::vector<ToolCallPiece>& pieces) {
  std::string out;
  for (const auto& p : pieces) {
    if (p.call) {
      out += Send(api::ToolCallChunk(h_.id, h_.model, h_.created, *p.call, calls_sent_++, first_));
    } else {
      out += Send(api::GenerationChunk(h_.ep, h_.id, h_.model, h_.created, p.content, first_, std::nullopt));
    }
  }
  return out;
}

std::string StreamReply::Text(std::string_view text, const std::vector<int32_t>& ids) {
  unsent_ids_.insert(unsent_ids_.end(), ids.begin(), ids.end());
  if (tools_) return Events(tools_->Append(text));
  return Events({ToolCallPiece{std::string(text), std::nullopt}});
}

std::string StreamReply::Finish(const std::string& finish_reason, json meta, const api::Usage* usage) {
  std::string out = tools_ ? Events(tools_->Finish()) : "";
  const std::string reason = calls_sent_ > 0 ? "tool_calls" : finish_reason;
  json last = api::GenerationChunk(h_.ep, h_.id, h_.model, h_.created, "", first_, reason);
  last["spillway"] = std::move(meta);
  out += Send(std::move(last));
  if (usage) out += api::SseEvent(api::UsageChunk(h_.ep, h_.id, h_.model, h_.created, *usage));
  return out;
}

json WholeReply(const ReplyHeader& h, const std::string& text, const std::string& finish_reason,
                const api::Usage& usage, const std::vector<std::string>* tool_names) {
  api::GenerationResult g{text, finish_reason, usage, {}};
  if (tool_names) {
    SplitText split = SplitToolCalls(text, *tool_names, h.id);
    if (!split.calls.empty()) {
      g.text = std::move(split.content);
      g.tool_calls = std::move(split.calls);
      g.finish_reason = "tool_calls";
    }
  }
  return api::GenerationBody(h.ep, h.id, h.model, h.created, g);
}

}  // namespace spillway::worker
