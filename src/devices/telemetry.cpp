#include "devices/telemetry.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "common/names.h"
#include "common/proc_file.h"
#include "devices/sim_ledger.h"

namespace spillway::devices {

namespace {

bool ReadWhole(const std::string& path, std::string* out) {
  std::ifstream f(path);
  if (!f) return false;
  std::stringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return true;
}

// The number after `key` on the line that begins with it: "MemAvailable:
// 123456 kB" (/proc/meminfo, key "MemAvailable:"), "inactive_file 4096"
// (a cgroup's memory.stat, key "inactive_file ").
std::optional<uint64_t> NumberField(const std::string& text, const std::string& key) {
  size_t pos = 0;
  while ((pos = text.find(key, pos)) != std::string::npos) {
    if (pos == 0 || text[pos - 1] == '\n') {
      std::istringstream line(text.substr(pos + key.size()));
      uint64_t n = 0;
      if (line >> n) return n;
      return std::nullopt;
    }
    pos += key.size();
  }
  return std::nullopt;
}

// "MemAvailable:   123456 kB" -> bytes
std::optional<uint64_t> KbField(const std::string& text, const std::string& key) {
  auto kb = NumberField(text, key);
  return kb ? std::optional<uint64_t>(*kb * 1024) : std::nullopt;
}

class SimTelemetry final : public DeviceTelemetry {
 public:
  SimTelemetry(std::string name, std::unique_ptr<SimLedger> ledger) : name_(std::move(name)), ledger_(std::move(ledger)) {}
  const std::string& device() const override { return name_; }
  StatusOr<DeviceReading> Read() override {
    // A reader is kept (one per thread): a device removed and created again
    // is another file, which it opens again (it went on reading the old,
    // unlinked one: its old capacity, and none of the new file's holders).
    if (ledger_->Replaced()) {
      auto again = SimLedger::Open(ledger_->index());
      if (!again.ok()) return Status::Unavailable(again.status().message());
      ledger_ = std::move(*again);
    }
    auto snap = ledger_->Snapshot();
    DeviceReading r{name_, snap.capacity, snap.free(), {}};
    for (const auto& e : snap.entries) {
      r.processes.push_back({e.pid, e.bytes, e.kind == static_cast<uint32_t>(LedgerKind::kHold) ? "hold" : "alloc"});
    }
    return r;
  }

 private:
  std::string name_;
  std::unique_ptr<SimLedger> ledger_;
};

// The few NVML entry points used, declared here so that no NVML header or
// library is needed at build time.
struct NvmlMemory {
  unsigned long long total, free, used;
};
struct NvmlProcessInfo {  // nvmlProcessInfo_v2_t
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id, compute_instance_id;
};
using NvmlInit = int (*)();
using NvmlGetHandle = int (*)(unsigned int, void**);
using NvmlGetHandleByUuid = int (*)(const char*, void**);
using NvmlGetMemory = int (*)(void*, NvmlMemory*);
using NvmlGetProcesses = int (*)(void*, unsigned int*, NvmlProcessInfo*);
constexpr int kNvmlInsufficientSize = 7;  // NVML_ERROR_INSUFFICIENT_SIZE

class NvmlTelemetry final : public DeviceTelemetry {
 public:
  static StatusOr<std::unique_ptr<DeviceTelemetry>> Open(const std::string& name, int index) {
    const CudaDeviceSelector which = SelectCudaDevice(index, std::getenv("CUDA_VISIBLE_DEVICES"));
    if (!which.error.empty()) return Status::Unavailable("cannot observe " + name + ": " + which.error);
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return Status::Unavailable("NVML (libnvidia-ml.so.1) is not available: cannot observe " + name);
    auto init = reinterpret_cast<NvmlInit>(dlsym(lib, "nvmlInit_v2"));
    auto handle = reinterpret_cast<NvmlGetHandle>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
    auto by_uuid = reinterpret_cast<NvmlGetHandleByUuid>(dlsym(lib, "nvmlDeviceGetHandleByUUID"));
    auto memory = reinterpret_cast<NvmlGetMemory>(dlsym(lib, "nvmlDeviceGetMemoryInfo"));
    auto procs = reinterpret_cast<NvmlGetProcesses>(dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v2"));
    void* dev = nullptr;
    const bool found = which.nvml_index ? handle && handle(*which.nvml_index, &dev) == 0
                                        : by_uuid && by_uuid(which.uuid.c_str(), &dev) == 0;
    if (!init || !memory || init() != 0 || !found) {
      dlclose(lib);
      return Status::Unavailable("NVML cannot open " + name +
                                 (which.nvml_index ? " (its index " + std::to_string(*which.nvml_index) + ")"
                                                   : " (" + which.uuid + ")"));
    }
    std::unique_ptr<NvmlTelemetry> t(new NvmlTelemetry());
    t->name_ = name;
    t->lib_ = lib;
    t->dev_ = dev;
    t->memory_ = memory;
    t->procs_ = procs;
    return std::unique_ptr<DeviceTelemetry>(std::move(t));
  }
  ~NvmlTelemetry() override {
    if (lib_) dlclose(lib_);
  }
  const std::string& device() const override { return name_; }
  StatusOr<DeviceReading> Read() override {
    NvmlMemory m{};
    if (memory_(dev_, &m) != 0) return Status::Unavailable("NVML memory query failed for " + name_);
    DeviceReading r{name_, m.total, m.free, {}};
    if (procs_) {
      // More processes than the buffer holds: NVML says how many
      // (NVML_ERROR_INSUFFICIENT_SIZE), and is asked again with room for
      // them (they read as none before).
      std::vector<NvmlProcessInfo> info(64);
      unsigned int n = static_cast<unsigned int>(info.size());
      int rc = procs_(dev_, &n, info.data());
      if (rc == kNvmlInsufficientSize && n > info.size()) {
        info.resize(n + 16);
        n = static_cast<unsigned int>(info.size());
        rc = procs_(dev_, &n, info.data());
      }
      if (rc == 0) {
        for (unsigned i = 0; i < n && i < info.size(); ++i) {
          // NVML_VALUE_NOT_AVAILABLE (all ones: WDDM, some MIG setups) is
          // no byte count: summed, it wrapped; counted as nothing known.
          const unsigned long long used = info[i].used_gpu_memory;
          r.processes.push_back({static_cast<int32_t>(info[i].pid), used == ~0ULL ? 0 : used, ""});
        }
      }
    }
    return r;
  }

 private:
  NvmlTelemetry() = default;
  std::string name_;
  void* lib_ = nullptr;
  void* dev_ = nullptr;
  NvmlGetMemory memory_ = nullptr;
  NvmlGetProcesses procs_ = nullptr;
};

}  // namespace

CudaDeviceSelector SelectCudaDevice(int index, const char* visible) {
  CudaDeviceSelector s;
  if (index < 0) {
    s.error = "no CUDA device " + std::to_string(index);
    return s;
  }
  if (!visible || !*visible) {
    s.nvml_index = static_cast<unsigned>(index);
    return s;
  }
  std::vector<std::string> entries;
  std::stringstream in(visible);
  for (std::string e; std::getline(in, e, ',');) {
    e.erase(0, e.find_first_not_of(" \t"));
    e.erase(e.find_last_not_of(" \t") + 1);
    entries.push_back(e);
  }
  if (static_cast<size_t>(index) >= entries.size() || entries[static_cast<size_t>(index)].empty()) {
    s.error = "cuda:" + std::to_string(index) + " is not among CUDA_VISIBLE_DEVICES=" + visible;
    return s;
  }
  const std::string& e = entries[static_cast<size_t>(index)];
  if (e.find_first_not_of("0123456789") == std::string::npos && e.size() < 6) {
    s.nvml_index = static_cast<unsigned>(std::stoul(e));
  } else {
    s.uuid = e;  // GPU-... or MIG-...: CUDA takes a UUID (or its prefix); NVML asked by the whole one
  }
  return s;
}

StatusOr<std::unique_ptr<DeviceTelemetry>> OpenDeviceTelemetry(const std::string& device) {
  const auto name = ParseDeviceName(device);
  if (!name || name->kind == "cpu") return Status::InvalidArgument("bad device '" + device + "' (sim:N or cuda:N)");
  const std::string& kind = name->kind;
  const int index = name->index;
  if (kind == "sim") {
    auto ledger = SimLedger::Open(index);
    if (!ledger.ok()) return Status::Unavailable(ledger.status().message());
    return std::unique_ptr<DeviceTelemetry>(new SimTelemetry(device, std::move(*ledger)));
  }
  if (kind == "cuda") return NvmlTelemetry::Open(device, index);
  return Status::InvalidArgument("unknown device kind '" + kind + "' (sim:N or cuda:N)");
}

uint64_t HostReading::effective_available() const {
  uint64_t avail = available;
  if (cgroup_limit && cgroup_current) {
    const uint64_t room = *cgroup_current >= *cgroup_limit ? 0 : *cgroup_limit - *cgroup_current;
    avail = std::min(avail, room);
  }
  return avail;
}

HostTelemetry::HostTelemetry(std::string proc_root, std::string cgroup_root)
    : proc_root_(std::move(proc_root)), cgroup_root_(std::move(cgroup_root)), meminfo_(proc_root_ + "/meminfo") {
  const char* sim = std::getenv("SPILLWAY_SIM_HOST_MEMINFO");
  if (proc_root_ == "/proc" && sim && *sim) {
    meminfo_ = sim;
    cgroups_ = false;
  }
}

StatusOr<HostReading> HostTelemetry::Read() const {
  std::string meminfo;
  if (!ReadWhole(meminfo_, &meminfo)) return Status::Unavailable("cannot read " + meminfo_);
  HostReading r;
  auto total = KbField(meminfo, "MemTotal:");
  auto avail = KbField(meminfo, "MemAvailable:");
  if (!total || !avail) return Status::Unavailable(meminfo_ + " lacks MemTotal or MemAvailable");
  r.total = *total;
  r.available = *avail;
  // cgroup v2: "0::/some/path" in /proc/self/cgroup.
  std::string cg;
  if (cgroups_ && ReadWhole(proc_root_ + "/self/cgroup", &cg)) {
    auto pos = cg.find("0::");
    if (pos != std::string::npos) {
      std::string path = cg.substr(pos + 3);
      path = path.substr(0, path.find('\n'));
      if (path == "/") path.clear();
      // The tightest limit of the group and every group above it (a limit
      // set on a parent slice binds too), each against what its group uses
      // less its inactive file pages: page cache the kernel reclaims before
      // it refuses memory (models read, logs written) filled a limited
      // group's memory.current up to its limit, and its room read as none.
      std::optional<uint64_t> least_room;
      for (std::string level = path;;) {
        std::string max, cur, stat;
        if (ReadWhole(cgroup_root_ + level + "/memory.max", &max) && max.rfind("max", 0) != 0 &&
            ReadWhole(cgroup_root_ + level + "/memory.current", &cur)) {
          const uint64_t limit = std::strtoull(max.c_str(), nullptr, 10);
          uint64_t used = std::strtoull(cur.c_str(), nullptr, 10);
          if (ReadWhole(cgroup_root_ + level + "/memory.stat", &stat)) {
            used -= std::min(used, NumberField(stat, "inactive_file ").value_or(0));
          }
          const uint64_t room = used >= limit ? 0 : limit - used;
          if (!least_room || room < *least_room) {
            least_room = room;
            r.cgroup_limit = limit;
            r.cgroup_current = used;
          }
        }
        if (level.empty()) break;
        level = level.substr(0, level.rfind('/'));
      }
    }
  }
  return r;
}

StatusOr<uint64_t> HostTelemetry::GroupRss(int32_t pgid) const {
  const auto members = ProcessesOfGroup(pgid, proc_root_);
  if (!members) return Status::Unavailable("the processes of group " + std::to_string(pgid) + " cannot be read");
  if (members->empty()) return Status::NotFound("no process in group " + std::to_string(pgid));
  uint64_t sum = 0;
  for (const auto& m : *members) {
    if (auto pss = ProcessPss(m.first); pss.ok()) sum += *pss;  // (one gone meanwhile holds nothing)
  }
  return sum;
}

StatusOr<uint64_t> HostTelemetry::ProcessPss(int32_t pid) const {
  std::string rollup;
  if (pid > 0 && ReadWhole(proc_root_ + "/" + std::to_string(pid) + "/smaps_rollup", &rollup)) {
    if (auto pss = KbField(rollup, "Pss:")) return *pss;
  }
  return ProcessRss(pid);  // (a kernel before 4.14, or not ours to read)
}

uint64_t DeviceReading::BytesOfGroup(int32_t pgid) const {
  uint64_t bytes = 0;
  if (pgid <= 0) return bytes;
  for (const auto& p : processes) {
    if (p.pid <= 0) continue;
    if (p.pid == pgid) {
      bytes += p.bytes;
    } else if (const auto f = ReadProcStat(p.pid); f && f->pgrp == pgid) {
      bytes += p.bytes;
    }
  }
  return bytes;
}

StatusOr<uint64_t> HostTelemetry::ProcessRss(int32_t pid) const {
  std::string status;
  if (pid <= 0 || !ReadWhole(proc_root_ + "/" + std::to_string(pid) + "/status", &status)) {
    return Status::NotFound("no process " + std::to_string(pid));
  }
  auto rss = KbField(status, "VmRSS:");
  return rss ? *rss : 0;  // kernel threads and zombies have no VmRSS
}

}  // namespace spillway::devices
