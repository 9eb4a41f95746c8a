#include "api/json_text.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

#include "api/json_member.h"

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

// Member and GivenMember, in a small object (scanned) and a large one (its
// tree): what nlohmann's find says, a null member there for Member only.
TEST(JsonMemberTest, FindsWhatFindFindsInSmallAndLargeObjects) {
  for (const int extra : {0, 20}) {
    json obj = {{"model", "chat"}, {"prompt", nullptr}, {"top_k", 3}, {"", "empty"}};
    for (int i = 0; i < extra; ++i) obj["k" + std::to_string(i)] = i;
    for (const std::string name : {"model", "prompt", "top_k", "", "top_p", "mode", "models", "k7", "k"}) {
      const auto it = obj.find(name);
      const json* m = Member(obj, name);
      ASSERT_EQ(m != nullptr, it != obj.end()) << name << " in " << obj.size();
      if (m) EXPECT_EQ(m, &*it) << name;
      EXPECT_EQ(GivenMember(obj, name) != nullptr, it != obj.end() && !it->is_null()) << name;
    }
  }
  for (const json& other : {json(nullptr), json::array({"model"}), json("model"), json(1)}) {
    EXPECT_EQ(Member(other, "model"), nullptr) << other;
  }
}

}  // namespace
}  // namespace spillway::api
