// The shared memory ledger of a simulated accelerator (`sim:N`).
//
// One small file per device (default /dev/shm/spillway-<uid>/spillway-sim-N.ledger,
// in a directory private to its user; the directory is $SPILLWAY_SIM_DIR when
// set, used as it is, for devices shared on purpose) holds the device's capacity and one
// entry per (process, kind): the bytes that process has allocated on the
// device, or holds as "another GPU workload". Every worker using the device,
// llama.cpp's own tools loading the sim backend, and `spillway sim hold` draw
// from the same capacity. All access is under an exclusive flock.
//
// Crashed processes do not leak capacity: every access first removes entries
// whose process is gone (or whose pid was reused: the process start time is
// recorded) and holds whose expiry has passed.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace spillway::devices {

inline constexpr uint32_t kLedgerMaxEntries = 256;

enum class LedgerKind : uint32_t { kAlloc = 1, kHold = 2 };

struct LedgerEntry {
  int32_t pid;
  uint32_t kind;
  uint64_t start_time;   // process start time (clock ticks since boot), 0 = unknown
  uint64_t bytes;
  uint64_t expires_ms;   // unix ms; 0 = never (allocations)
  char label[40];
};

struct LedgerData {
  char magic[8];
  uint64_t capacity;
  uint32_t n_entries;
  uint32_t version;
  LedgerEntry entries[kLedgerMaxEntries];
};

// Pure operations on the ledger contents (no files, no clock, no /proc).
using AliveFn = std::function<bool(int32_t pid, uint64_t start_time)>;
void LedgerInit(LedgerData* d, uint64_t capacity);
bool LedgerValid(const LedgerData& d);
// Removes entries of dead processes and expired holds; returns bytes freed.
uint64_t LedgerReap(LedgerData* d, const AliveFn& alive, uint64_t now_ms);
uint64_t LedgerUsed(const LedgerData& d);
// Adds `bytes` to the (pid, kind, label) entry if capacity allows.
bool LedgerReserve(LedgerData* d, int32_t pid, uint64_t start_time, LedgerKind kind, const std::string& label,
                   uint64_t bytes, uint64_t expires_ms);
// Subtracts up to `bytes` from the (pid, kind, label) entry; removes it at zero.
void LedgerRelease(LedgerData* d, int32_t pid, LedgerKind kind, const std::string& label, uint64_t bytes);

struct LedgerSnapshot {
  uint64_t capacity = 0;
  uint64_t used = 0;
  std::vector<LedgerEntry> entries;
  uint64_t free() const { return used >= capacity ? 0 : capacity - used; }
};

// The file-backed ledger. Thread-safe within a process (a mutex around the
// flock), safe across processes (the flock).
class SimLedger {
 public:
  ~SimLedger();
  SimLedger(const SimLedger&) = delete;
  SimLedger& operator=(const SimLedger&) = delete;

  static std::string DirPath();                 // $SPILLWAY_SIM_DIR or /dev/shm/spillway-<uid>
  static std::string PathFor(int device_index);  // <dir>/spillway-sim-<N>.ledger
  // Creates the device (or changes its capacity, keeping its entries).
  static StatusOr<std::unique_ptr<SimLedger>> Create(int device_index, uint64_t capacity);
  static StatusOr<std::unique_ptr<SimLedger>> Open(int device_index);
  static Status Remove(int device_index);
  // Indices of the devices that exist in DirPath().
  static std::vector<int> List();

  int index() const { return index_; }
  // For this process: reserve / release device bytes.
  bool Reserve(LedgerKind kind, const std::string& label, uint64_t bytes, uint64_t expires_ms = 0);
  void Release(LedgerKind kind, const std::string& label, uint64_t bytes);
  LedgerSnapshot Snapshot();
  // Whether its file is no longer the one at PathFor(index) (removed, or
  // removed and created again: `sim remove` then `sim create`).
  bool Replaced() const;

 private:
  SimLedger(int index, int fd, LedgerData* data) : index_(index), fd_(fd), data_(data) {}
  template <typename Fn>
  auto Locked(Fn&& fn);

  int index_;
  int fd_;
  LedgerData* data_;
};

// Process liveness by /proc: alive if /proc/<pid> exists and (when recorded)
// its start time matches. kUnknown: kill() finds the pid but its /proc entry
// cannot be read (no descriptor left, hidepid), so whether it is still the
// recorded process cannot be told: neither signal it nor take it for ended.
enum class Liveness { kAlive, kGone, kUnknown };
Liveness ProcessLiveness(int32_t pid, uint64_t start_time);
// kAlive only: safe to signal.
bool ProcessAlive(int32_t pid, uint64_t start_time);
uint64_t ProcessStartTime(int32_t pid);
uint64_t UnixMillis();

}  // namespace spillway::devices
