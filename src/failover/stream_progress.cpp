#include "failover/stream_progress.h"

#include <nlohmann/json.hpp>

#include "api/http_client.h"

namespace spillway::failover {

using nlohmann::json;

StreamProgress::Event StreamProgress::Observe(const std::string& event, std::string* error_phase) {
  const auto datas = http::ParseSseData(event);
  if (datas.empty()) return Event::kOther;  // a comment
  if (datas.size() == 1 && datas[0] == "[DONE]") return Event::kDone;
  json j = json::parse(datas[0], nullptr, false);
  if (!j.is_object()) return Event::kOther;
  if (auto err = protocol::ParseStreamError(j)) {
    last_error_ = err;
    if (error_phase) *error_phase = err->placement_failure() ? FailurePhaseName(err->phase) : "";
    return Event::kError;
  }
  if (j.contains("spillway") && j["spillway"].is_object() && j["spillway"].contains("tokens") &&
      j["spillway"]["tokens"].is_array()) {
    for (const auto& t : j["spillway"]["tokens"]) {
      if (t.is_number_integer()) tokens_.push_back(t.get<int32_t>());
    }
  }
  if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty() && j["choices"][0].is_object()) {
    const auto& c = j["choices"][0];
    if (c.contains("delta") && c["delta"].is_object()) {
      const auto& d = c["delta"];
      if (d.contains("content") && d["content"].is_string()) text_bytes_ += d["content"].get_ref<const std::string&>().size();
      if (d.contains("tool_calls") && d["tool_calls"].is_array() && !d["tool_calls"].empty()) tool_calls_ = true;
    } else if (c.contains("text") && c["text"].is_string()) {
      text_bytes_ += c["text"].get_ref<const std::string&>().size();
    }
    if (c.value("finish_reason", json()).is_string()) {
      finished_ = true;
      if (c["finish_reason"] == "tool_calls") tool_calls_ = true;
    }
  }
  return Event::kChunk;
}

}  // namespace spillway::failover
