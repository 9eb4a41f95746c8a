#include "worker/chat_output.h"

#include <chat.h>

#include <exception>

#include "common/hash.h"
#include "common/utf8.h"

namespace spillway::worker {

namespace {

const common_chat_parser_params& ParamsOf(const ChatSyntax& s) {
  static const common_chat_parser_params kContentOnly;
  return s.params ? *s.params : kContentOnly;
}

api::AssistantMessage ToMessage(const common_chat_msg& m) {
  api::AssistantMessage out{m.content, m.reasoning_content, {}};
  for (const auto& c : m.tool_calls) out.tool_calls.push_back(api::ToolCall{c.id, c.name, c.arguments});
  return out;
}

}  // namespace

std::string ToolCallId(const std::string& request_id, int index) {
  return "call_" + Sha256Hex(request_id + ":" + std::to_string(index)).substr(0, 24);
}

struct ChatOutput::State {
  common_chat_msg msg;
  std::vector<std::string> ids;
};

ChatOutput::ChatOutput(ChatSyntax syntax, std::string request_id)
    : syntax_(std::move(syntax)), request_id_(std::move(request_id)), state_(std::make_unique<State>()) {}

ChatOutput::~ChatOutput() = default;

std::vector<api::ChatDelta> ChatOutput::Parse(bool partial) {
  const auto& params = ParamsOf(syntax_);
  // Invalid bytes (a random or broken model's) as U+FFFD: llama.cpp's
  // parsers stop at them, and a stream would hold everything back until it ends.
  const std::string text = ValidUtf8(text_);
  common_chat_msg next;
  try {
    next = common_chat_parse(text, partial, params);
  } catch (const std::exception&) {
    // A complete answer that does not match the format (a model that broke
    // off mid-call): read what can be read, as a partial answer.
    if (partial) return {};
    try {
      next = common_chat_parse(text, true, params);
    } catch (const std::exception&) {
      next = common_chat_msg();
    }
    const auto& prev = state_->msg;
    if (next.empty() && !text.empty() && prev.tool_calls.empty() && prev.reasoning_content.empty() &&
        text.rfind(prev.content, 0) == 0) {
      // Nothing of it reads in the format (a call cut off by max_tokens, text
      // the parser rejects): what the model wrote is the content, where
      // llama-server answers 500.
      next.role = "assistant";
      next.content = text;
    }
  }
  if (next.empty()) return {};
  auto& ids = state_->ids;
  next.set_tool_call_ids(ids, [&] { return ToolCallId(request_id_, static_cast<int>(ids.size())); });
  std::vector<common_chat_msg_diff> diffs;
  try {
    diffs = common_chat_msg_diff::compute_diffs(state_->msg, next);
  } catch (const std::exception&) {
    return {};  // a parse that takes back a call: wait for more text
  }
  state_->msg = std::move(next);
  msg_ = ToMessage(state_->msg);
  std::vector<api::ChatDelta> out;
  out.reserve(diffs.size());
  for (auto& d : diffs) {
    api::ChatDelta delta;
    delta.reasoning_content = std::move(d.reasoning_content_delta);
    delta.content = std::move(d.content_delta);
    if (d.tool_call_index != std::string::npos) {
      delta.tool_call_index = static_cast<int>(d.tool_call_index);
      delta.tool_call = api::ToolCall{d.tool_call_delta.id, d.tool_call_delta.name, d.tool_call_delta.arguments};
    }
    out.push_back(std::move(delta));
  }
  return out;
}

std::vector<api::ChatDelta> ChatOutput::Append(std::string_view text) {
  text_.append(text);
  return Parse(/*partial=*/true);
}

void ChatOutput::Replayed(std::string_view text) {
  text_.append(text);
  Parse(/*partial=*/true);
}

std::vector<api::ChatDelta> ChatOutput::Finish(std::string_view rest) {
  text_.append(rest);
  return Parse(/*partial=*/false);
}

api::AssistantMessage ParseAnswer(const ChatSyntax& syntax, const std::string& text, const std::string& request_id) {
  ChatOutput out(syntax, request_id);
  out.Finish(text);
  return out.message();
}

}  // namespace spillway::worker
