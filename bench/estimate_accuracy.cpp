// Benchmark: the metadata estimator (no model load) against llama.cpp's exact
// plan (spillway-worker --dry-run, which allocates nothing but reports what a
// real load allocates) for several placements on the simulated device.
// Prints per-component and total errors, raw and after calibration on another
// configuration of the same model and device.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "gguf/gguf_reader.h"
#include "memory/estimator.h"

using nlohmann::json;
using spillway::memory::DeviceBytes;

namespace {

struct Config {
  std::string model;
  uint32_t ctx, slots;
  int gpu_layers;
  std::string kv;
};

bool Exact(const std::string& bin, const Config& c, DeviceBytes* acc, DeviceBytes* host) {
  const std::string cmd = bin + "/spillway-worker --model " + c.model + " --device sim:0 --gpu-layers " +
                          std::to_string(c.gpu_layers) + " --ctx " + std::to_string(c.ctx) + " --slots " +
                          std::to_string(c.slots) + " --kv-type " + c.kv + " --dry-run 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  if (pclose(p) != 0) return false;
  json j = json::parse(out, nullptr, false);
  if (j.is_discarded()) return false;
  *acc = {};
  *host = {};
  for (const auto& b : j["buffers"]) {
    DeviceBytes& d = b["name"].get<std::string>().rfind("CPU", 0) == 0 ? *host : *acc;
    d.weights += b["model"].get<uint64_t>();
    d.kv += b["context"].get<uint64_t>();
    d.compute += b["compute"].get<uint64_t>();
  }
  return true;
}

double Err(uint64_t est, uint64_t exact) {
  if (exact == 0) return est == 0 ? 0 : 1;
  return (static_cast<double>(est) - static_cast<double>(exact)) / static_cast<double>(exact);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Estimator accuracy against llama.cpp's exact plan"};
  std::string bin = "build/bin", models = "build/models";
  app.add_option("--bin", bin);
  app.add_option("--models", models);
  CLI11_PARSE(app, argc, argv);
  std::vector<Config> configs = {
      {models + "/tiny-chat.gguf", 512, 1, 0, "f16"},    {models + "/tiny-chat.gguf", 2048, 4, 1, "f16"},
      {models + "/tiny-chat.gguf", 2048, 4, 2, "f16"},   {models + "/tiny-chat.gguf", 32768, 8, 99, "f16"},
      {models + "/demo-chat.gguf", 4096, 2, 2, "q8_0"},  {models + "/demo-chat.gguf", 4096, 4, 4, "f16"},
      {models + "/demo-chat.gguf", 16384, 8, 99, "q8_0"}, {models + "/demo-chat.gguf", 512, 1, 0, "f16"},
  };
  if (std::filesystem::exists(models + "/bench.gguf")) {
    configs.push_back({models + "/bench.gguf", 8192, 4, 7, "f16"});
    configs.push_back({models + "/bench.gguf", 32768, 8, 99, "q8_0"});
  }
  spillway::memory::Calibration cal;
  std::printf("%-16s %6s %5s %4s %5s | %-34s | %-34s | %8s %8s\n", "model", "ctx", "slots", "ngl", "kv",
              "accelerator err: weights kv compute", "host err: weights kv compute", "total", "calib");
  double worst_total = 0, worst_cal = 0;
  for (const auto& c : configs) {
    auto meta = spillway::gguf::ReadGgufFile(c.model);
    auto shape = spillway::memory::ShapeFromMetadata(*meta);
    spillway::memory::PlacementSpec spec;
    spec.accelerator = true;
    spec.gpu_layers = c.gpu_layers;
    spec.ctx = c.ctx;
    spec.slots = c.slots;
    spec.kv_k_x32 = spec.kv_v_x32 = c.kv == "q8_0" ? 34 : 64;
    auto est = spillway::memory::EstimatePlacement(*shape, spec);
    DeviceBytes acc, host;
    if (!Exact(bin, c, &acc, &host)) {
      std::printf("%s: dry run failed\n", c.model.c_str());
      continue;
    }
    const uint64_t est_total = est.accelerator.total() + est.host.total();
    const uint64_t exact_total = acc.total() + host.total();
    // Calibration learned on the previous configuration of the same model (none for the first).
    const std::string key = std::filesystem::path(c.model).filename().string() + "/sim";
    DeviceBytes cal_acc = cal.Apply(key + "/acc", est.accelerator), cal_host = cal.Apply(key + "/host", est.host);
    const double e_total = Err(est_total, exact_total);
    const double e_cal = Err(cal_acc.total() + cal_host.total(), exact_total);
    cal.Observe(key + "/acc", est.accelerator, acc);
    cal.Observe(key + "/host", est.host, host);
    worst_total = std::max(worst_total, std::fabs(e_total));
    worst_cal = std::max(worst_cal, std::fabs(e_cal));
    std::printf("%-16s %6u %5u %4d %5s | %+9.2f%% %+9.2f%% %+9.2f%%    | %+9.2f%% %+9.2f%% %+9.2f%%    | %+7.2f%% %+7.2f%%\n",
                std::filesystem::path(c.model).filename().c_str(), c.ctx, c.slots, c.gpu_layers, c.kv.c_str(),
                100 * Err(est.accelerator.weights, acc.weights), 100 * Err(est.accelerator.kv, acc.kv),
                100 * Err(est.accelerator.compute, acc.compute), 100 * Err(est.host.weights, host.weights),
                100 * Err(est.host.kv, host.kv), 100 * Err(est.host.compute, host.compute), 100 * e_total, 100 * e_cal);
  }
  std::printf("worst total error: %.2f%% raw, %.2f%% calibrated (target <= 3%%)\n", 100 * worst_total, 100 * worst_cal);
  return 0;
}
