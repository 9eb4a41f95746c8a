// `spillway init`: writes a starting configuration from the GGUF models
// (given folders and files, Ollama's store) and the devices it finds, with
// `spillway plan`'s verdict for each placement in comments at the top
// (cli/init_config.h). Never replaces an existing file without --force.
#pragma once

#include <CLI/CLI.hpp>

namespace spillway::cli {

void AddInitCommand(CLI::App& app, int* exit_code);

}  // namespace spillway::cli
