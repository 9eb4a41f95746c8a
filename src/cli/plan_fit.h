// The fit check of `spillway plan`, for `plan` and `init` alike: a model's
// memory estimate on a device (memory/estimator.h; for a model the metadata
// cannot size, llama.cpp's dry run, memory/exact_plan.h) against what the device
// (or the host, for "cpu") holds and has free now, with headroom; with
// gpu_layers "auto", the most layers that fit; the largest context that fits.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "memory/estimator.h"

namespace spillway::cli {

struct FitQuery {
  std::string model_file;        // a GGUF file (ollama: names resolved by the caller)
  std::string device = "cpu";    // cpu | sim:N | cuda:N
  std::string gpu_layers = "auto";  // N or auto
  std::string kv_type = "f16";   // f16 | q8_0 | f32
  uint32_t ctx = 4096, slots = 4, batch = 512;
  double headroom_mib = 0, headroom_pct = 5;
  bool kv_unified = false;
  std::string worker_binary;     // for the dry runs ("": the one next to spillway)
};

struct Fit {
  // Not empty: why the metadata cannot size the model, which llama.cpp's dry
  // runs then planned (shape holds only its architecture and layer count).
  std::string exact_reason;
  bool embedding = false;  // (an exact plan's: the shape's own flag otherwise)
  memory::ModelShape shape;
  memory::PlacementSpec spec;  // as estimated: the layers chosen
  memory::PlacementEstimate estimate;
  // What the device (the host for "cpu") holds, has free, and the budget after
  // headroom; unset when it cannot be observed (telemetry_note says why).
  std::optional<uint64_t> capacity, free, budget;
  std::string telemetry_note;
  bool fits = false;       // known to fit: a budget and the device's part within it
  uint32_t max_ctx = 0;    // the largest KV pool that fits with these layers (0: unknown)
  uint32_t per_slot = 0, max_slots = 0;  // ctx/slots, and how many such slots fit
  const memory::DeviceBytes& DevicePart() const {
    return spec.accelerator ? estimate.accelerator : estimate.host;
  }
};

// kInvalidArgument for a model that cannot be read or estimated (naming the
// file) or a gpu_layers that is neither a number nor "auto".
StatusOr<Fit> PlanFit(const FitQuery& query);

// plan's verdict, as it prints it: "cuda:0: 8192.0 MiB, 7000.0 MiB free;
// budget after headroom 6590.4 MiB -> FITS" and "largest context that fits:
// ...", or the line saying the device's memory is unknown.
std::vector<std::string> FitVerdict(const FitQuery& query, const Fit& fit);

}  // namespace spillway::cli
