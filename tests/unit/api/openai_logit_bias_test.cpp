// "logit_bias": what is accepted (OpenAI's object, llama-server's array and
// `false`) and the 400 each wrong input gets, naming the field.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <string>

#include "api/openai_request.h"

namespace spillway::api {
namespace {

using nlohmann::json;

StatusOr<ChatRequest> Chat(const std::string& logit_bias) {
  return ParseChatRequest(
      json::parse(R"({"messages": [{"role": "user", "content": "x"}], "logit_bias": )" + logit_bias + "}"));
}

TEST(OpenAiLogitBiasTest, ReadsOpenAisObjectOnChatAndCompletions) {
  auto r = Chat(R"({"15": -100, "0": 100, "2147483647": 0.5, "007": 3})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto& b = r->gen.sampling.logit_bias;
  ASSERT_EQ(b.size(), 4u);
  // nlohmann keeps object keys sorted as strings.
  EXPECT_EQ(b[0], (TokenBias{0, 100}));
  EXPECT_EQ(b[1], (TokenBias{7, 3}));
  EXPECT_EQ(b[2], (TokenBias{15, -100}));
  EXPECT_EQ(b[3], (TokenBias{2147483647, 0.5f}));

  auto c = ParseCompletionRequest(json::parse(R"({"prompt": "x", "logit_bias": {"42": -1.5}})"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->gen.sampling.logit_bias.size(), 1u);
  EXPECT_EQ(c->gen.sampling.logit_bias[0], (TokenBias{42, -1.5f}));
}

TEST(OpenAiLogitBiasTest, ReadsLlamaServersArrayAndFalse) {
  auto r = Chat(R"([[3, 2], [9, false]])");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto& b = r->gen.sampling.logit_bias;
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0], (TokenBias{3, 2}));
  EXPECT_EQ(b[1].token, 9);
  EXPECT_TRUE(std::isinf(b[1].bias) && b[1].bias < 0);

  auto o = Chat(R"({"5": false})");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_TRUE(std::isinf(o->gen.sampling.logit_bias.at(0).bias));
}

TEST(OpenAiLogitBiasTest, AbsentNullAndEmptyMeanNoBias) {
  for (const char* v : {"null", "{}", "[]"}) {
    auto r = Chat(v);
    ASSERT_TRUE(r.ok()) << v << ": " << r.status().ToString();
    EXPECT_TRUE(r->gen.sampling.logit_bias.empty()) << v;
  }
  auto none = ParseCompletionRequest(json::parse(R"({"prompt": "x"})"));
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->gen.sampling.logit_bias.empty());
}

TEST(OpenAiLogitBiasTest, AcceptsTheLimitAndRefusesOneMoreNamingIt) {
  json at_limit = json::object();
  for (size_t i = 0; i < kMaxLogitBias; ++i) at_limit[std::to_string(i)] = -1;
  auto ok = Chat(at_limit.dump());
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->gen.sampling.logit_bias.size(), kMaxLogitBias);

  json over = at_limit;
  over[std::to_string(kMaxLogitBias)] = -1;
  auto r = Chat(over.dump());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("'logit_bias'"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("at most 1024"), std::string::npos) << r.status().message();
}

TEST(OpenAiLogitBiasTest, RefusesEachWrongInputNamingTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"("15")", "'logit_bias' must be an object"},
      {R"(15)", "'logit_bias' must be an object"},
      {R"(true)", "'logit_bias' must be an object"},
      {R"({"abc": 1})", "\"abc\" is not one"},
      {R"({"-1": 1})", "\"-1\" is not one"},
      {R"({"+1": 1})", "\"+1\" is not one"},
      {R"({" 1": 1})", "\" 1\" is not one"},
      {R"({"1.5": 1})", "\"1.5\" is not one"},
      {R"({"": 1})", "token ids"},
      {R"({"2147483648": 1})", "\"2147483648\" is not one"},
      {R"({"99999999999999999999": 1})", "token ids"},
      {R"({"15": 101})", "'logit_bias.15' must be between -100 and 100"},
      {R"({"15": -100.5})", "'logit_bias.15' must be between -100 and 100"},
      {R"({"15": "10"})", "'logit_bias.15' must be a number"},
      {R"({"15": true})", "'logit_bias.15' must be a number"},
      {R"({"15": null})", "'logit_bias.15' must be a number"},
      {R"({"15": [1]})", "'logit_bias.15' must be a number"},
      {R"({"7": 1, "007": 2})", "names token 7 more than once"},
      {R"([[1, 2], [1, 3]])", "names token 1 more than once"},
      {R"([[1, 2, 3]])", "'logit_bias[0]' must be a pair"},
      {R"([5])", "'logit_bias[0]' must be a pair"},
      {R"([[1, 2], ["hello", 1]])", "'logit_bias[1]' must start with a token id"},
      {R"([[-1, 1]])", "'logit_bias[0]' must start with a token id"},
      {R"([[1.5, 1]])", "'logit_bias[0]' must start with a token id"},
      {R"([[1, 200]])", "'logit_bias[0]' must be between -100 and 100"},
  };
  for (const auto& [value, fragment] : cases) {
    auto r = Chat(value);
    ASSERT_FALSE(r.ok()) << value;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << value;
    EXPECT_NE(r.status().message().find(fragment), std::string::npos) << value << ": " << r.status().message();
    auto c = ParseCompletionRequest(json::parse(std::string(R"({"prompt": "x", "logit_bias": )") + value + "}"));
    EXPECT_FALSE(c.ok()) << value;
  }
  // A long or unprintable key is echoed shortened, never whole.
  auto r = Chat(json{{std::string(5000, 'k') + "\n", 1}}.dump());
  ASSERT_FALSE(r.ok());
  EXPECT_LT(r.status().message().size(), 200u) << r.status().message();
}

}  // namespace
}  // namespace spillway::api
