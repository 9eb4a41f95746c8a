#include "api/json_limits.h"

#include <nlohmann/json.hpp>

#include <vector>

namespace spillway::api {

using nlohmann::json;

namespace {

// A SAX handler that keeps nothing but counters; returning false stops the
// parse at once.
class LimitChecker {
 public:
  explicit LimitChecker(const JsonLimits& l) : l_(l) {}

  bool null() { return Value(); }
  bool boolean(bool) { return Value(); }
  bool number_integer(json::number_integer_t) { return Value(); }
  bool number_unsigned(json::number_unsigned_t) { return Value(); }
  bool number_float(json::number_float_t, const std::string&) { return Value(); }
  bool string(std::string& s) { return Value() && Text(s.size()); }
  bool binary(json::binary_t&) { return Value(); }
  bool key(std::string& k) { return Text(k.size()); }
  bool start_object(std::size_t) { return Open(); }
  bool start_array(std::size_t) { return Open(); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception&) {
    if (shape == JsonShape::kOk) {
      shape = JsonShape::kMalformed;
      why = "is not valid JSON (at byte " + std::to_string(position) + ")";
    }
    return false;
  }

  JsonShape shape = JsonShape::kOk;
  std::string why;

 private:
  bool Fail(std::string what) {
    shape = JsonShape::kTooLarge;
    why = std::move(what);
    return false;
  }
  bool Value() {
    if (++values_ > l_.max_values) {
      return Fail("holds more than " + std::to_string(l_.max_values) + " JSON values (json_max_values)");
    }
    if (!counts_.empty() && ++counts_.back() > l_.max_elements) {
      return Fail("has an array or object of more than " + std::to_string(l_.max_elements) +
                  " entries (json_max_elements)");
    }
    return true;
  }
  bool Text(size_t n) {
    if (n > l_.max_string_bytes) {
      return Fail("has a string longer than " + std::to_string(l_.max_string_bytes) + " bytes (json_max_string_bytes)");
    }
    return true;
  }
  bool Open() {
    if (!Value()) return false;
    if (counts_.size() >= l_.max_depth) {
      return Fail("nests arrays and objects deeper than " + std::to_string(l_.max_depth) + " levels (json_max_depth)");
    }
    counts_.push_back(0);
    return true;
  }
  bool Close() {
    if (!counts_.empty()) counts_.pop_back();
    return true;
  }

  const JsonLimits& l_;
  size_t values_ = 0;
  std::vector<size_t> counts_;  // entries so far of each open container
};

// The limits checked and the document built in one pass: each event goes to
// the checker first, then to nlohmann's own DOM builder (what json::parse
// uses), so a body within its limits is parsed once, not checked in one pass
// and parsed in a second (about 7,000 instructions a small request).
// json_sax_dom_parser is nlohmann's detail API, unchanged through its 3.x
// releases; the test ParseJsonBodyChecksEveryLimitInItsOnePass compares
// what it builds with json::parse.
class LimitedDom {
 public:
  LimitedDom(const JsonLimits& l, json& root) : check(l), dom_(root, /*allow_exceptions=*/false) {}

  bool null() { return check.null() && dom_.null(); }
  bool boolean(bool b) { return check.boolean(b) && dom_.boolean(b); }
  bool number_integer(json::number_integer_t v) { return check.number_integer(v) && dom_.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { return check.number_unsigned(v) && dom_.number_unsigned(v); }
  bool number_float(json::number_float_t v, const std::string& s) {
    return check.number_float(v, s) && dom_.number_float(v, s);
  }
  bool string(std::string& s) { return check.string(s) && dom_.string(s); }
  bool binary(json::binary_t& b) { return check.binary(b) && dom_.binary(b); }
  bool key(std::string& k) { return check.key(k) && dom_.key(k); }
  bool start_object(std::size_t n) { return check.start_object(n) && dom_.start_object(n); }
  bool start_array(std::size_t n) { return check.start_array(n) && dom_.start_array(n); }
  bool end_object() { return check.end_object() && dom_.end_object(); }
  bool end_array() { return check.end_array() && dom_.end_array(); }
  bool parse_error(std::size_t position, const std::string& token, const nlohmann::detail::exception& e) {
    return check.parse_error(position, token, e);
  }

  LimitChecker check;

 private:
  nlohmann::detail::json_sax_dom_parser<json> dom_;
};

}  // namespace

JsonShape CheckJsonLimits(std::string_view text, const JsonLimits& limits, std::string* why) {
  LimitChecker checker(limits);
  const bool ok = json::sax_parse(text.begin(), text.end(), &checker, json::input_format_t::json, /*strict=*/true);
  if (!ok && checker.shape == JsonShape::kOk) {  // stopped without saying why: treat as malformed
    checker.shape = JsonShape::kMalformed;
    checker.why = "is not valid JSON";
  }
  if (why) *why = checker.why;
  return checker.shape;
}

StatusOr<json> ParseJsonBody(std::string_view body, const JsonLimits& limits) {
  json j;
  LimitedDom sax(limits, j);
  const bool ok = json::sax_parse(body.begin(), body.end(), &sax, json::input_format_t::json, /*strict=*/true);
  if (sax.check.shape != JsonShape::kOk) return Status::InvalidArgument("request body " + sax.check.why);
  if (!ok) return Status::InvalidArgument("request body is not valid JSON");
  if (!j.is_object()) return Status::InvalidArgument("request body must be a JSON object");
  return j;
}

}  // namespace spillway::api
