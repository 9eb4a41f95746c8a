// Benchmark: failover costs on the simulated device, through a real gateway.
//   failover overhead  = time to the first streamed token when the GPU attempt
//                        fails (injected compute error) minus the CPU path's own
//                        time to first token (warm replica; target <= 100 ms),
//                        and the same with an idle mmap replica (its context is
//                        created on demand) and a stopped on-demand replica (the
//                        whole worker is started)
//   dead-worker detection: kill -9 of the GPU worker until the supervisor has
//                        seen it exit (target <= 100 ms)
//   hung-worker detection: a stalled decode loop until the worker is replaced
//                        (progress timeout 1 s; target <= 2 s)
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
#include <memory>
#include <thread>

#include "api/http_client.h"
#include "worker_secret.h"
#include "devices/sim_ledger.h"

extern char** environ;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {

double Ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

json Status(uint16_t port) {
  auto r = spillway::http::Fetch("127.0.0.1", port, "GET", "/v1/status");
  return r.ok() ? json::parse(r->body, nullptr, false) : json();
}

double Ttft(uint16_t port, const std::string& body) {
  const auto t0 = Clock::now();
  double first = -1;
  (void)spillway::http::StreamFetch(
      "127.0.0.1", port, "POST", "/v1/completions", body, {}, [](const auto&) { return true; },
      [&](std::string_view d) {
        if (first < 0 && d.find("\"text\"") != std::string_view::npos) first = Ms(t0, Clock::now());
        return true;
      });
  return first;
}

struct Gateway {
  pid_t pid = 0;
  uint16_t port = 0;
  std::string dir;
  json Placement(int i) const { return Status(port)["services"][0]["placements"][i]; }
  ~Gateway() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      waitpid(pid, nullptr, 0);
    }
  }
};

// A gateway with the GPU placement on sim:0 and a CPU fallback kept ready by `readiness`.
std::unique_ptr<Gateway> Start(const std::string& bin, const std::string& model, const std::string& dir,
                               const std::string& readiness) {
  auto g = std::make_unique<Gateway>();
  g->dir = dir + "/" + readiness;
  fs::create_directories(g->dir);
  std::ofstream(g->dir + "/c.toml") << "[[service]]\nname = \"chat\"\nmodel = \"" << model << "\"\n"
                                    << "[service.failover]\nbreaker_failures = 1000\nreadiness = \"" << readiness
                                    << "\"\nidle_unload_s = 1\n"
                                    << "[[service.placement]]\ndevice = \"sim:0\"\ngpu_layers = 99\nctx = 1024\nslots = 2\n"
                                    << "threads = 1\nbatch = 64\nprogress_timeout_s = 1\n"
                                    << "[[service.placement]]\nrole = \"fallback\"\ndevice = \"cpu\"\nctx = 1024\nslots = 2\n"
                                    << "threads = 1\nbatch = 64\n";
  std::vector<std::string> args = {bin + "/spillway", "serve", "--config", g->dir + "/c.toml", "--state-dir",
                                   g->dir + "/state", "--listen", "127.0.0.1:0", "--port-file", g->dir + "/port"};
  std::vector<char*> argvv;
  for (auto& a : args) argvv.push_back(a.data());
  argvv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, (g->dir + "/log").c_str(), O_WRONLY | O_CREAT, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawn(&g->pid, argvv[0], &fa, nullptr, argvv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  const std::string want_cpu = readiness == "on-demand" ? "stopped" : "ready";
  for (int i = 0; i < 3000 && !g->port; ++i) {
    std::ifstream f(g->dir + "/port");
    int p = 0;
    if (f >> p) {
      json s = Status(static_cast<uint16_t>(p));
      if (s.is_object() && s["services"][0]["placements"][0]["state"] == "ready" &&
          s["services"][0]["placements"][1]["state"] == want_cpu) {
        g->port = static_cast<uint16_t>(p);
      }
    }
    if (!g->port) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!g->port) std::fprintf(stderr, "gateway (%s) did not start; see %s/log\n", readiness.c_str(), g->dir.c_str());
  return g->port ? std::move(g) : nullptr;
}

const std::string kBody = json{{"model", "chat"}, {"prompt", "fail over"}, {"max_tokens", 4}, {"temperature", 0},
                               {"stream", true}}.dump();

// Time to the first token through the gateway while the GPU attempt fails.
double FailedOverTtft(const Gateway& g) {
  const uint16_t gpu_port = g.Placement(0)["port"].get<uint16_t>();
  (void)spillway::http::Fetch("127.0.0.1", gpu_port, "POST", "/v1/worker/faults", json{{"faults", {"compute-error"}}}.dump(),
                              spillway::bench::WorkerAuth());
  return Ttft(g.port, kBody);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string bin = argc > 1 ? argv[1] : "build/bin";
  const std::string model = argc > 2 ? argv[2] : "build/models/tiny-chat.gguf";
  spillway::bench::WorkerSecret();  // the gateway's workers take it; the fault calls send it
  const std::string dir = fs::temp_directory_path() / ("spillway-bench-fo-" + std::to_string(getpid()));
  fs::create_directories(dir);
  setenv("SPILLWAY_SIM_DIR", dir.c_str(), 1);
  (void)spillway::devices::SimLedger::Create(0, 256 << 20);
  double cpu_ttft = 0;
  {
    auto g = Start(bin, model, dir, "warm");
    if (!g) return 1;
    const uint16_t cpu_port = g->Placement(1)["port"].get<uint16_t>();
    std::vector<double> cpu, failover;
    for (int i = 0; i < 15; ++i) {
      cpu.push_back(Ttft(cpu_port, kBody));
      failover.push_back(FailedOverTtft(*g));
    }
    cpu_ttft = Median(cpu);
    std::printf("CPU path time to first token (direct):   median %.1f ms\n", cpu_ttft);
    std::printf("through the gateway, GPU attempt failing: median %.1f ms\n", Median(failover));
    std::printf("failover overhead (warm replica):        %.1f ms (target <= 100 ms)\n", Median(failover) - cpu_ttft);
  }
  for (const char* readiness : {"mmap", "on-demand"}) {
    auto g = Start(bin, model, dir, readiness);
    if (!g) return 1;
    std::vector<double> failover;
    for (int i = 0; i < 5; ++i) {
      // Idle past idle_unload_s: the context (mmap) or the worker (on-demand) is gone again.
      for (int k = 0; k < 500; ++k) {
        const json p = g->Placement(1);
        const bool idle = std::string(readiness) == "mmap" ? !p["readiness"].value("context_created", true)
                                                          : p["state"] == "stopped";
        if (idle) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      failover.push_back(FailedOverTtft(*g));
    }
    const json r = g->Placement(1)["readiness"];
    std::printf("failover overhead (%-9s replica):     %.1f ms (expected readiness %.0f ms)\n", readiness,
                Median(failover) - cpu_ttft, r.value("expected_s", 0.0) * 1000);
  }

  auto gp = Start(bin, model, dir, "warm");
  if (!gp) return 1;
  const Gateway& g = *gp;
  auto placement = [&](int i) { return g.Placement(i); };
  // Dead worker: kill -9 until the supervisor has noticed.
  std::vector<double> dead;
  for (int i = 0; i < 5; ++i) {
    json g;
    for (int k = 0; k < 500; ++k) {
      g = placement(0);
      if (g["state"] == "ready") break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const pid_t pid = g["pid"].get<pid_t>();
    const auto t0 = Clock::now();
    kill(pid, SIGKILL);
    while (Ms(t0, Clock::now()) < 5000) {
      json s = placement(0);
      if (s["pid"].get<pid_t>() != pid || s["state"] != "ready") break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    dead.push_back(Ms(t0, Clock::now()));
  }
  std::printf("dead-worker detection:                   median %.1f ms (target <= 100 ms)\n", Median(dead));

  // Hung worker: a stalled decode loop until the worker is replaced.
  std::vector<double> hung;
  for (int i = 0; i < 3; ++i) {
    json g;
    for (int k = 0; k < 1000; ++k) {
      g = placement(0);
      if (g["state"] == "ready") break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const pid_t pid = g["pid"].get<pid_t>();
    const uint16_t gpu_port = g["port"].get<uint16_t>();
    (void)spillway::http::Fetch("127.0.0.1", gpu_port, "POST", "/v1/worker/faults", json{{"faults", {"hang=60"}}}.dump(),
                                spillway::bench::WorkerAuth());
    std::thread req([&] { (void)spillway::http::Fetch("127.0.0.1", gpu_port, "POST", "/v1/completions",
                                                       json{{"prompt", "x"}, {"max_tokens", 2}}.dump(),
                                                       spillway::bench::WorkerAuth()); });
    const auto t0 = Clock::now();
    while (Ms(t0, Clock::now()) < 10000) {
      json s = placement(0);
      if (s["pid"].get<pid_t>() != pid || s["state"] != "ready") break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    hung.push_back(Ms(t0, Clock::now()));
    req.join();
  }
  std::printf("hung-worker detection (timeout 1 s):     median %.1f ms (target <= 2000 ms)\n", Median(hung));
  gp.reset();
  fs::remove_all(dir);
  return 0;
}
