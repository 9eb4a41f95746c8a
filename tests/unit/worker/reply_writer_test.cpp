#include "worker/reply_writer.h"

#include <gtest/gtest.h>

#include "api/http_client.h"

namespace spillway::worker {
namespace {

using nlohmann::json;

std::vector<json> Events(const std::string& sse) {
  std::vector<json> out;
  for (const auto& d : http::ParseSseData(sse)) out.push_back(json::parse(d));
  return out;
}

ReplyHeader Chat() { return {api::Endpoint::kChat, "req-9", "m", 1}; }

TEST(ReplyWriterTest, StreamedCallIsOneDeltaAndEveryTokenGoesOutOnce) {
  StreamReply reply(Chat(), ToolCallParser({"increment"}, "req-9"));
  std::string sse;
  sse += reply.Text("Ok ", {1, 2});
  sse += reply.Text("<tool_", {3});
  sse += reply.Text("call>{\"name\": \"increment\"}", {4, 5});
  sse += reply.Text("</tool_call>", {6});
  sse += reply.Text("\n", {7});
  sse += reply.Finish("stop", {{"seed", 1}}, nullptr);
  auto ev = Events(sse);
  ASSERT_EQ(ev.size(), 3u) << sse;
  EXPECT_EQ(ev[0]["choices"][0]["delta"]["content"], "Ok");
  EXPECT_EQ(ev[0]["choices"][0]["delta"]["role"], "assistant");
  const json& call = ev[1]["choices"][0]["delta"]["tool_calls"][0];
  EXPECT_EQ(call["index"], 0);
  EXPECT_EQ(call["id"], ToolCallId("req-9", 0));
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "increment");
  EXPECT_EQ(call["function"]["arguments"], "{}");
  EXPECT_EQ(ev[2]["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(ev[2]["spillway"]["seed"], 1);
  std::vector<int32_t> ids;
  for (const auto& e : ev) {
    if (e.contains("spillway") && e["spillway"].contains("tokens")) {
      for (int32_t t : e["spillway"]["tokens"]) ids.push_back(t);
    }
  }
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7}));
}

TEST(ReplyWriterTest, WithoutToolsEachTextIsOneChunk) {
  StreamReply reply({api::Endpoint::kCompletion, "r", "m", 1}, std::nullopt);
  auto ev = Events(reply.Text("a <tool_call>", {1}) + reply.Finish("length", json::object(), nullptr));
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0]["choices"][0]["text"], "a <tool_call>");
  EXPECT_EQ(ev[0]["spillway"]["tokens"], json::array({1}));
  EXPECT_EQ(ev[1]["choices"][0]["finish_reason"], "length");
}

TEST(ReplyWriterTest, WholeReplyMatchesTheStream) {
  const std::vector<std::string> names = {"increment"};
  json body = WholeReply(Chat(), "<tool_call>\n{\"name\": \"increment\", \"arguments\": {}}\n</tool_call>", "stop",
                         {5, 9}, &names);
  const json& msg = body["choices"][0]["message"];
  EXPECT_TRUE(msg["content"].is_null());
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["id"], ToolCallId("req-9", 0));
  EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], "{}");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");

  body = WholeReply(Chat(), "no call here", "length", {5, 9}, &names);
  EXPECT_EQ(body["choices"][0]["message"]["content"], "no call here");
  EXPECT_FALSE(body["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
}

}  // namespace
}  // namespace spillway::worker
