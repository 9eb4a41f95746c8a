// "logit_bias" on a real spillway-worker with the tiny generated chat model:
// a bias of -100 bans the greedy token, +100 forces another, on both OpenAI
// routes, also when a stream is continued; an id outside the vocabulary is a
// 400 naming it.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "api/http_client.h"
#include "worker_process.h"

namespace spillway::testing {
namespace {

using nlohmann::json;

class WorkerLogitBiasTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    worker_ = new WorkerProcess(ModelPath("tiny-chat"), {"--slots", "2", "--ctx", "2048", "--threads", "2"});
    ASSERT_TRUE(worker_->running()) << worker_->Stderr();
  }
  static void TearDownTestSuite() {
    delete worker_;
    worker_ = nullptr;
  }

  static http::ClientResponse Post(const std::string& path, const json& body) {
    auto r = http::Fetch("127.0.0.1", worker_->port(), "POST", path, body.dump(), WorkerAuth());
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : http::ClientResponse{};
  }

  // The token ids a streamed answer reports (spillway.tokens of its events).
  static std::vector<int32_t> StreamedTokens(const std::string& path, json body) {
    body["stream"] = true;
    auto r = Post(path, body);
    EXPECT_EQ(r.status, 200) << r.body;
    std::vector<int32_t> ids;
    for (const auto& e : http::ParseSseData(r.body)) {
      json j = json::parse(e, nullptr, false);
      if (j.is_object() && j.contains("spillway") && j["spillway"].contains("tokens")) {
        for (const auto& t : j["spillway"]["tokens"]) ids.push_back(t);
      }
    }
    return ids;
  }

  static int32_t FirstToken(const std::string& path, const json& body) {
    auto ids = StreamedTokens(path, body);
    EXPECT_FALSE(ids.empty()) << body.dump();
    return ids.empty() ? -1 : ids[0];
  }

  static WorkerProcess* worker_;
};
WorkerProcess* WorkerLogitBiasTest::worker_ = nullptr;

json Completion(const std::string& prompt) {
  return {{"prompt", prompt}, {"max_tokens", 3}, {"temperature", 0}, {"ignore_eos", true}};
}

json Chat(const std::string& content) {
  return {{"messages", json::array({{{"role", "user"}, {"content", content}}})},
          {"max_tokens", 3}, {"temperature", 0}, {"ignore_eos", true}};
}

json WithBias(json body, int32_t token, const json& bias) {
  body["logit_bias"] = {{std::to_string(token), bias}};
  return body;
}

// Another prompt's greedy first token, different from `t`: a token the model
// really produces (not a control or byte token).
int32_t OtherToken(const std::string& path, int32_t t, bool chat,
                   int32_t (*first)(const std::string&, const json&)) {
  for (const char* p : {"Hello there", "12345", "Once upon a time", "zebra", "Q:", "import os"}) {
    const int32_t u = first(path, chat ? Chat(p) : Completion(p));
    if (u >= 0 && u != t) return u;
  }
  return -1;
}

TEST_F(WorkerLogitBiasTest, MinusHundredBansTheGreedyTokenAndPlusHundredForcesAnother) {
  for (const bool chat : {false, true}) {
    SCOPED_TRACE(chat ? "chat" : "completions");
    const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
    const json body = chat ? Chat("The quick brown fox") : Completion("The quick brown fox");
    const int32_t t = FirstToken(path, body);
    ASSERT_GE(t, 0);
    EXPECT_EQ(FirstToken(path, body), t);  // greedy: the same token every time

    EXPECT_NE(FirstToken(path, WithBias(body, t, -100)), t);
    EXPECT_NE(FirstToken(path, WithBias(body, t, false)), t);  // llama-server's ban

    const int32_t u = OtherToken(path, t, chat, &FirstToken);
    ASSERT_GE(u, 0);
    EXPECT_EQ(FirstToken(path, WithBias(body, u, 100)), u);
    // Sampled rather than greedy, +100 still decides, at every position.
    json sampled = WithBias(body, u, 100);
    sampled["temperature"] = 1.0;
    sampled["top_k"] = 0;
    sampled["seed"] = 99;
    EXPECT_EQ(StreamedTokens(path, sampled), std::vector<int32_t>(3, u));
    // A small bias leaves the greedy token alone: the bias is added, not a switch.
    EXPECT_EQ(FirstToken(path, WithBias(body, u, 0)), t);
  }
}

// The bias is in the body, so a continuation (what the gateway sends another
// placement after a cut) samples the same tokens with it.
TEST_F(WorkerLogitBiasTest, AContinuationKeepsTheBias) {
  json req = {{"prompt", "Continue me"}, {"max_tokens", 12}, {"temperature", 1.0}, {"seed", 4242},
              {"ignore_eos", true}};
  const std::vector<int32_t> plain = StreamedTokens("/v1/completions", req);
  ASSERT_EQ(plain.size(), 12u);
  req["logit_bias"] = {{std::to_string(plain[0]), -100}, {std::to_string(plain[4]), -100}};
  const std::vector<int32_t> biased = StreamedTokens("/v1/completions", req);
  ASSERT_EQ(biased.size(), 12u);
  for (int32_t tok : biased) {
    EXPECT_NE(tok, plain[0]);
    EXPECT_NE(tok, plain[4]);
  }
  auto whole = Post("/v1/completions", req);
  ASSERT_EQ(whole.status, 200) << whole.body;
  // Resumed after 5 delivered tokens: the same remaining tokens, so the same text.
  json resume = req;
  resume["spillway_resume"] = {{"tokens", std::vector<int32_t>(biased.begin(), biased.begin() + 5)}, {"text_bytes", 0}};
  auto cont = Post("/v1/completions", resume);
  ASSERT_EQ(cont.status, 200) << cont.body;
  const json c = json::parse(cont.body);
  EXPECT_EQ(c["choices"][0]["text"], json::parse(whole.body)["choices"][0]["text"]);
  EXPECT_EQ(c["usage"]["completion_tokens"], 12);
  // Without the bias the delivered tokens are not what the sampler makes: refused, not continued.
  resume.erase("logit_bias");
  auto bad = Post("/v1/completions", resume);
  EXPECT_EQ(bad.status, 503) << bad.body;
  EXPECT_NE(bad.body.find("not reproducible"), std::string::npos) << bad.body;
}

TEST_F(WorkerLogitBiasTest, ATokenOutsideTheVocabularyIsA400NamingIt) {
  for (const std::string path : {"/v1/completions", "/v1/chat/completions"}) {
    json body = path == "/v1/completions" ? Completion("x") : Chat("x");
    body["logit_bias"] = {{"5", 1}, {"99999999", -100}};
    auto r = Post(path, body);
    EXPECT_EQ(r.status, 400) << r.body;
    json e = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(e.is_object() && e.contains("error")) << r.body;
    const std::string msg = e["error"]["message"];
    EXPECT_NE(msg.find("'logit_bias'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("99999999"), std::string::npos) << msg;
    EXPECT_NE(msg.find("vocabulary of"), std::string::npos) << msg;
    // The admission route (the gateway asks it first) refuses it the same way.
    auto tok = http::Fetch("127.0.0.1", worker_->port(), "POST",
                           std::string("/v1/worker/tokenize?endpoint=") + (path == "/v1/completions" ? "completion" : "chat"),
                           body.dump(), WorkerAuth());
    ASSERT_TRUE(tok.ok());
    EXPECT_EQ(tok->status, 400) << tok->body;
  }
  // Wrong shapes get the gateway's 400s here too (one parser), and the worker keeps serving.
  json bad = Completion("x");
  bad["logit_bias"] = {{"abc", 1}};
  EXPECT_EQ(Post("/v1/completions", bad).status, 400);
  bad["logit_bias"] = {{"1", 1000}};
  EXPECT_EQ(Post("/v1/completions", bad).status, 400);
  EXPECT_EQ(Post("/v1/completions", Completion("x")).status, 200);
}

}  // namespace
}  // namespace spillway::testing
