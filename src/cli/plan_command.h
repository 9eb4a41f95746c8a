// `spillway plan`: a memory plan for a model on a device, from GGUF metadata
// (and, with --exact, llama.cpp's own dry run through spillway-worker).
#pragma once

#include <CLI/CLI.hpp>

namespace spillway::cli {

void AddPlanCommand(CLI::App& app, int* exit_code);

}  // namespace spillway::cli
