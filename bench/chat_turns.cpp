// Benchmark: a chat's turns, each resending the whole conversation, against
// llama.cpp's own llama-server built from the same source (its prompt cache,
// cache_prompt, on by default), on the same model, threads and context.
//
// Three servers, one slot each: spillway-worker as it runs (prompt prefixes
// reused), spillway-worker with --no-prefix-reuse (every prompt computed
// whole: what it did before), and llama-server (flash attention off, as the
// worker decodes). Each round is a new conversation; each turn sends the same
// messages to the three in turn (their order rotating), then appends a fixed
// assistant reply and the next user message, so the three see the same
// prompts. Non-streamed, max_tokens generated tokens (ignore_eos). Prints, per
// turn, the p50 of each server's time for the whole answer and the prompt
// tokens it computed, and the conversation's time against llama-server's.
//
// --count-first: each turn to a worker is counted first, as the gateway counts
// a chat for admission when its service has more than one placement (POST
// /v1/worker/tokenize with the same body, then the run), its time the pair's;
// the second worker then keeps no renderings (--rendered-prompts 0: the count
// and the run each render and tokenize the conversation) in place of
// --no-prefix-reuse. llama-server, which counts nothing, is asked as before.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "api/http_client.h"
#include "worker_secret.h"

extern char** environ;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Server {
  std::string label;
  pid_t pid = -1;
  uint16_t port = 0;
  bool worker = false;  // spillway-worker (its secret, its timings)
  std::unique_ptr<spillway::http::Connection> conn;
  std::vector<std::vector<double>> ms, computed, compute_ms;  // [turn][round]
};

pid_t Spawn(std::vector<std::string> args, const std::string& log) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

// Waits for a worker's port file, or for llama-server's /health to answer 200.
uint16_t WaitReady(const Server& s, const std::string& port_file, uint16_t fixed_port) {
  for (int i = 0; i < 6000; ++i) {
    if (waitpid(s.pid, nullptr, WNOHANG) == s.pid) return 0;
    if (s.worker) {
      std::ifstream f(port_file);
      int p = 0;
      if (f >> p && p > 0) return static_cast<uint16_t>(p);
    } else {
      auto r = spillway::http::Fetch("127.0.0.1", fixed_port, "GET", "/health", "", {});
      if (r.ok() && r->status == 200) return fixed_port;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"a chat's turns (the whole conversation resent each turn): spillway-worker against llama-server"};
  std::string model, worker, llama_server;
  int threads = 2, turns = 8, rounds = 3, max_tokens = 16, reply_words = 120, ctx = 4096;
  app.add_option("--model", model)->required();
  app.add_option("--worker", worker)->required();
  app.add_option("--llama-server", llama_server)->required();
  app.add_option("--threads", threads)->capture_default_str();
  app.add_option("--turns", turns, "turns a conversation")->check(CLI::Range(2, 64))->capture_default_str();
  app.add_option("--rounds", rounds, "conversations")->check(CLI::Range(1, 50))->capture_default_str();
  app.add_option("--max-tokens", max_tokens)->check(CLI::Range(1, 512))->capture_default_str();
  app.add_option("--reply-words", reply_words, "words of each assistant reply appended")->capture_default_str();
  app.add_option("--ctx", ctx)->capture_default_str();
  bool count_first = false;
  app.add_flag("--count-first", count_first,
               "count each worker turn first (its tokenize call, as a gateway with several placements does); the "
               "second worker keeps no renderings instead of reusing no prefixes");
  bool count_only = false;
  app.add_flag("--count-only", count_only,
               "only count each turn: a worker's tokenize call against llama-server's /apply-template and /tokenize; "
               "the second worker tokenizes every prompt whole (--kept-prompt-tokens 0) instead of reusing no "
               "prefixes (a model whose vocabulary holds its template's markers as special tokens shows the "
               "difference)")
      ->excludes("--count-first");
  CLI11_PARSE(app, argc, argv);
  const std::string other = count_only    ? "tokenized whole"
                            : count_first ? "without kept renderings"
                                          : "without reuse";

  const fs::path dir = fs::temp_directory_path() / ("spillway-bench-turns-" + std::to_string(getpid()));
  fs::create_directories(dir);
  spillway::bench::WorkerSecret();  // the workers take it from the environment
  std::vector<Server> servers(3);
  servers[0].label = "spillway-worker";
  servers[1].label = count_only    ? "  --kept-prompt-tokens 0"
                      : count_first ? "  --rendered-prompts 0"
                                    : "  --no-prefix-reuse";
  servers[2].label = "llama-server";
  const std::string t = std::to_string(threads), c = std::to_string(ctx);
  for (int i = 0; i < 2; ++i) {
    Server& s = servers[static_cast<size_t>(i)];
    s.worker = true;
    const std::string port_file = (dir / ("port" + std::to_string(i))).string();
    std::vector<std::string> args = {worker, "--model", model, "--listen", "127.0.0.1:0", "--port-file", port_file,
                                     "--threads", t, "--slots", "1", "--ctx", c};
    if (i == 1 && count_first) args.insert(args.end(), {"--rendered-prompts", "0"});
    if (i == 1 && count_only) args.insert(args.end(), {"--kept-prompt-tokens", "0"});
    if (i == 1 && !count_first && !count_only) args.push_back("--no-prefix-reuse");
    s.pid = Spawn(args, (dir / ("worker" + std::to_string(i) + ".log")).string());
    s.port = s.pid > 0 ? WaitReady(s, port_file, 0) : 0;
  }
  {
    Server& s = servers[2];
    const uint16_t port = spillway::http::FreeLoopbackPort();  // (llama-server takes a number, not port 0)
    s.pid = Spawn({llama_server, "-m", model, "--host", "127.0.0.1", "--port", std::to_string(port), "-t", t, "-tb", t,
                   "-c", c, "-np", "1", "-fa", "off", "--no-webui"},
                  (dir / "llama-server.log").string());
    s.port = s.pid > 0 ? WaitReady(s, "", port) : 0;
  }
  auto stop_all = [&] {
    for (auto& s : servers) {
      if (s.pid > 0) {
        kill(s.pid, SIGTERM);
        waitpid(s.pid, nullptr, 0);
      }
    }
  };
  for (const auto& s : servers) {
    if (!s.port) {
      std::fprintf(stderr, "%s did not start (logs in %s)\n", s.label.c_str(), dir.c_str());
      stop_all();
      return 1;
    }
  }
  for (auto& s : servers) {
    s.conn = std::make_unique<spillway::http::Connection>("127.0.0.1", s.port);
    s.ms.assign(static_cast<size_t>(turns), {});
    s.computed.assign(static_cast<size_t>(turns), {});
    s.compute_ms.assign(static_cast<size_t>(turns), {});
  }

  std::string reply;
  for (int w = 0; w < reply_words; ++w) reply += (w ? " " : "") + std::string(w % 7 == 0 ? "river" : w % 3 ? "stone" : "light");
  // One turn to one server: its time, the time it says it computed (prompt
  // and generation), and the prompt tokens it computed (-1: failed).
  auto ask = [&](Server& s, const json& messages, double* ms, double* compute_ms) -> double {
    const json body = {{"messages", messages}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
    const auto t0 = std::chrono::steady_clock::now();
    if (count_only) {  // the count alone: its tokens (what llama-server's two calls give)
      double n = -1;
      if (s.worker) {
        auto c = s.conn->Send("POST", "/v1/worker/tokenize?endpoint=chat", body.dump(), spillway::bench::WorkerAuth());
        if (c.ok() && c->status == 200) n = json::parse(c->body, nullptr, false).value("prompt_tokens", -1.0);
      } else {
        auto a = s.conn->Send("POST", "/apply-template", body.dump(), {});
        const json prompt = a.ok() && a->status == 200 ? json::parse(a->body, nullptr, false) : json();
        if (prompt.contains("prompt")) {
          const json tk = {{"content", prompt["prompt"]}, {"add_special", true}, {"parse_special", true}};
          auto t = s.conn->Send("POST", "/tokenize", tk.dump(), {});
          if (t.ok() && t->status == 200) n = static_cast<double>(json::parse(t->body, nullptr, false)["tokens"].size());
        }
      }
      *ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      *compute_ms = 0;
      if (n < 0) std::fprintf(stderr, "%s: the count failed\n", s.label.c_str());
      return n;
    }
    if (s.worker && count_first) {
      auto c = s.conn->Send("POST", "/v1/worker/tokenize?endpoint=chat", body.dump(), spillway::bench::WorkerAuth());
      if (!c.ok() || c->status != 200) return -1;
    }
    auto r = s.conn->Send("POST", "/v1/chat/completions", body.dump(),
                          s.worker ? spillway::bench::WorkerAuth() : spillway::http::HeaderList{});
    *ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!r.ok() || r->status != 200) {
      std::fprintf(stderr, "%s: %s\n", s.label.c_str(),
                   r.ok() ? (std::to_string(r->status) + " " + r->body.substr(0, 300)).c_str() : r.status().ToString().c_str());
      return -1;
    }
    const json j = json::parse(r->body, nullptr, false);
    if (s.worker) {
      const json& tm = j["spillway"]["timings"];
      *compute_ms = tm.value("prompt_ms", 0.0) + tm.value("generation_ms", 0.0);
      return tm.value("prompt_tokens", 0.0) - tm.value("cached_tokens", 0.0);
    }
    if (!j.contains("timings")) return -1;
    *compute_ms = j["timings"].value("prompt_ms", 0.0) + j["timings"].value("predicted_ms", 0.0);
    return j["timings"].value("prompt_n", -1.0);
  };
  double ignored = 0, ignored_too = 0;
  for (auto& s : servers) ask(s, json::array({{{"role", "user"}, {"content", "warm up"}}}), &ignored, &ignored_too);
  int failed = 0;
  for (int round = 0; round < rounds; ++round) {
    json messages = json::array({{{"role", "system"}, {"content", "You answer at length. Conversation " +
                                                                      std::to_string(round) + "."}},
                                 {{"role", "user"}, {"content", "Tell me about rivers, part 1."}}});
    for (int turn = 0; turn < turns; ++turn) {
      for (size_t k = 0; k < servers.size(); ++k) {
        Server& s = servers[(k + static_cast<size_t>(turn + round)) % servers.size()];
        double ms = 0, compute_ms = 0;
        const double computed = ask(s, messages, &ms, &compute_ms);
        if (computed < 0) {
          ++failed;
          continue;
        }
        s.ms[static_cast<size_t>(turn)].push_back(ms);
        s.computed[static_cast<size_t>(turn)].push_back(computed);
        s.compute_ms[static_cast<size_t>(turn)].push_back(compute_ms);
      }
      messages.push_back({{"role", "assistant"}, {"content", reply}});
      messages.push_back({{"role", "user"}, {"content", "Go on, part " + std::to_string(turn + 2) + "."}});
    }
  }
  stop_all();
  if (failed) {
    std::printf("%d requests failed (logs in %s)\n", failed, dir.c_str());
    return 1;
  }
  fs::remove_all(dir);
  std::printf("model %s, %d threads, ctx %d, one slot; %d conversations of %d turns, %d-word replies appended%s%s\n",
              model.c_str(), threads, ctx, rounds, turns, reply_words,
              count_only ? "" : (", " + std::to_string(max_tokens) + " tokens generated a turn").c_str(),
              count_only    ? "; each turn only counted (its prompt rendered and tokenized), nothing generated"
              : count_first ? "; each worker turn counted first (tokenize, then the run), as a gateway does"
                            : "");
  std::printf("%-5s", "turn");
  for (const auto& s : servers) std::printf(" | %28s", s.label.c_str());
  std::printf("\n%-5s", "");
  for (size_t k = 0; k < servers.size(); ++k) std::printf(" | %8s %8s %10s", "ms p50", "compute", "computed");
  std::printf("\n");
  std::vector<double> total(servers.size(), 0), later(servers.size(), 0), compute(servers.size(), 0);
  for (int turn = 0; turn < turns; ++turn) {
    std::printf("%-5d", turn + 1);
    for (size_t k = 0; k < servers.size(); ++k) {
      const double ms = Median(servers[k].ms[static_cast<size_t>(turn)]);
      const double cm = Median(servers[k].compute_ms[static_cast<size_t>(turn)]);
      total[k] += ms;
      compute[k] += cm;
      if (turn > 0) later[k] += ms;
      std::printf(" | %8.1f %8.1f %10.0f", ms, cm, Median(servers[k].computed[static_cast<size_t>(turn)]));
    }
    std::printf("\n");
  }
  if (!count_only) std::printf("of it computing (the servers' own prompt and generation times, p50s summed): spillway-worker %.0f ms, "
              "%s %.0f ms, llama-server %.0f ms; the rest (the request's handling: template, tokens, "
              "HTTP) %.0f, %.0f and %.0f ms\n",
              compute[0], other.c_str(), compute[1], compute[2], total[0] - compute[0], total[1] - compute[1],
              total[2] - compute[2]);
  std::printf("conversation (p50s summed): spillway-worker %.0f ms, %s %.0f ms, llama-server %.0f ms\n", total[0],
              other.c_str(), total[1], total[2]);
  std::printf("spillway-worker / llama-server: %.2fx the whole conversation, %.2fx its turns after the first; "
              "%s %.2fx and %.2fx\n",
              total[0] / total[2], later[0] / later[2], other.c_str(), total[1] / total[2], later[1] / later[2]);
  if (count_only) {
    std::printf("spillway-worker / %s: %.2fx the conversation's counts, %.2fx its turns after the first\n",
                other.c_str(), total[0] / total[1], later[0] / later[1]);
  } else {
    std::printf("goal: spillway-worker's conversation within 1.10x llama-server's: %s\n",
                total[0] <= 1.10 * total[2] ? "met" : "MISSED");
  }
  std::printf("%s", count_only ? "computed: the prompt's tokens, as each server counted them\n" : "");
  if (!count_only) std::printf("computed: the prompt tokens each server computed (its own count: spillway.timings' prompt_tokens less "
              "cached_tokens; llama-server's timings.prompt_n)\n");
  return 0;
}
