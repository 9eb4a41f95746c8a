// Fault injection for the worker on a simulated device. Off by default; armed
// by --fault flags, $SPILLWAY_FAULTS (separated by ';' or ','), or at run time
// through POST /v1/worker/faults. Every armed and fired fault is logged to
// stderr and listed in /v1/worker/info.
//
//   fail-next=load|kv|compute   the next device allocation in that phase fails
//                                (compute: buffers must grow at the next graph,
//                                and that allocation fails; decode returns an error)
//   fail-next=reserve           as compute, but through a re-reservation inside
//                                llama_decode, which throws and poisons the context
//   fail-after-bytes=N          device allocations beyond N bytes (this process) fail
//   kv-full                     the next decode finds no room in the KV cache
//                                (llama_decode's 1, what a full cache returns at run
//                                time: its cells are allocated once, at the context's creation)
//   compute-error               the next graph compute returns an error
//   compute-abort               the next graph compute aborts the process (as a CUDA pool failure)
//   hang=SECONDS                the next graph compute stalls (decimal seconds)
//   lose-at-token=K             the device is lost after K more generated tokens
//   lose-device                 the device is lost now
//   slow-load=SECONDS           the model load takes at least this long (any
//                                device; its progress is reported as it goes)
//   clear                       disarm everything not yet fired
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/sim_control.h"

namespace spillway::worker {

struct FaultSpec {
  enum Kind { kFailNext, kFailAfterBytes, kKvFull, kComputeError, kComputeAbort, kHang, kLoseAtToken, kLoseDevice, kSlowLoad, kClear };
  Kind kind;
  int64_t arg = 0;            // bytes, ms, tokens, or a spillway_sim_phase
  bool via_reserve = false;   // fail-next=reserve
};

// Parses one fault spec (pure; no device needed).
StatusOr<FaultSpec> ParseFault(const std::string& spec);

class FaultInjector {
 public:
  explicit FaultInjector(SimControl* sim) : sim_(sim) {}

  // Parses and arms one fault. Errors: unknown fault, bad argument, no sim device.
  Status Arm(const std::string& spec);
  Status ArmAll(const std::string& list);  // ';' or ',' separated

  // Engine hooks (engine thread).
  void OnToken();
  bool TakeForceReserve() { return force_reserve_.exchange(false); }
  // The kv-full fault, once: the decode it is taken for returns 1 (counted as fired).
  bool TakeKvFull();
  // The slow-load fault's length (0: none), once: the load it stretches.
  int64_t TakeSlowLoadMs() { return slow_load_ms_.exchange(0); }

  nlohmann::json ToJson() const;

 private:
  void Log(const std::string& what);

  SimControl* sim_;
  mutable std::mutex mu_;
  std::vector<nlohmann::json> history_;
  std::atomic<int64_t> lose_at_token_{-1};
  std::atomic<bool> force_reserve_{false};
  std::atomic<bool> kv_full_{false};
  std::atomic<uint64_t> fired_{0};  // faults fired in the engine (kv-full); the sim device counts its own
  std::atomic<int64_t> slow_load_ms_{0};
};

}  // namespace spillway::worker
