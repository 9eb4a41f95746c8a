// `spillway plan --config`: whether a whole config's services fit together on
// each accelerator, which combinations fit, and what would be evicted first.
//
// Per accelerator device (never "cpu") every holder of memory there is
// listed: each llama placement on it (its bytes as admission predicts them,
// gateway/placement_admission.h) and each external service declaring it
// (resident_mib plus one request's transient_mib), with its residency mode,
// priority and, where it has them, its windows. The budget is the
// device's capacity less its headroom (the config's [[device]], else the
// defaults): the config is planned for the device as it would have it, not
// for whatever else holds memory there now (Reading::free is reported
// beside it).
//
// Verdicts, per device:
//   together   all holders fit at once (sum <= budget), and the device is
//              not exclusive (there at most one service besides the pinned
//              ones is ever loaded, and every load unloads the others);
//   pinned     the pinned holders (and url externals, which Spillway cannot
//              stop) fit alone; if not, the config can never serve as
//              written; and with the keep_alive ones, which load at start;
//   combos     every other holder beside the pinned ones, and the largest
//              sets of them that fit together (enumerated up to
//              kMaxEnumerated holders, else one greedy set: higher priority,
//              then smaller, first);
//   evictions  for each keep_alive / on_demand holder: loading it when the
//              device is as full as it gets without it (the pinned, then
//              the keep_alive, then the on_demand ones, higher priority
//              first, in config order, each while it fits), what
//              admission::PlanEviction unloads, in order, and why. Nothing
//              runs requests and nothing has a measured rate: a holder's cost
//              is its evict_cost, else its expected reload time.
//
// PlanDevice is pure (no I/O); CollectDevices reads GGUF headers and device
// telemetry.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "admission/eviction.h"
#include "config/config.h"

namespace spillway::cli {

inline constexpr size_t kMaxEnumerated = 12;

struct Holder {
  std::string key;      // supervisor key: "chat.0", "whisper.ext"
  std::string service;
  bool external = false;
  std::string mode;      // pinned | keep_alive | on_demand
  std::string priority;  // interactive | batch | background
  int rank = 0;          // 0 interactive, 1 batch, 2 background
  uint64_t bytes = 0;    // 0 with `note` when there is no estimate
  double evict_cost = -1;  // declared (< 0: none)
  double reload_s = 0;     // expected load time (gateway/readiness.h's rates)
  std::string shape;       // "ctx 4096, 4 slots, all layers", "declared 600 MiB"
  std::string note;        // why it is not counted, or how it is held
  bool Pinned() const { return mode == "pinned"; }
};

struct Combination {
  std::vector<std::string> keys;  // besides the pinned holders
  uint64_t bytes = 0;             // pinned ones included
};

struct EvictionCase {
  std::string key;                          // the holder that loads
  std::vector<std::string> resident;        // what is assumed loaded when it does
  uint64_t available = 0;                   // budget less those
  admission::EvictionPlan plan;
};

struct DevicePlan {
  std::string device;
  bool exclusive = false;       // [[device]] exclusive = true: one service at a time there
  std::vector<Holder> holders;  // config order: llama placements, then externals
  std::optional<uint64_t> capacity, free;  // unset: not observable (telemetry_note)
  std::string telemetry_note;
  uint64_t headroom = 0;
  std::optional<uint64_t> budget;  // capacity - headroom
  uint64_t pinned_bytes = 0, total_bytes = 0;
  uint64_t start_bytes = 0;  // pinned + keep_alive: what loads at start
  // Verdicts, meaningful only with a budget.
  bool all_fit = false, pinned_fit = false, start_fit = false;
  std::vector<std::string> beside_pinned, never_beside_pinned;  // non-pinned keys
  std::vector<Combination> largest;  // maximal sets that fit, largest first
  bool greedy = false;               // `largest` is one greedy set (too many to enumerate)
  std::vector<EvictionCase> evictions;
};

// Exit status of `spillway plan --config` over all devices: 0 all fit
// together everywhere, 1 they fit only by switching, 2 a pinned set does not
// fit, 3 a device's memory could not be observed (no verdict).
int PlanExitCode(const std::vector<DevicePlan>& plans);

// The verdicts for `plan.holders` against `plan.budget` (pure).
void PlanDevice(DevicePlan& plan);

// Holders, capacity and free memory per accelerator device of `cfg`, in the
// order devices first appear (verdicts not yet made). A placement whose
// model has no estimate is listed with 0 bytes and a note, as admission
// starts it unchecked.
std::vector<DevicePlan> CollectDevices(const config::GatewayConfig& cfg);

// Output: short lines in MiB, or one JSON document.
std::vector<std::string> PlanConfigLines(const std::vector<DevicePlan>& plans);
std::string PlanConfigJson(const std::string& config_file, const std::vector<DevicePlan>& plans);

}  // namespace spillway::cli
