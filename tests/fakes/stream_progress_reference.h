// What StreamProgress::Observe made of one event when it read the whole
// parsed document (before it read only its few members as it parses): the
// reference its tests and its fuzz target compare it with.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "api/http_client.h"
#include "failover/stream_progress.h"
#include "protocol/worker_protocol.h"

namespace spillway::failover {

struct StreamProgressReference {
  std::vector<int32_t> tokens;
  uint64_t text_bytes = 0;
  bool tool_calls = false, finished = false, error = false, ids_pending = false;
  StreamProgress::Event Observe(const std::string& event) {
    using nlohmann::json;
    const auto datas = http::ParseSseData(event);
    if (datas.empty()) return StreamProgress::Event::kOther;
    if (datas.size() == 1 && datas[0] == "[DONE]") return StreamProgress::Event::kDone;
    json j = json::parse(datas[0], nullptr, false);
    if (!j.is_object()) return StreamProgress::Event::kOther;
    if (protocol::ParseStreamError(j)) {
      error = true;
      return StreamProgress::Event::kError;
    }
    bool with_tokens = false, delivers = false;
    if (j.contains("spillway") && j["spillway"].is_object() && j["spillway"].contains("tokens") &&
        j["spillway"]["tokens"].is_array()) {
      for (const auto& t : j["spillway"]["tokens"]) {
        if (t.is_number_integer()) tokens.push_back(t.get<int32_t>());
        with_tokens |= t.is_number_integer();
      }
    }
    if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty() && j["choices"][0].is_object()) {
      const auto& c = j["choices"][0];
      if (c.contains("delta") && c["delta"].is_object()) {
        const auto& d = c["delta"];
        if (d.contains("content") && d["content"].is_string()) {
          text_bytes += d["content"].get_ref<const std::string&>().size();
          delivers |= !d["content"].get_ref<const std::string&>().empty();
        }
        if (d.contains("tool_calls") && d["tool_calls"].is_array() && !d["tool_calls"].empty()) tool_calls = delivers = true;
        if (d.contains("reasoning_content") && d["reasoning_content"].is_string()) {
          delivers |= !d["reasoning_content"].get_ref<const std::string&>().empty();
        }
      } else if (c.contains("text") && c["text"].is_string()) {
        text_bytes += c["text"].get_ref<const std::string&>().size();
        delivers |= !c["text"].get_ref<const std::string&>().empty();
      }
      if (c.value("finish_reason", json()).is_string()) {
        finished = true;
        if (c["finish_reason"] == "tool_calls") tool_calls = true;
      }
    }
    if (with_tokens) ids_pending = false;
    else if (delivers) ids_pending = true;
    return StreamProgress::Event::kChunk;
  }
};

}  // namespace spillway::failover
