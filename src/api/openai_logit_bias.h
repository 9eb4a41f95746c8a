// OpenAI's "logit_bias" on /v1/chat/completions and /v1/completions.
// Called by ParseGeneration; errors name the field (kInvalidArgument -> 400).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <vector>

#include "api/openai_request.h"
#include "common/status.h"

namespace spillway::api {

// Reads "logit_bias" into `out` (left empty when the field is absent, null or
// empty). Accepted, as llama-server accepts them for token ids:
//   {"15": 10, "42": -100}      OpenAI's form: token id (decimal digits) -> bias
//   [[15, 10], [42, -100]]      llama-server's array form
// A bias is a number from -100 to 100, or `false` (llama-server's ban: -inf).
// At most kMaxLogitBias entries, each token once. Token ids are checked
// against the model's vocabulary by the worker, which alone knows it.
Status ParseLogitBias(const nlohmann::json& body, std::vector<TokenBias>* out);

}  // namespace spillway::api
