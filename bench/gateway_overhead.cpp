// Benchmark: what the gateway adds to a request, against the worker called
// directly, in the same run over loopback. A small non-streaming completion
// (1 token) for latency, a streamed one for time to first token; once with the
// journal at synchronous=FULL (the default: fsync per commit) and once at
// NORMAL; plus the journal's own writes measured alone.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "api/http_client.h"
#include "worker_secret.h"
#include "common/clock.h"
#include "journal/journal.h"

extern char** environ;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {

double Pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}
double Us(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); }

struct Gateway {
  pid_t pid = -1;
  uint16_t port = 0;
  std::string dir;
};

Gateway StartGateway(const std::string& bin, const std::string& model, bool full) {
  Gateway g;
  g.dir = fs::temp_directory_path() / ("spillway-bench-gw-" + std::to_string(getpid()) + (full ? "-full" : "-normal"));
  fs::remove_all(g.dir);
  fs::create_directories(g.dir);
  std::ofstream(g.dir + "/c.toml") << "[journal]\nsynchronous = \"" << (full ? "full" : "normal") << "\"\n"
                                    << "[[service]]\nname = \"chat\"\nmodel = \"" << model << "\"\n"
                                    << "[[service.placement]]\ndevice = \"cpu\"\nctx = 1024\nslots = 1\nthreads = 1\n";
  std::vector<std::string> args = {bin + "/spillway", "serve", "--config", g.dir + "/c.toml", "--state-dir",
                                   g.dir + "/state", "--listen", "127.0.0.1:0", "--port-file", g.dir + "/port"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, (g.dir + "/log").c_str(), O_WRONLY | O_CREAT, 0644);
  posix_spawn(&g.pid, argv[0], &fa, nullptr, argv.data(), environ);
  for (int i = 0; i < 3000; ++i) {
    std::ifstream f(g.dir + "/port");
    int p = 0;
    if (f >> p) {
      auto r = spillway::http::Fetch("127.0.0.1", static_cast<uint16_t>(p), "GET", "/readyz");
      if (r.ok() && r->status == 200) {
        g.port = static_cast<uint16_t>(p);
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return g;
}

void StopGateway(Gateway& g) {
  kill(g.pid, SIGTERM);
  waitpid(g.pid, nullptr, 0);
  fs::remove_all(g.dir);
}

struct Row {
  double p50, p99;
};

void Measure(const std::string& label, uint16_t gw_port, uint16_t worker_port, int n) {
  spillway::http::Connection gw("127.0.0.1", gw_port), direct("127.0.0.1", worker_port);
  const std::string direct_body = json{{"prompt", "x"}, {"max_tokens", 1}, {"temperature", 0}}.dump();
  const std::string gw_body = json{{"model", "chat"}, {"prompt", "x"}, {"max_tokens", 1}, {"temperature", 0}}.dump();
  for (int i = 0; i < 20; ++i) {
    (void)direct.Send("POST", "/v1/completions", direct_body, spillway::bench::WorkerAuth());
    (void)gw.Send("POST", "/v1/completions", gw_body);
  }
  std::vector<double> d, g, diff;
  for (int i = 0; i < n; ++i) {  // interleaved, so drift hits both alike
    auto t0 = Clock::now();
    auto a = direct.Send("POST", "/v1/completions", direct_body, spillway::bench::WorkerAuth());
    auto t1 = Clock::now();
    auto b = gw.Send("POST", "/v1/completions", gw_body);
    auto t2 = Clock::now();
    if (!a.ok() || !b.ok() || a->status != 200 || b->status != 200) continue;
    d.push_back(Us(t0, t1));
    g.push_back(Us(t1, t2));
  }
  std::vector<double> ttft_d, ttft_g;
  auto ttft = [](uint16_t port, const std::string& body) {
    auto t0 = Clock::now();
    double first = -1;
    (void)spillway::http::StreamFetch(
        "127.0.0.1", port, "POST", "/v1/completions", body, spillway::bench::WorkerAuth(), [](const auto&) { return true; },
        [&](std::string_view) {
          if (first < 0) first = Us(t0, Clock::now());
          return true;
        });
    return first;
  };
  const std::string sd = json{{"prompt", "x"}, {"max_tokens", 4}, {"stream", true}}.dump();
  const std::string sg = json{{"model", "chat"}, {"prompt", "x"}, {"max_tokens", 4}, {"stream", true}}.dump();
  for (int i = 0; i < n / 4; ++i) {
    ttft_d.push_back(ttft(worker_port, sd));
    ttft_g.push_back(ttft(gw_port, sg));
  }
  std::printf("%-22s %9.0f %9.0f %9.0f %7.2fx | %9.0f %9.0f %9.0f | %9.0f %9.0f %9.0f\n", label.c_str(), Pct(d, 0.5),
              Pct(g, 0.5), Pct(g, 0.5) - Pct(d, 0.5), Pct(g, 0.5) / Pct(d, 0.5), Pct(d, 0.99), Pct(g, 0.99),
              Pct(g, 0.99) - Pct(d, 0.99), Pct(ttft_d, 0.5), Pct(ttft_g, 0.5), Pct(ttft_g, 0.5) - Pct(ttft_d, 0.5));
}

void JournalAlone(bool full, int n) {
  spillway::SystemClock clock;
  const std::string dir = fs::temp_directory_path() / ("spillway-bench-journal-" + std::to_string(getpid()));
  fs::remove_all(dir);
  spillway::journal::JournalOptions o;
  o.synchronous_full = full;
  auto j = spillway::journal::Journal::Open(dir + "/j.db", o, clock);
  std::vector<double> accept, start, finish;
  for (int i = 0; i < n; ++i) {
    spillway::journal::RequestRecord r;
    r.id = "r" + std::to_string(i);
    r.payload_hash = "h";
    r.service = "chat";
    r.endpoint = "completion";
    r.body = R"({"model":"chat","prompt":"x","max_tokens":1})";
    auto t0 = Clock::now();
    (void)(*j)->Accept(r);
    auto t1 = Clock::now();
    (void)(*j)->StartAttempt(r.id, "cpu");
    auto t2 = Clock::now();
    (void)(*j)->Finish(r.id, spillway::journal::State::kCompleted, 200, "application/json", std::string(600, 'x'));
    auto t3 = Clock::now();
    accept.push_back(Us(t0, t1));
    start.push_back(Us(t1, t2));
    finish.push_back(Us(t2, t3));
  }
  std::printf("journal synchronous=%-6s  accept p50 %7.0f us p99 %7.0f | attempt p50 %7.0f p99 %7.0f | finish p50 %7.0f p99 %7.0f\n",
              full ? "FULL" : "NORMAL", Pct(accept, .5), Pct(accept, .99), Pct(start, .5), Pct(start, .99),
              Pct(finish, .5), Pct(finish, .99));
  fs::remove_all(dir);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Gateway overhead: latency added by spillway serve over calling the worker directly"};
  std::string bin = "build/bin", model = "build/models/tiny-chat.gguf";
  int n = 400;
  app.add_option("--bin", bin)->capture_default_str();
  app.add_option("--model", model)->capture_default_str();
  app.add_option("-n", n, "requests per side")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  spillway::bench::WorkerSecret();  // the gateway's workers take it; the direct calls send it
  std::printf("non-streaming 1-token completion, loopback, keep-alive, interleaved; times in microseconds\n");
  std::printf("%-22s %9s %9s %9s %8s | %9s %9s %9s | %9s %9s %9s\n", "journal", "p50 dir", "p50 gw", "added", "ratio",
              "p99 dir", "p99 gw", "added", "ttft dir", "ttft gw", "added");
  for (bool full : {true, false}) {
    Gateway g = StartGateway(bin, model, full);
    if (!g.port) {
      std::fprintf(stderr, "gateway did not start\n");
      return 1;
    }
    auto st = spillway::http::Fetch("127.0.0.1", g.port, "GET", "/v1/status");
    const uint16_t worker = json::parse(st->body)["services"][0]["placements"][0]["port"].get<uint16_t>();
    Measure(full ? "FULL (default)" : "NORMAL", g.port, worker, n);
    StopGateway(g);
  }
  JournalAlone(true, 200);
  JournalAlone(false, 200);
  std::printf("targets: <= 50 us p50 and <= 500 us p99 added\n");
  return 0;
}
