// `spillway models`: the GGUF files a person already has, in given paths,
// in a config's model_dirs and services, and in Ollama's store: size,
// architecture, quantization, context length and chat template family. Each
// name it prints is one `spillway plan --model` and a service's `model` take.
#pragma once

#include <CLI/CLI.hpp>

namespace spillway::cli {

void AddModelsCommand(CLI::App& app, int* exit_code);

}  // namespace spillway::cli
