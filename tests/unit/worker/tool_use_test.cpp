#include "worker/tool_use.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace spillway::worker {
namespace {

using nlohmann::json;

api::ChatRequest Parse(const std::string& body) {
  auto r = api::ParseChatRequest(json::parse(body));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : api::ChatRequest{};
}

constexpr const char* kTools =
    R"("tools": [{"type": "function", "function": {"name": "increment", "description": "adds one",
                  "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}}},
                 {"type": "function", "function": {"name": "reset"}}])";

TEST(ToolUseTest, ChoiceDecidesGrammarAndParsing) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}])";
  ToolUse none = PlanToolUse(Parse("{" + msgs + "}"));
  EXPECT_FALSE(none.parse_calls);
  EXPECT_TRUE(none.grammar.empty());

  ToolUse a = PlanToolUse(Parse("{" + msgs + ", " + kTools + "}"));
  EXPECT_TRUE(a.parse_calls);
  EXPECT_TRUE(a.grammar.empty());
  EXPECT_EQ(a.names, (std::vector<std::string>{"increment", "reset"}));

  ToolUse req = PlanToolUse(Parse("{" + msgs + ", " + kTools + R"(, "tool_choice": "required"})"));
  EXPECT_NE(req.grammar.find("increment"), std::string::npos);
  EXPECT_NE(req.grammar.find("reset"), std::string::npos);

  ToolUse named = PlanToolUse(
      Parse("{" + msgs + ", " + kTools + R"(, "tool_choice": {"type": "function", "function": {"name": "reset"}}})"));
  EXPECT_EQ(named.grammar.find("increment"), std::string::npos);
  EXPECT_NE(named.grammar.find("reset"), std::string::npos);

  ToolUse off = PlanToolUse(Parse("{" + msgs + ", " + kTools + R"(, "tool_choice": "none"})"));
  EXPECT_FALSE(off.parse_calls);
}

TEST(ToolUseTest, DefinitionsJoinTheSystemMessageOrLeadAsOne) {
  auto r = Parse(std::string(R"({"messages": [{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "hi"}], )") + kTools + "}");
  auto m = PromptMessages(r);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].content.rfind("Be brief.\n\n# Tools", 0), 0u) << m[0].content;
  EXPECT_NE(m[0].content.find("<tools>\n{\"type\":\"function\",\"function\":{\"name\":\"increment\",\"description\":\"adds one\""),
            std::string::npos) << m[0].content;
  EXPECT_NE(m[0].content.find("<tool_call>"), std::string::npos);

  r = Parse(std::string(R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required", )") + kTools + "}");
  m = PromptMessages(r);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].role, "system");
  EXPECT_NE(m[0].content.find("You must call one of the functions."), std::string::npos);
  EXPECT_EQ(m[1].content, "hi");
}

TEST(ToolUseTest, HistoryCallsAndResultsBecomeText) {
  auto r = Parse(std::string(R"({"messages": [
      {"role": "user", "content": "add"},
      {"role": "assistant", "content": null, "tool_calls": [
          {"id": "call_1", "type": "function", "function": {"name": "increment", "arguments": "{\"n\": 2}"}},
          {"id": "call_2", "type": "function", "function": {"name": "reset", "arguments": "oops"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "3"}], "tool_choice": "none", )") + kTools + "}");
  auto m = PromptMessages(r);
  ASSERT_EQ(m.size(), 3u);  // "none": no definitions
  EXPECT_EQ(m[1].role, "assistant");
  EXPECT_EQ(m[1].content,
            "<tool_call>\n{\"name\": \"increment\", \"arguments\": {\"n\":2}}\n</tool_call>\n"
            "<tool_call>\n{\"name\": \"reset\", \"arguments\": \"oops\"}\n</tool_call>");
  EXPECT_EQ(m[2].role, "tool");
  EXPECT_EQ(m[2].content, "3");
}

}  // namespace
}  // namespace spillway::worker
