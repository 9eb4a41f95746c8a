// `spillway sim`: create, inspect and load the simulated accelerator.
#pragma once

#include <CLI/CLI.hpp>

namespace spillway::cli {

void AddSimCommand(CLI::App& app, int* exit_code);

// "sim:3" -> 3; -1 when malformed.
int ParseSimDevice(const std::string& device);

}  // namespace spillway::cli
