#include "worker/tool_call_grammar.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <set>

#include "worker/tool_call_parser.h"

namespace spillway::worker {

using nlohmann::json;

namespace {

// Shared value rules; "str" keeps to characters that need no JSON escape.
constexpr const char* kValueRules =
    "str ::= \"\\\"\" [a-zA-Z0-9 _.,:-]{0,32} \"\\\"\"\n"
    "int ::= \"-\"? ([0-9] | [1-9] [0-9]{1,8})\n"
    "num ::= int (\".\" [0-9]{1,6})?\n"
    "bool ::= \"true\" | \"false\"\n";

constexpr size_t kMaxEnumValues = 32;
constexpr size_t kMaxEnumValueBytes = 128;

std::string JsonText(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); }

// The rule expression for one property's value.
std::string ValueRule(const json& schema) {
  if (auto e = schema.find("enum"); e != schema.end() && e->is_array() && !e->empty() && e->size() <= kMaxEnumValues) {
    std::string alts;
    bool ok = true;
    for (const auto& v : *e) {
      const std::string text = JsonText(v);
      ok = ok && (v.is_string() || v.is_number() || v.is_boolean()) && text.size() <= kMaxEnumValueBytes;
      alts += (alts.empty() ? "" : " | ") + GbnfLiteral(text);
    }
    if (ok) return "(" + alts + ")";
  }
  std::string type;
  if (auto t = schema.find("type"); t != schema.end()) {
    if (t->is_string()) {
      type = t->get<std::string>();
    } else if (t->is_array()) {  // ["integer", "null"]: the first that is not null
      for (const auto& x : *t) {
        if (x.is_string() && x != "null") {
          type = x.get<std::string>();
          break;
        }
      }
    }
  }
  if (type == "integer") return "int";
  if (type == "number") return "num";
  if (type == "boolean") return "bool";
  return "str";
}

// Property names: "required" ones in their order, then the rest by name.
std::vector<std::string> PropertyOrder(const json& params, const json& props) {
  std::vector<std::string> order;
  std::set<std::string> seen;
  if (auto req = params.find("required"); req != params.end() && req->is_array()) {
    for (const auto& n : *req) {
      if (n.is_string() && props.contains(n.get<std::string>()) && seen.insert(n.get<std::string>()).second) {
        order.push_back(n.get<std::string>());
      }
    }
  }
  for (const auto& [name, _] : props.items()) {
    if (seen.insert(name).second) order.push_back(name);
  }
  return order;
}

// The rule expression for a function's "arguments" object.
std::string ArgumentsRule(const std::string& parameters) {
  const json params = parameters.empty() ? json::object() : json::parse(parameters, nullptr, false);
  const json* props = nullptr;
  if (params.is_object()) {
    if (auto it = params.find("properties"); it != params.end() && it->is_object() && !it->empty()) props = &*it;
  }
  if (!props) return GbnfLiteral("{}");
  std::string rule;
  const auto order = PropertyOrder(params, *props);
  for (size_t i = 0; i < order.size(); ++i) {
    const std::string key = (i == 0 ? "{" : ", ") + JsonText(json(order[i])) + ": ";
    rule += GbnfLiteral(key) + " " + ValueRule((*props)[order[i]]) + " ";
  }
  return rule + GbnfLiteral("}");
}

}  // namespace

std::string GbnfLiteral(std::string_view text) {
  std::string out = "\"";
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    } else {
      out += ch;  // UTF-8 passes through: the GBNF parser decodes it
    }
  }
  return out + "\"";
}

std::string ToolCallGrammar(const std::vector<api::ToolFunction>& allowed) {
  std::string g = "root ::= " + GbnfLiteral(std::string(kToolCallOpen) + "\n{\"name\": ") + " call " +
                  GbnfLiteral("}\n" + std::string(kToolCallClose)) + "\ncall ::= ";
  std::string tools;
  for (size_t i = 0; i < allowed.size(); ++i) {
    const std::string rule = "tool" + std::to_string(i);
    g += (i == 0 ? "" : " | ") + rule;
    tools += rule + " ::= " + GbnfLiteral("\"" + allowed[i].name + "\", \"arguments\": ") + " " +
             ArgumentsRule(allowed[i].parameters) + "\n";
  }
  return g + "\n" + tools + kValueRules;
}

}  // namespace spillway::worker
