// The forced-call grammar, as text and as llama.cpp's grammar sampler over the
// tiny test model's real (SPM llama) vocabulary: random logits stand in for a
// random model, and every output must be one valid call that ends in time.
#include "worker/tool_call_grammar.h"

#include <gtest/gtest.h>
#include <llama.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <memory>
#include <random>

#include "worker/model.h"
#include "worker/sampling.h"
#include "worker/tool_call_parser.h"

namespace spillway::worker {
namespace {

using nlohmann::json;

api::ToolFunction Fn(const std::string& name, const std::string& parameters) { return {name, "", parameters}; }

TEST(ToolCallGrammarTest, LiteralsEscapeWhatGbnfWouldRead) {
  EXPECT_EQ(GbnfLiteral("a\"b\\c\nd"), R"("a\"b\\c\nd")");
  EXPECT_EQ(GbnfLiteral(std::string("\x01", 1)), R"("\x01")");
  EXPECT_EQ(GbnfLiteral("é"), "\"é\"");
}

TEST(ToolCallGrammarTest, NoPropertiesMeansEmptyArguments) {
  const std::string g = ToolCallGrammar({Fn("increment", R"({"type":"object","properties":{}})"), Fn("noop", "")});
  EXPECT_NE(g.find("tool0 ::= \"\\\"increment\\\", \\\"arguments\\\": \" \"{}\""), std::string::npos) << g;
  EXPECT_NE(g.find("tool1 ::= \"\\\"noop\\\", \\\"arguments\\\": \" \"{}\""), std::string::npos) << g;
  EXPECT_NE(g.find("call ::= tool0 | tool1"), std::string::npos) << g;
}

TEST(ToolCallGrammarTest, RequiredPropertiesComeFirstThenTheRestByName) {
  const std::string g = ToolCallGrammar(
      {Fn("f", R"({"type":"object","properties":{"a":{"type":"boolean"},"z":{"type":"integer"},"m":{"type":"number"}},
                   "required":["z"]})")});
  const size_t z = g.find(R"(\"z\")"), a = g.find(R"(\"a\")"), m = g.find(R"(\"m\")");
  ASSERT_NE(z, std::string::npos);
  EXPECT_LT(z, a);
  EXPECT_LT(a, m);
  EXPECT_NE(g.find(R"(\"z\": " int)"), std::string::npos) << g;
  EXPECT_NE(g.find(R"(\"a\": " bool)"), std::string::npos) << g;
  EXPECT_NE(g.find(R"(\"m\": " num)"), std::string::npos) << g;
}

class ToolCallGrammarVocabTest : public ::testing::Test {
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

  // Samples with `grammar` from random logits until end-of-generation; returns
  // the text (and the token count in *n). Fails if it runs past `limit`.
  static std::string Sample(const std::string& grammar, uint32_t seed, float temperature, int limit, int* n) {
    SamplerSettings s;
    s.temperature = temperature;
    s.seed = seed;
    s.grammar = grammar;
    std::unique_ptr<llama_sampler, decltype(&llama_sampler_free)> chain(
        BuildSamplerChain(s, model_->vocab(), false), llama_sampler_free);
    EXPECT_NE(chain, nullptr);
    if (!chain) return "";
    const int32_t n_vocab = llama_vocab_n_tokens(model_->vocab());
    std::mt19937 rng(seed);
    std::normal_distribution<float> logit(0.0f, 3.0f);
    std::vector<llama_token_data> cur(static_cast<size_t>(n_vocab));
    std::string text;
    for (*n = 0; *n < limit; ++*n) {
      for (int32_t t = 0; t < n_vocab; ++t) cur[static_cast<size_t>(t)] = {t, logit(rng), 0.0f};
      llama_token_data_array arr{cur.data(), cur.size(), -1, false};
      llama_sampler_apply(chain.get(), &arr);
      const llama_token tok = arr.data[arr.selected].id;
      llama_sampler_accept(chain.get(), tok);
      if (model_->IsEndOfGeneration(tok)) return text;
      text += model_->TokenPiece(tok);
    }
    ADD_FAILURE() << "no end of generation within " << limit << " tokens: " << text;
    return text;
  }

  static Model* model_;
};
Model* ToolCallGrammarVocabTest::model_ = nullptr;

TEST_F(ToolCallGrammarVocabTest, ARandomModelAlwaysWritesOneValidCallAndStops) {
  const std::vector<api::ToolFunction> tools = {
      Fn("increment", R"({"type":"object","properties":{}})"),
      Fn("label_it", R"({"type":"object","properties":{"n":{"type":"integer"},"label":{"type":"string"},
                        "x":{"type":"number"},"ok":{"type":"boolean"},"unit":{"enum":["c","f"]},
                        "any":{"type":"array"}},"required":["n"]})")};
  ASSERT_TRUE(CheckGrammar(ToolCallGrammar(tools), model_->vocab()).ok());
  int longest = 0;
  for (uint32_t seed = 1; seed <= 8; ++seed) {
    for (const auto& allowed : {std::vector<api::ToolFunction>{tools[0]}, std::vector<api::ToolFunction>{tools[1]}, tools}) {
      int n = 0;
      const std::string text = Sample(ToolCallGrammar(allowed), seed, seed % 2 ? 1.0f : 0.0f, 400, &n);
      longest = std::max(longest, n);
      SplitText split = SplitToolCalls(text, {"increment", "label_it"}, "r");
      ASSERT_EQ(split.calls.size(), 1u) << text;
      EXPECT_EQ(split.content, "") << text;
      const json args = json::parse(split.calls[0].arguments);
      if (split.calls[0].name == "increment") {
        EXPECT_EQ(split.calls[0].arguments, "{}");
        continue;
      }
      EXPECT_TRUE(args["n"].is_number_integer()) << text;
      EXPECT_TRUE(args["label"].is_string()) << text;
      EXPECT_LE(args["label"].get<std::string>().size(), 32u);
      EXPECT_TRUE(args["x"].is_number()) << text;
      EXPECT_TRUE(args["ok"].is_boolean()) << text;
      EXPECT_TRUE(args["unit"] == "c" || args["unit"] == "f") << text;
      EXPECT_TRUE(args["any"].is_string()) << text;
      EXPECT_EQ(args.begin().key(), "any");  // nlohmann sorts; the text has "n" first
      EXPECT_EQ(text.find("{\"n\": "), text.find("\"arguments\": ") + 13) << text;
    }
  }
  RecordProperty("longest_tokens", longest);
}

}  // namespace
}  // namespace spillway::worker
