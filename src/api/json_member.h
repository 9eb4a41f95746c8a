// A member of a JSON object by name, found by a scan of its members: a
// request's body has a handful, and its parsers ask for some fifty names,
// most of them absent. (nlohmann's find("name") walked its tree with a
// strlen and a comparison at each step: ~7,000 instructions a one-token
// request, the most of any step of its validation.)
#pragma once

#include <nlohmann/json.hpp>

#include <cstring>
#include <string_view>

namespace spillway::api {

// nullptr: `obj` is not an object, or has no member `name` (a null one is there).
inline const nlohmann::json* Member(const nlohmann::json& obj, std::string_view name) {
  if (!obj.is_object()) return nullptr;
  const auto& members = obj.get_ref<const nlohmann::json::object_t&>();
  if (members.size() > 8) {  // (a large object: its tree, by a string_view, without strlen)
    const auto it = members.find(name);
    return it == members.end() ? nullptr : &it->second;
  }
  for (const auto& [key, value] : members) {
    if (key.size() == name.size() && std::memcmp(key.data(), name.data(), name.size()) == 0) return &value;
  }
  return nullptr;
}

// The same, a null member taken as absent (as most fields are read).
inline const nlohmann::json* GivenMember(const nlohmann::json& obj, std::string_view name) {
  const nlohmann::json* v = Member(obj, name);
  return v && !v->is_null() ? v : nullptr;
}

}  // namespace spillway::api
