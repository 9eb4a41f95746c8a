// Benchmark (Google Benchmark): the cost of an admission decision and of a
// device-ledger check with 100 services' reservations on the device.
// Target: <= 5 us p99 per decision.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "admission/admission.h"
#include "memory/ledger.h"

using namespace spillway;

static std::vector<admission::PlacementView> Views(std::mt19937& rng) {
  return {{"sim:0/99", true, false, false, 8192, static_cast<uint32_t>(rng() % 8192), 4, 1},
          {"sim:0/8", true, true, false, 16384, static_cast<uint32_t>(rng() % 16384), 2, 1},
          {"cpu", true, false, true, 32768, static_cast<uint32_t>(rng() % 32768), 2, 2}};
}

static void BM_Decide(benchmark::State& state) {
  std::mt19937 rng(1);
  auto views = Views(rng);
  admission::Policy policy;
  uint32_t i = 0;
  for (auto _ : state) {
    admission::RequestNeed need{100 + (i * 37) % 9000, 256, (i & 1) != 0, 16};
    views[0].cells_free = (i * 131) % 8192;
    benchmark::DoNotOptimize(admission::Decide(need, views, policy));
    ++i;
  }
}
BENCHMARK(BM_Decide);

static void BM_LedgerWith100Services(benchmark::State& state) {
  memory::DeviceLedger ledger("sim:0", 80ull << 30, {1ull << 30, 5});
  for (int s = 0; s < 100; ++s) (void)ledger.Reserve("svc" + std::to_string(s), 500ull << 20, 0);
  ledger.Observe(20ull << 30, 1);
  uint64_t i = 0;
  for (auto _ : state) {
    const std::string key = "svc" + std::to_string(i % 100);
    benchmark::DoNotOptimize(ledger.Reserve(key, (400ull + i % 200) << 20, 2));
    benchmark::DoNotOptimize(ledger.Available());
    ++i;
  }
}
BENCHMARK(BM_LedgerWith100Services);

// Tail latency, measured per call (Google Benchmark reports means).
static void Percentiles() {
  std::mt19937 rng(2);
  auto views = Views(rng);
  memory::DeviceLedger ledger("sim:0", 80ull << 30, {1ull << 30, 5});
  for (int s = 0; s < 100; ++s) (void)ledger.Reserve("svc" + std::to_string(s), 500ull << 20, 0);
  std::vector<double> ns;
  for (int i = 0; i < 200000; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    admission::RequestNeed need{static_cast<uint32_t>(100 + (i * 37) % 9000), 256, (i & 1) != 0, 16};
    auto d = admission::Decide(need, views, {});
    benchmark::DoNotOptimize(d);
    benchmark::DoNotOptimize(ledger.Available());
    ns.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ns.begin(), ns.end());
  std::printf("decision + ledger check (100 services reserved): p50 %.0f ns, p99 %.0f ns, p99.9 %.0f ns (target p99 <= 5000 ns)\n",
              ns[ns.size() / 2], ns[ns.size() * 99 / 100], ns[ns.size() * 999 / 1000]);
}

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  Percentiles();
  return 0;
}
