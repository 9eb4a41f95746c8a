#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/json_log.h"

namespace spillway {
namespace {

using nlohmann::json;

TEST(JsonLogLineTest, TextIsWrappedWithItsStreamAndTime) {
  const std::string line = JsonLogLine("spillway: worker \"chat.0\" exited\t(signal 9)", "stderr", 1764585062123);
  EXPECT_EQ(line.rfind("{\"time\":\"2025-12-01T10:31:02.123Z\"", 0), 0u) << line;
  const json j = json::parse(line);
  EXPECT_EQ(j["stream"], "stderr");
  EXPECT_EQ(j["msg"], "spillway: worker \"chat.0\" exited\t(signal 9)");
}

TEST(JsonLogLineTest, AJsonObjectPassesWithATimeAddedFirst) {
  const json j = json::parse(JsonLogLine(R"({"event":"request.attempt","request_id":"r1"})", "stderr", 0));
  EXPECT_EQ(j["event"], "request.attempt");
  EXPECT_EQ(j["time"], "1970-01-01T00:00:00.000Z");
  EXPECT_FALSE(j.contains("msg"));
  EXPECT_EQ(JsonLogLine(R"({"time":"kept","a":1})", "stdout", 0), R"({"time":"kept","a":1})");
  // Not an object, or not JSON at all: wrapped like any text.
  EXPECT_EQ(json::parse(JsonLogLine("[1,2]", "stdout", 0))["msg"], "[1,2]");
  EXPECT_EQ(json::parse(JsonLogLine("{broken", "stdout", 0))["msg"], "{broken");
}

}  // namespace
}  // namespace spillway
