#include "cli/plan_command.h"


#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <optional>

#include "cli/plan_config.h"
#include "cli/plan_fit.h"
#include "cli/serve_config.h"
#include "common/names.h"
#include "gateway/startup_check.h"
#include "memory/exact_plan.h"
#include "memory/estimator.h"
#include "models/ollama_store.h"

namespace spillway::cli {

using nlohmann::json;
using memory::DeviceBytes;

namespace {

struct PlanArgs {
  std::string config_file, model, device = "cpu", gpu_layers = "auto", kv_type = "f16";
  uint32_t ctx = 4096, slots = 4, batch = 512;
  double headroom_mib = 0, headroom_pct = 5;
  bool exact = false, json_out = false, kv_unified = false;
};

constexpr double kMiB = 1024.0 * 1024.0;

json BytesJson(const DeviceBytes& b) {
  return {{"weights", b.weights}, {"kv", b.kv}, {"compute", b.compute}, {"total", b.total()}};
}

// llama.cpp's exact plan of the placement `spec`, from `spillway-worker --dry-run`.
std::optional<std::pair<DeviceBytes, DeviceBytes>> Exact(const PlanArgs& a, const memory::PlacementSpec& spec,
                                                         std::string* error) {
  auto plan = memory::RunDryRun(DefaultWorkerBinary(), memory::DryRunArgsFor(a.model, a.device, spec, a.kv_type));
  if (!plan.ok()) {
    *error = plan.status().message();
    return std::nullopt;
  }
  return std::make_pair(plan->accelerator, plan->host);
}

// The whole config: every accelerator's holders, verdicts and evictions.
int PlanConfig(const PlanArgs& a) {
  auto cfg = LoadServeConfig(a.config_file, "", "");
  if (!cfg.ok()) {
    std::fprintf(stderr, "spillway plan: %s\n", cfg.status().message().c_str());
    return 2;
  }
  cfg->worker_binary = DefaultWorkerBinary();  // (its dry run plans the models the metadata cannot size, as serve's does)
  std::vector<DevicePlan> plans = CollectDevices(*cfg);
  for (auto& p : plans) PlanDevice(p);
  if (a.json_out) {
    std::printf("%s\n", PlanConfigJson(a.config_file, plans).c_str());
  } else {
    for (const auto& line : PlanConfigLines(plans)) std::printf("%s\n", line.c_str());
  }
  return PlanExitCode(plans);
}

int Plan(PlanArgs a) {
  if (!a.config_file.empty()) return PlanConfig(a);
  // An ollama:NAME[:TAG] (as `spillway models` lists it) is planned on its blob.
  const std::string shown = a.model;
  auto file = models::ResolveModelPath(a.model, models::DefaultOllamaStoreRoot());
  if (!file.ok()) {
    std::fprintf(stderr, "spillway plan: %s\n", file.status().message().c_str());
    return 2;
  }
  a.model = *file;
  const FitQuery query = {a.model, a.device, a.gpu_layers, a.kv_type, a.ctx, a.slots, a.batch,
                          a.headroom_mib, a.headroom_pct, a.kv_unified, DefaultWorkerBinary()};
  auto fit = PlanFit(query);
  if (!fit.ok()) {
    std::fprintf(stderr, "spillway plan: %s\n", fit.status().message().c_str());
    return 2;
  }
  const memory::ModelShape& shape = fit->shape;
  const memory::PlacementSpec& spec = fit->spec;
  const memory::PlacementEstimate& est = fit->estimate;
  const int L = static_cast<int>(shape.n_layer);
  const int layers = spec.gpu_layers;

  json out = {{"model", shown},
              {"file", a.model},
              {"architecture", shape.architecture},
              {"layers", L},
              {"device", a.device},
              {"gpu_layers", layers},
              {"layers_on_accelerator", est.layers_on_accelerator},
              {"output_on_accelerator", est.output_on_accelerator},
              {"ctx", a.ctx},
              {"slots", a.slots},
              {"kv_type", a.kv_type},
              {"estimate", {{"accelerator", BytesJson(est.accelerator)}, {"host", BytesJson(est.host)}}},
              {"kv_bytes_per_token", nullptr}};
  if (fit->exact_reason.empty()) {
    out["kv_bytes_per_token"] = memory::KvBytesForCells(shape, spec, 1);
  } else {
    // (Its estimate is llama.cpp's own plan: --exact has nothing to compare.)
    out["planned_by"] = "llama.cpp's dry run: the metadata cannot size it (" + fit->exact_reason + ")";
    a.exact = false;
  }
  // A shape serve refuses at start (an embedding model's ctx not a multiple
  // of its slots): planned as FITS, exit 0, it was no plan at all.
  std::string shape_problem;
  {
    config::ServiceConfig svc;
    svc.model = a.model;
    config::PlacementConfig p;
    p.ctx = static_cast<int>(a.ctx);
    p.slots = static_cast<int>(a.slots);
    svc.placements = {p};
    shape_problem = gateway::PlacementShapeProblem(svc, 0);
  }
  if (!shape_problem.empty()) out["shape_problem"] = shape_problem;
  if (fit->capacity) {
    out["device_capacity"] = *fit->capacity;
    out["device_free"] = *fit->free;
    out["budget"] = *fit->budget;
    out["fits"] = fit->fits;
    out["max_ctx"] = fit->max_ctx;
    out["max_slots_at_ctx_per_slot"] = fit->max_slots;
  } else {
    out["fits"] = nullptr;
    out["note"] = "device memory unknown: " + fit->telemetry_note;
  }
  if (a.exact) {
    std::string err;
    auto ex = Exact(a, spec, &err);
    if (ex) {
      const auto& [acc, host] = *ex;
      out["exact"] = {{"accelerator", BytesJson(acc)}, {"host", BytesJson(host)}};
      auto rel = [](uint64_t est_b, uint64_t exact_b) {
        return exact_b == 0 ? 0.0 : (static_cast<double>(est_b) - static_cast<double>(exact_b)) / exact_b;
      };
      out["estimate_error"] = {{"accelerator_total", rel(est.accelerator.total(), acc.total())},
                               {"host_total", rel(est.host.total(), host.total())}};
    } else {
      out["exact_error"] = err;
    }
  }
  // Exit 3: no fit check (a device whose memory cannot be read: no such
  // device, no driver), as --config says of one; a plan that says nothing
  // of the device is no yes.
  const int unchecked = fit->capacity ? 0 : 3;
  if (a.json_out) {
    std::printf("%s\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());  // (a path in any bytes)
    return shape_problem.empty() ? unchecked : 1;
  }
  std::printf("%s (%s, %d layers) on %s, %d GPU layers (%d repeating + output %s), ctx %u, %u slots, KV %s\n",
              shown.c_str(), shape.architecture.c_str(), L, a.device.c_str(), layers, est.layers_on_accelerator,
              est.output_on_accelerator ? "yes" : "no", a.ctx, a.slots, a.kv_type.c_str());
  if (out.contains("planned_by")) std::printf("planned by %s\n", out["planned_by"].get<std::string>().c_str());
  std::printf("%-12s %12s %12s %12s %12s\n", "MiB", "weights", "KV", "compute", "total");
  auto row = [](const char* name, const DeviceBytes& b) {
    std::printf("%-12s %12.1f %12.1f %12.1f %12.1f\n", name, b.weights / kMiB, b.kv / kMiB, b.compute / kMiB,
                b.total() / kMiB);
  };
  if (spec.accelerator) row("accelerator", est.accelerator);
  row("host", est.host);
  if (out.contains("exact")) {
    std::printf("llama.cpp's dry run (exact):\n");
    DeviceBytes acc, host;
    acc = {out["exact"]["accelerator"]["weights"], out["exact"]["accelerator"]["kv"], out["exact"]["accelerator"]["compute"]};
    host = {out["exact"]["host"]["weights"], out["exact"]["host"]["kv"], out["exact"]["host"]["compute"]};
    if (spec.accelerator) row("accelerator", acc);
    row("host", host);
  }
  for (const auto& line : FitVerdict(query, *fit)) std::printf("%s\n", line.c_str());
  if (!shape_problem.empty()) {
    std::printf("this shape cannot work: %s (spillway serve refuses it)\n", shape_problem.c_str());
    return 1;
  }
  return unchecked;
}

}  // namespace

// A number that is one: CLI11's Range lets NaN through (every comparison
// false), and a headroom of nan planned a budget of 0 ("DOES NOT FIT").
static CLI::Validator Finite() {
  return CLI::Validator(
      [](std::string& text) {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        return end != text.c_str() && *end == '\0' && std::isfinite(v) ? std::string() : "must be a finite number";
      },
      "NUMBER");
}

void AddPlanCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "Memory plan for a model on a device: bytes per component and device, whether it fits with headroom, the "
      "largest context and layer split that fit (exit 1: a shape serve refuses, such as an embedding model's ctx "
      "that is not a multiple of its slots; 3: the device's memory is unknown, no fit check). With --config: whether a whole config's services fit together on "
      "each accelerator, which combinations fit, and what would be evicted first (exit 0: all fit together, 1: "
      "only by switching, 2: the pinned ones do not fit or the config is invalid, 3: a device's memory is unknown)");
  auto* model = cmd->add_option("--model", a->model, "GGUF file, or ollama:NAME[:TAG] from Ollama's store "
                                                     "($OLLAMA_MODELS, else ~/.ollama/models); `spillway models` lists both");
  auto* config = cmd->add_option("--config", a->config_file, "plan a whole config (spillway.toml) instead of one model: "
                                                             "its devices, headroom, placements and residency");
  model->excludes(config);
  // One model's shape and device: with --config, the config says them (refused, not ignored).
  const std::vector<CLI::Option*> one_model = {
      cmd->add_option("--device", a->device, "cpu | sim:N | cuda:N")
          ->check([](const std::string& v) -> std::string {
            return KnownDeviceName(v) ? "" : "'" + v + "' is not cpu, sim:N or cuda:N";
          })
          ->capture_default_str(),
      cmd->add_option("--ctx", a->ctx, "KV cells in all (ctx/slots per slot unless --kv-unified)")
          ->check(CLI::Number)->check(CLI::Range(16u, 1u << 22))
          ->capture_default_str(),
      cmd->add_option("--slots", a->slots)->check(CLI::Number)->check(CLI::Range(1u, 256u))->capture_default_str(),
      cmd->add_option("--batch", a->batch)->check(CLI::Number)->check(CLI::Range(1u, 65536u))->capture_default_str(),
      cmd->add_option("--gpu-layers", a->gpu_layers, "N (-1: all) or auto (the most that fit)")
          ->check([](const std::string& v) -> std::string {
            if (v == "auto") return "";
            const size_t digits = v.rfind('-', 0) == 0 ? 1 : 0;  // after a leading minus
            if (v.size() <= digits || v.size() > 6 || v.find_first_not_of("0123456789", digits) != std::string::npos ||
                std::stoi(v) < -1) {
              return "--gpu-layers must be a number from -1 (all) up, or auto";
            }
            return "";
          })
          ->capture_default_str(),
      cmd->add_option("--kv-type", a->kv_type)->check(CLI::IsMember({"f16", "q8_0", "f32"}))->capture_default_str(),
      cmd->add_option("--headroom-mib", a->headroom_mib, "kept free on the device")
          ->check(Finite() & CLI::Range(0.0, 1e9))
          ->capture_default_str(),
      cmd->add_option("--headroom-pct", a->headroom_pct, "kept free, percent of capacity")
          ->check(Finite() & CLI::Range(0.0, 90.0))
          ->capture_default_str(),
      cmd->add_flag("--kv-unified", a->kv_unified,
                    "one KV pool shared by the slots, with flash attention (as the worker's --kv-unified)")};
  for (CLI::Option* o : one_model) o->excludes(config);
  cmd->add_flag("--exact", a->exact, "also run llama.cpp's dry run (spillway-worker --dry-run) and report the estimate's error (a model "
                "the metadata cannot size is planned by that dry run alone: nothing to compare)")
      ->excludes(config);
  cmd->add_flag("--json", a->json_out, "print JSON");
  cmd->callback([a, exit_code] {
    if (a->model.empty() && a->config_file.empty()) throw CLI::RequiredError("--model or --config");
    *exit_code = Plan(*a);
  });
}

}  // namespace spillway::cli
