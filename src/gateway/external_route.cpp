#include "gateway/external_route.h"

#include <nlohmann/json.hpp>

#include <cctype>

namespace spillway::gateway {

namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// The value of parameter `param` in a header value like `form-data; name="model"`.
std::optional<std::string> Param(std::string_view header_value, std::string_view param) {
  size_t at = 0;
  while (at < header_value.size()) {
    size_t semi = header_value.find(';', at);
    if (semi == std::string_view::npos) semi = header_value.size();
    std::string_view part = Trim(header_value.substr(at, semi - at));
    at = semi + 1;
    const size_t eq = part.find('=');
    if (eq == std::string_view::npos) continue;
    if (Lower(Trim(part.substr(0, eq))) != param) continue;
    std::string_view v = Trim(part.substr(eq + 1));
    if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
    return std::string(v);
  }
  return std::nullopt;
}

}  // namespace

std::string MultipartBoundary(std::string_view content_type) {
  const size_t semi = content_type.find(';');
  if (Lower(Trim(content_type.substr(0, semi))) != "multipart/form-data" || semi == std::string_view::npos) return "";
  auto b = Param(content_type.substr(semi + 1), "boundary");
  // RFC 2046: 1 to 70 characters.
  if (!b || b->empty() || b->size() > 70) return "";
  return *b;
}

std::optional<std::string> MultipartField(std::string_view body, std::string_view boundary, std::string_view name,
                                          size_t max_value) {
  if (boundary.empty()) return std::nullopt;
  const std::string delim = "--" + std::string(boundary);
  size_t at = body.find(delim);
  while (at != std::string_view::npos) {
    size_t head = at + delim.size();
    if (body.substr(head, 2) == "--") return std::nullopt;  // the closing delimiter
    if (body.substr(head, 2) != "\r\n") return std::nullopt;
    head += 2;
    const size_t head_end = body.find("\r\n\r\n", head);
    if (head_end == std::string_view::npos) return std::nullopt;
    const size_t next = body.find("\r\n" + delim, head_end + 4);
    if (next == std::string_view::npos) return std::nullopt;
    // The part's headers: its Content-Disposition names it.
    bool match = false, file = false;
    std::string_view headers = body.substr(head, head_end - head);
    while (!headers.empty()) {
      size_t eol = headers.find("\r\n");
      std::string_view line = headers.substr(0, eol);
      headers = eol == std::string_view::npos ? std::string_view() : headers.substr(eol + 2);
      const size_t colon = line.find(':');
      if (colon == std::string_view::npos || Lower(Trim(line.substr(0, colon))) != "content-disposition") continue;
      const std::string_view value = line.substr(colon + 1);
      match = Param(value, "name") == std::string(name);
      file = Param(value, "filename").has_value();
    }
    if (match && !file) {
      const std::string_view v = body.substr(head_end + 4, next - head_end - 4);
      if (v.size() > max_value) return std::nullopt;
      return std::string(v);
    }
    at = next + 2;
  }
  return std::nullopt;
}

std::string PayloadForHash(std::string_view content_type, std::string_view body) {
  const std::string boundary = MultipartBoundary(content_type);
  if (boundary.empty()) return std::string(content_type) + "\n" + std::string(body);
  std::string out = "multipart/form-data\n";
  out.reserve(out.size() + body.size() + 64);
  const std::string delimiter = "--" + boundary;
  for (size_t at = 0;;) {
    const size_t next = body.find(delimiter, at);
    const std::string_view piece = body.substr(at, next == std::string_view::npos ? std::string_view::npos : next - at);
    out += std::to_string(piece.size());
    out += ':';
    out.append(piece);
    if (next == std::string_view::npos) break;
    at = next + delimiter.size();
  }
  return out;
}

namespace {

// Top-level "model" and "stream" of a JSON object, read by a SAX walk (the
// last of a duplicated key wins, as in a parsed document).
class TopLevelFields final : public nlohmann::json_sax<nlohmann::json> {
 public:
  RequestedFields fields;
  bool object = false;       // the document is an object
  bool model_wrong = false;  // "model" is neither a string nor null

  bool null() override { return Scalar(Kind::kNull); }
  bool boolean(bool v) override { return Scalar(v ? Kind::kTrue : Kind::kOther); }
  bool number_integer(number_integer_t) override { return Scalar(Kind::kOther); }
  bool number_unsigned(number_unsigned_t) override { return Scalar(Kind::kOther); }
  bool number_float(number_float_t, const string_t&) override { return Scalar(Kind::kOther); }
  bool string(string_t& v) override {
    if (depth_ == 1 && field_ == Field::kModel) {
      fields.model = v;
      model_wrong = false;
      return true;
    }
    return Scalar(Kind::kOther);
  }
  bool binary(binary_t&) override { return Scalar(Kind::kOther); }
  bool start_object(std::size_t) override { return Open(true); }
  bool start_array(std::size_t) override { return Open(false); }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }
  bool key(string_t& k) override {
    if (depth_ == 1) field_ = k == "model" ? Field::kModel : k == "stream" ? Field::kStream : Field::kNone;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  enum class Kind { kNull, kTrue, kOther };
  enum class Field { kNone, kModel, kStream };
  bool Scalar(Kind k) {
    if (depth_ != 1) return true;
    if (field_ == Field::kModel) {
      fields.model.clear();
      model_wrong = k != Kind::kNull;
    } else if (field_ == Field::kStream) {
      fields.stream = k == Kind::kTrue;
    }
    return true;
  }
  bool Open(bool is_object) {
    if (depth_ == 0) object = is_object;
    if (depth_ == 1) Scalar(Kind::kOther);  // a container as the value of a top-level key
    ++depth_;
    return true;
  }
  bool Close() {
    --depth_;
    return true;
  }
  int depth_ = 0;
  Field field_ = Field::kNone;
};

}  // namespace

StatusOr<RequestedFields> ReadRequestedFields(std::string_view content_type, std::string_view body,
                                              const api::JsonLimits& limits) {
  const std::string boundary = MultipartBoundary(content_type);
  if (!boundary.empty()) return RequestedFields{MultipartField(body, boundary, "model").value_or(""), false};
  if (Lower(Trim(content_type.substr(0, content_type.find(';')))).rfind("multipart/", 0) == 0) {
    return Status::InvalidArgument("a multipart body needs multipart/form-data with a boundary of 1 to 70 characters");
  }
  if (body.empty()) return RequestedFields{};
  std::string why;
  const api::JsonShape shape = api::CheckJsonLimits(body, limits, &why);
  if (shape == api::JsonShape::kTooLarge) return Status::InvalidArgument("request body " + why);
  TopLevelFields walk;
  if (shape != api::JsonShape::kOk || !nlohmann::json::sax_parse(body, &walk) || !walk.object) {
    return Status::InvalidArgument("the body must be a JSON object or multipart/form-data");
  }
  if (walk.model_wrong) return Status::InvalidArgument("'model' must be a string");
  return walk.fields;
}

StatusOr<const config::ExternalConfig*> ChooseExternal(const config::GatewayConfig& config, const std::string& path,
                                                       const std::string& model) {
  if (!model.empty()) {
    const config::ExternalConfig* e = config.FindExternal(model);
    if (!e) {
      if (config.FindService(model)) {
        return Status::InvalidArgument("service '" + model + "' does not serve " + path);
      }
      return Status::NotFound("no service named '" + model + "' (GET /v1/models lists them)");
    }
    if (e->UpstreamPath(path).empty()) return Status::InvalidArgument("service '" + model + "' does not serve " + path);
    return e;
  }
  const config::ExternalConfig* only = nullptr;
  int serving = 0;
  for (const auto& e : config.externals) {
    if (e.UpstreamPath(path).empty()) continue;
    only = &e;
    ++serving;
  }
  if (serving == 1) return only;
  if (serving == 0) return Status::NotFound("no service serves " + path);
  return Status::InvalidArgument("'model' is required: several services serve " + path + " (GET /v1/models lists them)");
}

}  // namespace spillway::gateway
