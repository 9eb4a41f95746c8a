#include "api/json_text.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace spillway::api {
namespace {

using nlohmann::json;

TEST(JsonTextTest, AMemberIsAddedFirstAndTheRestStaysAsItCame) {
  const std::string body = R"(  {"model":"chat", "messages":[{"role":"user","content":"h\u00e9llo"}],"max_tokens":8} )";
  const auto out = WithFirstMember(body, "seed", "42");
  ASSERT_TRUE(out);
  EXPECT_EQ(*out, R"(  {"seed":42,"model":"chat", "messages":[{"role":"user","content":"h\u00e9llo"}],"max_tokens":8} )");
  const json j = json::parse(*out);
  EXPECT_EQ(j["seed"], 42);
  EXPECT_EQ(j["messages"][0]["content"], "h\u00e9llo");
  EXPECT_EQ(j.size(), 4u);
}

TEST(JsonTextTest, AnEmptyObjectGetsNoComma) {
  EXPECT_EQ(WithFirstMember("{ }", "seed", "7"), std::optional<std::string>(R"({"seed":7 })"));
  EXPECT_EQ(json::parse(*WithFirstMember("\n{}\n", "seed", "7")), json({{"seed", 7}}));
}

TEST(JsonTextTest, TextThatDoesNotOpenAnObjectIsLeftToTheCaller) {
  EXPECT_FALSE(WithFirstMember("\xEF\xBB\xBF{\"a\":1}", "seed", "1"));  // a byte order mark
  EXPECT_FALSE(WithFirstMember("[1,2]", "seed", "1"));
  EXPECT_FALSE(WithFirstMember("   ", "seed", "1"));
  EXPECT_FALSE(WithFirstMember("{", "seed", "1"));
  EXPECT_FALSE(WithFirstMember("", "seed", "1"));
}

// Every byte value (and UTF-8 text) comes out as nlohmann::json writes it.
TEST(JsonTextTest, JsonStringEscapesAsTheJsonLibraryDoes) {
  std::string all;
  for (int c = 1; c < 0x80; ++c) all.push_back(static_cast<char>(c));
  for (const std::string& s : {std::string(), all, std::string("cpu:0 \"x\" \u00e9\u4e2d"), std::string("a\0b", 3)}) {
    EXPECT_EQ(JsonString(s), json(s).dump()) << s;
    EXPECT_EQ(json::parse(JsonString(s)).get<std::string>(), s);
  }
}

}  // namespace
}  // namespace spillway::api
