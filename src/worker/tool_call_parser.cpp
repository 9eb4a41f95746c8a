#include "worker/tool_call_parser.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "api/json_limits.h"
#include "common/hash.h"

namespace spillway::worker {

namespace {

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// The length of the longest proper prefix of `tag` that ends `text`.
size_t PartialTagSuffix(std::string_view text, std::string_view tag) {
  for (size_t k = std::min(tag.size() - 1, text.size()); k > 0; --k) {
    if (text.substr(text.size() - k) == tag.substr(0, k)) return k;
  }
  return 0;
}

}  // namespace

ToolCallParser::ToolCallParser(std::vector<std::string> names, std::string request_id)
    : names_(std::move(names)), request_id_(std::move(request_id)) {}

void ToolCallParser::EmitContent(std::string text, std::vector<ToolCallPiece>* out) {
  text.insert(0, held_ws_);
  held_ws_.clear();
  size_t end = text.size();
  while (end > 0 && IsSpace(text[end - 1])) --end;
  held_ws_ = text.substr(end);
  text.resize(end);
  if (text.empty()) return;
  if (!out->empty() && !out->back().call) {
    out->back().content += text;
  } else {
    out->push_back({std::move(text), std::nullopt});
  }
}

std::vector<ToolCallPiece> ToolCallParser::Append(std::string_view text) {
  buf_.append(text);
  std::vector<ToolCallPiece> out;
  while (true) {
    if (!in_block_) {
      const size_t open = buf_.find(kToolCallOpen);
      if (open == std::string::npos) {
        const size_t keep = PartialTagSuffix(buf_, kToolCallOpen);
        EmitContent(buf_.substr(0, buf_.size() - keep), &out);
        buf_.erase(0, buf_.size() - keep);
        return out;
      }
      EmitContent(buf_.substr(0, open), &out);
      buf_.erase(0, open + kToolCallOpen.size());
      in_block_ = true;
      continue;
    }
    const size_t close = buf_.find(kToolCallClose);
    if (close == std::string::npos) return out;
    const size_t block_end = close + kToolCallClose.size();
    if (auto call = ParseToolCallBody(std::string_view(buf_).substr(0, close), names_)) {
      call->id = ToolCallId(request_id_, calls_++);
      held_ws_.clear();  // whitespace before a call is not content
      out.push_back({"", std::move(call)});
    } else {
      EmitContent(std::string(kToolCallOpen) + buf_.substr(0, block_end), &out);
    }
    buf_.erase(0, block_end);
    in_block_ = false;
  }
}

std::vector<ToolCallPiece> ToolCallParser::Finish() {
  std::vector<ToolCallPiece> out;
  EmitContent((in_block_ ? std::string(kToolCallOpen) : std::string()) + buf_, &out);
  buf_.clear();
  in_block_ = false;
  // Trailing whitespace is content only in an answer without calls.
  if (calls_ == 0 && !held_ws_.empty()) {
    if (!out.empty()) {
      out.back().content += held_ws_;
    } else {
      out.push_back({held_ws_, std::nullopt});
    }
  }
  held_ws_.clear();
  return out;
}

std::optional<api::ToolCall> ParseToolCallBody(std::string_view body, const std::vector<std::string>& names) {
  // Model output is outside input too: bounded before anything recursive (dump) runs on it.
  if (api::CheckJsonLimits(body, api::JsonLimits{}) != api::JsonShape::kOk) return std::nullopt;
  // ordered_json keeps the arguments' keys in the order the model wrote them.
  auto j = nlohmann::ordered_json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string()) return std::nullopt;
  const auto& n = name->get_ref<const std::string&>();
  if (std::find(names.begin(), names.end(), n) == names.end()) return std::nullopt;
  api::ToolCall call;
  call.name = n;
  auto args = j.find("arguments");
  if (args == j.end() || args->is_null()) {
    call.arguments = "{}";
  } else if (args->is_object()) {
    call.arguments = args->dump();
  } else {
    return std::nullopt;
  }
  return call;
}

std::string ToolCallId(const std::string& request_id, int index) {
  return "call_" + Sha256Hex(request_id + ":" + std::to_string(index)).substr(0, 24);
}

SplitText SplitToolCalls(std::string_view text, const std::vector<std::string>& names, const std::string& request_id) {
  ToolCallParser parser(names, request_id);
  auto pieces = parser.Append(text);
  for (auto& p : parser.Finish()) pieces.push_back(std::move(p));
  SplitText out;
  for (auto& p : pieces) {
    if (p.call) {
      out.calls.push_back(std::move(*p.call));
    } else {
      out.content += p.content;
    }
  }
  return out;
}

}  // namespace spillway::worker
