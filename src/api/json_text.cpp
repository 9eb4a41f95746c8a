#include "api/json_text.h"

namespace spillway::api {

namespace {

bool JsonSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

}  // namespace

std::optional<std::string> WithFirstMember(std::string_view object_text, std::string_view key,
                                           std::string_view value_json) {
  size_t open = 0;
  while (open < object_text.size() && JsonSpace(object_text[open])) ++open;
  if (open == object_text.size() || object_text[open] != '{') return std::nullopt;
  size_t next = open + 1;
  while (next < object_text.size() && JsonSpace(object_text[next])) ++next;
  if (next == object_text.size()) return std::nullopt;
  const bool empty = object_text[next] == '}';
  std::string out;
  out.reserve(object_text.size() + key.size() + value_json.size() + 4);
  out.append(object_text.substr(0, open + 1));
  out.append("\"").append(key).append("\":").append(value_json);
  if (!empty) out.append(",");
  out.append(object_text.substr(open + 1));
  return out;
}

std::string JsonString(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size() + 2);
  out.push_back('"');
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out.push_back(kHex[c >> 4]);
          out.push_back(kHex[c & 0xF]);
        } else {
          out.push_back(ch);
        }
    }
  }
  out.push_back('"');
  return out;
}

}  // namespace spillway::api
