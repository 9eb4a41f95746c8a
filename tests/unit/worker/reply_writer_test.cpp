// The chat layer over the tiny test model (its template is Qwen 2.5's, tools
// included): what llama.cpp's common renders and asks of the sampler, and how
// StreamReply turns the model's text into llama-server-style deltas.
#include "worker/reply_writer.h"

#include <gtest/gtest.h>
#include <llama.h>

#include <cstdlib>

#include "api/http_client.h"
#include "worker/chat_template.h"
#include "worker/model.h"

namespace spillway::worker {
namespace {

using nlohmann::json;

std::vector<json> Events(const std::string& sse) {
  std::vector<json> out;
  for (const auto& d : http::ParseSseData(sse)) out.push_back(json::parse(d));
  return out;
}

ReplyHeader Chat() { return {api::Endpoint::kChat, "req-9", "m", 1}; }

const char* kCall = "<tool_call>\n{\"name\": \"increment\", \"arguments\": {\"n\": 2}}\n</tool_call>";

class ChatLayerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* bin = std::getenv("SPILLWAY_BIN");
    const char* models = std::getenv("SPILLWAY_MODELS");
    if (!bin || !models) GTEST_SKIP() << "SPILLWAY_BIN / SPILLWAY_MODELS not set (run through ctest)";
    InstallLlamaLog(GGML_LOG_LEVEL_ERROR);
    ASSERT_TRUE(LoadBackends(bin, "cpu").ok());
    llama_backend_init();
    Placement p;
    p.threads = 1;
    auto m = Model::Load(std::string(models) + "/tiny-chat.gguf", p);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = m->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP();
  }

  // Renders a chat body (tools: increment(n: integer), decrement()).
  static ChatPlan Render(json body) {
    const json params = {{"type", "object"}, {"properties", {{"n", {{"type", "integer"}}}}}, {"required", {"n"}}};
    if (!body.contains("messages")) body["messages"] = json::array({{{"role", "user"}, {"content", "Count"}}});
    if (!body.contains("tools")) {
      body["tools"] = json::array({{{"type", "function"}, {"function", {{"name", "increment"}, {"parameters", params}}}},
                                   {{"type", "function"}, {"function", {{"name", "decrement"}}}}});
    }
    auto r = api::ParseChatRequest(body);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    auto plan = model_->chat()->Render(body["messages"], body["tools"], *r);
    EXPECT_TRUE(plan.ok()) << plan.status().ToString();
    return plan.ok() ? *plan : ChatPlan{};
  }

  static Model* model_;
};
Model* ChatLayerTest::model_ = nullptr;

TEST_F(ChatLayerTest, ToolChoiceShapesTheGrammar) {
  ChatPlan required = Render({{"tool_choice", "required"}, {"parallel_tool_calls", false}});
  EXPECT_NE(required.prompt.find("<tools>"), std::string::npos) << required.prompt;
  EXPECT_EQ(required.prompt.substr(required.prompt.size() - 22), "<|im_start|>assistant\n");
  ASSERT_FALSE(required.grammar.empty());
  EXPECT_FALSE(required.grammar.lazy);
  // The grammar starts with the generation prompt, which the SPM vocabulary
  // cannot spell in tokens: taken off the grammar instead of prefilled.
  EXPECT_TRUE(required.grammar.prefill.empty());
  EXPECT_EQ(required.grammar.gbnf.find("root ::= \"<|im_start|>"), std::string::npos) << required.grammar.gbnf;
  // A forced call is a call: no free text before it (llama.cpp's grammar allows some).
  EXPECT_NE(required.grammar.gbnf.find("root ::= space tool-calls"), std::string::npos) << required.grammar.gbnf;
  // parallel_tool_calls false: one call (llama.cpp's grammar repeats this format's calls regardless).
  EXPECT_NE(required.grammar.gbnf.find("\ntool-calls ::= tool-call space\n"), std::string::npos) << required.grammar.gbnf;
  ChatPlan parallel = Render({{"tool_choice", "required"}, {"parallel_tool_calls", true}});
  EXPECT_NE(parallel.grammar.gbnf.find("\ntool-calls ::= (tool-call space)+\n"), std::string::npos) << parallel.grammar.gbnf;
  EXPECT_TRUE(CheckGrammar(required.grammar, model_->vocab()).ok());

  ChatPlan automatic = Render({{"tool_choice", "auto"}});
  ASSERT_FALSE(automatic.grammar.empty());
  EXPECT_TRUE(automatic.grammar.lazy);
  EXPECT_FALSE(automatic.grammar.trigger_patterns.empty() && automatic.grammar.trigger_tokens.empty());
  EXPECT_TRUE(CheckGrammar(automatic.grammar, model_->vocab()).ok());

  // A named function: offered with the others, but the only one the grammar allows.
  ChatPlan named = Render({{"tool_choice", {{"type", "function"}, {"function", {{"name", "decrement"}}}}}});
  EXPECT_NE(named.prompt.find("increment"), std::string::npos);
  EXPECT_NE(named.grammar.gbnf.find("decrement"), std::string::npos) << named.grammar.gbnf;
  EXPECT_EQ(named.grammar.gbnf.find("increment"), std::string::npos) << named.grammar.gbnf;

  ChatPlan none = Render({{"tool_choice", "none"}});
  EXPECT_TRUE(none.grammar.empty());
}

TEST_F(ChatLayerTest, ResponseFormatIsAGrammar) {
  ChatPlan plan = Render({{"tools", nullptr},
                          {"response_format", {{"type", "json_schema"},
                                               {"json_schema", {{"name", "n"}, {"strict", true},
                                                                {"schema", {{"type", "object"},
                                                                            {"properties", {{"n", {{"type", "integer"}}}}},
                                                                            {"required", {"n"}}}}}}}}});
  ASSERT_FALSE(plan.grammar.empty());
  EXPECT_FALSE(plan.grammar.lazy);
  EXPECT_TRUE(CheckGrammar(plan.grammar, model_->vocab()).ok());
  // JSON mode without a schema still constrains (llama-server's would not).
  ChatPlan object = Render({{"tools", nullptr}, {"response_format", {{"type", "json_object"}}}});
  EXPECT_FALSE(object.grammar.empty());
  auto completion = ResponseFormatGrammar(api::ResponseFormat{api::ResponseFormatType::kJsonObject, "", "", false});
  ASSERT_TRUE(completion.ok());
  EXPECT_FALSE(completion->empty());
}

TEST_F(ChatLayerTest, StreamedCallAndEveryTokenGoesOutOnce) {
  StreamReply reply(Chat(), Render({{"tool_choice", "auto"}}).syntax);
  std::string sse;
  sse += reply.Text("Ok ", {1, 2});
  const std::string call = kCall;
  for (size_t i = 0; i < call.size(); i += 7) sse += reply.Text(call.substr(i, 7), {static_cast<int32_t>(3 + i / 7)});
  sse += reply.Finish("stop", {{"seed", 1}}, nullptr);
  auto ev = Events(sse);
  std::string content, args, name, id;
  std::vector<int32_t> ids;
  for (const auto& e : ev) {
    const json& d = e["choices"][0]["delta"];
    if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
    if (d.contains("tool_calls")) {
      const json& c = d["tool_calls"][0];
      EXPECT_EQ(c["index"], 0);
      if (c.contains("id")) id = c["id"];
      if (c.contains("function") && c["function"].contains("name")) name = c["function"]["name"];
      if (c.contains("function") && c["function"].contains("arguments")) args += c["function"]["arguments"].get<std::string>();
    }
    if (e.contains("spillway") && e["spillway"].contains("tokens")) {
      for (int32_t t : e["spillway"]["tokens"]) ids.push_back(t);
    }
  }
  EXPECT_EQ(content, "Ok ") << sse;
  EXPECT_EQ(name, "increment") << sse;
  EXPECT_EQ(id, ToolCallId("req-9", 0));
  EXPECT_EQ(json::parse(args), json({{"n", 2}})) << sse;
  EXPECT_EQ(ev.back()["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(ev.back()["spillway"]["seed"], 1);
  ASSERT_FALSE(ids.empty());
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(ids[i], static_cast<int32_t>(i + 1));
  EXPECT_EQ(ids.size(), 2 + (call.size() + 6) / 7);

  // The whole answer reads the same.
  const ChatSyntax syntax = Render({{"tool_choice", "auto"}}).syntax;
  json body = WholeReply(Chat(), "Ok " + call, "stop", {5, 9}, &syntax);
  const json& msg = body["choices"][0]["message"];
  EXPECT_EQ(msg["content"], "Ok ");
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["id"], ToolCallId("req-9", 0));
  EXPECT_EQ(json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()), json({{"n", 2}}));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
}

TEST_F(ChatLayerTest, WithoutToolsATagIsContent) {
  ChatSyntax syntax = Render({{"tools", nullptr}}).syntax;
  json body = WholeReply(Chat(), kCall, "length", {5, 9}, &syntax);
  EXPECT_EQ(body["choices"][0]["message"]["content"], kCall);
  EXPECT_FALSE(body["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");

  StreamReply completion({api::Endpoint::kCompletion, "r", "m", 1}, std::nullopt);
  auto ev = Events(completion.Text("a <tool_call>", {1}) + completion.Finish("length", json::object(), nullptr));
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0]["choices"][0]["text"], "a <tool_call>");
  EXPECT_EQ(ev[0]["spillway"]["tokens"], json::array({1}));
  EXPECT_EQ(ev[1]["choices"][0]["finish_reason"], "length");
}

// A random model writes invalid UTF-8 at times: the stream goes on past it
// (llama.cpp's parser would stop there and hold everything back).
TEST_F(ChatLayerTest, InvalidUtf8DoesNotStallTheStream) {
  StreamReply reply(Chat(), Render({{"tools", nullptr}}).syntax);
  reply.Text("before ", {1});
  auto bad = Events(reply.Text(std::string("\x9f", 1), {2}));
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0]["choices"][0]["delta"]["content"], "\xEF\xBF\xBD");  // U+FFFD, as JSON would carry it
  auto ev = Events(reply.Text(" after", {3}));
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0]["choices"][0]["delta"]["content"], " after");
  EXPECT_EQ(ev[0]["spillway"]["tokens"], json::array({3}));
}

// A completion stream whose text holds invalid bytes can be continued: the
// client counted U+FFFD for each (3 bytes), and so does the continuation
// when it counts the replayed text against it.
TEST_F(ChatLayerTest, ACompletionWithInvalidUtf8CanBeContinued) {
  const ReplyHeader h{api::Endpoint::kCompletion, "r", "m", 1};
  const std::string bad("ok \xE2\x28\xA1 \xF0\x9F\x98\x80 \xC3", 13);  // (a cut sequence, a valid emoji)
  StreamReply first(h, std::nullopt);
  auto ev = Events(first.Text(bad, {1, 2}) + first.Finish("length", json::object(), nullptr));
  ASSERT_EQ(ev.size(), 2u);
  const std::string delivered = ev[0]["choices"][0]["text"];
  EXPECT_EQ(delivered, "ok \xEF\xBF\xBD(\xEF\xBF\xBD \xF0\x9F\x98\x80 \xEF\xBF\xBD");
  StreamReply cont(h, std::nullopt);
  EXPECT_TRUE(cont.Replayed(bad, delivered.size()).ok());
  StreamReply wrong(h, std::nullopt);
  EXPECT_EQ(wrong.Replayed(bad, bad.size()).code(), StatusCode::kUnavailable);
  // A whole answer carries the same text as the stream.
  EXPECT_EQ(WholeReply(h, bad, "length", {1, 2}, nullptr)["choices"][0]["text"], delivered);
}

// A continuation parses what the earlier attempt delivered and sends only
// what follows, so the client's deltas join up; a count that disagrees is refused.
TEST_F(ChatLayerTest, AContinuationDeltasJoinTheDeliveredOnes) {
  ChatSyntax syntax = Render({{"tool_choice", "auto"}}).syntax;
  StreamReply whole(Chat(), syntax);
  std::string full = whole.Text("Hello there", {1});
  full += whole.Text(", friend", {2});  // (after the first: the operands of + are evaluated in any order)
  StreamReply cont(Chat(), syntax);
  ASSERT_TRUE(cont.Replayed("Hello there", 11).ok());
  std::string rest = cont.Text(", friend", {2});
  EXPECT_EQ(Events(rest)[0]["choices"][0]["delta"]["content"], Events(full)[1]["choices"][0]["delta"]["content"]);
  // The role came with the first delivered delta: a continuation's first
  // delta carried it again, and clients that begin a message at each role
  // split the answer in two.
  EXPECT_TRUE(Events(full)[0]["choices"][0]["delta"].contains("role")) << full;
  EXPECT_FALSE(Events(rest)[0]["choices"][0]["delta"].contains("role")) << rest;
  StreamReply wrong(Chat(), syntax);
  EXPECT_EQ(wrong.Replayed("Hello there", 5).code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace spillway::worker
