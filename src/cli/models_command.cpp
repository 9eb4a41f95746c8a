#include "cli/models_command.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <set>

#include "config/config.h"
#include "models/model_info.h"
#include "models/ollama_store.h"

namespace spillway::cli {

using nlohmann::json;

namespace {

struct ModelsArgs {
  std::vector<std::string> paths;
  std::string config;
  std::string ollama_dir;
  bool ollama_dir_given = false;  // --ollama-dir on the command line (else a --config's ollama_models wins)
  bool no_ollama = false, json_out = false;
};

struct Row {
  std::string name;  // a path or "ollama:NAME:TAG"
  std::string file;
  StatusOr<models::ModelSummary> summary = Status::NotFound("");
};

json RowJson(const Row& r) {
  json j = {{"name", r.name}, {"file", r.file}};
  if (!r.summary.ok()) {
    j["error"] = r.summary.status().message();
    return j;
  }
  const auto& m = *r.summary;
  j.update({{"size", m.size},
            {"architecture", m.architecture},
            {"quantization", m.quantization},
            {"context_length", m.context_length},
            {"parameters", m.parameters},
            {"template_family", m.template_family},
            {"embedding", m.embedding}});
  return j;
}

std::string Size(uint64_t bytes) {
  char buf[32];
  if (bytes >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / double(1ull << 30));
  else std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / double(1ull << 20));
  return buf;
}

int ListModels(ModelsArgs a) {
  std::vector<Row> rows;
  std::set<std::string> seen;
  auto add_file = [&](const std::string& name, const std::string& file) {
    if (!seen.insert(name).second) return;
    rows.push_back({name, file, models::SummarizeFile(file)});
  };
  auto add_path = [&](const std::string& p) {
    std::error_code ec;
    if (std::filesystem::is_directory(p, ec)) {
      for (const auto& f : models::FindGgufFiles(p)) add_file(f, f);
    } else {
      add_file(p, p);  // a missing file is listed with its error
    }
  };
  int rc = 0;
  if (!a.config.empty()) {
    auto cfg = config::LoadConfigFile(a.config);
    if (!cfg.ok()) {
      std::fprintf(stderr, "spillway models: %s\n", cfg.status().message().c_str());
      return 2;
    }
    if (!a.ollama_dir_given && !cfg->ollama_models.empty()) a.ollama_dir = cfg->ollama_models;
    for (const auto& d : cfg->model_dirs) add_path(d);
    for (const auto& s : cfg->services) add_file(s.model_name.empty() ? s.model : s.model_name, s.model);
  }
  for (const auto& p : a.paths) {
    if (models::IsOllamaName(p)) {
      auto name = models::ParseOllamaName(p);
      auto file = name.ok() ? models::ResolveOllamaModel(a.ollama_dir, *name) : StatusOr<std::string>(name.status());
      if (file.ok()) add_file(p, *file);
      else rows.push_back({p, "", file.status()});
    } else {
      add_path(p);
    }
  }
  if (!a.no_ollama) {
    auto store = models::ListOllamaStore(a.ollama_dir);
    if (!store.ok()) {
      rows.push_back({"ollama store", a.ollama_dir, store.status()});
    } else {
      for (const auto& e : *store) {
        const std::string name = std::string(models::kOllamaPrefix) + e.name.Display();
        if (e.error.ok()) add_file(name, e.blob);
        else if (seen.insert(name).second) rows.push_back({name, e.manifest, e.error});
      }
    }
  }
  for (const auto& r : rows) rc = r.summary.ok() ? rc : 1;
  if (a.json_out) {
    json out = json::array();
    for (const auto& r : rows) out.push_back(RowJson(r));
    // (A file name or a model's metadata that is not UTF-8 is shown with U+FFFD, not a failed listing.)
    std::printf("%s\n", out.dump(2, ' ', false, json::error_handler_t::replace).c_str());
    return rc;
  }
  std::printf("%-44s %10s %-10s %-9s %8s %7s %-10s\n", "NAME", "SIZE", "ARCH", "QUANT", "CTX", "PARAMS", "TEMPLATE");
  for (const auto& r : rows) {
    if (!r.summary.ok()) {
      std::printf("%-44s error: %s\n", r.name.c_str(), r.summary.status().message().c_str());
      continue;
    }
    const auto& m = *r.summary;
    std::printf("%-44s %10s %-10s %-9s %8llu %7s %-10s\n", r.name.c_str(), Size(m.size).c_str(), m.architecture.c_str(),
                m.quantization.c_str(), static_cast<unsigned long long>(m.context_length),
                models::HumanCount(m.parameters).c_str(), m.embedding ? "embedding" : m.template_family.c_str());
  }
  if (rows.empty()) std::printf("(no models found; give paths, --config, or set OLLAMA_MODELS)\n");
  return rc;
}

}  // namespace

void AddModelsCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<ModelsArgs>();
  a->ollama_dir = models::DefaultOllamaStoreRoot();
  CLI::App* cmd = app.add_subcommand(
      "models", "List GGUF models (given files and folders, a config's model_dirs and services, Ollama's store) with "
                "size, architecture, quantization, context length and chat template family; each NAME is one "
                "`spillway plan --model` and a service's `model` accept. Exit 1 when a model cannot be read");
  cmd->add_option("paths", a->paths, "GGUF files, folders to search, or ollama:NAME[:TAG]");
  cmd->add_option("--config", a->config, "also list the config's model_dirs and its services' models");
  cmd->add_option("--ollama-dir", a->ollama_dir,
                  "Ollama's store (a --config's ollama_models, else $OLLAMA_MODELS, else ~/.ollama/models)")
      ->capture_default_str();
  cmd->add_flag("--no-ollama", a->no_ollama, "do not list Ollama's store");
  cmd->add_flag("--json", a->json_out, "print JSON");
  cmd->callback([a, cmd, exit_code] {
    a->ollama_dir_given = cmd->get_option("--ollama-dir")->count() > 0;
    *exit_code = ListModels(*a);
  });
}

}  // namespace spillway::cli
