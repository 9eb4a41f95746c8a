#include "common/names.h"
#include "cli/chaos_command.h"

#include <algorithm>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>

#include "chaos/harness.h"
#include "chaos/report.h"
#include "chaos/schedule.h"

#ifndef SPILLWAY_LLAMA_SERVER
#define SPILLWAY_LLAMA_SERVER ""
#endif

namespace spillway::cli {

namespace fs = std::filesystem;

namespace {

struct ChaosArgs {
  std::string scenario = "all";
  uint64_t seed = 1;
  double duration_s = 20;
  int faults = -1;  // total; -1: 3 per scenario that has faults
  std::string report_dir = "chaos-report";
  bool json = false;
  bool pause = false;
  std::string baselines = "all";
  bool profiles = true;
  std::string llama_server = SPILLWAY_LLAMA_SERVER;
  std::string models_dir, work_dir;
  bool keep = false;
  std::string device = "sim:0";
};

std::string ExeDir() {
  std::error_code ec;
  return fs::canonical("/proc/self/exe", ec).parent_path().string();
}

int Chaos(const ChaosArgs& a) {
  std::vector<const chaos::Scenario*> scenarios;
  if (a.scenario == "all") {
    for (const auto& s : chaos::AllScenarios()) scenarios.push_back(&s);
  } else {
    for (size_t start = 0; start <= a.scenario.size();) {
      const size_t end = std::min(a.scenario.find(',', start), a.scenario.size());
      const std::string name = a.scenario.substr(start, end - start);
      const chaos::Scenario* s = chaos::FindScenario(name);
      if (!s) {
        std::string names;
        for (const auto& x : chaos::AllScenarios()) names += " " + x.name;
        std::fprintf(stderr, "spillway chaos: unknown scenario '%s' (known:%s)\n", name.c_str(), names.c_str());
        return 2;
      }
      scenarios.push_back(s);
      start = end + 1;
    }
  }
  chaos::HarnessOptions o;
  o.bin_dir = ExeDir();
  o.models_dir = a.models_dir.empty() ? o.bin_dir + "/../models" : a.models_dir;
  o.llama_server = a.llama_server;
  o.seed = a.seed;
  o.device = a.device;
  if (a.device != "sim:0" && !(a.device.rfind("cuda:", 0) == 0 && KnownDeviceName(a.device))) {
    std::fprintf(stderr, "spillway chaos: --device must be sim:0 or cuda:N\n");
    return 2;
  }
  o.duration_ms = static_cast<int64_t>(a.duration_s * 1000);
  for (const char* m : {"demo-chat.gguf", "demo-embed.gguf"}) {
    if (!fs::exists(o.models_dir + "/" + m)) {
      std::fprintf(stderr, "spillway chaos: %s/%s not found (build the demo models, or pass --models DIR)\n",
                   o.models_dir.c_str(), m);
      return 2;
    }
  }
  int with_faults = 0;
  for (const auto* s : scenarios) with_faults += s->fault_kinds.empty() ? 0 : 1;
  o.faults = a.faults < 0 ? 3 : (with_faults ? (a.faults + with_faults - 1) / with_faults : 0);
  // A directory of its own, in the one given (removed at the end: never
  // the given directory itself, which may hold the user's files).
  const fs::path scratch_parent = a.work_dir.empty() ? fs::temp_directory_path() : fs::path(a.work_dir);
  o.work_dir = (scratch_parent / ("spillway-chaos-" + std::to_string(getpid()))).string();
  fs::create_directories(o.work_dir);
  // Removed however the run ends (a report that cannot be written, an exception), unless --keep.
  struct Scratch {
    std::string dir;
    bool keep;
    ~Scratch() {
      std::error_code ec;
      if (!keep) fs::remove_all(dir, ec);
    }
  } scratch{o.work_dir, a.keep};
  o.log = [&](const std::string& line) {
    if (!a.json) std::fprintf(stderr, "chaos: %s\n", line.c_str());
  };
  std::vector<chaos::ScenarioResult> spillway, baselines, profiles;
  bool all_passed = true;
  int injected = 0;
  for (size_t i = 0; i < scenarios.size(); ++i) {
    const auto& s = *scenarios[i];
    auto r = chaos::RunScenario(s, chaos::Target::kSpillway, o);
    for (const auto& f : r.faults) injected += f.injected ? 1 : 0;  // (one whose target was not ready is not)
    all_passed &= r.verdict.passed;
    if (Status st = chaos::WriteScenario(a.report_dir, r); !st.ok()) {
      std::fprintf(stderr, "spillway chaos: %s\n", st.message().c_str());
    }
    if (!a.json) {
      const auto done = std::count_if(r.faults.begin(), r.faults.end(), [](const auto& f) { return f.injected; });
      std::fprintf(stderr, "chaos: %-26s %s  sent %d, success %.0f%%, lost %d, unknown %d, duplicates %d, p95 %.0f ms, %ld of %zu faults injected%s\n",
                   s.name.c_str(), r.verdict.passed ? "PASS" : "FAIL", r.verdict.sent, r.verdict.success_rate * 100,
                   r.verdict.lost, r.verdict.unknown, r.verdict.duplicates, r.verdict.p95_ms, static_cast<long>(done),
                   r.faults.size(),
                   r.verdict.faults_armed ? (" (" + std::to_string(r.verdict.faults_fired) + " of " +
                                             std::to_string(r.verdict.faults_armed) + " armed went off)").c_str()
                                          : "");
      for (const auto& f : r.verdict.failures) std::fprintf(stderr, "chaos:     %s\n", f.c_str());
    }
    spillway.push_back(std::move(r));
    // Scenarios of one service against the plain proxy and llama-server; services competing for a device
    // against llama-swap's policy (swap-all), which is all the other two could be there.
    if (s.Competing()) {
      if (a.baselines == "all" || a.baselines == "swap") baselines.push_back(chaos::RunScenario(s, chaos::Target::kSwapAll, o));
    } else {
      if (a.baselines == "all" || a.baselines == "plain") baselines.push_back(chaos::RunScenario(s, chaos::Target::kPlainProxy, o));
      if (a.baselines == "all" || a.baselines == "llama") baselines.push_back(chaos::RunScenario(s, chaos::Target::kLlamaServer, o));
    }
    if (a.pause && i + 1 < scenarios.size()) {
      std::fprintf(stderr, "chaos: %s written to %s; press Enter for the next scenario\n", s.name.c_str(),
                   a.report_dir.c_str());
      std::string line;
      std::getline(std::cin, line);
    }
  }
  if (a.profiles) {
    for (const char* p : {"resident", "split", "cpu"}) profiles.push_back(chaos::RunProfile(p, o));
  }
  if (Status st = chaos::WriteReport(a.report_dir, spillway, baselines, profiles, a.seed); !st.ok()) {
    std::fprintf(stderr, "spillway chaos: %s\n", st.message().c_str());
    return 1;
  }
  if (a.json) {
    std::printf("%s\n", chaos::ReportJson(spillway, baselines, profiles, a.seed).dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("%s\n", chaos::MarkdownSummary(spillway, baselines, profiles, a.seed).c_str());
    std::fprintf(stderr, "chaos: %d faults injected; report in %s; %s\n", injected, a.report_dir.c_str(),
                 all_passed ? "every scenario passed" : "SOME SCENARIOS FAILED");
  }
  return all_passed ? 0 : 1;
}

}  // namespace

void AddChaosCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ChaosArgs>();
  auto* cmd = app.add_subcommand(
      "chaos",
      "the proving suite: replays the failure scenarios (allocation failures, lost device, hung worker, memory taken by "
      "others, gateway kill -9, ...) on a simulated device with its own gateway and workers, against a plain proxy and "
      "llama-server as baselines, and reports success, lost requests, duplicates, token equivalence, latency, queue "
      "age, host RAM and recovery time. Exit status 0 only if every scenario passes.");
  std::string names;
  for (const auto& s : chaos::AllScenarios()) names += "\n  " + s.name + ": " + s.description;
  cmd->add_option("--scenario", args->scenario, "a scenario, a comma-separated list, or all:" + names)->capture_default_str();
  cmd->add_option("--seed", args->seed, "fixes every request and fault; a failing seed replays the same run")->capture_default_str();
  cmd->add_option("--duration", args->duration_s, "seconds of traffic per scenario")
      ->check(CLI::Number)->check(CLI::Range(2.0, 3600.0))->capture_default_str();
  cmd->add_option("--faults", args->faults, "faults to inject in all (spread over the scenarios; default 3 each)")
      ->check(CLI::Number)->check(CLI::Range(1, 1000000));  // (none: a fault scenario that proves nothing)
  cmd->add_option("--report", args->report_dir, "directory for summary.md, report.json, per-scenario JSON and SVG plots")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "print the whole report as JSON on stdout instead of the summary");
  cmd->add_flag("--pause", args->pause, "wait for Enter after each scenario (its records are already written)");
  cmd->add_option("--baselines", args->baselines,
                  "which baselines to run on the same schedule: plain (the gateway as a plain proxy) and llama "
                  "(llama-server) for the single-service scenarios, swap (llama-swap's one-at-a-time policy) for "
                  "competing_services")
      ->check(CLI::IsMember({"all", "plain", "llama", "swap", "none"}))->capture_default_str();
  cmd->add_flag("!--no-profiles", args->profiles, "skip the placement profiles (resident, split, cpu)");
  cmd->add_option("--llama-server", args->llama_server, "llama.cpp's llama-server, for the baseline")->capture_default_str();
  cmd->add_option("--models", args->models_dir, "directory with demo-chat.gguf and demo-embed.gguf (default: the build's)");
  cmd->add_option("--work-dir", args->work_dir, "where the scratch directory goes (configs, journals, logs: a spillway-chaos-<pid> directory made in it and "
                  "removed at the end unless --keep; default: the system's temporary directory)");
  cmd->add_option("--device", args->device,
                  "sim:0 (a fresh simulated device per run) or a real cuda:N; on a real device only kill -9 faults are "
                  "injected and scenarios that need the simulated device are reported as skipped")
      ->capture_default_str();
  cmd->add_flag("--keep", args->keep, "keep the scratch directory (logs of every process)");
  cmd->callback([args, exit_code] { *exit_code = Chaos(*args); });
}

}  // namespace spillway::cli
