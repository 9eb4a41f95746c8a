// Bounds on the shape of JSON that comes from outside (request bodies, tool
// call arguments, model output parsed as JSON), checked before anything
// recursive runs on it.
//
// nlohmann::json parses iteratively, but dump(), copies and comparisons
// recurse once per nesting level: a 200 kB body nested 100,000 levels deep
// would overflow the stack. CheckJsonLimits walks the text once with a SAX
// handler that stops at the first violation, so nothing deep is ever built.
// The gateway and the worker both call it (through ParseJsonBody), so a body
// one accepts the other accepts too.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <string_view>

#include "common/status.h"

namespace spillway::api {

// The config's json_max_depth is at most kMaxJsonDepth; a worker takes
// kWorkerExtraJsonDepth levels more (an Ollama "format" schema is nested
// deeper once translated), so its own bound is their sum.
inline constexpr int kMaxJsonDepth = 512;
inline constexpr int kWorkerExtraJsonDepth = 8;

struct JsonLimits {
  size_t max_depth = 64;                 // nesting of arrays and objects
  size_t max_elements = (1 << 20) + 64;  // entries of one array or object (a prompt of 2^20 token ids fits)
  size_t max_values = 1 << 21;           // values in the whole document
  size_t max_string_bytes = 16 << 20;    // one string or key
};

// Only nesting bounded, the rest as large as a size goes: for JSON read back
// (a model's tool-call arguments, a stored answer) whose size was bounded
// elsewhere, where depth is what overflows a stack (a copy, a dump and a
// destructor recurse once per level).
inline JsonLimits DepthOnly(size_t max_depth) {
  return {max_depth, static_cast<size_t>(-1), static_cast<size_t>(-1), static_cast<size_t>(-1)};
}

// What the checks found. kMalformed: not JSON at all (the caller decides
// whether that is an error); kTooLarge: JSON beyond a limit (always an error).
enum class JsonShape { kOk, kMalformed, kTooLarge };

// Walks `text` once. On anything but kOk, *why (when given) says what and
// names the limit ("nests deeper than 64 levels (json_max_depth)").
JsonShape CheckJsonLimits(std::string_view text, const JsonLimits& limits, std::string* why = nullptr);

// Parses a request body: InvalidArgument (HTTP 400) naming the limit when the
// body breaks one, or saying it is not JSON or not an object.
StatusOr<nlohmann::json> ParseJsonBody(std::string_view body, const JsonLimits& limits = {});

}  // namespace spillway::api
