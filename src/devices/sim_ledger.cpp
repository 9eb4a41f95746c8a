#include "devices/sim_ledger.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>

#include "common/private_files.h"
#include "common/proc_file.h"

namespace spillway::devices {

namespace {

constexpr char kMagic[8] = {'S', 'W', 'S', 'I', 'M', '0', '1', '\0'};

bool SameEntry(const LedgerEntry& e, int32_t pid, LedgerKind kind, const std::string& label) {
  return e.pid == pid && e.kind == static_cast<uint32_t>(kind) && label == e.label;
}

void RemoveAt(LedgerData* d, uint32_t i) {
  d->entries[i] = d->entries[d->n_entries - 1];
  --d->n_entries;
}

std::mutex& ProcessMutex() {
  static std::mutex mu;
  return mu;
}

}  // namespace

void LedgerInit(LedgerData* d, uint64_t capacity) {
  std::memset(d, 0, sizeof *d);
  std::memcpy(d->magic, kMagic, sizeof kMagic);
  d->capacity = capacity;
  d->version = 1;
}

bool LedgerValid(const LedgerData& d) {
  return std::memcmp(d.magic, kMagic, sizeof kMagic) == 0 && d.n_entries <= kLedgerMaxEntries;
}

uint64_t LedgerReap(LedgerData* d, const AliveFn& alive, uint64_t now_ms) {
  uint64_t freed = 0;
  for (uint32_t i = 0; i < d->n_entries;) {
    const LedgerEntry& e = d->entries[i];
    const bool expired = e.expires_ms != 0 && e.expires_ms <= now_ms;
    if (expired || !alive(e.pid, e.start_time)) {
      freed += e.bytes;
      RemoveAt(d, i);
    } else {
      ++i;
    }
  }
  return freed;
}

uint64_t LedgerUsed(const LedgerData& d) {
  uint64_t used = 0;
  for (uint32_t i = 0; i < d.n_entries; ++i) used += d.entries[i].bytes;
  return used;
}

bool LedgerReserve(LedgerData* d, int32_t pid, uint64_t start_time, LedgerKind kind, const std::string& label,
                   uint64_t bytes, uint64_t expires_ms) {
  const uint64_t used = LedgerUsed(*d);
  if (bytes > d->capacity || used > d->capacity - bytes) return false;
  for (uint32_t i = 0; i < d->n_entries; ++i) {
    if (SameEntry(d->entries[i], pid, kind, label)) {
      d->entries[i].bytes += bytes;
      if (expires_ms) d->entries[i].expires_ms = expires_ms;
      return true;
    }
  }
  if (d->n_entries >= kLedgerMaxEntries) return false;
  LedgerEntry& e = d->entries[d->n_entries++];
  std::memset(&e, 0, sizeof e);
  e.pid = pid;
  e.kind = static_cast<uint32_t>(kind);
  e.start_time = start_time;
  e.bytes = bytes;
  e.expires_ms = expires_ms;
  std::strncpy(e.label, label.c_str(), sizeof e.label - 1);
  return true;
}

void LedgerRelease(LedgerData* d, int32_t pid, LedgerKind kind, const std::string& label, uint64_t bytes) {
  for (uint32_t i = 0; i < d->n_entries; ++i) {
    if (SameEntry(d->entries[i], pid, kind, label)) {
      LedgerEntry& e = d->entries[i];
      e.bytes = bytes >= e.bytes ? 0 : e.bytes - bytes;
      if (e.bytes == 0) RemoveAt(d, i);
      return;
    }
  }
}

uint64_t UnixMillis() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

uint64_t ProcessStartTime(int32_t pid) {
  const auto f = ReadProcStat(pid);
  return f ? f->start_time : 0;
}

Liveness ProcessLiveness(int32_t pid, uint64_t start_time) {
  if (pid <= 0) return Liveness::kGone;
  if (kill(pid, 0) != 0 && errno == ESRCH) return Liveness::kGone;
  // A zombie has released its memory as far as the device is concerned.
  const std::optional<std::string> stat = ReadSmallFile("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) {
    // Reaped since kill() saw it (a read after reaping fails with ESRCH).
    if (errno == ENOENT || errno == ESRCH) return Liveness::kGone;
    // Another error (no descriptor left, hidepid) says nothing of its death:
    // alive as kill() said, unless a start time is there to compare.
    return start_time == 0 ? Liveness::kAlive : Liveness::kUnknown;
  }
  const std::optional<ProcStat> f = ParseProcStat(*stat);  // (the text read above: one read, one process)
  if (f && f->state == 'Z') return Liveness::kGone;
  return start_time == 0 || (f ? f->start_time : 0) == start_time ? Liveness::kAlive : Liveness::kGone;
}

bool ProcessAlive(int32_t pid, uint64_t start_time) { return ProcessLiveness(pid, start_time) == Liveness::kAlive; }

std::string SimLedger::DirPath() {
  const char* d = std::getenv("SPILLWAY_SIM_DIR");
  return d && *d ? d : "/dev/shm/spillway-" + std::to_string(::geteuid());
}

namespace {

// The default directory is private to its user (another user must not be
// able to change a simulated device's capacity or holders); a configured one
// ($SPILLWAY_SIM_DIR) is used as it is, for devices shared on purpose.
Status PrepareDir() {
  const char* d = std::getenv("SPILLWAY_SIM_DIR");
  if (d && *d) {
    std::error_code ec;
    std::filesystem::create_directories(d, ec);
    return Status::Ok();
  }
  return EnsurePrivateDir(SimLedger::DirPath());
}

}  // namespace

std::string SimLedger::PathFor(int device_index) {
  return DirPath() + "/spillway-sim-" + std::to_string(device_index) + ".ledger";
}

namespace {

StatusOr<std::pair<int, LedgerData*>> MapFile(const std::string& path, bool create) {
  // 0666 less the umask: shared only where a configured directory allows it.
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT : 0), 0666);
  if (fd < 0) {
    if (!create && errno == ENOENT) {
      return Status::NotFound("simulated device ledger " + path +
                              " does not exist (run `spillway sim create sim:N --capacity-mib M`)");
    }
    return Status::Unavailable("cannot open " + path + ": " + std::strerror(errno));
  }
  struct stat st {};
  fstat(fd, &st);
  if (static_cast<size_t>(st.st_size) < sizeof(LedgerData)) {
    if (!create) {
      ::close(fd);
      return Status::Unavailable(path + " is not a simulated device ledger (too short)");
    }
    if (ftruncate(fd, sizeof(LedgerData)) != 0) {
      ::close(fd);
      return Status::Unavailable("cannot size " + path);
    }
  }
  void* p = mmap(nullptr, sizeof(LedgerData), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    ::close(fd);
    return Status::Unavailable("cannot map " + path);
  }
  return std::make_pair(fd, static_cast<LedgerData*>(p));
}

}  // namespace

template <typename Fn>
auto SimLedger::Locked(Fn&& fn) {
  std::lock_guard<std::mutex> lk(ProcessMutex());
  flock(fd_, LOCK_EX);
  struct Unlock {
    int fd;
    ~Unlock() { flock(fd, LOCK_UN); }
  } unlock{fd_};
  // A file cut short from outside since it was mapped (a `truncate`, a
  // copy over it) faults on the pages past its end (SIGBUS in the gateway
  // and every sim worker): read as no ledger until `sim create` sizes it
  // again.
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || static_cast<size_t>(st.st_size) < sizeof(LedgerData)) {
    auto none = std::make_unique<LedgerData>();  // zeroed: no magic, not valid
    return fn(none.get());
  }
  // Only a ledger (a file of another shape, written from outside, trusted
  // for its entry count, had the reap read far past the mapping), and only
  // holders that are gone: one whose /proc entry cannot be read now (no
  // descriptor left) still holds its bytes.
  if (LedgerValid(*data_)) {
    LedgerReap(data_, [](int32_t pid, uint64_t start) { return ProcessLiveness(pid, start) != Liveness::kGone; },
               UnixMillis());
  }
  return fn(data_);
}

SimLedger::~SimLedger() {
  munmap(data_, sizeof(LedgerData));
  ::close(fd_);
}

StatusOr<std::unique_ptr<SimLedger>> SimLedger::Create(int device_index, uint64_t capacity) {
  SPILLWAY_RETURN_IF_ERROR(PrepareDir());
  auto m = MapFile(PathFor(device_index), true);
  if (!m.ok()) return m.status();
  std::unique_ptr<SimLedger> l(new SimLedger(device_index, m->first, m->second));
  l->Locked([capacity](LedgerData* d) {
    if (!LedgerValid(*d)) {
      LedgerInit(d, capacity);
    } else {
      d->capacity = capacity;
    }
    return 0;
  });
  return l;
}

StatusOr<std::unique_ptr<SimLedger>> SimLedger::Open(int device_index) {
  SPILLWAY_RETURN_IF_ERROR(PrepareDir());
  auto m = MapFile(PathFor(device_index), false);
  if (!m.ok()) return m.status();
  std::unique_ptr<SimLedger> l(new SimLedger(device_index, m->first, m->second));
  const bool valid = l->Locked([](LedgerData* d) { return LedgerValid(*d); });
  if (!valid) return Status::Unavailable(PathFor(device_index) + " is not a simulated device ledger");
  return l;
}

Status SimLedger::Remove(int device_index) {
  std::error_code ec;
  if (!std::filesystem::remove(PathFor(device_index), ec)) {
    return Status::NotFound("no simulated device sim:" + std::to_string(device_index));
  }
  return Status::Ok();
}

std::vector<int> SimLedger::List() {
  std::vector<int> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(DirPath(), ec)) {
    const std::string f = e.path().filename().string();
    int n = -1;
    char tail[16] = {0};
    if (std::sscanf(f.c_str(), "spillway-sim-%d.%15s", &n, tail) == 2 && std::string(tail) == "ledger" && n >= 0) {
      out.push_back(n);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool SimLedger::Reserve(LedgerKind kind, const std::string& label, uint64_t bytes, uint64_t expires_ms) {
  // Not cached across fork(): a child reserves under its own pid.
  static thread_local int32_t cached_pid = 0;
  static thread_local uint64_t cached_start = 0;
  const int32_t pid = getpid();
  if (pid != cached_pid) {
    cached_pid = pid;
    cached_start = ProcessStartTime(pid);
  }
  const uint64_t start = cached_start;
  return Locked([&](LedgerData* d) { return LedgerValid(*d) && LedgerReserve(d, pid, start, kind, label, bytes, expires_ms); });
}

void SimLedger::Release(LedgerKind kind, const std::string& label, uint64_t bytes) {
  const int32_t pid = getpid();
  Locked([&](LedgerData* d) {
    if (LedgerValid(*d)) LedgerRelease(d, pid, kind, label, bytes);
    return 0;
  });
}

bool SimLedger::Replaced() const {
  struct stat open_file {}, named {};
  if (::fstat(fd_, &open_file) != 0) return true;
  if (::stat(PathFor(index_).c_str(), &named) != 0) return true;
  return open_file.st_dev != named.st_dev || open_file.st_ino != named.st_ino;
}

LedgerSnapshot SimLedger::Snapshot() {
  return Locked([](LedgerData* d) {
    LedgerSnapshot s;
    if (!LedgerValid(*d)) return s;  // (overwritten from outside since it was opened: no capacity to give)
    s.capacity = d->capacity;
    s.used = LedgerUsed(*d);
    s.entries.assign(d->entries, d->entries + d->n_entries);
    return s;
  });
}

}  // namespace spillway::devices
