// `spillway serve --log-format json`: every line the gateway writes is a JSON
// object, and each request transition is a line with its id, service,
// placement, attempt and admission decision.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <signal.h>

#include <chrono>
#include <sstream>
#include <thread>
#include <vector>

#include "gateway_calls.h"
#include "gateway_process.h"

namespace spillway::testing {
namespace {

using nlohmann::json;

TEST(JsonLogTest, EveryLineIsJsonAndRequestLinesCarryTheirFields) {
  GatewayProcess gw(TestConfig(1));
  gw.SetExtraArgs({"--log-format", "json"});
  ASSERT_TRUE(gw.Start()) << gw.Output();
  auto r = Call(gw.port(), "POST", "/v1/chat/completions", Chat(4), {{"X-Request-Id", "log-1"}});
  ASSERT_EQ(r.status, 200) << r.body;
  // A worker killed under the gateway: its exit is an event with fields.
  const json before = Body(Call(gw.port(), "GET", "/v1/status"));
  const json chat0 = before["services"][0]["placements"][0];
  ASSERT_GT(chat0.value("pid", 0), 0) << chat0.dump();
  ::kill(chat0["pid"].get<pid_t>(), SIGKILL);
  for (int i = 0; i < 500; ++i) {
    const json now = Body(Call(gw.port(), "GET", "/v1/status"));
    if (now["services"][0]["placements"][0].value("restarts", 0) >= 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  gw.Stop();
  std::istringstream lines(gw.Output());
  std::string line;
  std::vector<json> all;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    const json j = json::parse(line, nullptr, false);
    ASSERT_TRUE(j.is_object()) << "not a JSON object: " << line;
    EXPECT_TRUE(j.contains("time")) << line;
    all.push_back(j);
  }
  bool serving = false, attempt = false, finished = false, exited = false;
  for (const auto& j : all) {
    if (j.value("event", "") == "worker.exited") {
      exited = true;
      EXPECT_EQ(j["worker"], chat0["key"]) << j.dump();
      EXPECT_EQ(j["reason"], "signal 9") << j.dump();
      EXPECT_TRUE(j.contains("next_start_s")) << j.dump();
      EXPECT_NE(j.value("msg", "").find("exited"), std::string::npos) << j.dump();
    }
    serving |= j.value("stream", "") == "stdout" && j.value("msg", "").rfind("spillway serving on http://127.0.0.1:", 0) == 0;
    if (j.value("request_id", "") != "log-1") continue;
    if (j["event"] == "request.attempt") {
      attempt = true;
      EXPECT_EQ(j["service"], "chat");
      EXPECT_EQ(j["placement"], "cpu");
      EXPECT_EQ(j["attempt"], 1);
      EXPECT_EQ(j["decision"], "admit");
      EXPECT_EQ(j["state"], "running") << "the attempt's line said the row's later state: " << j.dump();
    }
    if (j["event"] == "request.finished") {
      finished = true;
      EXPECT_EQ(j["state"], "completed");
      EXPECT_EQ(j["placement"], "cpu");
    }
  }
  EXPECT_TRUE(serving) << gw.Output();
  EXPECT_TRUE(attempt) << gw.Output();
  EXPECT_TRUE(finished) << gw.Output();
  EXPECT_TRUE(exited) << gw.Output();
}

}  // namespace
}  // namespace spillway::testing
