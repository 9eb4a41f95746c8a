#include "chaos/schedule.h"

#include <algorithm>
#include <cstdio>
#include <random>

namespace spillway::chaos {

const std::vector<Scenario>& AllScenarios() {
  static const std::vector<Scenario> all = [] {
    std::vector<Scenario> v;
    auto add = [&](Scenario s) { v.push_back(std::move(s)); };
    add({"short_prompts", "steady short prompts while the accelerator path fails now and then", 4, 8, 0.5, 0, 0, 0.15, 0,
         8, 32, {"compute-error"}, false});
    // (A KV cache's cells are allocated with its context: at run time it fails as full, not as an allocation.)
    add({"long_prompts", "prompts longer than the accelerator's KV pool, and a KV cache with no room for a batch", 2, 6,
         0.5, 0.5, 0, 0.1, 0, 8, 24, {"kv-full"}, false});
    add({"concurrent", "many requests at once with compute failures", 8, 16, 0.5, 0, 0, 0.1, 0, 8, 32,
         {"compute-error", "fail-next=compute"}, false});
    add({"other_workload", "another program takes most of the device memory, then lets go", 3, 8, 0.5, 0, 0, 0.15, 0, 8,
         32, {"sim-hold"}, true});
    add({"memory_steps", "the device's free memory shrinks step by step while the GPU worker restarts", 3, 8, 0.5, 0, 0,
         0.15, 0, 8, 32, {"memory-step"}, false});
    add({"routing_before_admission", "requests that cannot fit the accelerator are routed before any allocation", 3, 8,
         0.5, 0.6, 0, 0.1, 0, 16, 48, {}, false});
    add({"allocation_failure", "allocation failures at KV, compute and re-reservation, before the first token", 3, 8, 0.5,
         0, 0, 0.1, 0, 8, 32, {"fail-next=kv", "fail-next=compute", "fail-next=reserve"}, false});
    add({"driver_reset", "the device is lost mid-generation, or the GPU worker is killed (-9)", 3, 8, 0.5, 0, 0, 0.15, 0,
         16, 48, {"lose-at-token", "kill-gpu-worker"}, true});
    add({"hung_worker", "the GPU worker's decode loop hangs while /health still answers", 2, 6, 0.5, 0, 0, 0.15, 0, 8, 32,
         {"hang"}, false});
    add({"cancel_in_cpu_queue", "the accelerator is out, the CPU line fills, clients cancel while waiting", 6, 14, 0.5, 0,
         0, 0.1, 0.4, 150, 300, {"gpu-out"}, false});
    add({"unrelated_traffic", "heavy traffic on an unrelated service while the GPU path fails", 3, 8, 0.5, 0, 0, 0.5, 0, 8,
         32, {"kill-gpu-worker", "compute-error"}, false});
    add({"agent_tool_calls", "agent requests whose tool increments the harness's counter, device lost after the call", 2, 6,
         0.5, 0, 0.6, 0.1, 0, 120, 120, {"lose-after-tool-call"}, false});
    add({"gateway_restart", "the gateway itself is killed (-9) and restarted mid-run", 3, 8, 0.5, 0, 0, 0.1, 0, 8, 32,
         {"kill-gateway"}, true});
    Scenario competing{"competing_services",
                       "a pinned chat, batch embeddings and an on-demand interactive service share a device too small "
                       "for all three: the interactive one evicts the batch one, chat's p95 stays as when alone",
                       6, 16, 0.5, 0, 0, 0, 0, 16, 16, {}, false};
    competing.batch_phases = 3;
    competing.batch_clients = 2;
    competing.batch_think_ms = 100;
    competing.search_fraction = 0.15;
    add(competing);
    return v;
  }();
  return all;
}

const Scenario* FindScenario(const std::string& name) {
  for (const auto& s : AllScenarios()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::string PromptText(uint64_t seed, int words) {
  static const char* kWords[] = {"river", "stone", "light", "garden", "engine", "window", "paper", "cloud", "signal",
                                 "market", "forest", "planet", "bridge", "music", "winter", "harbor"};
  std::mt19937_64 rng(seed);
  std::string out;
  for (int i = 0; i < words; ++i) {
    if (i) out += ' ';
    out += kWords[rng() % (sizeof kWords / sizeof *kWords)];
  }
  return out;
}

std::vector<Window> PressureWindows(const Scenario& s, int64_t duration_ms) {
  std::vector<Window> out;
  const int slices = 2 * s.batch_phases;
  const double span = duration_ms * 0.85, slice = slices > 0 ? span / slices : 0;
  for (int i = 1; i < slices; i += 2) {
    out.push_back({static_cast<int64_t>(slice * i), static_cast<int64_t>(slice * (i + 1))});
  }
  return out;
}

PlannedRequest BatchRequest(const Scenario& s, uint64_t seed, int n) {
  PlannedRequest r;
  char id[64];
  std::snprintf(id, sizeof id, "chaos-%s-%llu-b%04d", s.name.c_str(), static_cast<unsigned long long>(seed), n);
  r.id = id;
  r.kind = "embedding";
  r.prompt_words = 8 + static_cast<int>((seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(n) * 0x100000001B3ull) % 24);
  return r;
}

Schedule MakeSchedule(const Scenario& s, uint64_t seed, int64_t duration_ms, int faults) {
  // One generator per scenario, derived from the seed and the name: adding a
  // scenario does not change the others' schedules.
  uint64_t h = seed * 0x9E3779B97F4A7C15ull;
  for (char c : s.name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001B3ull;
  std::mt19937_64 rng(h);
  auto uniform = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  auto chance = [&](double p) { return uniform(0, 1) < p; };
  Schedule out;
  // Requests arrive as a Poisson process over the first 85% of the run (see below for competing services).
  const double rate_per_ms = s.requests_per_s / 1000.0;
  double t = 0;
  int n = 0;
  while (true) {
    // Services competing: evenly spaced (within 20 %) rather than Poisson, so that the interactive p95 before and
    // during the batch traffic compares interference, not which phase drew a burst of arrivals.
    t += s.Competing() ? uniform(0.8, 1.2) / rate_per_ms : std::exponential_distribution<double>(rate_per_ms)(rng);
    if (t > duration_ms * 0.85) break;
    PlannedRequest r;
    r.at_ms = static_cast<int64_t>(t);
    char id[64];
    std::snprintf(id, sizeof id, "chaos-%s-%llu-%04d", s.name.c_str(), static_cast<unsigned long long>(seed), n++);
    r.id = id;
    if (s.Competing() && chance(s.search_fraction)) {
      r.kind = "search";
      r.prompt_words = static_cast<int>(uniform(2, 12));
    } else if (chance(s.embed_fraction)) {
      r.kind = "embedding";
      r.prompt_words = static_cast<int>(uniform(2, 12));
    } else {
      r.kind = chance(s.agent_fraction) ? "agent" : chance(0.5) ? "chat" : "completion";
      r.stream = chance(s.stream_fraction);
      r.long_prompt = r.kind != "agent" && chance(s.long_prompt_fraction);
      r.prompt_words = r.long_prompt ? 1100 + static_cast<int>(uniform(0, 400)) : static_cast<int>(uniform(3, 20));
      r.max_tokens = static_cast<int>(uniform(s.max_tokens_lo, s.max_tokens_hi + 1));
      r.seed = static_cast<uint32_t>(rng() & 0x7fffffff);
      if (chance(s.cancel_fraction)) r.cancel_after_ms = static_cast<int64_t>(uniform(200, 1000));
    }
    out.requests.push_back(r);
  }
  if (!s.fault_kinds.empty()) {
    const double lo = duration_ms * 0.10, hi = duration_ms * 0.75;
    for (int i = 0; i < faults; ++i) {
      const double at = faults == 1 ? lo + (hi - lo) / 3 : lo + (hi - lo) * i / (faults - 1) + uniform(-50, 50);
      out.faults.push_back({static_cast<int64_t>(std::max(0.0, at)),
                            s.fault_kinds[rng() % s.fault_kinds.size()]});
    }
  }
  std::sort(out.faults.begin(), out.faults.end(), [](const auto& a, const auto& b) { return a.at_ms < b.at_ms; });
  return out;
}

}  // namespace spillway::chaos
