// `spillway mkmodel`: writes a deterministic demo GGUF model.
#pragma once

#include <CLI/CLI.hpp>

namespace spillway::cli {

// Registers the subcommand on `app`; it runs when selected.
void AddMkmodelCommand(CLI::App& app, int* exit_code);

}  // namespace spillway::cli
