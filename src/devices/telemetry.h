// Device and host memory telemetry behind one interface, for the gateway's
// ledger and admission decisions (which never include llama.h).
//
//   sim:N   the simulated device's shared ledger (capacity, per-process use)
//   cuda:N  NVML, loaded with dlopen when present (total/free, per-process use);
//           absent NVML is a clean kUnavailable, never a crash
//   host    MemAvailable from /proc/meminfo, cgroup v2 memory.max and
//           memory.current (less inactive file pages) of the group and its
//           parents when a limit is set, per-process RSS
//
// Readers are cheap to call repeatedly; each Read() is a fresh observation.
// Not thread-safe: one reader per thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace spillway::devices {

struct ProcessMemory {
  int32_t pid = 0;
  uint64_t bytes = 0;
  std::string label;  // "alloc", "hold", or empty
};

struct DeviceReading {
  std::string device;
  uint64_t total = 0;
  uint64_t free = 0;
  std::vector<ProcessMemory> processes;
  // What process group `pgid` holds (0 for pgid <= 0): its leader's entries
  // and those of every process in its group (an external server's, whose
  // memory may be its children's: a wrapper script's server, a server's
  // runner processes; a worker has none).
  uint64_t BytesOfGroup(int32_t pgid) const;
};

class DeviceTelemetry {
 public:
  virtual ~DeviceTelemetry() = default;
  virtual const std::string& device() const = 0;
  virtual StatusOr<DeviceReading> Read() = 0;
};

// "sim:N" or "cuda:N". kInvalidArgument for other names, kUnavailable when
// the device cannot be observed (no ledger, no NVML, no such GPU).
StatusOr<std::unique_ptr<DeviceTelemetry>> OpenDeviceTelemetry(const std::string& device);

// Which GPU NVML must read for `cuda:N`, numbered as the workers' CUDA
// runtime numbers them: in PCI bus order (workers get
// CUDA_DEVICE_ORDER=PCI_BUS_ID, as NVML orders its indices; CUDA's default,
// fastest first, differs on a machine of mixed GPUs), and among
// CUDA_VISIBLE_DEVICES when the gateway's environment sets it (`visible`):
// its Nth entry, an index or a GPU-/MIG- UUID. `error` says why there is
// none (N past the list).
struct CudaDeviceSelector {
  std::optional<unsigned> nvml_index;
  std::string uuid;
  std::string error;
};
CudaDeviceSelector SelectCudaDevice(int index, const char* visible);

struct HostReading {
  uint64_t total = 0;       // MemTotal
  uint64_t available = 0;   // MemAvailable
  // The cgroup v2 limit that leaves the least room, of this process's group
  // and those above it (none: no limit), and what that group uses:
  // memory.current less its inactive file pages (reclaimable page cache).
  std::optional<uint64_t> cgroup_limit;    // memory.max when not "max"
  std::optional<uint64_t> cgroup_current;
  // What this process group may still use: MemAvailable, capped by the cgroup.
  uint64_t effective_available() const;
};

// The host's memory as the kernel tells it. With $SPILLWAY_SIM_HOST_MEMINFO
// set, the default one reads the host's memory (Read) from that file, in
// /proc/meminfo's format, and no cgroup limit: a simulated host whose free
// memory a test or a demo sets, as a `sim:N` device's ledger does for an
// accelerator. Processes' sizes are still read from /proc.
class HostTelemetry {
 public:
  // The roots are parameters so that tests can point them at fake trees.
  explicit HostTelemetry(std::string proc_root = "/proc", std::string cgroup_root = "/sys/fs/cgroup");
  StatusOr<HostReading> Read() const;
  // Resident set size of a process (VmRSS), kNotFound when it is gone.
  StatusOr<uint64_t> ProcessRss(int32_t pid) const;
  // Its proportional set size (smaps_rollup's Pss: a page it shares with
  // N-1 other processes counts 1/N), VmRSS where smaps_rollup cannot be read;
  // kNotFound when it is gone.
  StatusOr<uint64_t> ProcessPss(int32_t pid) const;
  // What every process in group `pgid` holds together, each page once: their
  // Pss summed (their VmRSS summed counted a forking server's shared and
  // copy-on-write pages once per process). One walk of the process tree;
  // kNotFound when none is there, kUnavailable when the walk cannot tell.
  StatusOr<uint64_t> GroupRss(int32_t pgid) const;

 private:
  std::string proc_root_, cgroup_root_;
  std::string meminfo_;  // proc_root_'s meminfo, or the simulated host's
  bool cgroups_ = true;  // (a simulated host has none)
};

}  // namespace spillway::devices
