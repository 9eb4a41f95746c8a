#include "cli/init_command.h"

#include <cstdio>
#include <filesystem>
#include <set>

#include "cli/init_config.h"
#include "cli/serve_config.h"
#include "common/names.h"
#include "common/private_files.h"
#include "config/config.h"
#include "devices/telemetry.h"
#include "gateway/startup_check.h"
#include "models/ollama_store.h"

namespace spillway::cli {

namespace fs = std::filesystem;

namespace {

// Where the systemd unit's service looks for models (README "Install as a service").
constexpr const char* kDefaultModelsDir = "/var/lib/spillway/models";

struct InitArgs {
  std::vector<std::string> model_paths, devices;
  bool ollama = false, force = false;
  std::string ollama_dir, out = "spillway.toml";
};

int Fail(const std::string& message) {
  std::fprintf(stderr, "spillway init: %s\n", message.c_str());
  return 2;
}

// The models under the given paths (default: kDefaultModelsDir when it
// exists) and, with --ollama, in Ollama's store; unusable files are noted.
Status FindModels(const InitArgs& a, InitInput* in) {
  std::set<std::string> seen;
  auto add = [&](const std::string& file, const std::string& label) {
    if (!seen.insert(fs::weakly_canonical(file).string()).second) return;
    auto summary = models::SummarizeFile(file);
    if (!summary.ok()) return in->skipped.push_back(summary.status().message());
    if (std::string problem = gateway::ModelFileProblem(file); !problem.empty()) {
      return in->skipped.push_back(label + ": " + problem);
    }
    in->models.push_back({file, label, *summary});
  };
  std::vector<std::string> paths = a.model_paths;
  std::error_code ec;
  if (paths.empty()) {
    if (fs::is_directory(kDefaultModelsDir, ec)) paths.push_back(kDefaultModelsDir);
    else in->searched.push_back(std::string(kDefaultModelsDir) + " (absent)");
  }
  for (const auto& p : paths) {
    if (fs::is_directory(p, ec)) {
      in->searched.push_back(p);
      in->model_dirs.push_back(fs::absolute(p).lexically_normal().string());
      for (const auto& f : models::FindGgufFiles(p)) {
        const std::string file = fs::absolute(f).lexically_normal().string();
        add(file, file);
      }
    } else if (fs::is_regular_file(p, ec)) {
      in->searched.push_back(p);
      const std::string file = fs::absolute(p).lexically_normal().string();
      add(file, file);
    } else {
      return Status::InvalidArgument("--models " + p + ": no such file or folder");
    }
  }
  in->models_hint = in->model_dirs.empty() ? kDefaultModelsDir : in->model_dirs.front();
  if (a.ollama) {
    in->searched.push_back("Ollama's store at " + a.ollama_dir);
    auto store = models::ListOllamaStore(a.ollama_dir);
    if (!store.ok()) {
      in->skipped.push_back(store.status().message());
    } else {
      for (const auto& e : *store) {
        const std::string label = std::string(models::kOllamaPrefix) + e.name.Display();
        if (e.error.ok()) add(e.blob, label);
        else in->skipped.push_back(label + ": " + e.error.message());
      }
    }
  }
  return Status::Ok();
}

// The accelerators: those given (each must be usable), else every cuda:N
// NVML reports with the CUDA backend module beside the worker, and every
// simulated device that exists.
Status FindDevices(const InitArgs& a, InitInput* in) {
  const std::string backend_dir = fs::path(DefaultWorkerBinary()).parent_path().string();
  if (!a.devices.empty()) {
    for (const auto& d : a.devices) {
      if (!KnownDeviceName(d)) return Status::InvalidArgument("--devices: '" + d + "' is not cpu, cuda:N or sim:N");
      if (d == "cpu") continue;
      if (std::string problem = gateway::DeviceProblem(d, backend_dir); !problem.empty()) {
        return Status::InvalidArgument("--devices " + d + ": " + problem);
      }
      in->accelerators.push_back(d);
    }
    return Status::Ok();
  }
  for (int i = 0; i < 16; ++i) {
    const std::string d = "cuda:" + std::to_string(i);
    auto t = devices::OpenDeviceTelemetry(d);
    if (!t.ok() || !(*t)->Read().ok()) break;  // no NVML, or no GPU i
    if (std::string problem = gateway::DeviceProblem(d, backend_dir); !problem.empty()) {
      in->device_notes.push_back(d + ": " + problem);
    } else {
      in->accelerators.push_back(d);
    }
  }
  for (int i = 0; i < 8; ++i) {
    const std::string d = "sim:" + std::to_string(i);
    if (gateway::DeviceProblem(d, backend_dir).empty()) in->accelerators.push_back(d);
  }
  return Status::Ok();
}

// Writes `text` to `path`: a new file only unless `replace`, whole or not at
// all. Mode 0644: the service's user reads it (it holds no key).
Status WriteConfig(const std::string& path, const std::string& text, bool replace) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return Status::InvalidArgument(path + " is a folder; -o takes a file name");
  const fs::path folder = fs::absolute(path, ec).parent_path();
  if (!fs::is_directory(folder, ec)) {
    return Status::InvalidArgument("cannot write " + path + ": no folder " + folder.string() + " (create it first)");
  }
  Status st = WriteFileAtomically(path, text, 0644, replace);
  if (st.code() == StatusCode::kConflict) return Status::Conflict(path + " exists; --force replaces it");
  return st;
}

int Init(const InitArgs& a) {
  const bool to_stdout = a.out == "-";
  std::error_code ec;
  // Refused before the search, which reads every model's header.
  if (!to_stdout && !a.force && fs::exists(fs::symlink_status(a.out, ec))) {
    return Fail(a.out + " exists; --force replaces it");
  }
  InitInput in;
  if (Status st = FindModels(a, &in); !st.ok()) return Fail(st.message());
  if (Status st = FindDevices(a, &in); !st.ok()) return Fail(st.message());
  const std::string text = StartingConfig(in);
  if (!in.models.empty()) {
    // What it writes must load: checked here, before anything is written.
    auto parsed = config::ParseConfig(text, to_stdout ? "(init)" : a.out);
    Status st = parsed.ok() ? config::Validate(*parsed) : parsed.status();
    if (!st.ok()) {
      std::fprintf(stderr, "spillway init: the config made would not load (a bug): %s\n", st.message().c_str());
      return 1;
    }
  }
  if (to_stdout) {
    std::fputs(text.c_str(), stdout);
    return 0;
  }
  if (Status st = WriteConfig(a.out, text, a.force); !st.ok()) return Fail(st.message());
  if (in.models.empty()) {
    std::printf("spillway init: no GGUF model found (searched: %s); wrote a commented config to %s.\n"
                "Put GGUF files in %s and run `spillway init --models %s --force -o %s`.\n",
                in.searched.empty() ? "nothing" : in.searched.front().c_str(), a.out.c_str(), in.models_hint.c_str(),
                in.models_hint.c_str(), a.out.c_str());
    return 0;
  }
  std::printf("spillway init: wrote %s (%zu model%s found; plan's verdict at its top).\n"
              "Check it: spillway serve --check --config %s\n"
              "Start it: spillway serve --config %s\n",
              a.out.c_str(), in.models.size(), in.models.size() == 1 ? "" : "s", a.out.c_str(), a.out.c_str());
  return 0;
}

}  // namespace

void AddInitCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<InitArgs>();
  a->ollama_dir = models::DefaultOllamaStoreRoot();
  CLI::App* cmd = app.add_subcommand(
      "init", "Write a starting config from the GGUF models and devices found: a chat service on the biggest chat\n"
              "model that fits the first accelerator (else the smallest), an embeddings service when an embedding\n"
              "model is found, each on the accelerator with a CPU fallback or on the CPU alone, and `spillway plan`'s\n"
              "verdict for each placement in comments at the top. Never replaces a file without --force. With no\n"
              "model found it writes a commented config that says where to put them (exit 0).");
  cmd->add_option("--models", a->model_paths,
                  std::string("GGUF files or folders to search (default: ") + kDefaultModelsDir + ")");
  cmd->add_flag("--ollama", a->ollama, "also use the models in Ollama's store (written as their blob's path)");
  cmd->add_option("--ollama-dir", a->ollama_dir, "Ollama's store ($OLLAMA_MODELS, else ~/.ollama/models)")
      ->capture_default_str();
  cmd->add_option("--devices", a->devices,
                  "accelerators to place services on, each cpu, cuda:N or sim:N and usable now (default: every "
                  "cuda:N with its backend module, and every simulated device; cpu alone: --devices cpu)")
      ->delimiter(',');
  cmd->add_option("-o,--output", a->out, "the file to write, - for stdout")->capture_default_str();
  cmd->add_flag("--force", a->force, "replace the file if it exists");
  cmd->callback([a, exit_code] { *exit_code = Init(*a); });
}

}  // namespace spillway::cli
