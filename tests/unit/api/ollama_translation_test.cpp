// Ollama's bodies into OpenAI's (api/ollama_request.h) and OpenAI's answers
// and streams back into Ollama's (api/ollama_response.h).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <sstream>

#include "api/ollama_request.h"
#include "api/ollama_response.h"
#include "api/openai_request.h"
#include "api/openai_response.h"

namespace spillway::api {
namespace {

using nlohmann::json;

OllamaCall Translate(OllamaRoute route, const json& body) {
  auto c = TranslateOllamaRequest(route, body);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : OllamaCall{};
}

std::string Error(OllamaRoute route, const json& body) {
  auto c = TranslateOllamaRequest(route, body);
  EXPECT_FALSE(c.ok()) << body.dump();
  return c.ok() ? "" : c.status().message();
}

TEST(OllamaRequestTest, AChatStreamsByDefaultAndItsOptionsBecomeOpenAiFields) {
  const auto c = Translate(OllamaRoute::kChat,
                           {{"model", "chat:latest"},
                            {"messages", {{{"role", "system"}, {"content", "be brief"}}, {{"role", "user"}, {"content", "hi"}}}},
                            {"options",
                             {{"temperature", 0.2}, {"top_p", 0.5}, {"top_k", 7}, {"seed", 42}, {"num_predict", 16},
                              {"stop", {"\n\n"}}, {"num_ctx", 8192}, {"repeat_penalty", 1.1}, {"min_p", 0.05}}},
                            {"format", "json"}});
  EXPECT_TRUE(c.stream);
  EXPECT_EQ(c.endpoint, "chat");
  EXPECT_EQ(c.model, "chat:latest");
  const json& o = c.openai;
  EXPECT_EQ(o["stream"], true);
  EXPECT_EQ(o["stream_options"]["include_usage"], true);
  EXPECT_EQ(o["messages"].size(), 2u);
  EXPECT_EQ(o["messages"][1], json({{"role", "user"}, {"content", "hi"}}));
  EXPECT_EQ(o["temperature"], 0.2);
  EXPECT_EQ(o["top_p"], 0.5);
  EXPECT_EQ(o["top_k"], 7);
  EXPECT_EQ(o["seed"], 42);
  EXPECT_EQ(o["max_tokens"], 16);
  EXPECT_EQ(o["stop"], json({"\n\n"}));
  EXPECT_EQ(o["repeat_penalty"], 1.1);
  EXPECT_EQ(o["min_p"], 0.05);
  EXPECT_FALSE(o.contains("num_ctx")) << "load-time options are the placement's";
  EXPECT_EQ(o["response_format"], json({{"type", "json_object"}}));
  EXPECT_EQ(o["truncate"], true) << "Ollama's default: a conversation past the context loses its oldest messages";
  // What the gateway's own parser then accepts.
  json named = o;
  named["model"] = "chat";
  EXPECT_TRUE(ParseChatRequest(named).ok());
  EXPECT_TRUE(ParseChatRequest(named)->truncate);
}

TEST(OllamaRequestTest, AChatsTruncateIsItsOwnOrTrue) {
  const json hi = {{{"role", "user"}, {"content", "hi"}}};
  EXPECT_EQ(Translate(OllamaRoute::kChat, {{"model", "m"}, {"messages", hi}, {"truncate", false}}).openai["truncate"], false);
  EXPECT_EQ(Translate(OllamaRoute::kChat, {{"model", "m"}, {"messages", hi}, {"truncate", nullptr}}).openai["truncate"], true);
  EXPECT_NE(Error(OllamaRoute::kChat, {{"model", "m"}, {"messages", hi}, {"truncate", "no"}}).find("'truncate'"),
            std::string::npos);
  // The OpenAI route's: off unless asked for.
  const json openai = {{"model", "m"}, {"messages", hi}};
  EXPECT_FALSE(ParseChatRequest(openai)->truncate);
  json asked = openai;
  asked["truncate"] = true;
  EXPECT_TRUE(ParseChatRequest(asked)->truncate);
  asked["truncate"] = 1;
  EXPECT_FALSE(ParseChatRequest(asked).ok());
}

TEST(OllamaRequestTest, DefaultsAndSentinelsLeaveTheServiceDefaults) {
  const auto c = Translate(OllamaRoute::kGenerate, {{"model", "m"}, {"prompt", "p"}, {"stream", false},
                                                    {"options", {{"num_predict", -1}, {"seed", -1}, {"repeat_last_n", -1}}}});
  EXPECT_FALSE(c.stream);
  EXPECT_FALSE(c.openai.contains("max_tokens"));
  EXPECT_FALSE(c.openai.contains("seed"));
  EXPECT_FALSE(c.openai.contains("repeat_last_n"));
  EXPECT_FALSE(c.openai.contains("stream_options"));
  EXPECT_EQ(Translate(OllamaRoute::kGenerate, {{"model", "m"}, {"prompt", "p"}, {"options", {{"num_predict", -2}}}})
                .openai.contains("max_tokens"),
            false);
  // 0 is no limit in Ollama too (its runner stops at num_predict only when positive).
  EXPECT_EQ(Translate(OllamaRoute::kGenerate, {{"model", "m"}, {"prompt", "p"}, {"options", {{"num_predict", 0}}}})
                .openai.contains("max_tokens"),
            false);
}

// Integer options written as whole floats are taken (Ollama's decoder takes
// them; they were a 400 "must be an integer"); a 64-bit seed goes on whole.
TEST(OllamaRequestTest, IntegerOptionsMayBeWrittenAsFloats) {
  const auto c = Translate(OllamaRoute::kGenerate, {{"model", "m"}, {"prompt", "p"},
                                                    {"options", {{"num_predict", 128.0}, {"seed", 7.0}, {"repeat_last_n", 32.0}}}});
  EXPECT_EQ(c.openai["max_tokens"], 128);
  EXPECT_EQ(c.openai["seed"], 7);
  EXPECT_EQ(c.openai["repeat_last_n"], 32);
  EXPECT_EQ(Translate(OllamaRoute::kGenerate, {{"model", "m"}, {"prompt", "p"},
                                               {"options", {{"seed", uint64_t{18446744073709551615u}}}}})
                .openai["seed"],
            uint64_t{18446744073709551615u});
}

TEST(OllamaRequestTest, AJsonSchemaFormatIsAStrictJsonSchemaResponseFormat) {
  const json schema = {{"type", "object"}, {"properties", {{"n", {{"type", "integer"}}}}}};
  const auto c = Translate(OllamaRoute::kChat, {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "x"}}}},
                                                {"format", schema}});
  EXPECT_EQ(c.openai["response_format"]["type"], "json_schema");
  EXPECT_EQ(c.openai["response_format"]["json_schema"]["schema"], schema);
  EXPECT_EQ(c.openai["response_format"]["json_schema"]["strict"], true);
  EXPECT_NE(Error(OllamaRoute::kChat, {{"model", "m"}, {"messages", json::array()}, {"format", "yaml"}}).find("'format'"),
            std::string::npos);
}

TEST(OllamaRequestTest, GenerateIsAChatWithTheSystemPromptUnlessRaw) {
  auto c = Translate(OllamaRoute::kGenerate, {{"model", "m"}, {"prompt", "why?"}, {"system", "sys"}, {"think", false}});
  EXPECT_EQ(c.endpoint, "chat");
  EXPECT_EQ(c.openai["messages"],
            json({{{"role", "system"}, {"content", "sys"}}, {{"role", "user"}, {"content", "why?"}}}));
  EXPECT_EQ(c.openai["reasoning_effort"], "none");
  c = Translate(OllamaRoute::kGenerate, {{"model", "m"}, {"prompt", "raw text"}, {"system", ""}, {"raw", true}});
  EXPECT_EQ(c.endpoint, "completion");
  EXPECT_EQ(c.openai["prompt"], "raw text");
  EXPECT_FALSE(c.openai.contains("messages"));
  // A system prompt with raw is Ollama's 400, in its words: it was dropped unsaid.
  EXPECT_EQ(Error(OllamaRoute::kGenerate, {{"model", "m"}, {"prompt", "raw text"}, {"system", "sys"}, {"raw", true}}),
            "raw mode does not support template, system, or context");
  EXPECT_TRUE(Translate(OllamaRoute::kGenerate, {{"model", "m"}}).load_only) << "an empty prompt only loads";
  EXPECT_TRUE(Translate(OllamaRoute::kChat, {{"model", "m"}, {"messages", json::array()}}).load_only);
  EXPECT_TRUE(Translate(OllamaRoute::kChat, {{"model", "m"}, {"messages", nullptr}}).load_only) << "null: no messages";
}

TEST(OllamaRequestTest, ToolCallsGetIdsAndToolResultsAnswerThemByName) {
  const json messages = {
      {{"role", "user"}, {"content", "weather?"}},
      {{"role", "assistant"},
       {"content", ""},
       {"tool_calls",
        {{{"function", {{"name", "get_weather"}, {"arguments", {{"city", "Oslo"}}}}}},
         {{"function", {{"name", "get_time"}, {"arguments", json::object()}}}}}}},
      {{"role", "tool"}, {"tool_name", "get_time"}, {"content", "noon"}},
      {{"role", "tool"}, {"tool_name", "get_weather"}, {"content", "rain"}}};
  // (A name with a dot, as gpt-oss's own `browser.search`, is taken as Ollama takes it.)
  const auto c = Translate(OllamaRoute::kChat, {{"model", "m"}, {"messages", messages},
                                                {"tools", {{{"type", "function"}, {"function", {{"name", "get_weather"}}}},
                                                           {{"type", "function"}, {"function", {{"name", "browser.search"}}}}}}});
  const json& m = c.openai["messages"];
  ASSERT_EQ(m[1]["tool_calls"].size(), 2u);
  EXPECT_EQ(m[1]["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Oslo\"}") << "OpenAI carries arguments as text";
  EXPECT_EQ(m[1]["tool_calls"][0]["type"], "function");
  EXPECT_EQ(m[2]["tool_call_id"], m[1]["tool_calls"][1]["id"]);
  EXPECT_EQ(m[3]["tool_call_id"], m[1]["tool_calls"][0]["id"]);
  // Its function's name goes on for the template (as Ollama's .ToolName): it was dropped.
  EXPECT_EQ(m[2]["name"], "get_time");
  EXPECT_EQ(m[3]["name"], "get_weather");
  EXPECT_EQ(c.openai["tools"].size(), 2u);
  json named = c.openai;
  named["model"] = "m";
  EXPECT_TRUE(ParseChatRequest(named).ok()) << ParseChatRequest(named).status().ToString();
}

// An assistant message's thinking, echoed back in the history, is the
// OpenAI shape's reasoning_content (llama.cpp's chat layer reads that); it was
// dropped, and a reasoning model's thought before its tool call lost.
TEST(OllamaRequestTest, AnAssistantsThinkingInTheHistoryIsKept) {
  const json messages = {{{"role", "user"}, {"content", "time?"}},
                         {{"role", "assistant"}, {"content", ""}, {"thinking", "I should call the clock."},
                          {"tool_calls", {{{"function", {{"name", "clock"}, {"arguments", json::object()}}}}}}},
                         {{"role", "tool"}, {"tool_name", "clock"}, {"content", "noon"}}};
  const auto c = Translate(OllamaRoute::kChat, {{"model", "m"}, {"messages", messages}});
  EXPECT_EQ(c.openai["messages"][1]["reasoning_content"], "I should call the clock.");
  EXPECT_FALSE(c.openai["messages"][0].contains("reasoning_content"));
  json named = c.openai;
  named["model"] = "m";
  EXPECT_TRUE(ParseChatRequest(named).ok()) << ParseChatRequest(named).status().ToString();
  EXPECT_NE(Error(OllamaRoute::kChat, {{"model", "m"}, {"messages", {{{"role", "assistant"}, {"content", ""}, {"thinking", 3}}}}})
                .find("thinking"),
            std::string::npos);
}

// LangChain's ChatOllama names a result's call by id (tool_call_id, no
// tool_name); results may come in another order than the calls. They were
// matched in order, each result given to the wrong call.
TEST(OllamaRequestTest, AToolResultNamingItsCallByIdAnswersThatCall) {
  const json messages = {
      {{"role", "user"}, {"content", "both?"}},
      {{"role", "assistant"},
       {"content", ""},
       {"tool_calls",
        {{{"id", "call_a"}, {"function", {{"name", "lookup"}, {"arguments", {{"q", "a"}}}}}},
         {{"id", "call_b"}, {"function", {{"name", "lookup"}, {"arguments", {{"q", "b"}}}}}}}}},
      {{"role", "tool"}, {"tool_call_id", "call_b"}, {"content", "B"}},
      {{"role", "tool"}, {"tool_call_id", "call_a"}, {"content", "A"}}};
  const auto c = Translate(OllamaRoute::kChat, {{"model", "m"}, {"messages", messages}});
  const json& m = c.openai["messages"];
  EXPECT_EQ(m[2]["tool_call_id"], "call_b");
  EXPECT_EQ(m[3]["tool_call_id"], "call_a");
  EXPECT_EQ(m[2]["name"], "lookup") << "its call's name, when it names none itself";
}

// The worker takes bodies up to twice the gateway's max_body_bytes (and
// 64 KiB): a translated body never grows past that, even when its tool calls'
// arguments are all quotes and backslashes (each escaped once more as text).
TEST(OllamaRequestTest, ATranslatedBodyAtMostDoublesItsSize) {
  const std::string nasty = std::string(20000, '"') + std::string(20000, '\\') + std::string(20000, '\n');
  const json body = {{"model", "m"},
                     {"messages",
                      {{{"role", "user"}, {"content", "write it"}},
                       {{"role", "assistant"},
                        {"content", ""},
                        {"tool_calls", {{{"function", {{"name", "write_file"}, {"arguments", {{"text", nasty}}}}}}}}},
                       {{"role", "tool"}, {"tool_name", "write_file"}, {"content", "ok"}}}}};
  const size_t sent = body.dump().size();
  const auto c = Translate(OllamaRoute::kChat, body);
  const size_t forwarded = c.openai.dump(-1, ' ', false, json::error_handler_t::replace).size();
  EXPECT_GT(forwarded, sent * 3 / 2) << "the case this guards: arguments escaped once more";
  EXPECT_LE(forwarded, 2 * sent + (64 << 10));
}

TEST(OllamaRequestTest, WhatSpillwayCannotHonourIsA400NamingTheField) {
  const json user = {{{"role", "user"}, {"content", "x"}}};
  EXPECT_NE(Error(OllamaRoute::kChat, {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "x"}, {"images", {"aGk="}}}}}})
                .find("images"),
            std::string::npos);
  EXPECT_NE(Error(OllamaRoute::kGenerate, {{"model", "m"}, {"prompt", "x"}, {"context", {1, 2, 3}}}).find("'context'"),
            std::string::npos);
  EXPECT_NE(Error(OllamaRoute::kGenerate, {{"model", "m"}, {"prompt", "x"}, {"template", "{{ .Prompt }}"}}).find("'template'"),
            std::string::npos);
  EXPECT_NE(Error(OllamaRoute::kGenerate, {{"model", "m"}, {"prompt", "x"}, {"suffix", "end"}}).find("'suffix'"),
            std::string::npos);
  EXPECT_NE(Error(OllamaRoute::kChat, {{"model", "m"}, {"messages", user}, {"options", {{"mirostat", 2}}}})
                .find("'options.mirostat'"),
            std::string::npos);
  // At their neutral values they are harmless (clients send the defaults).
  Translate(OllamaRoute::kChat, {{"model", "m"}, {"messages", user}, {"options", {{"mirostat", 0}, {"typical_p", 1.0}}},
                                 {"images", nullptr}, {"context", json::array()}});
}

TEST(OllamaRequestTest, WrongBodiesAreClear400s) {
  EXPECT_NE(Error(OllamaRoute::kChat, json::array()).find("JSON object"), std::string::npos);
  EXPECT_NE(Error(OllamaRoute::kChat, {{"messages", json::array()}}).find("'model'"), std::string::npos);
  EXPECT_NE(Error(OllamaRoute::kChat, {{"model", 3}}).find("'model'"), std::string::npos);
  EXPECT_NE(Error(OllamaRoute::kChat, {{"model", "m"}, {"stream", "yes"}}).find("'stream'"), std::string::npos);
  EXPECT_NE(Error(OllamaRoute::kChat, {{"model", "m"}, {"messages", "hi"}}).find("'messages'"), std::string::npos);
  EXPECT_NE(Error(OllamaRoute::kChat, {{"model", "m"}, {"messages", {1}}}).find("'messages[0]'"), std::string::npos);
  EXPECT_NE(Error(OllamaRoute::kChat, {{"model", "m"}, {"options", "hot"}}).find("'options'"), std::string::npos);
  EXPECT_NE(Error(OllamaRoute::kChat, {{"model", "m"}, {"options", {{"temperature", "hot"}}}}).find("'options.temperature'"),
            std::string::npos);
  EXPECT_NE(Error(OllamaRoute::kChat, {{"model", "m"}, {"options", {{"num_predict", -3}}}}).find("'options.num_predict'"),
            std::string::npos);
  // -2 is no repeat window Ollama knows (-1: the whole context); it was taken as -1.
  EXPECT_NE(Error(OllamaRoute::kChat, {{"model", "m"}, {"options", {{"repeat_last_n", -2}}}}).find("'options.repeat_last_n'"),
            std::string::npos);
  EXPECT_NE(Error(OllamaRoute::kChat, {{"model", "m"}, {"options", {{"seed", 1e30}}}}).find("below 2^64"),
            std::string::npos);
  EXPECT_NE(Error(OllamaRoute::kChat, {{"model", "m"}, {"keep_alive", "5 fortnights"}}).find("'keep_alive'"),
            std::string::npos);
  EXPECT_NE(Error(OllamaRoute::kEmbed, {{"model", "m"}, {"input", 5}}).find("'input'"), std::string::npos);
}

TEST(OllamaRequestTest, TheOpenAiParsersErrorsNameTheOllamaField) {
  const auto c = Translate(OllamaRoute::kChat, {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "x"}}}},
                                                {"options", {{"temperature", 9}, {"num_predict", 5}}}});
  json named = c.openai;
  named["model"] = "m";
  const Status st = OllamaFieldNames(ParseChatRequest(named).status(), c);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message().rfind("'options.temperature' must be between", 0), 0u) << st.message();
  EXPECT_EQ(OllamaFieldNames(Status::InvalidArgument("'messages' x"), c).message(), "'messages' x");
  // The schema's checks name the field the client sent: "format".
  const Status big = Status::InvalidArgument("'response_format.json_schema.schema' is larger than 65536 bytes");
  EXPECT_EQ(OllamaFieldNames(big, c).message(), "'format' is larger than 65536 bytes");
  EXPECT_EQ(OllamaFieldNames(Status::InvalidArgument("'response_format' x"), c).message(), "'format' x");
}

TEST(OllamaRequestTest, KeepAliveIsSecondsOrAGoDuration) {
  EXPECT_EQ(*ParseKeepAlive(json(300)), 300);
  EXPECT_EQ(*ParseKeepAlive(json(-1)), -1);
  EXPECT_EQ(*ParseKeepAlive(json("5m")), 300);
  EXPECT_EQ(*ParseKeepAlive(json("1h30m")), 5400);
  EXPECT_DOUBLE_EQ(*ParseKeepAlive(json("250ms")), 0.25);
  EXPECT_EQ(*ParseKeepAlive(json("-1")), -1);
  EXPECT_EQ(*ParseKeepAlive(json("-1m")), -60);
  EXPECT_EQ(*ParseKeepAlive(json("0")), 0);
  // Huge values are "for ever", not an overflow of the gateway's clock arithmetic.
  EXPECT_EQ(*ParseKeepAlive(json(1e300)), kMaxKeepAliveS);
  EXPECT_EQ(*ParseKeepAlive(json(-1e300)), -kMaxKeepAliveS);
  EXPECT_EQ(*ParseKeepAlive(json("99999999999999h")), kMaxKeepAliveS);
  EXPECT_FALSE(ParseKeepAlive(json("m")).ok());
  EXPECT_FALSE(ParseKeepAlive(json("5y")).ok());
  EXPECT_FALSE(ParseKeepAlive(json(true)).ok());
  EXPECT_TRUE(Translate(OllamaRoute::kChat, {{"model", "m"}, {"keep_alive", "10m"}}).keep_alive_s == 600);
}

TEST(OllamaRequestTest, EmbedAndLegacyEmbeddings) {
  auto c = Translate(OllamaRoute::kEmbed, {{"model", "e"}, {"input", {"a", "b"}}, {"truncate", true}, {"keep_alive", 0}});
  EXPECT_EQ(c.endpoint, "embedding");
  EXPECT_FALSE(c.stream);
  EXPECT_EQ(c.openai["input"], json({"a", "b"}));
  EXPECT_FALSE(c.openai.contains("encoding_format")) << "floats, not base64";
  EXPECT_EQ(c.openai["truncate"], true);
  // Ollama cuts an input past the context unless told not to.
  EXPECT_EQ(Translate(OllamaRoute::kEmbed, {{"model", "e"}, {"input", "a"}}).openai["truncate"], true);
  EXPECT_EQ(Translate(OllamaRoute::kEmbed, {{"model", "e"}, {"input", "a"}, {"truncate", false}}).openai["truncate"], false);
  c = Translate(OllamaRoute::kEmbeddings, {{"model", "e"}, {"prompt", "one"}});
  EXPECT_EQ(c.openai["input"], "one");
  EXPECT_TRUE(Translate(OllamaRoute::kEmbeddings, {{"model", "e"}}).load_only);
  // /api/embed without input loads the model, as Ollama's does (200, no
  // embeddings): it was a 400.
  EXPECT_TRUE(Translate(OllamaRoute::kEmbed, {{"model", "e"}}).load_only);
  EXPECT_TRUE(Translate(OllamaRoute::kEmbed, {{"model", "e"}, {"input", ""}}).load_only);
  EXPECT_TRUE(Translate(OllamaRoute::kEmbed, {{"model", "e"}, {"input", json::array()}}).load_only);
  EXPECT_FALSE(Translate(OllamaRoute::kEmbed, {{"model", "e"}, {"input", {""}}}).load_only);
  EXPECT_EQ(WithoutLatestTag("chat:latest"), "chat");
  EXPECT_EQ(WithoutLatestTag("chat:7b"), "chat:7b");
}

// --- answers back ---

const OllamaReplyContext kChat{OllamaRoute::kChat, "chat:latest", 1'700'000'000'000};
const OllamaReplyContext kGenerate{OllamaRoute::kGenerate, "chat", 1'700'000'000'000};

TEST(OllamaResponseTest, TimestampsAreRfc3339WithNanoseconds) {
  EXPECT_EQ(OllamaTimestamp(1'700'000'000'123), "2023-11-14T22:13:20.123000000Z");
}

TEST(OllamaResponseTest, AChatAnswerWithToolCallsAndStats) {
  GenerationResult r;
  r.finish_reason = "tool_calls";
  r.usage = {12, 5};
  r.message = AssistantMessage{"", "let me see", {{"call_1", "get_weather", R"({"city":"Oslo"})"}}};
  json openai = GenerationBody(Endpoint::kChat, "req_1", "chat", 0, r);
  openai["spillway"] = {{"timings", {{"prompt_ms", 4.0}, {"generation_ms", 10.0}}}, {"placement", "cpu"}};
  auto a = OllamaAnswer(kChat, openai, kChat.started_ms + 250);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  const json& j = *a;
  EXPECT_EQ(j["model"], "chat:latest");
  EXPECT_EQ(j["message"]["role"], "assistant");
  EXPECT_EQ(j["message"]["content"], "");
  EXPECT_EQ(j["message"]["thinking"], "let me see");
  EXPECT_EQ(j["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(j["message"]["tool_calls"][0]["function"]["arguments"], json({{"city", "Oslo"}})) << "an object, as Ollama's";
  EXPECT_EQ(j["done"], true);
  EXPECT_EQ(j["done_reason"], "stop");
  EXPECT_EQ(j["total_duration"], 250'000'000);
  EXPECT_EQ(j["prompt_eval_count"], 12);
  EXPECT_EQ(j["eval_count"], 5);
  EXPECT_EQ(j["prompt_eval_duration"], 4'000'000);
  EXPECT_EQ(j["eval_duration"], 10'000'000);
  EXPECT_EQ(j["load_duration"], 0);
  EXPECT_EQ(j["spillway"]["placement"], "cpu") << "who served it stays visible";
}

// Arguments a model nested a million deep are its text, not a call: parsed,
// their copy and dump recursed once per level and overflowed the stack.
TEST(OllamaResponseTest, ToolCallArgumentsBeyondTheJsonLimitsAreText) {
  const std::string deep = R"({"a":)" + std::string(1'000'000, '[') + std::string(1'000'000, ']') + "}";
  GenerationResult r;
  r.finish_reason = "tool_calls";
  r.message = AssistantMessage{"", "", {{"call_1", "f", deep}}};
  auto a = OllamaAnswer(kChat, GenerationBody(Endpoint::kChat, "req_1", "chat", 0, r), kChat.started_ms);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE((*a)["message"].value("tool_calls", json::array()).empty());
  EXPECT_EQ((*a)["message"]["content"].get<std::string>().size(), deep.size() + std::string(R"({"name":"f","arguments":})").size());
}

TEST(OllamaResponseTest, GenerateAnswersFromChatOrCompletionBodies) {
  GenerationResult r;
  r.text = "hi there";
  r.finish_reason = "length";
  auto a = OllamaAnswer(kGenerate, GenerationBody(Endpoint::kCompletion, "req_1", "chat", 0, r), kGenerate.started_ms);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)["response"], "hi there");
  EXPECT_EQ((*a)["done_reason"], "length");
  EXPECT_FALSE(a->contains("message"));
  r.message = AssistantMessage{"from chat", "", {}};
  a = OllamaAnswer(kGenerate, GenerationBody(Endpoint::kChat, "req_1", "chat", 0, r), kGenerate.started_ms);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)["response"], "from chat");
  EXPECT_FALSE(OllamaAnswer(kGenerate, json::array(), 0).ok());
  EXPECT_FALSE(OllamaAnswer(kGenerate, json{{"choices", json::array()}}, 0).ok());
}

TEST(OllamaResponseTest, EmbeddingsBothShapes) {
  const json openai = EmbeddingsBody("e", {{1.0f, 2.0f}, {3.0f, 4.0f}}, 6);
  auto a = OllamaAnswer({OllamaRoute::kEmbed, "e", 0}, openai, 0);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)["embeddings"], json({{1.0, 2.0}, {3.0, 4.0}}));
  EXPECT_EQ((*a)["prompt_eval_count"], 6);
  a = OllamaAnswer({OllamaRoute::kEmbeddings, "e", 0}, openai, 0);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, json({{"embedding", {1.0, 2.0}}}));
}

TEST(OllamaResponseTest, ErrorsAreOneStringAndLoadsSayLoad) {
  EXPECT_EQ(OllamaError(ErrorBody(Status::NotFound("gone")).dump()), json({{"error", "gone"}}));
  EXPECT_EQ(OllamaError("not json"), json({{"error", "not json"}}));
  const json load = OllamaLoadAnswer(kGenerate, 0);
  EXPECT_EQ(load["done_reason"], "load");
  EXPECT_EQ(OllamaLoadAnswer(kGenerate, 0, /*unload=*/true)["done_reason"], "unload");  // keep_alive 0
  EXPECT_EQ(load["response"], "");
  EXPECT_EQ(OllamaLoadAnswer({OllamaRoute::kEmbeddings, "e", 0}, 0), json({{"embedding", json::array()}}));
}

std::vector<json> Lines(const std::string& ndjson) {
  std::vector<json> out;
  std::istringstream in(ndjson);
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

TEST(OllamaResponseTest, AStreamBecomesNdjsonLinesWithOneFinalLine) {
  OllamaStreamTranslator t(kChat);
  std::string out;
  out += t.Feed(SseEvent(DeltaChunk("req_1", "chat", 0, {"", "Hel", -1, {}}, true)), 0);
  out += t.Feed(": spillway: waiting\n\n", 0);  // a comment: dropped
  // Events split anywhere.
  const std::string second = SseEvent(DeltaChunk("req_1", "chat", 0, {"hmm", "lo", -1, {}}, false));
  out += t.Feed(second.substr(0, 7), 0);
  out += t.Feed(second.substr(7), 0);
  ChatDelta call;
  call.tool_call_index = 0;
  call.tool_call = {"call_9", "f", "{\"a\":"};
  out += t.Feed(SseEvent(DeltaChunk("req_1", "chat", 0, call, false)), 0);
  call.tool_call = {"", "", "1}"};
  out += t.Feed(SseEvent(DeltaChunk("req_1", "chat", 0, call, false)), 0);
  json last = GenerationChunk(Endpoint::kChat, "req_1", "chat", 0, "", false, "tool_calls");
  last["spillway"] = {{"tokens", {1, 2}}, {"timings", {{"prompt_ms", 1.0}, {"generation_ms", 2.0}}}, {"placement", "cpu"}};
  out += t.Feed(SseEvent(last), 0);
  out += t.Feed(SseEvent(UsageChunk(Endpoint::kChat, "req_1", "chat", 0, {3, 4})), 0);
  out += t.Feed(kSseDone, kChat.started_ms + 1000);
  EXPECT_TRUE(t.done());
  EXPECT_EQ(t.Finish(0), "");
  const auto lines = Lines(out);
  ASSERT_EQ(lines.size(), 4u) << out;
  EXPECT_EQ(lines[0]["message"]["content"], "Hel");
  EXPECT_EQ(lines[0]["done"], false);
  EXPECT_EQ(lines[1]["message"]["content"], "lo");
  EXPECT_EQ(lines[1]["message"]["thinking"], "hmm");
  EXPECT_EQ(lines[2]["message"]["tool_calls"][0]["function"], json({{"name", "f"}, {"arguments", {{"a", 1}}}}));
  EXPECT_EQ(lines[3]["done"], true);
  EXPECT_EQ(lines[3]["done_reason"], "stop");
  EXPECT_EQ(lines[3]["prompt_eval_count"], 3);
  EXPECT_EQ(lines[3]["eval_count"], 4);
  EXPECT_EQ(lines[3]["total_duration"], 1'000'000'000);
  EXPECT_EQ(lines[3]["spillway"]["placement"], "cpu");
  EXPECT_FALSE(lines[3]["spillway"].contains("tokens"));
}

// Ollama's clients decode `arguments` as a map: a call cut short by
// num_predict is text, as Ollama's parser hands back what it cannot parse.
TEST(OllamaResponseTest, AToolCallCutShortIsTextNotACallWithStringArguments) {
  GenerationResult r;
  r.finish_reason = "length";
  r.usage = {12, 8};
  r.message = AssistantMessage{"", "", {{"call_1", "get_weather", R"({"city":"Os)"}, {"call_2", "get_time", ""}}};
  auto a = OllamaAnswer(kChat, GenerationBody(Endpoint::kChat, "req_1", "chat", 0, r), kChat.started_ms);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  const json& m = (*a)["message"];
  EXPECT_EQ(m["content"], R"({"name":"get_weather","arguments":{"city":"Os})");
  ASSERT_EQ(m["tool_calls"].size(), 1u) << m.dump();
  EXPECT_EQ(m["tool_calls"][0]["function"], json({{"name", "get_time"}, {"arguments", json::object()}}))
      << "no arguments are an empty map";
  EXPECT_EQ((*a)["done_reason"], "length");

  OllamaStreamTranslator t(kChat);
  ChatDelta call;
  call.tool_call_index = 0;
  call.tool_call = {"call_9", "f", "{\"a\": [1, "};
  std::string out = t.Feed(SseEvent(DeltaChunk("req_1", "chat", 0, call, false)), 0);
  out += t.Feed(SseEvent(GenerationChunk(Endpoint::kChat, "req_1", "chat", 0, "", false, "length")), 0);
  out += t.Feed(kSseDone, 0);
  const auto lines = Lines(out);
  ASSERT_EQ(lines.size(), 2u) << out;
  EXPECT_EQ(lines[0]["message"]["content"], R"({"name":"f","arguments":{"a": [1, })");
  EXPECT_FALSE(lines[0]["message"].contains("tool_calls")) << lines[0].dump();
  EXPECT_EQ(lines[1]["done_reason"], "length");
}

TEST(OllamaResponseTest, AStreamErrorIsAnErrorLineAndAStreamCutShortSaysSo) {
  OllamaStreamTranslator t(kGenerate);
  std::string out = t.Feed(SseEvent(GenerationChunk(Endpoint::kCompletion, "r", "chat", 0, "x", false, std::nullopt)), 0);
  out += t.Feed(SseEvent(ErrorBody(Status::Unavailable("the stream failed"))) + kSseDone, 0);
  auto lines = Lines(out);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["response"], "x");
  EXPECT_EQ(lines[1], json({{"error", "the stream failed"}}));
  OllamaStreamTranslator cut(kGenerate);
  (void)cut.Feed(SseEvent(GenerationChunk(Endpoint::kCompletion, "r", "chat", 0, "x", false, std::nullopt)), 0);
  lines = Lines(cut.Finish(0));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(lines[0].contains("error"));
  // A resumable end keeps what the client resumes from (it was dropped with the rest of the error object).
  OllamaStreamTranslator resumable(kGenerate);
  json err = ErrorBody(Status::Unavailable("cut after 1 delivered tokens; resume from the checkpoint"));
  err["error"]["request_id"] = "r";
  err["error"]["checkpoint"] = {{"tokens_delivered", 1}, {"text_bytes", 1}, {"tool_calls_delivered", false}};
  out = resumable.Feed(SseEvent(GenerationChunk(Endpoint::kCompletion, "r", "chat", 0, "x", false, std::nullopt)), 0);
  lines = Lines(out + resumable.Feed(SseEvent(err) + kSseDone, 0));
  ASSERT_EQ(lines.size(), 2u) << out;
  EXPECT_EQ(lines[1]["error"], "cut after 1 delivered tokens; resume from the checkpoint");
  EXPECT_EQ(lines[1]["spillway"]["request_id"], "r");
  EXPECT_EQ(lines[1]["spillway"]["checkpoint"]["tokens_delivered"], 1) << lines[1].dump();
}

}  // namespace
}  // namespace spillway::api
