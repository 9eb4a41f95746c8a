// Integration tests: real spillway-worker processes on port 0, tiny generated models.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <nlohmann/json.hpp>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "api/http_client.h"
#include "protocol/worker_protocol.h"
#include "worker_process.h"

namespace spillway::testing {
namespace {

using nlohmann::json;

json Body(const http::ClientResponse& r) { return json::parse(r.body); }

http::ClientResponse Post(const WorkerProcess& w, const std::string& path, const json& body,
                          const http::HeaderList& headers = {}) {
  auto r = http::Fetch("127.0.0.1", w.port(), "POST", path, body.dump(), WorkerAuth(headers));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : http::ClientResponse{};
}

http::ClientResponse Get(const WorkerProcess& w, const std::string& path) {
  auto r = http::Fetch("127.0.0.1", w.port(), "GET", path, "", WorkerAuth());
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : http::ClientResponse{};
}

json Completion(const WorkerProcess& w, const json& extra) {
  json body = {{"prompt", "The quick brown fox"}, {"max_tokens", 16}, {"temperature", 0}};
  if (extra.is_object()) body.update(extra);
  auto r = Post(w, "/v1/completions", body);
  EXPECT_EQ(r.status, 200) << r.body;
  return Body(r);
}

std::string Text(const json& completion) { return completion["choices"][0]["text"].get<std::string>(); }

// Waits (polling the info route) until the worker reports no busy slot.
json WaitIdle(const WorkerProcess& w) {
  json info;
  for (int i = 0; i < 500; ++i) {
    info = Body(Get(w, "/v1/worker/info"));
    if (info["slots"]["busy"] == 0 && info["slots"]["queued"] == 0 && info["kv_cells"]["reserved"] == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return info;
}

class WorkerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    chat_ = new WorkerProcess(ModelPath("tiny-chat"), {"--slots", "4", "--ctx", "8192", "--threads", "2"});
    ASSERT_TRUE(chat_->running()) << chat_->Stderr();
  }
  static void TearDownTestSuite() {
    delete chat_;
    chat_ = nullptr;
  }
  static WorkerProcess* chat_;
};
WorkerProcess* WorkerTest::chat_ = nullptr;

// The harness: whatever a test starts ends with the thread that started it,
// so a test process killed halfway (a timeout, a broken pipe) leaves no
// gateway or worker running on the machine.
TEST(TestHarness, AProcessATestStartsEndsWithTheThreadThatStartedIt) {
  pid_t pid = -1;
  std::thread starter([&] {
    pid = SpawnProcess({"/bin/sleep", "60"}, "/dev/null", "/dev/null");
    // Until it runs sleep (setpriv has set its death signal by then).
    for (int i = 0; i < 500 && ReadTextFile("/proc/" + std::to_string(pid) + "/comm") != "sleep\n"; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  starter.join();
  ASSERT_GT(pid, 0);
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 500 && done == 0; ++i) {
    done = ::waitpid(pid, &status, WNOHANG);
    if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (done == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
  ASSERT_EQ(done, pid) << "still running 5 s after the thread that started it ended";
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
}

TEST_F(WorkerTest, HealthAndInfoReportPlacementFingerprintAndMemory) {
  auto h = Get(*chat_, "/health");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(Body(h)["status"], "ok");
  json info = Body(Get(*chat_, "/v1/worker/info"));
  EXPECT_EQ(info["placement"]["device"], "cpu");
  EXPECT_EQ(info["placement"]["slots"], 4);
  EXPECT_EQ(info["fingerprint"]["model_sha256"].get<std::string>().size(), 64u);
  EXPECT_EQ(info["fingerprint"]["tokenizer_sha256"].get<std::string>().size(), 64u);
  EXPECT_FALSE(info["fingerprint"]["quantization"].get<std::string>().empty());
  ASSERT_FALSE(info["memory"]["buffers"].empty());
  size_t model_bytes = 0, context_bytes = 0;
  for (const auto& b : info["memory"]["buffers"]) {
    model_bytes += b["model"].get<size_t>();
    context_bytes += b["context"].get<size_t>();
  }
  EXPECT_GT(model_bytes, 1u << 20);  // the tiny model's weights
  EXPECT_GT(context_bytes, 0u);      // its KV cache
  ASSERT_FALSE(info["memory"]["devices"].empty());
  EXPECT_GT(info["memory"]["devices"][0]["total"].get<size_t>(), 0u);
  EXPECT_EQ(info["kv_cells"]["total"], 8192);
  EXPECT_EQ(info["kv_cells"]["per_request"], 2048);  // a stream of its own per slot
  EXPECT_EQ(info["kv_cells"]["unified"], false);
}

TEST_F(WorkerTest, GreedyOutputIsIdenticalAcrossRunsAndProcesses) {
  const std::string a = Text(Completion(*chat_, {}));
  const std::string b = Text(Completion(*chat_, {}));
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, b);
  WorkerProcess other(ModelPath("tiny-chat"), {"--slots", "1", "--ctx", "512", "--threads", "1"});
  ASSERT_TRUE(other.running()) << other.Stderr();
  EXPECT_EQ(Text(Completion(other, {})), a);
}

TEST_F(WorkerTest, SeededSamplingIsReproducible) {
  const json seeded = {{"temperature", 1.0}, {"top_k", 0}, {"top_p", 1.0}, {"min_p", 0}, {"seed", 1234}, {"max_tokens", 24}};
  const std::string a = Text(Completion(*chat_, seeded));
  const std::string b = Text(Completion(*chat_, seeded));
  EXPECT_EQ(a, b);
  json other_seed = seeded;
  other_seed["seed"] = 99;
  EXPECT_NE(Text(Completion(*chat_, other_seed)), a);
  // The seed used is reported, so an unseeded request can be replayed.
  json unseeded = seeded;
  unseeded.erase("seed");
  json first = Completion(*chat_, unseeded);
  json replay = seeded;
  replay["seed"] = first["spillway"]["seed"];
  EXPECT_EQ(Text(Completion(*chat_, replay)), Text(first));
}

TEST_F(WorkerTest, MaxTokensEndsGenerationExactly) {
  json c = Completion(*chat_, {{"max_tokens", 7}, {"ignore_eos", true}});
  EXPECT_EQ(c["usage"]["completion_tokens"], 7);
  EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(c["spillway"]["max_tokens"], 7);
}

TEST_F(WorkerTest, StopStringEndsGenerationBeforeIt) {
  const std::string full = Text(Completion(*chat_, {{"max_tokens", 40}, {"ignore_eos", true}}));
  ASSERT_GE(full.size(), 12u) << full;
  // Three bytes or more from byte 6 on, cut at UTF-8 character boundaries
  // (the random model's text is multilingual).
  auto boundary = [&](size_t i) {
    while (i < full.size() && (static_cast<unsigned char>(full[i]) & 0xC0) == 0x80) ++i;
    return i;
  };
  const size_t from = boundary(6), to = boundary(from + 3);
  ASSERT_LT(to, full.size()) << full;
  const std::string stop = full.substr(from, to - from);
  json c = Completion(*chat_, {{"max_tokens", 40}, {"ignore_eos", true}, {"stop", json::array({stop})}});
  EXPECT_EQ(c["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(Text(c), full.substr(0, full.find(stop)));
}

TEST_F(WorkerTest, StreamedAndNonStreamedCarryTheSameText) {
  const json req = {{"messages", json::array({{{"role", "user"}, {"content", "Tell me a story"}}})},
                    {"max_tokens", 30}, {"temperature", 0}, {"ignore_eos", true}};
  auto plain = Post(*chat_, "/v1/chat/completions", req);
  ASSERT_EQ(plain.status, 200) << plain.body;
  const json pj = Body(plain);
  EXPECT_EQ(pj["object"], "chat.completion");
  EXPECT_EQ(pj["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(plain.Header("x-request-id"), pj["id"]);

  json sreq = req;
  sreq["stream"] = true;
  sreq["stream_options"] = {{"include_usage", true}};
  auto streamed = Post(*chat_, "/v1/chat/completions", sreq);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  EXPECT_EQ(streamed.Header("content-type"), "text/event-stream");
  auto events = http::ParseSseData(streamed.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  std::string finish;
  int usage_tokens = -1;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json e = json::parse(events[i]);
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    if (e.contains("usage")) usage_tokens = e["usage"]["completion_tokens"];
    if (e["choices"].empty()) continue;
    const auto& d = e["choices"][0]["delta"];
    if (d.contains("content")) text += d["content"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, pj["choices"][0]["message"]["content"]);
  EXPECT_EQ(finish, "length");
  EXPECT_EQ(usage_tokens, 30);
}

json ToolRequest(const json& parameters, bool stream) {
  json fn = {{"name", "increment"}};
  if (!parameters.is_null()) fn["parameters"] = parameters;
  return {{"messages", json::array({{{"role", "user"}, {"content", "Count up"}}})},
          {"tools", json::array({{{"type", "function"}, {"function", fn}}})},
          {"tool_choice", "required"}, {"parallel_tool_calls", false},
          {"temperature", 1.0}, {"seed", 31337}, {"max_tokens", 300}, {"stream", stream}};
}

// The stream's tool calls (deltas joined by index, as the SDKs do), finish
// reason and token ids.
struct StreamedCalls {
  json calls = json::array();
  size_t call_deltas = 0;
  std::string finish;
  std::vector<int32_t> tokens;
  std::string content;
};
StreamedCalls ReadStream(const std::string& sse) {
  StreamedCalls out;
  for (const auto& e : http::ParseSseData(sse)) {
    if (e == "[DONE]") continue;
    json j = json::parse(e);
    if (j.contains("spillway") && j["spillway"].contains("tokens")) {
      for (const auto& t : j["spillway"]["tokens"]) out.tokens.push_back(t);
    }
    if (j["choices"].empty()) continue;
    const json& c = j["choices"][0];
    if (c["delta"].contains("tool_calls")) {
      for (const auto& d : c["delta"]["tool_calls"]) {
        ++out.call_deltas;
        const size_t i = d["index"];
        if (out.calls.size() <= i) out.calls.push_back({{"index", i}, {"function", {{"arguments", ""}}}});
        json& call = out.calls[i];
        if (d.contains("id")) call["id"] = d["id"];
        if (d.contains("type")) call["type"] = d["type"];
        if (d.contains("function") && d["function"].contains("name")) call["function"]["name"] = d["function"]["name"];
        if (d.contains("function") && d["function"].contains("arguments")) {
          call["function"]["arguments"] = call["function"]["arguments"].get<std::string>() +
                                          d["function"]["arguments"].get<std::string>();
        }
      }
    }
    if (c["delta"].contains("content") && c["delta"]["content"].is_string()) out.content += c["delta"]["content"];
    if (c["finish_reason"].is_string()) out.finish = c["finish_reason"];
  }
  return out;
}

TEST_F(WorkerTest, RequiredToolChoiceMakesARealToolCall) {
  const json no_props = {{"type", "object"}, {"properties", json::object()}};
  auto r = Post(*chat_, "/v1/chat/completions", ToolRequest(no_props, false), {{"X-Request-Id", "tools-1"}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json body = Body(r);
  const json& msg = body["choices"][0]["message"];
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls") << r.body;
  EXPECT_TRUE(msg["content"].is_null()) << r.body;
  ASSERT_EQ(msg["tool_calls"].size(), 1u) << r.body;
  EXPECT_EQ(msg["tool_calls"][0]["type"], "function");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "increment");
  // No properties: an empty object (with whatever whitespace the grammar allows).
  EXPECT_EQ(json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()), json::object()) << r.body;
  EXPECT_EQ(msg["tool_calls"][0]["id"].get<std::string>().rfind("call_", 0), 0u);

  // Streamed as llama-server streams it (the call's id and name first, then
  // pieces of its arguments): every token id once, the same call; a second
  // run with the same seed and request id is byte-identical.
  auto s1 = Post(*chat_, "/v1/chat/completions", ToolRequest(no_props, true), {{"X-Request-Id", "tools-1"}});
  auto s2 = Post(*chat_, "/v1/chat/completions", ToolRequest(no_props, true), {{"X-Request-Id", "tools-1"}});
  ASSERT_EQ(s1.status, 200) << s1.body;
  ASSERT_EQ(s2.status, 200) << s2.body;
  StreamedCalls a = ReadStream(s1.body), b = ReadStream(s2.body);
  EXPECT_EQ(a.finish, "tool_calls") << s1.body;
  ASSERT_EQ(a.calls.size(), 1u) << s1.body;
  EXPECT_EQ(a.calls[0]["index"], 0);
  EXPECT_EQ(a.calls[0]["id"], msg["tool_calls"][0]["id"]);
  EXPECT_EQ(a.calls[0]["function"]["name"], "increment");
  EXPECT_EQ(a.calls[0]["function"]["arguments"], msg["tool_calls"][0]["function"]["arguments"]);
  EXPECT_GE(a.call_deltas, 1u);
  EXPECT_EQ(a.content, "");
  EXPECT_EQ(a.tokens.size(), body["usage"]["completion_tokens"].get<size_t>());
  EXPECT_EQ(a.calls, b.calls);
  EXPECT_EQ(a.tokens, b.tokens);
  auto strip_timings = [](std::string sse) {
    std::string out;
    for (const auto& e : http::ParseSseData(sse)) {
      json j = json::parse(e, nullptr, false);
      if (j.is_object() && j.contains("spillway")) j["spillway"].erase("timings");
      if (j.is_object()) j.erase("created");
      out += (j.is_discarded() ? e : j.dump()) + "\n";
    }
    return out;
  };
  EXPECT_EQ(strip_timings(s1.body), strip_timings(s2.body));

  // The grammar is part of the sampler state a continuation replays.
  json resume = ToolRequest(no_props, false);
  resume["spillway_resume"] = {{"tokens", std::vector<int32_t>(a.tokens.begin(), a.tokens.begin() + 5)}, {"text_bytes", 0}};
  auto cont = Post(*chat_, "/v1/chat/completions", resume, {{"X-Request-Id", "tools-1"}});
  ASSERT_EQ(cont.status, 200) << cont.body;
  EXPECT_EQ(Body(cont)["choices"][0]["message"]["tool_calls"], msg["tool_calls"]);
}

TEST_F(WorkerTest, ToolArgumentsFollowTheSchemaTypes) {
  const json params = {{"type", "object"},
                       {"properties", {{"n", {{"type", "integer"}}},
                                       // Bounded: a random model would not close an unbounded string.
                                       {"label", {{"type", "string"}, {"maxLength", 8}}}}},
                       {"required", {"n", "label"}}};
  for (uint32_t seed : {1u, 2u, 3u}) {
    json req = ToolRequest(params, false);
    req["seed"] = seed;
    auto r = Post(*chat_, "/v1/chat/completions", req);
    ASSERT_EQ(r.status, 200) << r.body;
    const json body = Body(r);
    ASSERT_EQ(body["choices"][0]["message"]["tool_calls"].size(), 1u) << r.body;
    const json args = json::parse(body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>());
    ASSERT_TRUE(args.is_object()) << r.body;
    EXPECT_EQ(args.size(), 2u) << r.body;
    EXPECT_TRUE(args["n"].is_number_integer()) << r.body;
    EXPECT_TRUE(args["label"].is_string()) << r.body;
  }
  // A function that is not among the tools is refused before any work.
  json bad = ToolRequest(params, false);
  bad["tool_choice"] = {{"type", "function"}, {"function", {{"name", "decrement"}}}};
  auto r = Post(*chat_, "/v1/chat/completions", bad);
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("tool_choice.function.name"), std::string::npos) << r.body;
}

// response_format is a grammar, not a hope: even the random model answers
// JSON that follows the schema, on chat and on completions.
TEST_F(WorkerTest, ResponseFormatMakesSchemaValidJson) {
  const json schema = {{"type", "object"},
                       {"properties", {{"n", {{"type", "integer"}}}, {"ok", {{"type", "boolean"}}}}},
                       {"required", {"n", "ok"}},
                       {"additionalProperties", false}};
  for (uint32_t seed : {1u, 2u}) {
    json req = {{"messages", json::array({{{"role", "user"}, {"content", "JSON please"}}})},
                {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "r"}, {"strict", true}, {"schema", schema}}}}},
                {"temperature", 1.0}, {"seed", seed}, {"max_tokens", 200}};
    auto r = Post(*chat_, "/v1/chat/completions", req);
    ASSERT_EQ(r.status, 200) << r.body;
    const json out = json::parse(Body(r)["choices"][0]["message"]["content"].get<std::string>(), nullptr, false);
    ASSERT_TRUE(out.is_object()) << r.body;
    EXPECT_TRUE(out["n"].is_number_integer()) << r.body;
    EXPECT_TRUE(out["ok"].is_boolean()) << r.body;
    EXPECT_EQ(out.size(), 2u) << r.body;
  }
  json completion = {{"prompt", "Data:"}, {"response_format", {{"type", "json_object"}}}, {"temperature", 1.0},
                     {"seed", 3}, {"max_tokens", 200}};
  auto c = Post(*chat_, "/v1/completions", completion);
  ASSERT_EQ(c.status, 200) << c.body;
  const std::string text = Text(Body(c));
  if (Body(c)["choices"][0]["finish_reason"] == "stop") {
    EXPECT_TRUE(json::parse(text, nullptr, false).is_object()) << text;
  } else {
    EXPECT_EQ(text.rfind("{", 0), 0u) << text;  // cut by max_tokens, but an object so far
  }
}

TEST_F(WorkerTest, LogprobsReportTheModelsDistribution) {
  json req = {{"messages", json::array({{{"role", "user"}, {"content", "Hi"}}})}, {"temperature", 0},
              {"max_tokens", 5}, {"logprobs", true}, {"top_logprobs", 2}};
  auto r = Post(*chat_, "/v1/chat/completions", req);
  ASSERT_EQ(r.status, 200) << r.body;
  const json whole = Body(r);
  const json& lp = whole["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), 5u) << r.body;
  for (const auto& t : lp) {
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    ASSERT_EQ(t["top_logprobs"].size(), 2u);
    EXPECT_EQ(t["logprob"], t["top_logprobs"][0]["logprob"]);  // greedy picks the most likely
    EXPECT_GE(t["top_logprobs"][0]["logprob"].get<double>(), t["top_logprobs"][1]["logprob"].get<double>());
  }
  // Streamed: the same numbers, spread over the chunks.
  req["stream"] = true;
  auto s = Post(*chat_, "/v1/chat/completions", req);
  json streamed = json::array();
  for (const auto& e : http::ParseSseData(s.body)) {
    json j = json::parse(e, nullptr, false);
    if (!j.is_object() || j["choices"].empty() || !j["choices"][0]["logprobs"].is_object()) continue;
    for (const auto& t : j["choices"][0]["logprobs"]["content"]) streamed.push_back(t);
  }
  EXPECT_EQ(streamed, lp);
  // Completions: the legacy shape.
  auto c = Post(*chat_, "/v1/completions", {{"prompt", "Hi"}, {"temperature", 0}, {"max_tokens", 3}, {"logprobs", 1}});
  const json cbody = Body(c);
  const json& cl = cbody["choices"][0]["logprobs"];
  EXPECT_EQ(cl["tokens"].size(), 3u) << c.body;
  EXPECT_EQ(cl["token_logprobs"].size(), 3u);
  EXPECT_EQ(cl["top_logprobs"][0].size(), 1u);
}

// A chat stream cut after some events continues with exactly the deltas the
// client has not had: the replayed tokens' text is parsed, not sent again.
TEST_F(WorkerTest, AChatStreamContinuesWhereItsDeliveredDeltasEnd) {
  json req = {{"messages", json::array({{{"role", "user"}, {"content", "Go on"}}})}, {"max_tokens", 24},
              {"temperature", 1.0}, {"seed", 77}, {"ignore_eos", true}, {"stream", true}};
  auto whole = Post(*chat_, "/v1/chat/completions", req, {{"X-Request-Id", "cont-chat"}});
  ASSERT_EQ(whole.status, 200) << whole.body;
  std::vector<int32_t> ids, cut_ids;
  std::string content, delivered;
  for (const auto& e : http::ParseSseData(whole.body)) {
    json j = json::parse(e, nullptr, false);
    if (!j.is_object() || j["choices"].empty()) continue;
    const json& d = j["choices"][0]["delta"];
    if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
    if (j.contains("spillway") && j["spillway"].contains("tokens")) {
      for (const auto& t : j["spillway"]["tokens"]) ids.push_back(t);
    }
    if (cut_ids.empty() && ids.size() >= 8) {
      cut_ids = ids;  // the stream is cut after this event
      delivered = content;
    }
  }
  ASSERT_EQ(ids.size(), 24u);
  ASSERT_FALSE(cut_ids.empty());
  json resume = req;
  resume["spillway_resume"] = {{"tokens", cut_ids}, {"text_bytes", delivered.size()}};
  auto cont = Post(*chat_, "/v1/chat/completions", resume, {{"X-Request-Id", "cont-chat"}});
  ASSERT_EQ(cont.status, 200) << cont.body;
  StreamedCalls rest = ReadStream(cont.body);
  EXPECT_EQ(delivered + rest.content, content);
  std::vector<int32_t> joined = cut_ids;
  joined.insert(joined.end(), rest.tokens.begin(), rest.tokens.end());
  EXPECT_EQ(joined, ids);
  // A count of delivered bytes the replay does not reproduce is refused.
  resume["spillway_resume"]["text_bytes"] = delivered.size() + 1;
  auto bad = Post(*chat_, "/v1/chat/completions", resume, {{"X-Request-Id", "cont-chat"}});
  EXPECT_NE(bad.body.find("not reproducible"), std::string::npos) << bad.body;
  // Continued where its cap (a CPU path's) is at or below what was delivered:
  // at its length, it ends so, with nothing new (it was refused, and the
  // client's stream ended failed after its answer).
  json capped = resume;
  capped["spillway_resume"]["text_bytes"] = delivered.size();
  capped["max_tokens"] = static_cast<int>(cut_ids.size());
  capped["stream_options"] = {{"include_usage", true}};
  auto at_length = Post(*chat_, "/v1/chat/completions", capped, {{"X-Request-Id", "cont-chat"}});
  ASSERT_EQ(at_length.status, 200) << at_length.body;
  EXPECT_NE(at_length.body.find("\"finish_reason\":\"length\""), std::string::npos) << at_length.body;
  EXPECT_EQ(ReadStream(at_length.body).content, "") << at_length.body;
  EXPECT_NE(at_length.body.find("\"completion_tokens\":" + std::to_string(cut_ids.size())), std::string::npos)
      << at_length.body;
  EXPECT_EQ(at_length.body.find("error"), std::string::npos) << at_length.body;
  EXPECT_EQ(at_length.body.find("\"role\""), std::string::npos) << "the message began before: " << at_length.body;
}

constexpr int kEndToken = 2;  // </s> in llama.cpp's SPM vocabulary, which the generated models use

TEST_F(WorkerTest, ContinuationReplaysDeliveredTokensAndRefusesOthers) {
  json req = {{"prompt", "Continue me"}, {"max_tokens", 20}, {"temperature", 1.0}, {"top_k", 0}, {"top_p", 1.0},
              {"min_p", 0}, {"seed", 4242}, {"ignore_eos", true}, {"stream", true}};
  auto streamed = Post(*chat_, "/v1/completions", req);
  ASSERT_EQ(streamed.status, 200);
  std::vector<int32_t> ids;
  std::string text;
  for (const auto& e : http::ParseSseData(streamed.body)) {
    json j = json::parse(e, nullptr, false);
    if (!j.is_object() || !j.contains("choices") || j["choices"].empty()) continue;
    text += j["choices"][0]["text"].get<std::string>();
    if (j.contains("spillway") && j["spillway"].contains("tokens")) {
      for (const auto& t : j["spillway"]["tokens"]) ids.push_back(t);
    }
  }
  ASSERT_EQ(ids.size(), 20u);
  // Resume after 7 delivered tokens: same sampler state, same remaining tokens.
  json resume = req;
  resume["stream"] = false;
  resume["spillway_resume"] = {{"tokens", std::vector<int32_t>(ids.begin(), ids.begin() + 7)}, {"text_bytes", 0}};
  auto cont = Post(*chat_, "/v1/completions", resume);
  ASSERT_EQ(cont.status, 200) << cont.body;
  EXPECT_EQ(Text(Body(cont)), text);
  EXPECT_EQ(Body(cont)["usage"]["completion_tokens"], 20);
  // Tokens the sampler would not have produced are refused, not continued.
  auto wrong = std::vector<int32_t>(ids.begin(), ids.begin() + 7);
  wrong[3] = wrong[3] == 500 ? 501 : 500;
  resume["spillway_resume"]["tokens"] = wrong;
  auto bad = Post(*chat_, "/v1/completions", resume);
  EXPECT_EQ(bad.status, 503) << bad.body;
  EXPECT_NE(Body(bad)["error"]["message"].get<std::string>().find("not reproducible"), std::string::npos) << bad.body;
  // A replay that diverges into an end-of-generation token is not
  // reproducible either: it ended as "stop", and the replayed text went to
  // the client a second time. (The bias makes the end token, </s>, come first.)
  json ends = resume;
  ends.erase("ignore_eos");
  ends["logit_bias"] = {{std::to_string(kEndToken), 100}};
  ends["spillway_resume"] = {{"tokens", std::vector<int32_t>(ids.begin(), ids.begin() + 7)}, {"text_bytes", 0}};
  auto diverged = Post(*chat_, "/v1/completions", ends);
  EXPECT_EQ(diverged.status, 503) << diverged.body;
  EXPECT_NE(diverged.body.find("not reproducible"), std::string::npos) << diverged.body;
  resume["spillway_resume"] = {{"tokens", {1, -2}}};
  EXPECT_EQ(Post(*chat_, "/v1/completions", resume).status, 400);
}

TEST_F(WorkerTest, ConcurrentRequestsAllCompleteOnSeveralSlots) {
  std::vector<std::future<json>> futures;
  for (int i = 0; i < 4; ++i) {
    futures.push_back(std::async(std::launch::async, [i] {
      return Completion(*chat_, {{"prompt", "request number " + std::to_string(i)}, {"max_tokens", 20}, {"ignore_eos", true}});
    }));
  }
  std::vector<std::string> texts;
  for (auto& f : futures) {
    json c = f.get();
    EXPECT_EQ(c["usage"]["completion_tokens"], 20);
    texts.push_back(Text(c));
  }
  // Batched together, each still equals its own solo greedy run.
  EXPECT_EQ(texts[2], Text(Completion(*chat_, {{"prompt", "request number 2"}, {"max_tokens", 20}, {"ignore_eos", true}})));
  WaitIdle(*chat_);
}

// Batch invariance: a seeded request's 200 tokens are the same alone and
// while three others decode beside it (started before and after it), which
// failover replay, continuation and the proving suite's token equivalence
// all rely on. Returns how many of `rounds` concurrent runs differed.
int RunsThatDependOnTheirNeighbours(const WorkerProcess& w, int rounds) {
  const json req = {{"prompt", "Tell me about the sea and the mountains in spring"}, {"max_tokens", 200},
                    {"temperature", 0.8}, {"seed", 5}, {"ignore_eos", true}};
  const std::string alone = Text(Completion(w, req));
  int differed = 0;
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::future<json>> others;
    for (int i = 0; i < 3; ++i) {
      if (i == round % 3) std::this_thread::sleep_for(std::chrono::milliseconds(30));
      others.push_back(std::async(std::launch::async, [&w, i, round] {
        return Completion(w, {{"prompt", "neighbour " + std::to_string(i + round)}, {"max_tokens", 120 + 40 * i},
                              {"temperature", 1.0}, {"seed", i}, {"ignore_eos", true}});
      }));
    }
    differed += Text(Completion(w, req)) != alone;
    for (auto& f : others) f.get();
  }
  return differed;
}

TEST_F(WorkerTest, ARequestsTokensDoNotDependOnWhatRunsBesideIt) {
  EXPECT_EQ(RunsThatDependOnTheirNeighbours(*chat_, 3), 0);
  WaitIdle(*chat_);
}

// Prefix reuse: a chat's next turn starts from what its slot's cache holds of
// the conversation. Each turn's answer (text and every token's log
// probabilities) must be what a worker that computes every prompt whole
// gives, and the cached tokens must say so: the conversation's turns, the
// same request again (all of the prompt found), one that leaves the cached
// conversation near its end (the cache's tail dropped), and a prompt that
// shares only its beginning, which must leave the conversation's slot alone.
TEST_F(WorkerTest, AChatsNextTurnReusesItsCachedBeginningAndAnswersAsAFreshPrefill) {
  WorkerProcess fresh(ModelPath("tiny-chat"),
                      {"--slots", "4", "--ctx", "8192", "--threads", "2", "--no-prefix-reuse"});
  ASSERT_TRUE(fresh.running()) << fresh.Stderr();
  auto ask = [](const WorkerProcess& w, const json& messages) {
    const json req = {{"messages", messages}, {"max_tokens", 24}, {"temperature", 0.9}, {"seed", 11},
                      {"ignore_eos", true}, {"logprobs", true}, {"top_logprobs", 2}};
    auto r = Post(w, "/v1/chat/completions", req);
    EXPECT_EQ(r.status, 200) << r.body;
    return Body(r);
  };
  auto cached = [](const json& answer) { return answer["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(); };
  auto same = [&](const json& reused, const json& whole, const std::string& what) {
    EXPECT_EQ(reused["choices"][0]["message"], whole["choices"][0]["message"]) << what;
    EXPECT_EQ(reused["choices"][0]["logprobs"], whole["choices"][0]["logprobs"]) << what;
    EXPECT_EQ(reused["usage"]["prompt_tokens"], whole["usage"]["prompt_tokens"]) << what;
    EXPECT_EQ(cached(whole), 0) << what;
  };
  json conversation = json::array({{{"role", "user"}, {"content", "Tell me about the sea in winter, at length."}}});
  int last_prompt = 0;
  for (const char* next : {"And the mountains?", "Which of the two is colder?", "Thank you."}) {
    const json reused = ask(*chat_, conversation), whole = ask(fresh, conversation);
    same(reused, whole, "turn " + std::to_string(conversation.size() / 2 + 1));
    if (last_prompt > 0) {
      // The earlier turns' prompt at least (the reply, as the template writes it again, may differ in its last tokens).
      EXPECT_GE(cached(reused), last_prompt) << reused.dump();
    }
    last_prompt = reused["usage"]["prompt_tokens"].get<int>();
    conversation.push_back({{"role", "assistant"}, {"content", reused["choices"][0]["message"]["content"]}});
    conversation.push_back({{"role", "user"}, {"content", next}});
  }
  // The same request twice: the second finds all of its prompt but the last token.
  const json turn = ask(*chat_, conversation);
  EXPECT_GE(cached(turn), last_prompt);
  const json again = ask(*chat_, conversation), again_whole = ask(fresh, conversation);
  same(turn, again_whole, "the last turn");
  same(again, again_whole, "the same request again");
  EXPECT_EQ(cached(again), again["usage"]["prompt_tokens"].get<int>() - 1);
  // Leaving it near its end (its last message changed): the cache's tail goes.
  json other = conversation;
  other.back()["content"] = "Something else entirely.";
  const json diverged = ask(*chat_, other), diverged_whole = ask(fresh, other);
  same(diverged, diverged_whole, "a conversation that leaves the cached one");
  EXPECT_GT(cached(diverged), 0);
  EXPECT_LT(cached(diverged), diverged["usage"]["prompt_tokens"].get<int>() - 1);
  // A prompt that shares only a short beginning with it (its first turn
  // alone) goes to another slot: the conversation's cache stays whole.
  const json first = ask(*chat_, json::array({conversation[0]})), first_whole = ask(fresh, json::array({conversation[0]}));
  same(first, first_whole, "the first turn again");
  const json resumed = ask(*chat_, other);
  same(resumed, diverged_whole, "the conversation after another prompt");
  EXPECT_EQ(cached(resumed), resumed["usage"]["prompt_tokens"].get<int>() - 1);
  // What the gateway's count hears: how much a run sent now would find cached
  // (the conversation's slot), and nothing much for a prompt of its own.
  auto count = [&](const json& messages) {
    const json c = Body(Post(*chat_, std::string(protocol::kTokenizePath) + "?endpoint=chat", {{"messages", messages}}));
    return std::make_pair(c.value("cached_tokens", 0), c["prompt_tokens"].get<int>());
  };
  const auto [held, counted] = count(other);
  EXPECT_EQ(held, counted - 1);
  const auto [held_new, counted_new] = count(json::array({{{"role", "user"}, {"content", "A question of its own."}}}));
  EXPECT_LT(held_new, counted_new / 2);
  const json info = Body(Get(*chat_, "/v1/worker/info"));
  EXPECT_TRUE(info["prefix_reuse"]["on"].get<bool>());
  EXPECT_GT(info["prefix_reuse"]["reused_prompt_tokens"].get<int>(), 0);
  EXPECT_FALSE(Body(Get(fresh, "/v1/worker/info"))["prefix_reuse"]["on"].get<bool>());
  WaitIdle(*chat_);
}

// A chat the gateway counts first (its tokenize call) and then runs is
// rendered and tokenized once: the run finds the count's rendering. Whatever
// is found must be what a worker that renders every time gives: the count,
// the answer and its log probabilities, for bodies that differ from a kept
// one only where a template never reads (max_tokens, the seed, the gateway's
// own members) and for bodies that render otherwise (tools, tool_choice,
// response_format, a tail that "truncate" keeps).
TEST_F(WorkerTest, AChatCountedThenRunIsRenderedOnceAndAnswersAsRenderedAnew) {
  WorkerProcess fresh(ModelPath("tiny-chat"),
                      {"--slots", "4", "--ctx", "8192", "--threads", "2", "--rendered-prompts", "0"});
  ASSERT_TRUE(fresh.running()) << fresh.Stderr();
  auto rendered = [](const WorkerProcess& w) { return Body(Get(w, "/v1/worker/info"))["rendered_prompts"]; };
  const json before = rendered(*chat_);
  json messages = json::array({{{"role", "system"}, {"content", "You keep a lighthouse."}}});
  for (int i = 0; i < 6; ++i) {
    messages.push_back({{"role", "user"}, {"content", "Question " + std::to_string(i) + " about the storm?"}});
    messages.push_back({{"role", "assistant"}, {"content", "Answer " + std::to_string(i) + ": the sea is rough."}});
  }
  messages.push_back({{"role", "user"}, {"content", "And tonight?"}});
  const json tools = json::array({{{"type", "function"},
                                   {"function", {{"name", "get_weather"},
                                                 {"parameters", {{"type", "object"},
                                                                 {"properties", {{"city", {{"type", "string"}}}}}}}}}}});
  // Each body: counted, then run as the gateway sends it (max_tokens set, its own members added).
  // (fit_cells: a "truncate" counted for a placement of that context, whose
  // tail the run is pinned to, as the gateway pins it.)
  // (shown: the run's body's rendering, prompt and tokens, by the worker's /apply-template.)
  auto count_and_run = [&](const WorkerProcess& w, json body, int* counted, json* shown, int fit_cells = 0) {
    auto c = Post(w, std::string(protocol::kTokenizePath) + "?endpoint=chat" +
                         (fit_cells ? "&fit_cells=" + std::to_string(fit_cells) : ""), body);
    EXPECT_EQ(c.status, 200) << c.body;
    *counted = Body(c)["prompt_tokens"].get<int>();
    if (fit_cells) {
      EXPECT_GT(Body(c).value("dropped_messages", 0), 0) << c.body;
      body["spillway_drop_messages"] = Body(c).value("dropped_messages", 0);
    }
    body["max_tokens"] = 12;
    body["spillway_fit_context"] = true;
    auto r = Post(w, "/v1/chat/completions", body);
    EXPECT_EQ(r.status, 200) << r.body;
    auto a = Post(w, std::string(protocol::kApplyTemplatePath), body);
    EXPECT_EQ(a.status, 200) << a.body;
    *shown = Body(a);
    return Body(r);
  };
  const json base = {{"messages", messages}, {"temperature", 0.9}, {"seed", 5}, {"logprobs", true}, {"top_logprobs", 2}};
  json with_tools = base;
  with_tools["tools"] = tools;
  json no_tool = with_tools;
  no_tool["tool_choice"] = "none";
  json as_json = base;
  as_json["response_format"] = {{"type", "json_object"}};
  json long_answer = base;  // (ignore_eos is not for a JSON answer, which ends where the JSON does)
  long_answer["ignore_eos"] = true;
  json reseeded = base;
  reseeded["seed"] = 6;
  json asked_max = base;
  asked_max["max_tokens"] = 40;
  json truncated = base;
  truncated["truncate"] = true;
  int base_tokens = 0;
  for (const auto& [what, body] : std::vector<std::pair<std::string, json>>{{"the conversation", base},
                                                                          {"with tools", with_tools},
                                                                          {"tool_choice none", no_tool},
                                                                          {"response_format", as_json},
                                                                          {"ignore_eos", long_answer},
                                                                          {"another seed", reseeded},
                                                                          {"its own max_tokens", asked_max},
                                                                          {"the conversation again", base},
                                                                          {"a kept tail", truncated}}) {
    int kept_count = 0, fresh_count = 0;
    json kept_shown, fresh_shown;
    const int fit = what == "a kept tail" ? 160 : 0;
    const json kept = count_and_run(*chat_, body, &kept_count, &kept_shown, fit),
               anew = count_and_run(fresh, body, &fresh_count, &fresh_shown, fit);
    EXPECT_EQ(kept_count, fresh_count) << what;
    EXPECT_EQ(kept_shown, fresh_shown) << what;
    EXPECT_EQ(kept["usage"]["prompt_tokens"], anew["usage"]["prompt_tokens"]) << what;
    EXPECT_EQ(kept["usage"]["prompt_tokens"].get<int>(), kept_count) << what;
    EXPECT_EQ(kept["choices"][0]["message"], anew["choices"][0]["message"]) << what;
    EXPECT_EQ(kept["choices"][0]["logprobs"], anew["choices"][0]["logprobs"]) << what;
    if (what == "the conversation") base_tokens = kept_count;
    if (what == "with tools") {
      EXPECT_GT(kept_count, base_tokens) << "the tools are in the prompt";
    }
    if (what == "a kept tail") {
      EXPECT_LT(kept_count, base_tokens) << "the oldest messages left out";
    }
  }
  // Each body's run (and its /apply-template) found its count's rendering
  // (the kept tail's too); the reseeded, the max_tokens and the repeated one
  // found the first's at their count too. (The truncated body's count
  // rendered the whole conversation and tails: misses of its own.)
  const json after = rendered(*chat_);
  EXPECT_EQ(after["hits"].get<int>() - before["hits"].get<int>(), 21) << after.dump();
  EXPECT_GT(after["misses"].get<int>() - before["misses"].get<int>(), 5) << after.dump();
  EXPECT_GE(after["kept"].get<int>(), 1);
  // A completion's text is tokenized once for its count and its run too
  // (and another text is another key).
  json completion = {{"temperature", 0.9}, {"seed", 3}, {"logprobs", 2}};
  auto count_and_complete = [&](const WorkerProcess& w, int* counted) {
    auto c = Post(w, std::string(protocol::kTokenizePath) + "?endpoint=completion", completion);
    EXPECT_EQ(c.status, 200) << c.body;
    *counted = Body(c)["prompt_tokens"].get<int>();
    json run = completion;
    run["max_tokens"] = 12;
    auto r = Post(w, "/v1/completions", run);
    EXPECT_EQ(r.status, 200) << r.body;
    return Body(r);
  };
  for (const char* text : {"The storm came in from the west, and the keeper", "Fog, then a bell across the water"}) {
    completion["prompt"] = text;
    int kept_count = 0, fresh_count = 0;
    const json kept = count_and_complete(*chat_, &kept_count), anew = count_and_complete(fresh, &fresh_count);
    EXPECT_EQ(kept_count, fresh_count) << text;
    EXPECT_EQ(kept["usage"]["prompt_tokens"], anew["usage"]["prompt_tokens"]) << text;
    EXPECT_EQ(kept["choices"][0]["text"], anew["choices"][0]["text"]) << text;
    EXPECT_EQ(kept["choices"][0]["logprobs"], anew["choices"][0]["logprobs"]) << text;
  }
  EXPECT_EQ(rendered(*chat_)["hits"].get<int>() - after["hits"].get<int>(), 2);
  EXPECT_EQ(rendered(fresh)["hits"], 0);
  EXPECT_EQ(rendered(fresh)["kept"], 0);
  WaitIdle(*chat_);
}

// The check above can fail: with one KV pool shared by the slots (cells of
// concurrent requests interleaved) and flash attention, tokens do depend on
// the neighbours.
TEST(WorkerKvUnifiedTest, SharedKvPoolMakesTokensDependOnNeighbours) {
  WorkerProcess w(ModelPath("tiny-chat"), {"--slots", "4", "--ctx", "2048", "--threads", "2", "--kv-unified"});
  ASSERT_TRUE(w.running()) << w.Stderr();
  EXPECT_GT(RunsThatDependOnTheirNeighbours(w, 3), 0);
}

TEST_F(WorkerTest, CancelFreesTheSlotWhileOthersContinue) {
  auto long_req = std::async(std::launch::async, [] {
    return Post(*chat_, "/v1/completions",
                {{"prompt", "long"}, {"max_tokens", 1500}, {"ignore_eos", true}, {"temperature", 0}},
                {{"X-Request-Id", "cancel-me-1"}});
  });
  auto other = std::async(std::launch::async, [] {
    return Completion(*chat_, {{"prompt", "short one"}, {"max_tokens", 10}, {"ignore_eos", true}});
  });
  // A DELETE that arrives before the request is remembered (404 now, refused
  // on arrival), one that finds it running answers 200: both end it cancelled.
  for (int i = 0; i < 200; ++i) {
    auto r = http::Fetch("127.0.0.1", chat_->port(), "DELETE", "/v1/worker/requests/cancel-me-1", "", WorkerAuth());
    ASSERT_TRUE(r.ok());
    if (r->status == 200 || long_req.wait_for(std::chrono::milliseconds(10)) == std::future_status::ready) break;
  }
  auto lr = long_req.get();
  EXPECT_EQ(lr.status, 499) << lr.body;
  EXPECT_EQ(Body(lr)["error"]["code"], "cancelled");
  EXPECT_EQ(other.get()["usage"]["completion_tokens"], 10);
  json info = WaitIdle(*chat_);
  EXPECT_EQ(info["slots"]["busy"], 0);
  EXPECT_EQ(info["kv_cells"]["reserved"], 0);
  // Cancelling an unknown id is a 404.
  auto r = http::Fetch("127.0.0.1", chat_->port(), "DELETE", "/v1/worker/requests/nope", "", WorkerAuth());
  EXPECT_EQ(r->status, 404);
}

// A cancel that found nothing is remembered against the id's arrival, but
// not past a cancel of everything (a restarted gateway adopting the worker,
// which then re-runs its journaled requests under their own ids: the one a
// crashed gateway cancelled as it died was refused as cancelled).
TEST_F(WorkerTest, ACancelOfEverythingForgetsTheEarlyCancels) {
  auto early = http::Fetch("127.0.0.1", chat_->port(), "DELETE", "/v1/worker/requests/early-1", "", WorkerAuth());
  ASSERT_TRUE(early.ok());
  EXPECT_EQ(early->status, 404);
  auto all = http::Fetch("127.0.0.1", chat_->port(), "DELETE", std::string(protocol::kCancelAllPath), "", WorkerAuth());
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->status, 200) << all->body;
  auto rerun = Post(*chat_, "/v1/completions", {{"prompt", "again"}, {"max_tokens", 2}}, {{"X-Request-Id", "early-1"}});
  EXPECT_EQ(rerun.status, 200) << rerun.body;
}

TEST_F(WorkerTest, ClientDisconnectCancelsTheRequest) {
  const uint64_t before = Body(Get(*chat_, "/v1/worker/info"))["requests"]["cancelled"];
  {
    namespace net = boost::asio;
    net::io_context ioc;
    net::ip::tcp::socket sock(ioc);
    sock.connect({net::ip::make_address("127.0.0.1"), chat_->port()});
    const std::string body = json{{"prompt", "x"}, {"max_tokens", 1800}, {"stream", true}, {"ignore_eos", true}}.dump();
    const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                            "Authorization: Bearer " + TestWorkerSecret() + "\r\n"
                            "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    net::write(sock, net::buffer(req));
    char buf[256];
    sock.read_some(net::buffer(buf));  // the stream has started
    sock.close();
  }
  json info;
  for (int i = 0; i < 500; ++i) {
    info = Body(Get(*chat_, "/v1/worker/info"));
    if (info["requests"]["cancelled"].get<uint64_t>() > before && info["slots"]["busy"] == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GT(info["requests"]["cancelled"].get<uint64_t>(), before);
  EXPECT_EQ(info["slots"]["busy"], 0);
}

struct BadCase {
  std::string path;
  std::string body;
  int status;
  std::string fragment;
};

// Preparing a long prompt (its JSON, tokenization: seconds for megabytes)
// does not hold up the worker's health checks, which the supervisor times
// out after 1 s: two such prompts held both I/O threads for 7 s, and the
// supervisor replaced a worker that was only busy.
TEST_F(WorkerTest, LongPromptsDoNotHoldUpHealthChecks) {
  std::string text;
  while (text.size() < (4u << 20)) text += "hello world, this is a fairly ordinary sentence with words. ";
  const std::string body = json{{"prompt", text}, {"max_tokens", 1}}.dump();
  std::atomic<int> done{0};
  std::vector<std::future<int>> long_ones;
  for (int i = 0; i < 2; ++i) {
    long_ones.push_back(std::async(std::launch::async, [&] {
      auto r = http::Fetch("127.0.0.1", chat_->port(), "POST", "/v1/completions", body, WorkerAuth(),
                           std::chrono::seconds(120));
      done.fetch_add(1);
      return r.ok() ? r->status : -1;
    }));
  }
  double slowest_ms = 0;
  int checks = 0;
  while (done.load() < 2) {
    const auto t0 = std::chrono::steady_clock::now();
    auto h = Get(*chat_, "/health");
    EXPECT_EQ(h.status, 200);
    slowest_ms = std::max(slowest_ms, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    ++checks;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (auto& f : long_ones) EXPECT_EQ(f.get(), 400) << "a prompt longer than the context";
  EXPECT_GT(checks, 3) << "the long prompts took too little time to tell anything";
  EXPECT_LT(slowest_ms, 1000) << "a health check waited " << slowest_ms << " ms (the supervisor gives it 1 s)";
}

TEST_F(WorkerTest, BadInputsGetTheirStatusAndTheWorkerKeepsServing) {
  const std::string big_prompt(40000, 'a');
  const std::vector<BadCase> cases = {
      {"/v1/completions", "{not json", 400, "not valid JSON"},
      {"/v1/completions", "[1,2]", 400, "JSON object"},
      {"/v1/completions", R"({"prompt": 5})", 400, "'prompt'"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": -3})", 400, "'max_tokens'"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": "ten"})", 400, "'max_tokens'"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 1e12})", 400, "'max_tokens'"},
      {"/v1/completions", R"({"prompt": "x", "temperature": 99})", 400, "'temperature'"},
      {"/v1/completions", R"({"prompt": "x", "top_k": -1})", 400, "'top_k'"},
      {"/v1/completions", R"({"prompt": "x", "seed": 1.5})", 400, "'seed'"},  // (-1 is no seed: a random one)
      {"/v1/completions", R"({"prompt": "x", "stop": [1]})", 400, "'stop'"},
      {"/v1/completions", R"({"prompt": "x", "n": 3})", 400, "'n'"},
      {"/v1/completions", R"({"prompt": [1, 99999999]})", 400, "outside the vocabulary"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 5000})", 400, "exceeds the context"},
      {"/v1/completions", json{{"prompt", big_prompt}}.dump(), 400, "does not fit the context"},
      {"/v1/chat/completions", R"({"messages": []})", 400, "'messages'"},
      {"/v1/chat/completions", R"({"messages": [{"role": "wizard", "content": "x"}]})", 400, "role"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": 12}]})", 400, "content"},
      {"/v1/embeddings", R"({"input": "x"})", 400, "generative model"},
      {"/v1/nothing", "{}", 404, "no route"},
  };
  for (const auto& c : cases) {
    auto r = http::Fetch("127.0.0.1", chat_->port(), "POST", c.path, c.body, WorkerAuth());
    ASSERT_TRUE(r.ok()) << c.body;
    EXPECT_EQ(r->status, c.status) << c.body << " -> " << r->body;
    json e = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(e.is_object()) << r->body;
    ASSERT_TRUE(e.contains("error")) << r->body;
    EXPECT_NE(e["error"]["message"].get<std::string>().find(c.fragment), std::string::npos)
        << c.body << " -> " << r->body;
    EXPECT_TRUE(e["error"].contains("type"));
    EXPECT_TRUE(e["error"].contains("code"));
    // A prompt (and its max_tokens) past the context carries OpenAI's code,
    // which clients look for; nothing else does.
    const bool past_context = c.fragment.find("the context") != std::string::npos;
    EXPECT_EQ(e["error"].value("code", "") == "context_length_exceeded", past_context) << c.body << " -> " << r->body;
  }
  // A body over the limit is refused before it is read whole.
  auto huge = http::Fetch("127.0.0.1", chat_->port(), "POST", "/v1/completions", std::string(9 << 20, 'x'), WorkerAuth());
  ASSERT_TRUE(huge.ok()) << huge.status().ToString();
  EXPECT_EQ(huge->status, 413);
  // Garbage on the wire gets a 400, not a crash.
  {
    namespace net = boost::asio;
    net::io_context ioc;
    net::ip::tcp::socket sock(ioc);
    sock.connect({net::ip::make_address("127.0.0.1"), chat_->port()});
    net::write(sock, net::buffer(std::string("\x01\x02 NOT HTTP\r\n\r\n")));
    char buf[512];
    boost::system::error_code ec;
    size_t n = sock.read_some(net::buffer(buf), ec);
    EXPECT_NE(std::string(buf, n).find("400"), std::string::npos);
  }
  EXPECT_EQ(Get(*chat_, "/health").status, 200);
  EXPECT_FALSE(Text(Completion(*chat_, {})).empty());
}

// A completion of `max_tokens` (ignore_eos) under id `id`, running on one
// of `w`'s slots when this returns (until it ends or is cancelled).
std::future<http::ClientResponse> RunningOneSlot(const WorkerProcess& w, const std::string& id, int max_tokens) {
  auto running = std::async(std::launch::async, [&w, id, max_tokens] {
    return Post(w, "/v1/completions", {{"prompt", "x"}, {"max_tokens", max_tokens}, {"ignore_eos", true}},
                {{"X-Request-Id", id}});
  });
  bool busy = false;
  for (int i = 0; i < 2500 && !(busy = Body(Get(w, "/v1/worker/info"))["slots"]["busy"] == 1); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_TRUE(busy) << "'" << id << "' never held its slot";
  return running;
}

TEST(WorkerSlotsTest, AllSlotsBusyIs503WithRetryAfter) {
  WorkerProcess w(ModelPath("tiny-chat"), {"--slots", "1", "--ctx", "2048", "--threads", "1"});
  ASSERT_TRUE(w.running()) << w.Stderr();
  auto busy = RunningOneSlot(w, "hold-slot", 2000);
  auto r = Post(w, "/v1/completions", {{"prompt", "y"}, {"max_tokens", 4}});
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(r.Header("retry-after"), "1");
  EXPECT_EQ(Body(r)["error"]["code"], "resource_exhausted");
  ASSERT_TRUE(http::Fetch("127.0.0.1", w.port(), "DELETE", "/v1/worker/requests/hold-slot", "", WorkerAuth()).ok());
  busy.get();
  EXPECT_EQ(Post(w, "/v1/completions", {{"prompt", "y"}, {"max_tokens", 4}}).status, 200);
}

// A shared KV pool that is full for now is capacity, not an allocation
// failure: 503 with Retry-After and no failure phase, which the gateway
// treats as busy (the request waits), not as a failure that opens the
// placement's breaker and moves the request elsewhere.
TEST(WorkerKvUnifiedTest, AFullPoolIsBusyNotAFailure) {
  // (A hold long enough to be running still when the second request comes,
  // on a loaded machine too: its cells leave fewer than 400.)
  WorkerProcess w(ModelPath("tiny-chat"), {"--slots", "2", "--ctx", "4096", "--threads", "1", "--kv-unified"});
  ASSERT_TRUE(w.running()) << w.Stderr();
  auto hold = RunningOneSlot(w, "hold-cells", 3800);
  auto r = Post(w, "/v1/completions", {{"prompt", "y"}, {"max_tokens", 400}});
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(r.Header("retry-after"), "1");
  EXPECT_NE(r.body.find("KV cache"), std::string::npos) << r.body;
  EXPECT_FALSE(Body(r)["error"].contains("phase")) << r.body;
  ASSERT_TRUE(http::Fetch("127.0.0.1", w.port(), "DELETE", "/v1/worker/requests/hold-cells", "", WorkerAuth()).ok());
  hold.get();
}

// A request that sets no max_tokens gets what fits beside its prompt in its
// slot's share of the cells (512 / 4 = 128 here), not in the whole context:
// it was a 400 ("exceeds the context of 128 tokens per slot").
TEST(WorkerSlotsTest, AnUnsetMaxTokensFitsTheSlotsShare) {
  WorkerProcess w(ModelPath("tiny-chat"), {"--slots", "4", "--ctx", "512", "--threads", "1"});
  ASSERT_TRUE(w.running()) << w.Stderr();
  auto r = Post(w, "/v1/completions", {{"prompt", "The quick brown fox"}, {"ignore_eos", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json u = Body(r)["usage"];
  EXPECT_EQ(u["prompt_tokens"].get<int>() + u["completion_tokens"].get<int>(), 128) << u.dump();
}

// "truncate": true (Ollama's /api/chat default, which the gateway sets): a
// conversation past the context loses its oldest messages, never the system
// message nor the last, and says how many; without it, a 400 as before.
TEST(WorkerChatFitTest, ALongConversationLosesItsOldestMessagesWhenAskedTo) {
  WorkerProcess w(ModelPath("tiny-chat"), {"--slots", "1", "--ctx", "512", "--threads", "1"});
  ASSERT_TRUE(w.running()) << w.Stderr();
  json messages = json::array({{{"role", "system"}, {"content", "Answer as a lighthouse keeper would."}}});
  for (int i = 0; i < 24; ++i) {
    std::string words;
    for (int k = 0; k < 12; ++k) words += "turn" + std::to_string(i) + "word" + std::to_string(k) + " ";
    messages.push_back({{"role", "user"}, {"content", "question " + words}});
    messages.push_back({{"role", "assistant"}, {"content", "answer " + words}});
  }
  messages.push_back({{"role", "user"}, {"content", "And the storm tonight?"}});
  json req = {{"messages", messages}, {"max_tokens", 4}, {"temperature", 0}, {"ignore_eos", true}};

  auto refused = Post(w, "/v1/chat/completions", req);
  EXPECT_EQ(refused.status, 400) << refused.body;
  EXPECT_NE(refused.body.find("does not fit the context"), std::string::npos) << refused.body;
  // OpenAI's code, which clients look for; the code's name beside it for the gateway.
  EXPECT_EQ(Body(refused)["error"]["code"], "context_length_exceeded") << refused.body;
  EXPECT_EQ(Body(refused)["error"]["status"], "invalid_argument") << refused.body;

  req["truncate"] = true;
  auto r = Post(w, "/v1/chat/completions", req);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = Body(r);
  const int dropped = j["spillway"].value("dropped_messages", 0);
  EXPECT_GT(dropped, 0) << j.dump();
  EXPECT_EQ(dropped % 2, 0) << "a kept tail begins at a user's message";
  EXPECT_EQ(r.Header("x-spillway-dropped-messages"), std::to_string(dropped));
  const int prompt_tokens = j["usage"]["prompt_tokens"];
  EXPECT_LE(prompt_tokens + 4, 512);
  // The longest tail that fits: one more question and its answer would not.
  json longer = {{"messages", json::array({messages[0]})}};
  for (size_t i = 1 + dropped - 2; i < messages.size(); ++i) longer["messages"].push_back(messages[i]);
  auto longer_count = Post(w, std::string(protocol::kTokenizePath) + "?endpoint=chat", longer);
  ASSERT_EQ(longer_count.status, 200) << longer_count.body;
  EXPECT_GT(Body(longer_count)["prompt_tokens"].get<int>() + 4, 512) << "kept " << prompt_tokens << " tokens of 512";

  // What was kept: the system message, the last one, none of the oldest.
  auto shown = Post(w, std::string(protocol::kApplyTemplatePath), req);
  ASSERT_EQ(shown.status, 200) << shown.body;
  const std::string prompt = Body(shown)["prompt"];
  EXPECT_NE(prompt.find("lighthouse keeper"), std::string::npos);
  EXPECT_NE(prompt.find("storm tonight"), std::string::npos);
  EXPECT_EQ(prompt.find("turn0word"), std::string::npos);
  EXPECT_NE(prompt.find("turn23word"), std::string::npos);
  // The gateway's count for admission is the kept prompt's; for a larger
  // placement of the model (fit_cells), fewer are left out.
  auto counted = Post(w, std::string(protocol::kTokenizePath) + "?endpoint=chat", req);
  ASSERT_EQ(counted.status, 200) << counted.body;
  EXPECT_EQ(Body(counted)["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(Body(counted)["dropped_messages"], dropped);
  auto for_larger = Post(w, std::string(protocol::kTokenizePath) + "?endpoint=chat&fit_cells=2048", req);
  ASSERT_EQ(for_larger.status, 200) << for_larger.body;
  EXPECT_LT(Body(for_larger).value("dropped_messages", 0), dropped);
  EXPECT_GT(Body(for_larger)["prompt_tokens"].get<int>(), 512);
  // The gateway's pin: exactly that many left out; one that leaves too much
  // for this placement is refused, saying so.
  json pinned = req;
  pinned["spillway_drop_messages"] = dropped + 2;
  auto p2 = Post(w, "/v1/chat/completions", pinned);
  ASSERT_EQ(p2.status, 200) << p2.body;
  EXPECT_EQ(Body(p2)["spillway"]["dropped_messages"], dropped + 2);
  EXPECT_EQ(p2.Header("x-spillway-dropped-messages"), std::to_string(dropped + 2));
  pinned["spillway_drop_messages"] = 0;
  auto p0 = Post(w, "/v1/chat/completions", pinned);
  EXPECT_EQ(p0.status, 400) << p0.body;
  EXPECT_NE(p0.body.find("the gateway's count left out"), std::string::npos) << p0.body;
  // Asked and nothing to leave out: said as 0.
  json short_chat = req;
  short_chat["messages"] = json::array({messages[0], messages.back()});
  auto none = Post(w, "/v1/chat/completions", short_chat);
  ASSERT_EQ(none.status, 200) << none.body;
  EXPECT_EQ(none.Header("x-spillway-dropped-messages"), "0");
  EXPECT_FALSE(Body(none)["spillway"].contains("dropped_messages"));

  // A stream says it in its head and in its last chunk's meta.
  json sreq = req;
  sreq["stream"] = true;
  auto s = Post(w, "/v1/chat/completions", sreq);
  ASSERT_EQ(s.status, 200) << s.body;
  EXPECT_EQ(s.Header("x-spillway-dropped-messages"), std::to_string(dropped));
  EXPECT_NE(s.body.find("\"dropped_messages\":" + std::to_string(dropped)), std::string::npos) << s.body;

  // A max_tokens that is not an upper bound keeps its room beside the prompt.
  req["max_tokens"] = 200;
  auto roomy = Post(w, "/v1/chat/completions", req);
  ASSERT_EQ(roomy.status, 200) << roomy.body;
  EXPECT_LE(Body(roomy)["usage"]["prompt_tokens"].get<int>() + 200, 512);
  EXPECT_GT(Body(roomy)["spillway"]["dropped_messages"].get<int>(), dropped);

  // An upper bound (an Ollama request's num_predict) leaves the answer a
  // quarter of the cells (128 of 512), not one token.
  // (Short turns: a tail of one token's room would be far longer.)
  json short_turns = json::array();
  for (int i = 0; i < 60; ++i) {
    short_turns.push_back({{"role", "user"}, {"content", "q" + std::to_string(i)}});
    short_turns.push_back({{"role", "assistant"}, {"content", "a" + std::to_string(i)}});
  }
  short_turns.push_back({{"role", "user"}, {"content", "last"}});
  json bounded = {{"messages", short_turns}, {"truncate", true}, {"max_tokens", 400}, {"spillway_fit_context", true},
                  {"temperature", 0}};
  auto fitted = Post(w, "/v1/chat/completions", bounded);
  ASSERT_EQ(fitted.status, 200) << fitted.body;
  const json fj = Body(fitted);
  EXPECT_LE(fj["usage"]["prompt_tokens"].get<int>(), 512 - 128);
  EXPECT_GT(fj["usage"]["prompt_tokens"].get<int>(), 512 - 128 - 30);
  EXPECT_EQ(fj["spillway"]["max_tokens"].get<int>(), 512 - fj["usage"]["prompt_tokens"].get<int>()) << fj.dump();

  // A conversation that fits only beside a shorter answer than the room a
  // truncate leaves by default (no max_tokens asked: a quarter of the cells)
  // is served whole, its answer shortened, as it is without truncate:
  // asking to truncate never does worse than not asking (it was a 400).
  {
    json one = json::array({{{"role", "user"}, {"content", ""}}});
    std::string words;
    int tokens = 0;
    for (int k = 0; k < 400 && tokens < 440; ++k) {
      words += "storm" + std::to_string(k % 10) + " ";
      one[0]["content"] = words;
      auto c = Post(w, std::string(protocol::kTokenizePath) + "?endpoint=chat", {{"messages", one}});
      ASSERT_EQ(c.status, 200) << c.body;
      tokens = Body(c)["prompt_tokens"].get<int>();
    }
    ASSERT_GE(tokens, 440);
    ASSERT_LT(tokens, 500);
    json whole = {{"messages", one}, {"temperature", 0}};
    auto plain = Post(w, "/v1/chat/completions", whole);
    ASSERT_EQ(plain.status, 200) << plain.body;
    whole["truncate"] = true;
    auto asked = Post(w, "/v1/chat/completions", whole);
    ASSERT_EQ(asked.status, 200) << "refused with truncate, served without: " << asked.body;
    EXPECT_EQ(Body(asked)["usage"]["prompt_tokens"], Body(plain)["usage"]["prompt_tokens"]);
    EXPECT_EQ(asked.Header("x-spillway-dropped-messages"), "0");
  }

  // A last message that cannot fit alone is refused, saying so.
  req["messages"].back()["content"] = std::string(4000, 'z') + " end";
  req["max_tokens"] = 4;
  auto alone = Post(w, "/v1/chat/completions", req);
  EXPECT_EQ(alone.status, 400) << alone.body;
  EXPECT_NE(alone.body.find("no tail of it that keeps its last message does either"), std::string::npos) << alone.body;
  auto bad = Post(w, "/v1/chat/completions", {{"messages", messages}, {"truncate", "yes"}});
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_NE(bad.body.find("'truncate' must be a boolean"), std::string::npos) << bad.body;
}

std::string FingerprintOf(const std::string& model) {
  WorkerProcess w(model, {"--slots", "1", "--ctx", "256", "--threads", "1"});
  EXPECT_TRUE(w.running()) << w.Stderr();
  return Body(Get(w, "/v1/worker/info"))["fingerprint"]["id"];
}

TEST(WorkerFingerprintTest, StableAcrossRestartsAndChangesWithTheFile) {
  const std::string a1 = FingerprintOf(ModelPath("tiny-chat"));
  const std::string a2 = FingerprintOf(ModelPath("tiny-chat"));
  const std::string b = FingerprintOf(ModelPath("tiny-chat-b"));
  EXPECT_EQ(a1.size(), 64u);
  EXPECT_EQ(a1, a2);
  EXPECT_NE(a1, b);
}

TEST(WorkerEmbeddingTest, EmbeddingsAreNormalizedAndDeterministic) {
  WorkerProcess w(ModelPath("tiny-embed"), {"--slots", "2", "--ctx", "512", "--threads", "1"});
  ASSERT_TRUE(w.running()) << w.Stderr();
  auto r = Post(w, "/v1/embeddings", {{"input", json::array({"hello world", "another text", "hello world"})}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = Body(r);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 3u);
  const auto v0 = j["data"][0]["embedding"].get<std::vector<float>>();
  const auto v1 = j["data"][1]["embedding"].get<std::vector<float>>();
  const auto v2 = j["data"][2]["embedding"].get<std::vector<float>>();
  EXPECT_EQ(v0.size(), 64u);
  double norm = 0;
  for (float x : v0) norm += double(x) * x;
  EXPECT_NEAR(norm, 1.0, 1e-3);
  EXPECT_EQ(v0, v2);
  EXPECT_NE(v0, v1);
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 0);
  // Its timings in a header: the gateway's throughput estimate, without parsing the vectors.
  const auto t = protocol::Timings::FromHeader(r.Header("x-spillway-timings"));
  ASSERT_TRUE(t && !r.Header("x-spillway-timings").empty()) << "no X-Spillway-Timings header";
  EXPECT_EQ(t->prompt_tokens, j["usage"]["prompt_tokens"].get<int>());
  EXPECT_GT(t->prompt_ms, 0);
  EXPECT_EQ(Post(w, "/v1/chat/completions", {{"messages", json::array({{{"role", "user"}, {"content", "x"}}})}}).status,
            400);
  EXPECT_EQ(Post(w, "/v1/embeddings", {{"input", json::array()}}).status, 400);
  EXPECT_EQ(Post(w, "/v1/embeddings", {{"input", json::array({1, 2})}}).status, 400);
}

// An embedding worker busy for longer than its progress timeout (a large
// batch of inputs) makes progress with each input: it is not "stalled", which
// would have the supervisor kill it and every request on it.
TEST(WorkerEmbeddingTest, ALongBatchOfInputsIsProgressNotAStall) {
  WorkerProcess w(ModelPath("tiny-embed"), {"--slots", "1", "--ctx", "512", "--threads", "1", "--progress-timeout", "1"});
  ASSERT_TRUE(w.running()) << w.Stderr();
  std::string text;
  for (int i = 0; i < 120; ++i) text += "word" + std::to_string(i % 37) + " ";
  json body = {{"input", json::array()}};
  for (int i = 0; i < 100; ++i) body["input"].push_back(std::to_string(i) + " " + text);
  // One input first: a fresh context's first step of a shape is its slowest (buffers planned), and sets the pace.
  ASSERT_EQ(Post(w, "/v1/embeddings", {{"input", body["input"][0]}}).status, 200);
  const auto started = std::chrono::steady_clock::now();
  auto batch = std::async(std::launch::async, [&] { return Post(w, "/v1/embeddings", body); });
  int healthy = 0, stalled = 0;
  while (batch.wait_for(std::chrono::milliseconds(50)) != std::future_status::ready) {
    const auto h = Get(w, "/health");
    (h.status == 200 ? healthy : stalled) += 1;
    if (h.status != 200) {
      ADD_FAILURE() << "health during the batch, after "
                    << std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count()
                    << " ms: " << h.status << " " << h.body;
    }
  }
  const auto took = std::chrono::steady_clock::now() - started;
  const auto r = batch.get();
  EXPECT_EQ(r.status, 200) << r.body.substr(0, 300);
  EXPECT_GT(took, std::chrono::seconds(3)) << "the batch was too short to test anything";
  EXPECT_EQ(stalled, 0) << healthy << " healthy answers";
}

// An embedding model is pooled as its GGUF says: a CLS model's vector is its
// first token's state, which for a causal model behind a BOS is the same for
// every input (a mean over the tokens, as every model was pooled before,
// differs). Inputs past the model's trained positions are refused: a
// BERT-style model's position table ends there (llama.cpp aborts beyond it).
TEST(WorkerEmbeddingTest, PooledAsTheModelSaysWithinItsTrainedContext) {
  WorkerProcess w(ModelPath("tiny-embed-cls"), {"--slots", "1", "--ctx", "512", "--threads", "1"});
  ASSERT_TRUE(w.running()) << w.Stderr();
  EXPECT_EQ(Body(Get(w, "/v1/worker/info"))["model"]["pooling"], "cls");
  auto r = Post(w, "/v1/embeddings", {{"input", json::array({"hello world", "another text entirely"})}});
  ASSERT_EQ(r.status, 200) << r.body;
  const auto a = Body(r)["data"][0]["embedding"].get<std::vector<float>>();
  const auto b = Body(r)["data"][1]["embedding"].get<std::vector<float>>();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a, b) << "not pooled from the first token";
  std::string fits, too_long;
  for (int i = 0; i < 40; ++i) fits += "w" + std::to_string(i) + " ";
  for (int i = 0; i < 100; ++i) too_long += "w" + std::to_string(i) + " ";  // within ctx, past 256
  r = Post(w, "/v1/embeddings", {{"input", too_long}});
  EXPECT_EQ(r.status, 400) << r.body.substr(0, 300);
  EXPECT_NE(r.body.find("trained context of 256 tokens"), std::string::npos) << r.body.substr(0, 300);
  EXPECT_NE(r.body.find("truncate"), std::string::npos) << "what to do about it: " << r.body.substr(0, 300);
  r = Post(w, "/v1/embeddings", {{"input", fits}});
  EXPECT_EQ(r.status, 200) << r.body.substr(0, 300);
  // Asked to ("truncate", Ollama's default), the long one is cut to the
  // trained context instead, and the answer says so.
  r = Post(w, "/v1/embeddings", {{"input", json::array({too_long, fits})}, {"truncate", true}});
  ASSERT_EQ(r.status, 200) << r.body.substr(0, 300);
  EXPECT_EQ(r.Header("x-spillway-truncated-inputs"), "1");
  const auto fits_tokens = Body(Post(w, "/v1/embeddings", {{"input", fits}}))["usage"]["prompt_tokens"].get<int>();
  EXPECT_EQ(Body(r)["usage"]["prompt_tokens"], 256 + fits_tokens) << "the long one counted as cut";
  r = Post(w, "/v1/embeddings", {{"input", fits}, {"truncate", true}});
  EXPECT_EQ(r.Header("x-spillway-truncated-inputs"), "") << "nothing cut, nothing said";
  EXPECT_EQ(Post(w, "/v1/embeddings", {{"input", fits}, {"truncate", "yes"}}).status, 400);
}

TEST(WorkerStartupTest, MissingOrCorruptModelExitsCleanlyWithPhaseLoad) {
  std::string err;
  EXPECT_EQ(RunWorkerToExit({"--model", "/nonexistent.gguf", "--listen", "127.0.0.1:0"}, &err), 3);
  EXPECT_NE(err.find("\"fatal\":true"), std::string::npos) << err;
  // A path that is not UTF-8 is quoted with U+FFFD: the JSON line's dump threw, and the worker aborted.
  EXPECT_EQ(RunWorkerToExit({"--model", "/nonexistent-\xff.gguf", "--listen", "127.0.0.1:0"}, &err), 3) << err;
  EXPECT_NE(err.find("\"fatal\":true"), std::string::npos) << err;

  const std::string bad = (std::filesystem::temp_directory_path() / "spillway-corrupt.gguf").string();
  {
    std::ofstream f(bad, std::ios::binary);
    f << "GGUF" << std::string(64, '\xff');
  }
  EXPECT_EQ(RunWorkerToExit({"--model", bad, "--listen", "127.0.0.1:0"}, &err), 3);
  EXPECT_NE(err.find("\"phase\":\"load\""), std::string::npos) << err;
  // A whole header whose weights are gone (no tensors): an invalid model, in
  // llama.cpp's own words, not "the weights do not fit" (a lack of memory,
  // which a gateway retries and its clients hear as one).
  {
    std::ifstream in(ModelPath("tiny-chat"), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    bytes.replace(8, 8, std::string(8, '\0'));  // the tensor count
    std::ofstream(bad, std::ios::binary) << bytes;
  }
  EXPECT_EQ(RunWorkerToExit({"--model", bad, "--listen", "127.0.0.1:0"}, &err), 3);
  EXPECT_NE(err.find("\"code\":\"invalid_argument\""), std::string::npos) << err;
  EXPECT_NE(err.find("token_embd.weight"), std::string::npos) << err;
  std::filesystem::remove(bad);

  EXPECT_EQ(RunWorkerToExit({"--model", ModelPath("tiny-chat"), "--listen", "0.0.0.0:0"}, &err), 2);
  EXPECT_NE(err.find("loopback"), std::string::npos) << err;
  EXPECT_EQ(RunWorkerToExit({"--model", ModelPath("tiny-chat"), "--slots", "0"}, &err), 2);
  EXPECT_EQ(RunWorkerToExit({"--model", ModelPath("tiny-chat"), "--device", "tpu:0"}, &err), 2);
  // An embedding model whose context the slots do not divide: refused, not
  // aborted inside llama.cpp's pooling (red without the check: SIGABRT).
  EXPECT_EQ(RunWorkerToExit({"--model", ModelPath("tiny-embed"), "--ctx", "512", "--slots", "3", "--dry-run"}, &err), 2);
  EXPECT_NE(err.find("multiple of slots"), std::string::npos) << err;
  // A batch smaller than the slots: each step carries a token of every slot,
  // past llama.cpp's n_batch (it aborts the worker at the first full step).
  EXPECT_EQ(RunWorkerToExit({"--model", ModelPath("tiny-chat"), "--batch", "2", "--slots", "4", "--dry-run"}, &err), 2);
  EXPECT_NE(err.find("below --slots"), std::string::npos) << err;
  // A quantized V cache without flash attention (a per-slot pool): refused as
  // a usage error; llama.cpp's refusal read as the KV cache not fitting (an
  // allocation failure, phase kv, at every start). With --kv-unified it plans.
  EXPECT_EQ(RunWorkerToExit({"--model", ModelPath("tiny-chat"), "--kv-type", "q8_0", "--dry-run"}, &err), 2);
  EXPECT_NE(err.find("--kv-type q8_0 needs --kv-unified"), std::string::npos) << err;
  EXPECT_EQ(RunWorkerToExit({"--model", ModelPath("demo-chat"), "--kv-type", "q8_0", "--kv-unified", "--dry-run"}, &err), 0)
      << err;
  // Parameters llama.cpp refuses before it allocates (q8_0's blocks of 32 do
  // not divide tiny-chat's heads of 16): no allocation failure either.
  EXPECT_EQ(RunWorkerToExit({"--model", ModelPath("tiny-chat"), "--kv-type", "q8_0", "--kv-unified", "--listen",
                             "127.0.0.1:0"},
                            &err),
            4);
  EXPECT_NE(err.find("refused the context's parameters"), std::string::npos) << err;
  EXPECT_EQ(err.find("\"phase\":\"kv\""), std::string::npos) << err;
}

}  // namespace
}  // namespace spillway::testing
