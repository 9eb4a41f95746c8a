#include "api/openai_request.h"
#include "api/openai_tools.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace spillway::api {
namespace {

using nlohmann::json;

TEST(OpenAiRequestTest, ParsesAFullChatRequest) {
  json body = json::parse(R"({
    "model": "chat", "stream": true, "stream_options": {"include_usage": true},
    "max_tokens": 64, "temperature": 0.2, "top_p": 0.9, "top_k": 20, "min_p": 0.1, "seed": 7,
    "stop": ["\n\n", "END"], "frequency_penalty": 0.5, "unknown_field": {"ignored": true},
    "messages": [{"role": "system", "content": "be brief"},
                 {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
                 {"role": "developer", "content": "dev"}]})");
  auto r = ParseChatRequest(body);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->gen.model, "chat");
  EXPECT_TRUE(r->gen.stream);
  EXPECT_TRUE(r->gen.include_usage);
  EXPECT_EQ(*r->gen.max_tokens, 64);
  EXPECT_FLOAT_EQ(*r->gen.sampling.temperature, 0.2f);
  EXPECT_EQ(*r->gen.sampling.top_k, 20);
  EXPECT_EQ(*r->gen.sampling.seed, 7u);
  EXPECT_EQ(r->gen.stop.size(), 2u);
  // A Modelfile's stop list (Ollama takes any number): more than OpenAI's 4.
  auto many = ParseCompletionRequest(
      json::parse(R"({"prompt":"x","stop":["<|im_end|>","<|endoftext|>","<|fim_prefix|>","<|fim_suffix|>","\n\n"]})"));
  ASSERT_TRUE(many.ok()) << many.status().ToString();
  EXPECT_EQ(many->gen.stop.size(), 5u);
  ASSERT_EQ(r->messages.size(), 3u);
  EXPECT_EQ(r->messages[1].content, "hi there");
  EXPECT_EQ(r->messages[2].role, "system");
}

TEST(OpenAiRequestTest, MaxTokensWinsOverMaxCompletionTokens) {
  auto r = ParseCompletionRequest(json::parse(R"({"prompt":"x","max_completion_tokens":9,"max_tokens":3})"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r->gen.max_tokens, 3);
  r = ParseCompletionRequest(json::parse(R"({"prompt":["only"],"max_completion_tokens":9})"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r->gen.max_tokens, 9);
  EXPECT_EQ(r->prompt, "only");
}

TEST(OpenAiRequestTest, TokenArrayPrompt) {
  auto r = ParseCompletionRequest(json::parse(R"({"prompt":[1, 15043, 3186]})"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->prompt_tokens, (std::vector<int32_t>{1, 15043, 3186}));
  EXPECT_TRUE(r->prompt.empty());
}

TEST(OpenAiRequestTest, NullMeansUnset) {
  auto r = ParseCompletionRequest(json::parse(R"({"prompt":"x","max_tokens":null,"temperature":null,"stop":null})"));
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->gen.max_tokens.has_value());
  EXPECT_FALSE(r->gen.sampling.temperature.has_value());
}

struct Bad {
  const char* body;
  const char* field;
};

TEST(OpenAiRequestTest, RejectsWrongTypesAndOutOfRangeNumbers) {
  const Bad cases[] = {
      {R"({"prompt": 1})", "'prompt'"},
      {R"({"prompt": ["a", "b"]})", "'prompt'"},
      {R"({"prompt": [1, -2]})", "'prompt'"},
      {R"({"prompt": [1, 2.5]})", "'prompt'"},
      {R"({"prompt": [1, "a"]})", "'prompt'"},
      {R"({})", "'prompt'"},
      {R"({"prompt": "x", "max_tokens": 0})", "'max_tokens'"},
      {R"({"prompt": "x", "max_tokens": 2.5})", "'max_tokens'"},
      {R"({"prompt": "x", "max_tokens": 1e300})", "'max_tokens'"},
      {R"({"prompt": "x", "temperature": -0.1})", "'temperature'"},
      {R"({"prompt": "x", "temperature": "hot"})", "'temperature'"},
      {R"({"prompt": "x", "top_p": 1.5})", "'top_p'"},
      {R"({"prompt": "x", "min_p": -1})", "'min_p'"},
      {R"({"prompt": "x", "repeat_penalty": 0})", "'repeat_penalty'"},
      {R"({"prompt": "x", "presence_penalty": 3})", "'presence_penalty'"},
      {R"({"prompt": "x", "seed": 1.5})", "'seed'"},
      {R"({"prompt": "x", "seed": "7"})", "'seed'"},
      {R"({"prompt": "x", "n_predict": 16})", "'n_predict'"},  // (llama-server's; it was ignored)
      {R"({"prompt": "x", "stream": "yes"})", "'stream'"},
      {R"({"prompt": "x", "stream_options": 1})", "'stream_options'"},
      {R"({"prompt": "x", "stream_options": {"include_usage": true}})", "'stream_options'"},  // not streamed (OpenAI: 400)
      {R"({"prompt": "x", "stop": ["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]})", "'stop'"},
      {R"({"prompt": "x", "stop": [""]})", "'stop'"},
      {R"({"prompt": "x", "stop": 3})", "'stop'"},
      {R"({"prompt": "x", "n": 2})", "'n'"},
      {R"({"prompt": "x", "ignore_eos": true, "response_format": {"type": "json_object"}})", "'ignore_eos'"},
      {R"({"prompt": "x", "model": 5})", "'model'"},
  };
  for (const auto& c : cases) {
    auto r = ParseCompletionRequest(json::parse(c.body));
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.field), std::string::npos) << c.body << ": " << r.status().message();
  }
}

// OpenAI's seed is 64-bit, llama.cpp's 32 (0xFFFFFFFF its "random"): a
// larger one is taken modulo 2^32 - 1, the same each time (2^32 and more
// were refused).
TEST(OpenAiRequestTest, ASixtyFourBitSeedIsFoldedIntoLlamasRange) {
  for (const auto& [seed, folded] : std::vector<std::pair<json, uint32_t>>{
           {json(0), 0u}, {json(4294967294u), 4294967294u}, {json(4294967295u), 0u},
           {json(uint64_t{1} << 40), static_cast<uint32_t>((uint64_t{1} << 40) % 4294967295u)},
           {json(18446744073709551615u), static_cast<uint32_t>(18446744073709551615u % 4294967295u)}}) {
    auto r = ParseCompletionRequest(json{{"prompt", "x"}, {"seed", seed}});
    ASSERT_TRUE(r.ok()) << seed << ": " << r.status().ToString();
    EXPECT_EQ(*r->gen.sampling.seed, folded) << seed;
  }
  // Past 2^64 (a float in JSON) it is whole, but too large: said so (it heard "must be an integer").
  auto huge = ParseCompletionRequest(json::parse(R"({"prompt": "x", "seed": 1e30})"));
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("must be below 2^64"), std::string::npos) << huge.status().message();
}

// An integer field's bounds are written as integers ("between 1 and
// 1048576", not "1.0 and 1048576.0"); a float field's as it has them.
TEST(OpenAiRequestTest, RangeErrorsWriteIntegerBoundsAsIntegers) {
  auto r = ParseCompletionRequest(json::parse(R"({"prompt": "x", "max_tokens": 0})"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().find(".0"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("between 1 and "), std::string::npos) << r.status().message();
  auto t = ParseCompletionRequest(json::parse(R"({"prompt": "x", "top_p": 1.5})"));
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("between 0.0 and 1.0"), std::string::npos) << t.status().message();
}

// A whole number written as a float is taken as every integer field takes it.
TEST(OpenAiRequestTest, OneChoiceMayBeWrittenAsAFloat) {
  auto r = ParseCompletionRequest(json::parse(R"({"prompt": "x", "n": 1.0, "max_tokens": 7.0})"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->gen.max_tokens, 7);
}

// A message's name and reasoning_content are strings: the worker's chat
// layer reads them so, and refused another type only after admission.
TEST(OpenAiRequestTest, AMessagesNameAndReasoningAreStrings) {
  for (const char* body : {R"({"messages": [{"role": "user", "content": "hi", "name": 5}]})",
                           R"({"messages": [{"role": "assistant", "content": "a", "reasoning_content": {}}]})"}) {
    auto r = ParseChatRequest(json::parse(body));
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_NE(r.status().message().find("messages[0]."), std::string::npos) << r.status().message();
  }
  EXPECT_TRUE(ParseChatRequest(json::parse(R"({"messages": [{"role": "user", "content": "hi", "name": "ann"}]})")).ok());
}

TEST(OpenAiRequestTest, RejectsBadMessages) {
  const char* cases[] = {
      R"({"messages": "hi"})",
      R"({"messages": []})",
      R"({"messages": [1]})",
      R"({"messages": [{"content": "x"}]})",
      R"({"messages": [{"role": "robot", "content": "x"}]})",
      R"({"messages": [{"role": "user"}]})",
      R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
      R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})",
      R"({"messages": [{"role": "user", "content": {"a": 1}}]})",
  };
  for (const char* c : cases) {
    auto r = ParseChatRequest(json::parse(c));
    EXPECT_FALSE(r.ok()) << c;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c;
  }
}

// What llama.cpp's chat layer in the worker would refuse, made what the client meant.
TEST(OpenAiRequestTest, NullsAndOmittedToolCallFieldsAreNormalizedForTheWorker) {
  json body = json::parse(R"({"messages":[
      {"role":"user","content":"x","name":null},
      {"role":"assistant","content":null,"tool_calls":[{"id":null,"function":{"name":"f"}}]}],
    "tools":[{"type":"function","function":{"name":"f","description":null}}]})");
  ASSERT_TRUE(NormalizeChatForWorker(&body));
  EXPECT_FALSE(body["messages"][0].contains("name"));
  EXPECT_TRUE(body["messages"][1].contains("content")) << "null content beside tool calls is kept";
  const json& call = body["messages"][1]["tool_calls"][0];
  EXPECT_FALSE(call.contains("id"));
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["arguments"], "{}");
  EXPECT_FALSE(body["tools"][0]["function"].contains("description"));
  EXPECT_FALSE(NormalizeChatForWorker(&body)) << "a second pass changes nothing";
}

TEST(OpenAiRequestTest, ParsesToolsToolChoiceAndToolHistory) {
  auto r = ParseChatRequest(json::parse(R"({
    "messages": [{"role": "user", "content": "add one"},
                 {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
                   "function": {"name": "increment", "arguments": "{\"n\": 1}"}}]},
                 {"role": "tool", "tool_call_id": "call_1", "content": "2"}],
    "tools": [{"type": "function", "function": {"name": "increment", "description": "adds one",
               "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}},
              {"type": "function", "function": {"name": "reset-all_2"}}],
    "tool_choice": {"type": "function", "function": {"name": "increment"}}, "parallel_tool_calls": false})"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->tools.size(), 2u);
  EXPECT_EQ(r->tools[0].name, "increment");
  EXPECT_EQ(r->tools[0].description, "adds one");
  EXPECT_EQ(json::parse(r->tools[0].parameters)["properties"]["n"]["type"], "integer");
  EXPECT_EQ(r->tools[1].parameters, "");
  EXPECT_EQ(r->tool_choice, ToolChoice::kFunction);
  EXPECT_EQ(r->tool_choice_name, "increment");
  ASSERT_EQ(r->messages.size(), 3u);
  EXPECT_EQ(r->messages[1].content, "");
  ASSERT_EQ(r->messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(r->messages[1].tool_calls[0].id, "call_1");
  EXPECT_EQ(r->messages[1].tool_calls[0].name, "increment");
  EXPECT_EQ(r->messages[1].tool_calls[0].arguments, R"({"n": 1})");
  EXPECT_EQ(r->messages[2].tool_call_id, "call_1");

  const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
  const std::string tool = R"("tools": [{"type": "function", "function": {"name": "f"}}])";
  EXPECT_EQ(ParseChatRequest(json::parse("{" + msgs + "}"))->tool_choice, ToolChoice::kNone);
  EXPECT_EQ(ParseChatRequest(json::parse("{" + msgs + "," + tool + "}"))->tool_choice, ToolChoice::kAuto);
  EXPECT_EQ(ParseChatRequest(json::parse("{" + msgs + "," + tool + R"(, "tool_choice": "required"})"))->tool_choice,
            ToolChoice::kRequired);
  EXPECT_EQ(ParseChatRequest(json::parse("{" + msgs + R"(, "tool_choice": "none"})"))->tool_choice, ToolChoice::kNone);
}

TEST(OpenAiRequestTest, RejectsBadToolShapesNamingTheField) {
  const std::string msgs = R"({"messages": [{"role": "user", "content": "x"}], )";
  const std::string f = R"("tools": [{"type": "function", "function": {"name": "f"}}])";
  const std::string many = [] {
    std::string t = R"("tools": [)";
    for (int i = 0; i <= 128; ++i) t += std::string(i ? "," : "") + R"({"type":"function","function":{"name":"f)" + std::to_string(i) + R"("}})";
    return t + "]";
  }();
  const std::pair<std::string, std::string> cases[] = {
      {R"("tools": {})", "'tools'"},
      {many, "'tools'"},
      {R"("tools": [1])", "'tools[0]'"},
      {R"("tools": [{"type": "retrieval"}])", "'tools[0].type'"},
      {R"("tools": [{"type": "function"}])", "'tools[0].function'"},
      {R"("tools": [{"type": "function", "function": {"name": "has space"}}])", "'tools[0].function.name'"},
      {R"("tools": [{"type": "function", "function": {"name": ""}}])", "'tools[0].function.name'"},
      {R"("tools": [{"type": "function", "function": {"name": ")" + std::string(65, 'a') + R"("}}])",
       "'tools[0].function.name'"},
      {R"("tools": [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}])",
       "'tools[1].function.name'"},
      {R"("tools": [{"type": "function", "function": {"name": "f", "description": 3}}])",
       "'tools[0].function.description'"},
      {R"("tools": [{"type": "function", "function": {"name": "f", "parameters": []}}])",
       "'tools[0].function.parameters'"},
      {R"("tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}])",
       "'tools[0].function.parameters.type'"},
      {R"("tools": [{"type": "function", "function": {"name": "f", "parameters": {"properties": []}}}])",
       "'tools[0].function.parameters.properties'"},
      {R"("tools": [{"type": "function", "function": {"name": "f", "parameters": {"properties": {"a": 1}}}}])",
       "'tools[0].function.parameters.properties.a'"},
      {f + R"(, "tool_choice": "always")", "'tool_choice'"},
      {f + R"(, "tool_choice": 1)", "'tool_choice'"},
      {f + R"(, "tool_choice": {"type": "function", "function": {"name": "g"}})", "'tool_choice.function.name'"},
      {f + R"(, "tool_choice": {"type": "function", "function": {}})", "'tool_choice.function.name'"},
      {R"("tool_choice": "required")", "'tool_choice'"},
      {f + R"(, "parallel_tool_calls": "yes")", "'parallel_tool_calls'"},
      {f + R"(, "tool_choice": "required", "ignore_eos": true)", "'ignore_eos'"},
  };
  for (const auto& [fields, field] : cases) {
    const std::string body = msgs + fields + "}";
    auto r = ParseChatRequest(json::parse(body));
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(field), std::string::npos) << body << ": " << r.status().message();
  }
}

TEST(OpenAiRequestTest, RejectsBadToolHistoryNamingTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"([{"role": "assistant", "tool_calls": {}}])", "'messages[0].tool_calls'"},
      {R"([{"role": "user", "content": "x", "tool_calls": []}])", "'messages[0].tool_calls'"},
      {R"([{"role": "assistant", "tool_calls": [1]}])", "'messages[0].tool_calls[0]'"},
      {R"([{"role": "assistant", "tool_calls": [{"type": "function"}]}])", "'messages[0].tool_calls[0].function'"},
      {R"([{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}])",
       "'messages[0].tool_calls[0].function.name'"},
      {R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 5}}]}])",
       "'messages[0].tool_calls[0].function.arguments'"},
      {R"([{"role": "tool", "tool_call_id": 5, "content": "x"}])", "'messages[0].tool_call_id'"},
      {R"([{"role": "assistant"}])", "'messages[0].content'"},
  };
  for (const auto& [messages, field] : cases) {
    const std::string body = std::string(R"({"messages": )") + messages + "}";
    auto r = ParseChatRequest(json::parse(body));
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_NE(r.status().message().find(field), std::string::npos) << body << ": " << r.status().message();
  }
}

TEST(OpenAiRequestTest, Embeddings) {
  auto r = ParseEmbeddingRequest(json::parse(R"({"input": ["a", "b"], "model": "embed"})"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->inputs.size(), 2u);
  EXPECT_TRUE(r->input_was_array);
  EXPECT_FALSE(ParseEmbeddingRequest(json::parse(R"({"input": ""})")).ok());
  EXPECT_FALSE(ParseEmbeddingRequest(json::parse(R"({"input": [[1,2]]})")).ok());
  EXPECT_TRUE(ParseEmbeddingRequest(json::parse(R"({"input": "x", "encoding_format": "base64"})"))->base64);
  EXPECT_FALSE(ParseEmbeddingRequest(json::parse(R"({"input": "x", "encoding_format": "hex"})")).ok());
  EXPECT_FALSE(ParseEmbeddingRequest(json::parse(R"({})")).ok());
  EXPECT_FALSE(r->truncate) << "an input too long is refused unless truncation is asked for";
  EXPECT_TRUE(ParseEmbeddingRequest(json::parse(R"({"input": "x", "truncate": true})"))->truncate);
  EXPECT_FALSE(ParseEmbeddingRequest(json::parse(R"({"input": "x", "truncate": null})"))->truncate);
  EXPECT_FALSE(ParseEmbeddingRequest(json::parse(R"({"input": "x", "truncate": 1})")).ok());
  // Vectors of another width than asked would fail a client's store later, far from here: refused now.
  auto dims = ParseEmbeddingRequest(json::parse(R"({"input": "x", "dimensions": 256})"));
  ASSERT_FALSE(dims.ok());
  EXPECT_NE(dims.status().message().find("'dimensions'"), std::string::npos) << dims.status().message();
}

// -1 is "random" to many UIs (OpenAI takes any integer): no seed, for the gateway to pin one.
TEST(OpenAiRequestTest, ANegativeSeedIsNoSeed) {
  auto r = ParseCompletionRequest(json::parse(R"({"prompt": "x", "seed": -1})"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FALSE(r->gen.sampling.seed.has_value());
  EXPECT_TRUE(IsNegativeSeed(json::parse(R"({"seed": -7})")));
  EXPECT_FALSE(IsNegativeSeed(json::parse(R"({"seed": 7})")));
}

TEST(OpenAiRequestTest, BodyMustBeAJsonObject) {
  EXPECT_FALSE(ParseJsonBody("{").ok());
  EXPECT_FALSE(ParseJsonBody("[]").ok());
  EXPECT_FALSE(ParseJsonBody("").ok());
  EXPECT_FALSE(ParseJsonBody("\"s\"").ok());
  EXPECT_TRUE(ParseJsonBody("{}").ok());
}

}  // namespace
}  // namespace spillway::api

namespace spillway::api {
namespace {

TEST(OpenAiRequestFeaturesTest, ReadsResponseFormatLogprobsReasoningAndUser) {
  auto r = ParseChatRequest(json::parse(R"({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "point", "strict": true,
                          "schema": {"type": "object", "properties": {"x": {"type": "number"}}}}},
      "logprobs": true, "top_logprobs": 3, "user": "u-1", "reasoning_format": "none",
      "reasoning_effort": "low", "chat_template_kwargs": {"enable_thinking": false},
      "parallel_tool_calls": true, "n": 1, "best_of": null, "logit_bias": {}})"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->gen.response_format.type, ResponseFormatType::kJsonSchema);
  EXPECT_EQ(r->gen.response_format.name, "point");
  EXPECT_TRUE(r->gen.response_format.strict);
  EXPECT_EQ(json::parse(r->gen.response_format.schema)["properties"]["x"]["type"], "number");
  EXPECT_TRUE(r->gen.logprobs);
  EXPECT_EQ(r->gen.top_logprobs, 3);
  EXPECT_EQ(r->gen.user, "u-1");
  EXPECT_EQ(r->reasoning_format, "none");
  EXPECT_EQ(r->reasoning_effort, "low");
  ASSERT_EQ(r->chat_template_kwargs.size(), 1u);
  EXPECT_EQ(r->chat_template_kwargs[0].second, "false");
  EXPECT_EQ(r->parallel_tool_calls, std::optional<bool>(true));

  auto c = ParseCompletionRequest(json::parse(R"({"prompt": "x", "logprobs": 2, "response_format": {"type": "json_object"}})"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->gen.logprobs);
  EXPECT_EQ(c->gen.top_logprobs, 2);
  EXPECT_EQ(c->gen.response_format.type, ResponseFormatType::kJsonObject);
}

// What Spillway cannot honour is refused by name, never silently ignored.
TEST(OpenAiRequestFeaturesTest, RefusesWhatItCannotHonourNamingTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"("response_format": {"type": "xml"})", "'response_format.type'"},
      {R"("response_format": {"type": "json_schema"})", "'response_format.json_schema'"},
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "a"}})", "'response_format.json_schema.schema'"},
      {R"("response_format": {"type": "json_schema", "json_schema": {"schema": []}})", "'response_format.json_schema.schema'"},
      {R"("top_logprobs": 2)", "'top_logprobs'"},
      {R"("logprobs": true, "top_logprobs": 21)", "'top_logprobs'"},
      {R"("n": 2)", "one choice per request"},
      {R"("mirostat": 2)", "'mirostat'"},
      {R"("typical_p": 0.5)", "'typical_p'"},
      {R"("grammar": "root ::= \"a\"")", "'grammar'"},
      {R"("functions": [{"name": "f"}])", "'functions'"},
      {R"("reasoning_format": "verbose")", "'reasoning_format'"},
      {R"("chat_template_kwargs": {"enable_thinking": "no"})", "'chat_template_kwargs.enable_thinking'"},
      {R"("user": 5)", "'user'"},
  };
  for (const auto& [fields, field] : cases) {
    const std::string body = std::string(R"({"messages": [{"role": "user", "content": "x"}], )") + fields + "}";
    auto r = ParseChatRequest(json::parse(body));
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(field), std::string::npos) << body << ": " << r.status().message();
  }
  auto c = ParseCompletionRequest(json::parse(R"({"prompt": "x", "best_of": 3})"));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("'best_of'"), std::string::npos);
  EXPECT_FALSE(ParseCompletionRequest(json::parse(R"({"prompt": "x", "logprobs": 6})")).ok());
  EXPECT_TRUE(ParseCompletionRequest(json::parse(R"({"prompt": "x", "echo": false, "best_of": 1})")).ok());
}

}  // namespace
}  // namespace spillway::api
