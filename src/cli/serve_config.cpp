#include "cli/serve_config.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

// Set by src/CMakeLists.txt from the install layout (relative to the binary's directory).
#ifndef SPILLWAY_PKGLIBDIR_FROM_BIN
#define SPILLWAY_PKGLIBDIR_FROM_BIN "../lib/spillway"
#endif
#ifndef SPILLWAY_DATADIR_FROM_BIN
#define SPILLWAY_DATADIR_FROM_BIN "../share/spillway"
#endif

namespace spillway::cli {

namespace fs = std::filesystem;

std::string ExeDir() {
  std::error_code ec;
  return fs::canonical("/proc/self/exe", ec).parent_path().string();
}

std::string DefaultWorkerBinary() {
  const std::string beside = ExeDir() + "/spillway-worker";
  const std::string installed = (fs::path(ExeDir()) / SPILLWAY_PKGLIBDIR_FROM_BIN / "spillway-worker").lexically_normal();
  // Neither there: the build tree's place, which the error then names.
  return ::access(beside.c_str(), X_OK) != 0 && ::access(installed.c_str(), X_OK) == 0 ? installed : beside;
}

std::string DemoModelsDir() {
  const std::string built = (fs::path(ExeDir()) / "../models").lexically_normal();
  const std::string installed = (fs::path(ExeDir()) / SPILLWAY_DATADIR_FROM_BIN / "models").lexically_normal();
  std::error_code ec;
  return !fs::is_directory(built, ec) && fs::is_directory(installed, ec) ? installed : built;
}

namespace {

std::string DefaultStateDir() {
  if (const char* x = std::getenv("XDG_STATE_HOME"); x && *x) return std::string(x) + "/spillway";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.local/state/spillway";
  return "/tmp/spillway-state";
}

// Comma-separated keys from an environment variable (spaces ignored).
void AddKeysFromEnv(const char* name, std::vector<std::string>* out) {
  const char* keys = std::getenv(name);
  if (!keys || !*keys) return;
  std::string k;
  for (const char* p = keys;; ++p) {
    if (*p == ',' || *p == 0) {
      if (!k.empty()) out->push_back(k);
      k.clear();
      if (*p == 0) break;
    } else if (*p != ' ') {
      k += *p;
    }
  }
}

}  // namespace

size_t ReservedDescriptors(const config::GatewayConfig& cfg) {
  size_t workers = 0;
  for (const auto& s : cfg.services) workers += s.placements.size();
  return 192 + 40 * workers;
}

std::string UnreadConfigNote(const std::string& config_path) {
  std::error_code ec;
  if (!config_path.empty() || !std::filesystem::is_regular_file("spillway.toml", ec)) return "";
  return "./spillway.toml is not read: without --config the built-in demo runs (use --config spillway.toml)";
}

StatusOr<config::GatewayConfig> LoadServeConfig(const std::string& config_path, const std::string& listen,
                                                const std::string& state_dir, bool validate, bool model_files) {
  StatusOr<config::GatewayConfig> loaded =
      config_path.empty() ? StatusOr<config::GatewayConfig>(config::DemoConfig(DemoModelsDir()))
                          : config::LoadConfigFile(config_path);
  if (!loaded.ok()) return loaded.status();
  config::GatewayConfig cfg = std::move(*loaded);
  if (!listen.empty() && !config::SplitHostPort(listen, &cfg.listen_host, &cfg.listen_port)) {
    return Status::InvalidArgument("--listen must be HOST:PORT, its port 0 to 65535 (127.0.0.1:8480)");
  }
  if (!state_dir.empty()) cfg.state_dir = state_dir;
  if (cfg.state_dir.empty()) cfg.state_dir = DefaultStateDir();
  // Absolute from here on: its workers are told paths in it (a relative one
  // meant another place to a gateway restarted from another directory, which
  // then took its adoptable workers for gone and started second ones).
  if (std::error_code ec; !cfg.state_dir.empty()) {
    if (auto abs = std::filesystem::absolute(cfg.state_dir, ec); !ec) cfg.state_dir = abs.string();
  }
  AddKeysFromEnv("SPILLWAY_API_KEYS", &cfg.api_keys);
  AddKeysFromEnv("SPILLWAY_OPERATOR_KEYS", &cfg.operator_keys);
  if (validate) SPILLWAY_RETURN_IF_ERROR(config::Validate(cfg, model_files));
  return cfg;
}

}  // namespace spillway::cli
