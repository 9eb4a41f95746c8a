// `spillway chaos`: the proving suite (src/chaos).
#pragma once

#include <CLI/CLI.hpp>

namespace spillway::cli {

void AddChaosCommand(CLI::App& app, int* exit_code);

}  // namespace spillway::cli
