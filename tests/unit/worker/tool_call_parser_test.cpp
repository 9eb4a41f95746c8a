#include "worker/tool_call_parser.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace spillway::worker {
namespace {

const std::vector<std::string> kNames = {"get_weather", "increment"};

// Content and calls of `text` fed in pieces of `step` bytes.
SplitText Feed(const std::string& text, size_t step) {
  ToolCallParser p(kNames, "req-1");
  SplitText out;
  auto take = [&](std::vector<ToolCallPiece> pieces) {
    for (auto& piece : pieces) {
      if (piece.call) out.calls.push_back(*piece.call);
      else out.content += piece.content;
    }
  };
  for (size_t i = 0; i < text.size(); i += step) take(p.Append(text.substr(i, step)));
  take(p.Finish());
  return out;
}

TEST(ToolCallParserTest, ABlockBecomesACallWithObjectArguments) {
  auto s = SplitToolCalls("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>",
                          kNames, "req-1");
  EXPECT_EQ(s.content, "");
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].name, "get_weather");
  EXPECT_EQ(s.calls[0].arguments, R"({"city":"Paris","days":2})");  // the model's key order
  EXPECT_EQ(s.calls[0].id, ToolCallId("req-1", 0));
}

TEST(ToolCallParserTest, TextBeforeAndBetweenCallsIsContentWhitespaceNextToCallsIsNot) {
  const std::string text =
      "Let me check.\n<tool_call>{\"name\": \"increment\"}</tool_call>\n\n"
      "<tool_call>{\"name\": \"increment\", \"arguments\": {}}</tool_call>\n";
  auto s = SplitToolCalls(text, kNames, "r");
  EXPECT_EQ(s.content, "Let me check.");
  ASSERT_EQ(s.calls.size(), 2u);
  EXPECT_EQ(s.calls[0].arguments, "{}");
  EXPECT_NE(s.calls[0].id, s.calls[1].id);
  EXPECT_EQ(s.calls[1].id, ToolCallId("r", 1));
}

TEST(ToolCallParserTest, WhatIsNotACallStaysContentVerbatim) {
  for (const std::string text : {
           "<tool_call>not json</tool_call>",
           "<tool_call>{\"name\": \"rm_rf\"}</tool_call>",                       // not declared
           "<tool_call>{\"name\": \"increment\", \"arguments\": [1]}</tool_call>",  // not an object
           "<tool_call>{\"arguments\": {}}</tool_call>",
           "before <tool_call>{\"name\": \"increment\"",  // never closed
           "a <tool_ca",                                   // a tag that never completes
           "plain text with trailing space  \n",
       }) {
    auto s = SplitToolCalls(text, kNames, "r");
    EXPECT_TRUE(s.calls.empty()) << text;
    EXPECT_EQ(s.content, text);
  }
}

TEST(ToolCallParserTest, StreamingInAnyPiecesGivesTheSameAnswer) {
  const std::string text =
      "Sure: <tool_ <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call> done";
  const SplitText whole = SplitToolCalls(text, kNames, "req-1");
  ASSERT_EQ(whole.calls.size(), 1u);
  EXPECT_EQ(whole.content, "Sure: <tool_ done");
  for (size_t step = 1; step <= text.size(); ++step) {
    SplitText s = Feed(text, step);
    EXPECT_EQ(s.content, whole.content) << step;
    ASSERT_EQ(s.calls.size(), 1u) << step;
    EXPECT_EQ(s.calls[0].arguments, whole.calls[0].arguments);
    EXPECT_EQ(s.calls[0].id, whole.calls[0].id);
  }
}

TEST(ToolCallParserTest, HoldsBackOnlyWhatMayStillBecomeACall) {
  ToolCallParser p(kNames, "r");
  auto a = p.Append("Hello <tool");
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].content, "Hello");  // the space may sit next to a call
  EXPECT_TRUE(p.Append("_call>{\"name\": \"increment\"}").empty());
  auto c = p.Append("</tool_call>");
  ASSERT_EQ(c.size(), 1u);
  ASSERT_TRUE(c[0].call.has_value());
  EXPECT_EQ(c[0].call->name, "increment");
  EXPECT_TRUE(p.Append("\n").empty());
  EXPECT_TRUE(p.Finish().empty());  // whitespace after the last call is dropped
  EXPECT_EQ(p.calls(), 1);
}

TEST(ToolCallParserTest, IdsAreDeterministicPerRequestAndIndex) {
  EXPECT_EQ(ToolCallId("req-1", 0), ToolCallId("req-1", 0));
  EXPECT_NE(ToolCallId("req-1", 0), ToolCallId("req-1", 1));
  EXPECT_NE(ToolCallId("req-1", 0), ToolCallId("req-2", 0));
  const std::string id = ToolCallId("req-1", 0);
  EXPECT_EQ(id.size(), 5u + 24u);
  EXPECT_EQ(id.rfind("call_", 0), 0u);
}

}  // namespace
}  // namespace spillway::worker
