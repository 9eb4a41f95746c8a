#include "api/openai_logit_bias.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "api/json_member.h"

namespace spillway::api {

using nlohmann::json;

namespace {

constexpr const char* kShape =
    "must be an object mapping token ids to biases from -100 to 100, e.g. {\"15\": -100}";

Status Bad(const std::string& field, const std::string& what) {
  return Status::InvalidArgument("'" + field + "' " + what);
}

// A key as it may be echoed in an error: printable ASCII, at most 32 bytes.
std::string Shown(const std::string& key) {
  std::string s;
  for (char c : key.substr(0, 32)) s += (c >= 0x20 && c < 0x7f && c != '"') ? c : '?';
  return key.size() > 32 ? s + "..." : s;
}

// A token id written as decimal digits (OpenAI's keys; strtol's signs,
// spaces and trailing text are not accepted).
bool ParseTokenId(const std::string& key, int32_t* token) {
  if (key.empty() || key.size() > 10) return false;
  int64_t v = 0;
  for (char c : key) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v > std::numeric_limits<int32_t>::max()) return false;
  *token = static_cast<int32_t>(v);
  return true;
}

Status ParseBias(const json& v, const std::string& field, float* bias) {
  if (v.is_boolean() && !v.get<bool>()) {
    *bias = -std::numeric_limits<float>::infinity();
    return Status::Ok();
  }
  if (!v.is_number()) return Bad(field, "must be a number from -100 to 100 (or false to ban the token)");
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < -kMaxAbsLogitBias || d > kMaxAbsLogitBias) {
    return Bad(field, "must be between -100 and 100");
  }
  *bias = static_cast<float>(d);
  return Status::Ok();
}

}  // namespace

Status ParseLogitBias(const json& body, std::vector<TokenBias>* out) {
  const json* it = GivenMember(body, "logit_bias");
  if (!it) return Status::Ok();
  if (!it->is_object() && !it->is_array()) return Bad("logit_bias", kShape);
  if (it->size() > kMaxLogitBias) {
    return Bad("logit_bias", "has " + std::to_string(it->size()) + " entries; at most " +
                                 std::to_string(kMaxLogitBias) + " are accepted");
  }
  std::vector<TokenBias> bias;
  bias.reserve(it->size());
  if (it->is_object()) {
    for (const auto& [key, value] : it->items()) {
      TokenBias b;
      if (!ParseTokenId(key, &b.token)) {
        return Bad("logit_bias", "keys must be token ids (non-negative integers, as strings); \"" + Shown(key) +
                                     "\" is not one");
      }
      SPILLWAY_RETURN_IF_ERROR(ParseBias(value, "logit_bias." + key, &b.bias));
      bias.push_back(b);
    }
  } else {
    for (size_t i = 0; i < it->size(); ++i) {
      const json& e = (*it)[i];
      const std::string field = "logit_bias[" + std::to_string(i) + "]";
      if (!e.is_array() || e.size() != 2) return Bad(field, "must be a pair [token id, bias]");
      if (!e[0].is_number_integer() || e[0].get<int64_t>() < 0 ||
          e[0].get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return Bad(field, "must start with a token id (a non-negative integer)");
      }
      TokenBias b;
      b.token = static_cast<int32_t>(e[0].get<int64_t>());
      SPILLWAY_RETURN_IF_ERROR(ParseBias(e[1], field, &b.bias));
      bias.push_back(b);
    }
  }
  // llama.cpp would add the biases of a token named twice ("7" and "007"):
  // refused instead, as neither value is obviously the one meant.
  std::vector<int32_t> tokens;
  tokens.reserve(bias.size());
  for (const auto& b : bias) tokens.push_back(b.token);
  std::sort(tokens.begin(), tokens.end());
  if (auto d = std::adjacent_find(tokens.begin(), tokens.end()); d != tokens.end()) {
    return Bad("logit_bias", "names token " + std::to_string(*d) + " more than once");
  }
  *out = std::move(bias);
  return Status::Ok();
}

}  // namespace spillway::api
