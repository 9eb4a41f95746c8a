// The starting configuration `spillway init` writes: from the models and the
// devices it found, one chat service on the biggest chat model that fits the
// first accelerator (else the smallest), an embeddings service when an
// embedding model was found, each on the accelerator with a CPU fallback
// (README "Failover"), or on the CPU alone; `spillway plan`'s verdict for
// every placement (cli/plan_fit.h) as comments at the top.
//
// Reads the models' metadata and the devices' memory (through PlanFit);
// writes nothing.
#pragma once

#include <string>
#include <vector>

#include "models/model_info.h"

namespace spillway::cli {

struct FoundModel {
  std::string file;   // the GGUF file to load
  std::string label;  // how it was found: the path, or "ollama:NAME:TAG" (the file is its blob)
  models::ModelSummary summary;
};

struct InitInput {
  std::vector<FoundModel> models;          // runnable GGUF files
  std::vector<std::string> skipped;        // "FILE: why" for files found but not usable
  std::vector<std::string> accelerators;   // usable devices in order: cuda:N, sim:N
  std::vector<std::string> device_notes;   // "cuda:1: why not used"
  std::vector<std::string> searched;       // where models were looked for (shown)
  std::vector<std::string> model_dirs;     // folders searched: the config's model_dirs
  std::string models_hint;                 // where to put models when none was found
};

// The TOML text. With no model: a commented-out config that says where to
// put models (it declares no service, so it does not load until edited).
std::string StartingConfig(const InitInput& in);

// A TOML basic string: quoted, with \, " and control characters escaped
// (and, since TOML is UTF-8, invalid bytes replaced by U+FFFD).
std::string TomlString(const std::string& s);

}  // namespace spillway::cli
