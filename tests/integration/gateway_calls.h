// Small helpers for integration tests that call a gateway: a call with its
// status checked, a chat body, waiting for a request's terminal state.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <string>
#include <thread>

#include "api/http_client.h"

namespace spillway::testing {

inline nlohmann::json Body(const http::ClientResponse& r) { return nlohmann::json::parse(r.body, nullptr, false); }

inline http::ClientResponse Call(uint16_t port, const std::string& method, const std::string& path,
                                 const std::string& body = "", const http::HeaderList& headers = {}) {
  auto r = http::Fetch("127.0.0.1", port, method, path, body, headers, std::chrono::seconds(120));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : http::ClientResponse{};
}

inline std::string Chat(int max_tokens, bool stream = false, const std::string& prompt = "Hello") {
  return nlohmann::json{{"model", "chat"},
                        {"messages", nlohmann::json::array({{{"role", "user"}, {"content", prompt}}})},
                        {"max_tokens", max_tokens},
                        {"temperature", 0},
                        {"ignore_eos", true},
                        {"stream", stream}}
      .dump();
}

inline nlohmann::json WaitTerminal(uint16_t port, const std::string& id, int seconds = 60,
                                   const http::HeaderList& headers = {}) {
  nlohmann::json j;
  for (int i = 0; i < seconds * 50; ++i) {
    j = Body(Call(port, "GET", "/v1/requests/" + id, "", headers));
    const std::string st = j.value("state", "");
    if (st != "queued" && st != "running") return j;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return j;
}

}  // namespace spillway::testing
