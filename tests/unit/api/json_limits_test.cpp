#include "api/json_limits.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "api/openai_request.h"

namespace spillway::api {
namespace {

std::string Nested(size_t depth, const std::string& inner = "1") {
  return std::string(depth, '[') + inner + std::string(depth, ']');
}

TEST(JsonLimitsTest, DepthIsCheckedBeforeAnythingRecursiveRuns) {
  JsonLimits l;
  l.max_depth = 64;
  EXPECT_EQ(CheckJsonLimits(Nested(64), l), JsonShape::kOk);
  std::string why;
  EXPECT_EQ(CheckJsonLimits(Nested(65), l, &why), JsonShape::kTooLarge);
  EXPECT_NE(why.find("64 levels"), std::string::npos) << why;
  EXPECT_NE(why.find("json_max_depth"), std::string::npos) << why;
  // The crash of the issue: 100,000 levels (200 kB) in an unknown field.
  const std::string deep = R"({"model":"chat","prompt":"x","x":)" + Nested(100000) + "}";
  auto body = ParseJsonBody(deep);
  ASSERT_FALSE(body.ok());
  EXPECT_EQ(body.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(body.status().message().find("deeper than 64 levels"), std::string::npos);
  // Objects count as levels too.
  std::string objects;
  for (int i = 0; i < 70; ++i) objects += "{\"a\":";
  objects += "1" + std::string(70, '}');
  EXPECT_EQ(CheckJsonLimits(objects, l), JsonShape::kTooLarge);
}

TEST(JsonLimitsTest, ElementsValuesAndStringsAreBounded) {
  JsonLimits l;
  l.max_elements = 3;
  EXPECT_EQ(CheckJsonLimits("[1,2,3]", l), JsonShape::kOk);
  std::string why;
  EXPECT_EQ(CheckJsonLimits("[1,2,3,4]", l, &why), JsonShape::kTooLarge);
  EXPECT_NE(why.find("json_max_elements"), std::string::npos);
  EXPECT_EQ(CheckJsonLimits(R"({"a":1,"b":2,"c":3,"d":4})", l), JsonShape::kTooLarge);
  JsonLimits v;
  v.max_values = 4;
  EXPECT_EQ(CheckJsonLimits("[[1],[2]]", v, &why), JsonShape::kTooLarge);  // 5 values
  EXPECT_NE(why.find("json_max_values"), std::string::npos);
  JsonLimits s;
  s.max_string_bytes = 4;
  EXPECT_EQ(CheckJsonLimits(R"(["abcd"])", s), JsonShape::kOk);
  EXPECT_EQ(CheckJsonLimits(R"(["abcde"])", s, &why), JsonShape::kTooLarge);
  EXPECT_NE(why.find("json_max_string_bytes"), std::string::npos);
  EXPECT_EQ(CheckJsonLimits(R"({"abcde":1})", s), JsonShape::kTooLarge);  // keys too
}

TEST(JsonLimitsTest, MalformedIsToldApart) {
  std::string why;
  EXPECT_EQ(CheckJsonLimits("{", JsonLimits{}, &why), JsonShape::kMalformed);
  EXPECT_NE(why.find("not valid JSON"), std::string::npos);
  EXPECT_EQ(CheckJsonLimits("hello", JsonLimits{}), JsonShape::kMalformed);
  EXPECT_EQ(CheckJsonLimits("", JsonLimits{}), JsonShape::kMalformed);
  EXPECT_EQ(CheckJsonLimits("{} {}", JsonLimits{}), JsonShape::kMalformed);  // trailing garbage
}

// ParseJsonBody checks and builds in one pass: every limit holds there as in
// CheckJsonLimits, and what it builds is what json::parse builds.
TEST(JsonLimitsTest, ParseJsonBodyChecksEveryLimitInItsOnePass) {
  JsonLimits l;
  l.max_depth = 4;
  l.max_elements = 3;
  l.max_string_bytes = 4;
  const auto refused = [&](const std::string& text, const std::string& what) {
    auto r = ParseJsonBody(text, l);
    EXPECT_FALSE(r.ok()) << text;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().message();
    }
  };
  refused(R"({"a":{"b":{"c":{"d":{"e":1}}}}})", "json_max_depth");  // objects (5 levels)
  refused(R"({"a":[[[[1]]]]})", "json_max_depth");                // arrays
  refused(R"({"a":1,"b":2,"c":3,"d":4})", "json_max_elements");
  refused(R"({"a":[1,2,3,4]})", "json_max_elements");
  refused(R"({"a":"abcde"})", "json_max_string_bytes");
  refused(R"({"abcde":1})", "json_max_string_bytes");  // keys too
  refused("{", "not valid JSON");
  refused("{} {}", "not valid JSON");
  refused("[1]", "must be a JSON object");
  const std::string ok = R"({"a":[1,-2,3.5],"b":{"c":null,"d":true},"e":"x\u00e9"})";
  auto r = ParseJsonBody(ok, l);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, nlohmann::json::parse(ok));
}

TEST(JsonLimitsTest, DeepToolArgumentsTextIs400) {
  // Arguments carried as a string of JSON are parsed by the worker: bounded too.
  nlohmann::json body = {{"messages",
                          {{{"role", "assistant"},
                            {"content", nullptr},
                            {"tool_calls", {{{"id", "c1"}, {"type", "function"},
                                             {"function", {{"name", "f"}, {"arguments", Nested(5000)}}}}}}}}}};
  auto r = ParseChatRequest(body);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("arguments"), std::string::npos);
  EXPECT_NE(r.status().message().find("json_max_depth"), std::string::npos);
  // Not JSON at all stays allowed (kept as text).
  body["messages"][0]["tool_calls"][0]["function"]["arguments"] = "not json";
  EXPECT_TRUE(ParseChatRequest(body).ok());
}

}  // namespace
}  // namespace spillway::api
