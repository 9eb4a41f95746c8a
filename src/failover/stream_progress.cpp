#include "failover/stream_progress.h"

#include <nlohmann/json.hpp>

#include "api/http_client.h"

namespace spillway::failover {

using nlohmann::json;

namespace {

// What Observe reads of one event's JSON, gathered as it is parsed (SAX):
// building the whole document for these few members cost about 40 % of a
// streamed request's instructions (an event a token). The same members as a
// parsed document would give, a later duplicate key winning as it does there.
class EventFacts : public nlohmann::json_sax<json> {
 public:
  bool top_object = false;
  bool error_object = false;  // "error" is an object: the event is the stream's error
  bool spillway_object = false, tokens_array = false;
  std::vector<int32_t> tokens;
  bool choices_array = false, choice_object = false;  // "choices"[0]
  bool delta_object = false, content_string = false, tool_calls_array = false, tool_calls_any = false;
  size_t content_bytes = 0;
  bool text_string = false;
  size_t text_bytes = 0;
  bool finish_string = false, finish_tool_calls = false;

  bool null() override { return Value(Kind::kScalar); }
  bool boolean(bool) override { return Value(Kind::kScalar); }
  bool number_integer(number_integer_t v) override { return Integer(static_cast<int32_t>(v)); }
  bool number_unsigned(number_unsigned_t v) override { return Integer(static_cast<int32_t>(v)); }
  bool number_float(number_float_t, const string_t&) override { return Value(Kind::kScalar); }
  bool binary(binary_t&) override { return Value(Kind::kScalar); }
  bool string(string_t& s) override {
    const Role at = Place();
    if (at == Role::kContent) {
      content_string = true;
      content_bytes = s.size();
    } else if (at == Role::kText) {
      text_string = true;
      text_bytes = s.size();
    } else if (at == Role::kFinish) {
      finish_string = true;
      finish_tool_calls = s == "tool_calls";
    }
    return Value(Kind::kScalar, at);
  }
  bool start_object(std::size_t) override {
    const Role at = Place();
    Role inside = Role::kOther;
    switch (at) {
      case Role::kTopValue: top_object = true; inside = Role::kTop; break;
      case Role::kSpillway: spillway_object = true; inside = Role::kSpillway; break;
      case Role::kChoice: choice_object = true; inside = Role::kChoice; break;
      case Role::kDelta: delta_object = true; inside = Role::kDelta; break;
      case Role::kError: error_object = true; break;
      default: break;
    }
    Value(Kind::kContainer, at);
    stack_.push_back({true, inside, Role::kOther, 0});
    return true;
  }
  bool key(string_t& k) override {
    Frame& f = stack_.back();
    f.next = Role::kOther;
    // A key met again replaces what its earlier value said (as a parsed document keeps the last).
    if (f.role == Role::kTop) {
      if (k == "spillway") {
        f.next = Role::kSpillway;
        spillway_object = tokens_array = false;
        tokens.clear();
      } else if (k == "choices") {
        f.next = Role::kChoices;
        choices_array = false;
        ResetChoice();
      } else if (k == "error") {
        f.next = Role::kError;
        error_object = false;
      }
    } else if (f.role == Role::kSpillway && k == "tokens") {
      f.next = Role::kTokens;
      tokens_array = false;
      tokens.clear();
    } else if (f.role == Role::kChoice) {
      if (k == "delta") {
        f.next = Role::kDelta;
        delta_object = content_string = tool_calls_array = tool_calls_any = false;
        content_bytes = 0;
      } else if (k == "text") {
        f.next = Role::kText;
        text_string = false;
        text_bytes = 0;
      } else if (k == "finish_reason") {
        f.next = Role::kFinish;
        finish_string = finish_tool_calls = false;
      }
    } else if (f.role == Role::kDelta) {
      if (k == "content") {
        f.next = Role::kContent;
        content_string = false;
        content_bytes = 0;
      } else if (k == "tool_calls") {
        f.next = Role::kToolCalls;
        tool_calls_array = tool_calls_any = false;
      }
    }
    return true;
  }
  bool end_object() override {
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    const Role at = Place();
    Role inside = Role::kOther;
    if (at == Role::kTokens) {
      tokens_array = true;
      inside = Role::kTokens;
    } else if (at == Role::kChoices) {
      choices_array = true;
      inside = Role::kChoices;
    } else if (at == Role::kToolCalls) {
      tool_calls_array = true;
      inside = Role::kToolCalls;
    }
    Value(Kind::kContainer, at);
    stack_.push_back({false, inside, Role::kOther, 0});
    return true;
  }
  bool end_array() override {
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  // Where a value sits, as far as Observe cares.
  enum class Role {
    kOther, kTopValue, kTop, kSpillway, kTokens, kChoices, kChoice, kDelta, kContent, kToolCalls, kText,
    kFinish, kError
  };
  enum class Kind { kScalar, kContainer };
  struct Frame {
    bool object;
    Role role;      // what this container is
    Role next;      // (an object) what its current key's value is
    size_t count;   // (an array) values so far
  };

  void ResetChoice() {
    choice_object = delta_object = content_string = tool_calls_array = tool_calls_any = false;
    text_string = finish_string = finish_tool_calls = false;
    content_bytes = text_bytes = 0;
  }
  // The role of the value about to be read.
  Role Place() const {
    if (stack_.empty()) return Role::kTopValue;
    const Frame& f = stack_.back();
    if (f.object) return f.next;
    if (f.role == Role::kChoices && f.count == 0) return Role::kChoice;
    return Role::kOther;
  }
  // A value was read: an array counts it; any value in the tool calls' list makes it non-empty.
  bool Value(Kind, Role = Role::kOther) {
    if (stack_.empty()) return true;
    Frame& f = stack_.back();
    if (!f.object) {
      if (f.role == Role::kToolCalls) tool_calls_any = true;
      ++f.count;
    }
    return true;
  }
  // (A token id is an integer directly in the tokens array; any other number is read past.)
  bool Integer(int32_t v) {
    if (!stack_.empty() && !stack_.back().object && stack_.back().role == Role::kTokens) tokens.push_back(v);
    return Value(Kind::kScalar);
  }

  std::vector<Frame> stack_;
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
  if (e.spillway_object && e.tokens_array) tokens_.insert(tokens_.end(), e.tokens.begin(), e.tokens.end());
  if (e.choices_array && e.choice_object) {
    if (e.delta_object) {
      if (e.content_string) text_bytes_ += e.content_bytes;
      if (e.tool_calls_array && e.tool_calls_any) tool_calls_ = true;
    } else if (e.text_string) {
      text_bytes_ += e.text_bytes;
    }
    if (e.finish_string) {
      finished_ = true;
      if (e.finish_tool_calls) tool_calls_ = true;
    }
  }
  return Event::kChunk;
}

}  // namespace spillway::failover
