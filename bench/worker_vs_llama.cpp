// Benchmark: spillway-worker's prompt and decode throughput against llama.cpp's
// own llama-bench, built from the same source, on the same model and threads.
//
// llama-bench measures pp<N> (one N-token prompt) and tg<M> (M single-token
// decodes from an empty cache). The worker is measured on the same work: an
// N-token prompt given as token ids with max_tokens 1, and a 1-token prompt
// with max_tokens M+1 (M decodes), using the worker's own timings, plus the
// end-to-end HTTP time for reference. Prints the ratios worker / llama-bench.
//
// Same settings on both sides: the worker runs without flash attention
// (its CPU kernels round differently with the batch's shape, and a worker's
// answers must not depend on what else it decodes: batch invariance), so
// llama-bench runs with `-fa off` too (its default, auto, turns it on).
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
#include <random>
#include <thread>

#include "api/http_client.h"
#include "worker_secret.h"

extern char** environ;
using nlohmann::json;

namespace {

std::string RunCapture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"spillway-worker vs llama-bench: prompt and decode tokens/s on the same model"};
  std::string model, llama_bench, worker;
  int threads = 2, n_prompt = 512, n_gen = 128, reps = 3, rounds = 3;
  app.add_option("--model", model)->required();
  app.add_option("--llama-bench", llama_bench)->required();
  app.add_option("--worker", worker)->required();
  app.add_option("--threads", threads)->capture_default_str();
  app.add_option("--n-prompt", n_prompt)->capture_default_str();
  app.add_option("--n-gen", n_gen)->capture_default_str();
  app.add_option("--reps", reps, "repetitions per round")->capture_default_str();
  std::string device = "cpu";
  int gpu_layers = 0;
  app.add_option("--device", device, "worker --device (llama-bench then offloads --gpu-layers too)")->capture_default_str();
  app.add_option("--gpu-layers", gpu_layers)->capture_default_str();
  app.add_option("--rounds", rounds, "interleaved rounds of llama-bench and worker")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  // The peer: llama-bench, run once per round.
  const std::string cmd = llama_bench + " -m " + model + " -p " + std::to_string(n_prompt) + " -n " +
                          std::to_string(n_gen) + " -t " + std::to_string(threads) + " -r " + std::to_string(reps) +
                          " -ngl " + std::to_string(device == "cpu" ? 0 : gpu_layers) + " -fa off -o json 2>/dev/null";
  auto run_peer = [&](double* pp, double* tg) {
    json lb = json::parse(RunCapture(cmd), nullptr, false);
    *pp = *tg = 0;
    if (!lb.is_array()) return false;
    for (const auto& e : lb) {
      if (e.value("n_prompt", 0) == n_prompt && e.value("n_gen", 0) == 0) *pp = e.value("avg_ts", 0.0);
      if (e.value("n_gen", 0) == n_gen && e.value("n_prompt", 0) == 0) *tg = e.value("avg_ts", 0.0);
    }
    return *pp > 0 && *tg > 0;
  };

  // 2. The worker, on the same model and thread count.
  const std::string dir = std::filesystem::temp_directory_path() / ("spillway-bench-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string port_file = dir + "/port";
  std::vector<std::string> args = {worker, "--model", model, "--listen", "127.0.0.1:0", "--port-file", port_file,
                                   "--threads", std::to_string(threads), "--slots", "1",
                                   "--ctx", std::to_string(n_prompt + n_gen + 64), "--batch", std::to_string(n_prompt),
                                   "--device", device, "--gpu-layers", std::to_string(gpu_layers)};
  std::vector<char*> argvv;
  for (auto& a : args) argvv.push_back(a.data());
  argvv.push_back(nullptr);
  pid_t pid;
  spillway::bench::WorkerSecret();  // the worker takes it from the environment
  if (posix_spawn(&pid, worker.c_str(), nullptr, nullptr, argvv.data(), environ) != 0) return 1;
  uint16_t port = 0;
  for (int i = 0; i < 3000 && !port; ++i) {
    std::ifstream f(port_file);
    int p = 0;
    if (f >> p) port = static_cast<uint16_t>(p);
    else std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!port) {
    kill(pid, SIGKILL);
    std::fprintf(stderr, "worker did not start\n");
    return 1;
  }
  spillway::http::Connection conn("127.0.0.1", port);
  std::mt19937 rng(1);
  auto tokens = [&](int n) {
    json a = json::array();
    for (int i = 0; i < n; ++i) a.push_back(3 + static_cast<int>(rng() % 30000));
    return a;
  };
  auto call = [&](const json& body, double* wall_ms) -> json {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = conn.Send("POST", "/v1/completions", body.dump(), spillway::bench::WorkerAuth());
    *wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!r.ok() || r->status != 200) return json();
    return json::parse(r->body);
  };
  double wall = 0;
  call({{"prompt", tokens(16)}, {"max_tokens", 4}, {"temperature", 0}}, &wall);  // warm-up

  std::vector<double> pp, pp_wall, tg, tg_wall, peer_pp, peer_tg;
  for (int round = 0; round < rounds; ++round) {
    double a = 0, b = 0;
    if (!run_peer(&a, &b)) {
      std::fprintf(stderr, "llama-bench gave no result (%s)\n", cmd.c_str());
      kill(pid, SIGKILL);
      return 1;
    }
    peer_pp.push_back(a);
    peer_tg.push_back(b);
  for (int r = 0; r < reps; ++r) {
    json a = call({{"prompt", tokens(n_prompt)}, {"max_tokens", 1}, {"temperature", 0}}, &wall);
    if (a.is_null()) break;
    pp.push_back(n_prompt / (a["spillway"]["timings"]["prompt_ms"].get<double>() / 1000.0));
    pp_wall.push_back(n_prompt / (wall / 1000.0));
    json b = call({{"prompt", tokens(1)}, {"max_tokens", n_gen + 1}, {"temperature", 0}, {"ignore_eos", true}}, &wall);
    if (b.is_null()) break;
    tg.push_back(n_gen / (b["spillway"]["timings"]["generation_ms"].get<double>() / 1000.0));
    tg_wall.push_back((n_gen + 1) / (wall / 1000.0));
  }
  }
  kill(pid, SIGTERM);
  int st;
  waitpid(pid, &st, 0);
  std::filesystem::remove_all(dir);
  if (pp.empty() || tg.empty()) {
    std::fprintf(stderr, "worker requests failed\n");
    return 1;
  }
  // Other tenants only ever slow a run down, so the best of the interleaved
  // rounds is the least noisy estimate of each side; medians are shown too.
  auto best = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  const double r_pp = best(pp) / best(peer_pp), r_tg = best(tg) / best(peer_tg);
  std::printf("model %s, %d threads, %d rounds x %d repetitions, llama-bench and worker interleaved\n", model.c_str(),
              threads, rounds, reps);
  std::printf("%-8s %16s %16s %8s %16s %16s %8s %14s\n", "test", "llama-bench best", "worker best", "ratio",
              "llama-bench med", "worker med", "ratio", "worker e2e med");
  std::printf("%-8s %12.1f t/s %12.1f t/s %7.3fx %12.1f t/s %12.1f t/s %7.3fx %10.1f t/s\n",
              ("pp" + std::to_string(n_prompt)).c_str(), best(peer_pp), best(pp), r_pp, Median(peer_pp), Median(pp),
              Median(pp) / Median(peer_pp), Median(pp_wall));
  std::printf("%-8s %12.1f t/s %12.1f t/s %7.3fx %12.1f t/s %12.1f t/s %7.3fx %10.1f t/s\n",
              ("tg" + std::to_string(n_gen)).c_str(), best(peer_tg), best(tg), r_tg, Median(peer_tg), Median(tg),
              Median(tg) / Median(peer_tg), Median(tg_wall));
  const bool met = r_pp >= 0.97 && r_tg >= 0.97;
  std::printf("target >= 0.97x on both: %s\n", met ? "met" : "NOT met");
  return 0;
}
