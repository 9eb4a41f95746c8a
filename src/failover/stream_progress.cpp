#include "failover/stream_progress.h"

#include <nlohmann/json.hpp>

#include "api/http_client.h"
#include "common/json_members.h"

namespace spillway::failover {

using nlohmann::json;

namespace {

// What Observe reads of one event's JSON, gathered as it is parsed
// (common/json_members.h): building the whole document for these few members
// cost about 40 % of a streamed request's instructions (an event a token).
// The same members as a parsed document would give, a later duplicate key
// winning as it does there.
enum class EventRole {
  kOther, kDocument, kTop, kSpillway, kTokens, kToken, kChoices, kChoice, kDelta, kContent, kReasoning, kToolCalls,
  kText, kFinish, kError
};

struct EventFacts : JsonMembers<EventFacts, EventRole> {
  using Role = EventRole;
  bool top_object = false;
  bool error_object = false;  // "error" is an object: the event is the stream's error
  bool spillway_object = false, tokens_array = false;
  std::vector<int32_t> tokens;
  bool choices_array = false, choice_object = false;  // "choices"[0]
  bool delta_object = false, content_string = false, tool_calls_array = false, tool_calls_any = false;
  size_t content_bytes = 0;
  size_t reasoning_bytes = 0;  // delta.reasoning_content, when a string
  bool text_string = false;
  size_t text_bytes = 0;
  bool finish_string = false, finish_tool_calls = false;

  Role Member(Role object, const std::string& k) {
    if (object == Role::kTop) {
      if (k == "spillway") {
        spillway_object = tokens_array = false;
        tokens.clear();
        return Role::kSpillway;
      }
      if (k == "choices") {
        choices_array = choice_object = false;
        ResetDelta();
        text_string = finish_string = finish_tool_calls = false;
        text_bytes = 0;
        return Role::kChoices;
      }
      if (k == "error") {
        error_object = false;
        return Role::kError;
      }
    } else if (object == Role::kSpillway && k == "tokens") {
      tokens_array = false;
      tokens.clear();
      return Role::kTokens;
    } else if (object == Role::kChoice) {
      if (k == "delta") {
        ResetDelta();
        return Role::kDelta;
      }
      if (k == "text") {
        text_string = false;
        text_bytes = 0;
        return Role::kText;
      }
      if (k == "finish_reason") {
        finish_string = finish_tool_calls = false;
        return Role::kFinish;
      }
    } else if (object == Role::kDelta) {
      if (k == "content") {
        content_string = false;
        content_bytes = 0;
        return Role::kContent;
      }
      if (k == "tool_calls") {
        tool_calls_array = tool_calls_any = false;
        return Role::kToolCalls;
      }
      if (k == "reasoning_content") {
        reasoning_bytes = 0;
        return Role::kReasoning;
      }
    }
    return Role::kOther;
  }
  Role Element(Role array, size_t index) const {
    if (array == Role::kTokens) return Role::kToken;
    return array == Role::kChoices && index == 0 ? Role::kChoice : Role::kOther;
  }
  Role Opened(Role at, bool object) {
    bool* seen = nullptr;  // (what was found there, as the container it had to be)
    Role inside = Role::kOther;
    if (object) {
      switch (at) {
        case Role::kDocument: seen = &top_object; inside = Role::kTop; break;
        case Role::kSpillway: seen = &spillway_object; inside = Role::kSpillway; break;
        case Role::kChoice: seen = &choice_object; inside = Role::kChoice; break;
        case Role::kDelta: seen = &delta_object; inside = Role::kDelta; break;
        case Role::kError: seen = &error_object; break;
        default: break;
      }
    } else {
      switch (at) {
        case Role::kTokens: seen = &tokens_array; inside = Role::kTokens; break;
        case Role::kChoices: seen = &choices_array; inside = Role::kChoices; break;
        case Role::kToolCalls: seen = &tool_calls_array; inside = Role::kToolCalls; break;
        default: break;
      }
    }
    if (seen) *seen = true;
    return inside;
  }
  void Closed(Role container, size_t values) {
    if (container == Role::kToolCalls && values > 0) tool_calls_any = true;
  }
  void String(Role at, const std::string& s) {
    if (at == Role::kContent) {
      content_string = true;
      content_bytes = s.size();
    } else if (at == Role::kReasoning) {
      reasoning_bytes = s.size();
    } else if (at == Role::kText) {
      text_string = true;
      text_bytes = s.size();
    } else if (at == Role::kFinish) {
      finish_string = true;
      finish_tool_calls = s == "tool_calls";
    }
  }
  // (A token id is an integer directly in the tokens array, as json's get<int32_t> casts it.)
  void Integer(Role at, int64_t v) {
    if (at == Role::kToken) tokens.push_back(static_cast<int32_t>(v));
  }
  void Unsigned(Role at, uint64_t v) {
    if (at == Role::kToken) tokens.push_back(static_cast<int32_t>(v));
  }

 private:
  void ResetDelta() {
    delta_object = content_string = tool_calls_array = tool_calls_any = false;
    content_bytes = reasoning_bytes = 0;
  }
};

}  // namespace

StreamProgress::Event StreamProgress::Observe(const std::string& event, std::string* error_phase) {
  const auto datas = http::ParseSseData(event);
  if (datas.empty()) return Event::kOther;  // a comment
  if (datas.size() == 1 && datas[0] == "[DONE]") return Event::kDone;
  EventFacts e;
  if (!json::sax_parse(datas[0], &e) || !e.top_object) return Event::kOther;
  if (e.error_object) {  // (rare: read as a whole document, as the worker's errors are everywhere)
    if (auto err = protocol::ParseStreamError(json::parse(datas[0], nullptr, false))) {
      last_error_ = err;
      if (error_phase) *error_phase = err->placement_failure() ? FailurePhaseName(err->phase) : "";
      return Event::kError;
    }
  }
  const bool with_tokens = e.spillway_object && e.tokens_array && !e.tokens.empty();
  if (with_tokens) tokens_.insert(tokens_.end(), e.tokens.begin(), e.tokens.end());
  bool delivers = false;  // text, reasoning or a tool call's piece reaches the client with it
  if (e.choices_array && e.choice_object) {
    if (e.delta_object) {
      if (e.content_string) text_bytes_ += e.content_bytes;
      if (e.tool_calls_array && e.tool_calls_any) tool_calls_ = true;
      delivers = (e.content_string && e.content_bytes > 0) || e.reasoning_bytes > 0 || (e.tool_calls_array && e.tool_calls_any);
    } else if (e.text_string) {
      text_bytes_ += e.text_bytes;
      delivers = e.text_bytes > 0;
    }
    if (e.finish_string) {
      finished_ = true;
      if (e.finish_tool_calls) tool_calls_ = true;
    }
  }
  if (with_tokens) ids_pending_ = false;
  else if (delivers) ids_pending_ = true;
  return Event::kChunk;
}

}  // namespace spillway::failover
