// Edits of JSON text that leave the rest of it as it came, for bodies that
// are forwarded: re-serializing a parsed body of many KiB (a long chat) costs
// about as much as parsing it.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace spillway::api {

// `object_text` (a JSON object, already parsed and validated by the caller)
// with `"key":value_json` added as its first member; nullopt when the text
// does not begin with `{` after whitespace (a byte order mark, say: the
// caller then re-serializes). The caller makes sure `key` is not a member
// already (a later duplicate would win over the added one). `key` is written
// as given: it must need no escaping.
std::optional<std::string> WithFirstMember(std::string_view object_text, std::string_view key,
                                           std::string_view value_json);

// `text` as a JSON string literal (quoted, escaped as nlohmann::json's dump()
// escapes it: `"`, `\`, control characters; UTF-8 passed through), for JSON
// written on the request path without building a document.
std::string JsonString(std::string_view text);

}  // namespace spillway::api
