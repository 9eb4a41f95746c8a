// Parity with llama-server built from the same llama.cpp source: for each
// chat template family of llama.cpp's models/templates, a tiny random model
// carrying that template (spillway mkmodel --chat-template) is served by a
// spillway-worker and by llama-server (started once per model on a free port,
// killed afterwards), and both must agree on
//   - the rendered prompt (POST /apply-template),
//   - the prompt tokens (llama-server's /tokenize of that prompt),
//   - greedy answers (content, reasoning, tool calls), plain and with tools
//     offered (tool_choice "auto": lazy grammar, the family's parser),
// and the worker's forced call (tool_choice "required") must be a call with
// valid arguments. The families listed here pass; README says which check what.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <thread>

#include "api/http_client.h"
#include "worker_process.h"

namespace spillway::testing {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

struct Family {
  const char* name;
  const char* tmpl;   // models/templates/<tmpl>.jinja
  const char* vocab;  // models/ggml-vocab-<vocab>.gguf
  // Which answers are compared: llama-server answers 500 when its parser
  // rejects a random model's text (the worker then answers the text as content).
  bool plain_answers = true;  // a plain chat
  bool tool_answers = true;   // tools offered, tool_choice "auto"
  bool forced_call = true;    // the template has a call format a forced call fits in max_tokens
};

std::string LlamaSrc() {
  const char* s = std::getenv("LLAMA_SRC");
  return s ? s : "";
}

uint16_t FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// llama-server on a free port, stopped (SIGTERM, then SIGKILL) when destroyed.
class LlamaServer {
 public:
  LlamaServer(const std::string& model, const std::string& dir) {
    const char* bin = std::getenv("LLAMA_SERVER");
    if (!bin) return;
    for (int attempt = 0; attempt < 3 && !ready_; ++attempt) {
      port_ = FreePort();
      // One slot, no flash attention, no prompt cache: the worker's
      // batch-invariant decoding, so greedy tokens can be compared.
      pid_ = SpawnProcess({bin, "-m", model, "--host", "127.0.0.1", "--port", std::to_string(port_), "--jinja", "-c",
                           "2048", "-np", "1", "-fa", "off", "-t", "2", "--no-warmup", "--no-cache-prompt"},
                          dir + "/llama-server.out", dir + "/llama-server.err");
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (std::chrono::steady_clock::now() < deadline) {
        auto r = http::Fetch("127.0.0.1", port_, "GET", "/health", "", {}, std::chrono::seconds(2));
        if (r.ok() && r->status == 200) {
          ready_ = true;
          break;
        }
        int status = 0;
        if (waitpid(pid_, &status, WNOHANG) == pid_) {
          pid_ = -1;
          break;  // exited (the port may have been taken): try another
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  }
  ~LlamaServer() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  bool ready() const { return ready_; }
  json Post(const std::string& path, const json& body) const {
    auto r = http::Fetch("127.0.0.1", port_, "POST", path, body.dump(), {{"Content-Type", "application/json"}},
                         std::chrono::seconds(120));
    EXPECT_TRUE(r.ok() && r->status == 200) << path << ": " << (r.ok() ? r->body : r.status().ToString());
    return r.ok() ? json::parse(r->body, nullptr, false) : json();
  }

 private:
  pid_t pid_ = -1;
  uint16_t port_ = 0;
  bool ready_ = false;
};

json WorkerPost(const WorkerProcess& w, const std::string& path, const json& body) {
  auto r = http::Fetch("127.0.0.1", w.port(), "POST", path, body.dump(), WorkerAuth(), std::chrono::seconds(120));
  EXPECT_TRUE(r.ok() && r->status == 200) << path << ": " << (r.ok() ? r->body : r.status().ToString());
  return r.ok() ? json::parse(r->body, nullptr, false) : json();
}

// The parts of an answer both servers must agree on (ids are each server's own).
json Answer(const json& completion) {
  if (!completion.is_object() || !completion.contains("choices")) return completion;
  const json& c = completion["choices"][0];
  const json& m = c["message"];
  json calls = json::array();
  for (const auto& t : m.value("tool_calls", json::array())) {
    calls.push_back({t["function"]["name"], t["function"]["arguments"]});
  }
  return {{"content", m["content"].is_string() ? m["content"].get<std::string>() : ""},
          {"reasoning", m.value("reasoning_content", "")},
          {"tool_calls", calls},
          {"finish_reason", c["finish_reason"]},
          {"completion_tokens", completion["usage"]["completion_tokens"]}};
}

class ChatParityTest : public ::testing::TestWithParam<Family> {};

TEST_P(ChatParityTest, MatchesLlamaServer) {
  const Family& f = GetParam();
  if (LlamaSrc().empty() || !std::getenv("LLAMA_SERVER")) GTEST_SKIP() << "LLAMA_SRC / LLAMA_SERVER not set (run through ctest)";
  const std::string dir = MakeScratchDir();
  const std::string model = dir + "/" + f.name + ".gguf";
  int rc = 0;
  const std::string out = RunCommand(BinDir() + "/spillway mkmodel --preset tiny --vocab " + LlamaSrc() +
                                         "/models/ggml-vocab-" + f.vocab + ".gguf --chat-template " + LlamaSrc() +
                                         "/models/templates/" + f.tmpl + ".jinja --out " + model + " 2>&1",
                                     &rc);
  ASSERT_EQ(rc, 0) << out;

  LlamaServer server(model, dir);
  ASSERT_TRUE(server.ready()) << "llama-server did not start for " << f.name;
  WorkerProcess worker(model, {"--slots", "1", "--ctx", "2048", "--threads", "2"});
  ASSERT_TRUE(worker.running()) << worker.Stderr();

  const json tools = json::array(
      {{{"type", "function"},
        {"function", {{"name", "increment"},
                      {"description", "Adds n to the counter"},
                      {"parameters", {{"type", "object"},
                                      {"properties", {{"n", {{"type", "integer"}}}}},
                                      {"required", {"n"}}}}}}}});
  const json plain = {{"messages", {{{"role", "system"}, {"content", "You are terse."}},
                                    {{"role", "user"}, {"content", "Name a colour."}}}},
                      {"temperature", 0}, {"max_tokens", 12},
                      // Templates that print today's date (Llama 3.x) would
                      // otherwise give a new prompt, so new random text, every
                      // day: one day's text is one llama-server's parser rejects.
                      {"chat_template_kwargs", {{"date_string", "26 Jul 2024"}, {"datetime", "Jul 26 2024"}}}};
  json with_tools = plain;
  with_tools["messages"][1]["content"] = "Add two.";
  with_tools["tools"] = tools;
  with_tools["max_tokens"] = 24;
  json forced = with_tools;
  forced["tool_choice"] = "required";
  forced["parallel_tool_calls"] = false;
  forced["chat_template_kwargs"]["enable_thinking"] = false;  // a random model's reasoning never ends
  forced["max_tokens"] = 160;  // random models write a lot of the whitespace JSON allows

  // A next turn: the conversation sent again with an answer and a question
  // more; the worker tokenizes it on from where the first one's tokens stop
  // being the same (worker/prompt_tokens.h), which must not change a token.
  // (Its first turn has a long system message: a continued prompt must leave
  // less than half of it to tokenize.)
  json first_turn = plain;
  first_turn["messages"][0]["content"] =
      "You are terse. You know about rivers, mountains, lakes, forests, deserts, oceans, islands and the weather "
      "over all of them, and you say what you know in plain words, one short sentence at a time, never more.";
  json next_turn = first_turn;
  next_turn["messages"].push_back({{"role", "assistant"}, {"content", "Blue."}});
  next_turn["messages"].push_back({{"role", "user"}, {"content", "And another one?"}});

  auto kept_tokens = [&] {
    auto info = http::Fetch("127.0.0.1", worker.port(), "GET", "/v1/worker/info", "", WorkerAuth(), std::chrono::seconds(10));
    EXPECT_TRUE(info.ok() && info->status == 200);
    return info.ok() ? json::parse(info->body, nullptr, false)["prompt_tokens"] : json();
  };
  json before_next_turn;

  // Prompt and tokens: every request shape.
  for (const json* body : std::initializer_list<const json*>{&plain, &with_tools, &forced, &first_turn, &next_turn}) {
    SCOPED_TRACE(body->dump());
    if (body == &next_turn) before_next_turn = kept_tokens();
    const json theirs = server.Post("/apply-template", *body);
    const json ours = WorkerPost(worker, "/apply-template", *body);
    ASSERT_TRUE(theirs.contains("prompt"));
    EXPECT_EQ(ours["prompt"], theirs["prompt"]);
    const json tokens = server.Post("/tokenize", {{"content", theirs["prompt"]}, {"add_special", true}, {"parse_special", true}});
    EXPECT_EQ(ours["tokens"], tokens["tokens"]);
  }
  // The next turn was continued where the vocabulary has the template's
  // markers as special tokens: Llama 3's (and functionary's, written in
  // them), Qwen's and Phi's. The stock vocabularies these tests use hold the
  // other families' markers as plain text (Hermes' and GPT-OSS's in Llama 3's
  // vocabulary, DeepSeek-R1's <｜User｜> in Qwen's, the SPM and GPT-2 ones).
  static const std::set<std::string> kMarkersAreSpecial = {"llama-3.1", "llama-3.2", "qwen-2.5", "qwen-3",
                                                           "functionary-3.2", "phi-3.5"};
  if (kMarkersAreSpecial.count(f.name)) {
    const json after = kept_tokens();
    EXPECT_EQ(after["continued"].get<int>(), before_next_turn["continued"].get<int>() + 1) << after.dump();
    EXPECT_GT(after["reused_tokens"].get<int>(), before_next_turn["reused_tokens"].get<int>()) << after.dump();
  }
  // Greedy answers, plain and with tools offered ("auto": the lazy grammar
  // and the format's parser): identical. Families whose parser rejects text
  // that is not in their format (llama-server answers 500) check prompts only.
  for (const json* body : std::initializer_list<const json*>{&plain, &with_tools}) {
    if (!(body == &plain ? f.plain_answers : f.tool_answers)) continue;
    {
      SCOPED_TRACE(body->dump());
      json to_server = *body;
      to_server["cache_prompt"] = false;
      const json b = Answer(WorkerPost(worker, "/v1/chat/completions", *body));
      const json a = Answer(server.Post("/v1/chat/completions", to_server));
      EXPECT_EQ(b, a) << "llama-server: " << a.dump() << "\nspillway:     " << b.dump();
    }
  }
  // A forced call: the worker's answer is a call of the offered function with
  // schema-valid arguments, read by the family's own parser. (llama-server's
  // grammar lets the model write text first, which a random model does.)
  if (f.forced_call) {
    const json b = Answer(WorkerPost(worker, "/v1/chat/completions", forced));
    ASSERT_FALSE(b["tool_calls"].empty()) << b.dump();
    EXPECT_EQ(b["tool_calls"][0][0], "increment") << b.dump();
    const json args = json::parse(b["tool_calls"][0][1].get<std::string>(), nullptr, false);
    EXPECT_TRUE(args.is_object() && args.contains("n") && args["n"].is_number_integer()) << b.dump();
    EXPECT_EQ(b["finish_reason"], "tool_calls") << b.dump();
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

const Family kFamilies[] = {
    //                                                                     plain  auto   forced
    {"llama-3.1", "meta-llama-Llama-3.1-8B-Instruct", "llama-bpe", true, true, true},
    {"llama-3.2", "meta-llama-Llama-3.2-3B-Instruct", "llama-bpe", true, true, true},
    {"qwen-2.5", "Qwen-Qwen2.5-7B-Instruct", "qwen2", true, false, true},
    {"qwen-3", "Qwen-Qwen3-0.6B", "qwen2", true, false, true},
    {"hermes-3", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "llama-bpe", true, false, true},
    {"mistral-nemo", "mistralai-Mistral-Nemo-Instruct-2407", "llama-spm", true, true, true},
    {"gemma-2", "google-gemma-2-2b-it", "llama-spm", true, true, false},
    {"gpt-oss", "openai-gpt-oss-120b", "llama-bpe", false, false, false},
    {"deepseek-r1", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "qwen2", true, true, true},
    {"functionary-3.2", "meetkai-functionary-medium-v3.2", "llama-bpe", false, false, true},
    {"granite-3.3", "ibm-granite-granite-3.3-2B-Instruct", "gpt-2", false, false, false},
    {"phi-3.5", "microsoft-Phi-3.5-mini-instruct", "phi-3", true, true, false},
};


INSTANTIATE_TEST_SUITE_P(Families, ChatParityTest, ::testing::ValuesIn(kFamilies),
                         [](const ::testing::TestParamInfo<Family>& i) {
                           std::string n = i.param.name;
                           for (char& c : n) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace spillway::testing
