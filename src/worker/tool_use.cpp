#include "worker/tool_use.h"

#include <nlohmann/json.hpp>

#include "api/json_limits.h"

#include "worker/tool_call_grammar.h"
#include "worker/tool_call_parser.h"

namespace spillway::worker {

using ojson = nlohmann::ordered_json;

namespace {

std::string JsonText(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

std::string ToolsSystemText(const api::ChatRequest& r) {
  std::string defs;
  for (const auto& t : r.tools) {
    ojson fn = {{"name", t.name}};
    if (!t.description.empty()) fn["description"] = t.description;
    if (!t.parameters.empty()) fn["parameters"] = ojson::parse(t.parameters, nullptr, false);
    defs += JsonText(ojson{{"type", "function"}, {"function", std::move(fn)}}) + "\n";
  }
  std::string text =
      "# Tools\n\nYou can call functions to help with the user's request. They are described within "
      "<tools></tools> XML tags:\n<tools>\n" + defs +
      "</tools>\n\nTo call a function, respond with a JSON object with its name and arguments within "
      "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
      "</tool_call>";
  if (r.tool_choice == api::ToolChoice::kRequired) text += "\n\nYou must call one of the functions.";
  if (r.tool_choice == api::ToolChoice::kFunction) text += "\n\nYou must call the function \"" + r.tool_choice_name + "\".";
  return text;
}

// An assistant message's calls in the format the model is asked to write.
std::string CallsText(const std::vector<api::ToolCall>& calls) {
  std::string text;
  for (const auto& c : calls) {
    // Bounded before parsing (dump() recurses per level); not JSON: kept, as a string.
    ojson args = api::CheckJsonLimits(c.arguments, api::JsonLimits{}) == api::JsonShape::kOk
                     ? ojson::parse(c.arguments, nullptr, false)
                     : ojson(c.arguments);
    if (args.is_discarded()) args = c.arguments;
    if (!text.empty()) text += '\n';
    text += kToolCallOpen;
    text += "\n{\"name\": " + JsonText(c.name) + ", \"arguments\": " + JsonText(args) + "}\n";
    text += kToolCallClose;
  }
  return text;
}

}  // namespace

ToolUse PlanToolUse(const api::ChatRequest& r) {
  ToolUse u;
  if (r.tools.empty() || r.tool_choice == api::ToolChoice::kNone) return u;
  u.parse_calls = true;
  std::vector<api::ToolFunction> forced;
  for (const auto& t : r.tools) {
    u.names.push_back(t.name);
    if (r.tool_choice == api::ToolChoice::kRequired || t.name == r.tool_choice_name) forced.push_back(t);
  }
  if (r.tool_choice != api::ToolChoice::kAuto && !forced.empty()) u.grammar = ToolCallGrammar(forced);
  return u;
}

std::vector<api::ChatMessage> PromptMessages(const api::ChatRequest& r) {
  std::vector<api::ChatMessage> out;
  out.reserve(r.messages.size() + 1);
  for (const auto& m : r.messages) {
    api::ChatMessage plain{m.role, m.content, {}, {}};
    if (!m.tool_calls.empty()) {
      if (!plain.content.empty()) plain.content += '\n';
      plain.content += CallsText(m.tool_calls);
    }
    out.push_back(std::move(plain));
  }
  if (!r.tools.empty() && r.tool_choice != api::ToolChoice::kNone) {
    const std::string tools = ToolsSystemText(r);
    if (!out.empty() && out.front().role == "system") {
      if (!out.front().content.empty()) out.front().content += "\n\n";
      out.front().content += tools;
    } else {
      out.insert(out.begin(), api::ChatMessage{"system", tools, {}, {}});
    }
  }
  return out;
}

}  // namespace spillway::worker
