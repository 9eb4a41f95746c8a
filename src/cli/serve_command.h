// `spillway serve`: the gateway.
#pragma once

#include <CLI/CLI.hpp>

namespace spillway::cli {

void AddServeCommand(CLI::App& app, int* exit_code);

}  // namespace spillway::cli
