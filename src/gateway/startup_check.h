// What `spillway serve` can know at start without loading a model: every
// model file is a readable GGUF whose shape Spillway understands (or, for one
// the metadata cannot size, that llama.cpp's dry run of each placement
// succeeds, with config.worker_binary), every device named exists with a
// usable backend module. Each problem names the
// service, the placement and its config key, so the operator can fix it
// before any request is accepted (or start with --keep-going, the placement
// marked unavailable with the same reason).
#pragma once

#include <string>
#include <vector>

#include "config/config.h"

namespace spillway::gateway {

struct StartupProblem {
  std::string worker_key;  // WorkerKey(service, placement)
  std::string where;       // "service 'chat' placement 1 (cuda:0), key service[0].placement[1].device"
  std::string reason;
};

// "" when the file is a readable GGUF of an architecture Spillway can run;
// otherwise why not (naming the file).
std::string ModelFileProblem(const std::string& path);
// "" when placement `pi` of `s` has a shape its worker takes; otherwise why
// not (an embedding model's ctx must be a multiple of its slots). A model
// file it cannot read is ModelFileProblem's to say: "" here.
std::string PlacementShapeProblem(const config::ServiceConfig& s, size_t pi);
// "" when `device` (cpu | sim:N | cuda:N) exists with a usable backend module
// in `backend_dir`; otherwise why not, with the fix. Without `needs_backend`
// (a device another program drives: an external server's), spillway-worker's
// CUDA module is not asked for.
std::string DeviceProblem(const std::string& device, const std::string& backend_dir, bool needs_backend = true);

// `backend_dir`: where the ggml backend modules live (next to spillway-worker).
std::vector<StartupProblem> CheckStartup(const config::GatewayConfig& config, const std::string& backend_dir);

}  // namespace spillway::gateway
