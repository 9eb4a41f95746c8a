// The configuration `spillway serve` runs with, as `serve` and `doctor` both
// read it: the file (or the built-in demo without one), --listen and
// --state-dir overrides, the default state directory, API keys from the
// environment, then validation.
#pragma once

#include <string>

#include "common/status.h"
#include "config/config.h"

namespace spillway::cli {

// The directory of the running binary.
std::string ExeDir();

// Where the rest of Spillway is, from the running binary: in a build tree
// spillway-worker, llama.cpp's libraries and the backend modules are beside
// it (build/bin) and the demo models in build/models; in an installed tree
// (`make install`) PREFIX/bin has spillway, PREFIX/lib/spillway the worker,
// libraries and modules, and PREFIX/share/spillway/models the demo models.
// The build tree's place wins when both exist.
std::string DefaultWorkerBinary();
std::string DemoModelsDir();

// `validate` false: the file's syntax and keys are checked, not what it
// points at (doctor reports those problems one by one).
// File descriptors `spillway serve` keeps beside its client connections: the
// journal, the workers' connections (pooled and streaming, one per request
// running an attempt) and health checks.
size_t ReservedDescriptors(const config::GatewayConfig& cfg);

// Without --config the built-in demo runs: when a spillway.toml (what
// `spillway init` writes) is in the working directory, a line saying it is
// not read and how to use it; "" otherwise.
std::string UnreadConfigNote(const std::string& config_path);

// `model_files` false: services' model files are not looked for (serve --keep-going).
StatusOr<config::GatewayConfig> LoadServeConfig(const std::string& config_path, const std::string& listen,
                                                const std::string& state_dir, bool validate = true,
                                                bool model_files = true);

}  // namespace spillway::cli
