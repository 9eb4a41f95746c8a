#include "journal/storage_faults.h"

#include <sqlite3.h>

#include <atomic>
#include <cerrno>
#include <thread>

namespace spillway::journal {

// sqlite3_vfs first, so SQLite's sqlite3_vfs* is also ours.
struct StorageFaults::Vfs {
  sqlite3_vfs base{};
  sqlite3_vfs* root = nullptr;
  StorageFaults* faults = nullptr;
};

namespace {

// An open file: our header, then the wrapped VFS's own file (szOsFile bytes).
struct FaultFile {
  sqlite3_file base;
  StorageFaults* faults;
  sqlite3_file* real;
};

StorageFaults::Vfs* Box(sqlite3_vfs* v) { return reinterpret_cast<StorageFaults::Vfs*>(v); }
sqlite3_vfs* Root(sqlite3_vfs* v) { return Box(v)->root; }
FaultFile* Ff(sqlite3_file* f) { return reinterpret_cast<FaultFile*>(f); }
const sqlite3_io_methods* Real(sqlite3_file* f) { return Ff(f)->real->pMethods; }

// --- file methods: pass through, except where a fault is armed ---

int Close(sqlite3_file* f) { return Real(f)->xClose(Ff(f)->real); }
int Read(sqlite3_file* f, void* buf, int n, sqlite3_int64 off) { return Real(f)->xRead(Ff(f)->real, buf, n, off); }
int Write(sqlite3_file* f, const void* buf, int n, sqlite3_int64 off) {
  if (int rc = Ff(f)->faults->BeforeWrite(); rc != SQLITE_OK) return rc;
  return Real(f)->xWrite(Ff(f)->real, buf, n, off);
}
int Truncate(sqlite3_file* f, sqlite3_int64 size) { return Real(f)->xTruncate(Ff(f)->real, size); }
int Sync(sqlite3_file* f, int flags) {
  if (int rc = Ff(f)->faults->BeforeSync(); rc != SQLITE_OK) return rc;
  return Real(f)->xSync(Ff(f)->real, flags);
}
int FileSize(sqlite3_file* f, sqlite3_int64* size) { return Real(f)->xFileSize(Ff(f)->real, size); }
int Lock(sqlite3_file* f, int level) { return Real(f)->xLock(Ff(f)->real, level); }
int Unlock(sqlite3_file* f, int level) { return Real(f)->xUnlock(Ff(f)->real, level); }
int CheckReservedLock(sqlite3_file* f, int* out) { return Real(f)->xCheckReservedLock(Ff(f)->real, out); }
int FileControl(sqlite3_file* f, int op, void* arg) { return Real(f)->xFileControl(Ff(f)->real, op, arg); }
int SectorSize(sqlite3_file* f) { return Real(f)->xSectorSize(Ff(f)->real); }
int DeviceCharacteristics(sqlite3_file* f) { return Real(f)->xDeviceCharacteristics(Ff(f)->real); }
// Version 2 and 3 methods exist only when the wrapped file has them.
int ShmMap(sqlite3_file* f, int region, int size, int extend, void volatile** pp) {
  if (Real(f)->iVersion < 2) return SQLITE_IOERR_SHMMAP;
  return Real(f)->xShmMap(Ff(f)->real, region, size, extend, pp);
}
int ShmLock(sqlite3_file* f, int offset, int n, int flags) {
  if (Real(f)->iVersion < 2) return SQLITE_IOERR_SHMLOCK;
  return Real(f)->xShmLock(Ff(f)->real, offset, n, flags);
}
void ShmBarrier(sqlite3_file* f) {
  if (Real(f)->iVersion >= 2) Real(f)->xShmBarrier(Ff(f)->real);
  else std::atomic_thread_fence(std::memory_order_seq_cst);
}
int ShmUnmap(sqlite3_file* f, int del) {
  return Real(f)->iVersion < 2 ? SQLITE_OK : Real(f)->xShmUnmap(Ff(f)->real, del);
}
int Fetch(sqlite3_file* f, sqlite3_int64 off, int n, void** pp) {
  if (Real(f)->iVersion < 3) {
    *pp = nullptr;  // "no mapping": SQLite reads instead
    return SQLITE_OK;
  }
  return Real(f)->xFetch(Ff(f)->real, off, n, pp);
}
int Unfetch(sqlite3_file* f, sqlite3_int64 off, void* p) {
  return Real(f)->iVersion < 3 ? SQLITE_OK : Real(f)->xUnfetch(Ff(f)->real, off, p);
}

const sqlite3_io_methods kMethods = {
    3,        Close,       Read,          Write,    Truncate,   Sync,       FileSize, Lock,    Unlock,
    CheckReservedLock, FileControl, SectorSize, DeviceCharacteristics, ShmMap, ShmLock, ShmBarrier, ShmUnmap,
    Fetch,    Unfetch,
};

// --- VFS methods: open wraps the file, everything else goes to the root ---

int Open(sqlite3_vfs* v, sqlite3_filename name, sqlite3_file* f, int flags, int* out_flags) {
  auto* ff = Ff(f);
  ff->base.pMethods = nullptr;  // SQLite must not call xClose if the open fails
  ff->faults = Box(v)->faults;
  ff->real = reinterpret_cast<sqlite3_file*>(ff + 1);
  const int rc = Root(v)->xOpen(Root(v), name, ff->real, flags, out_flags);
  if (rc == SQLITE_OK) ff->base.pMethods = &kMethods;
  return rc;
}
int Delete(sqlite3_vfs* v, const char* name, int sync_dir) { return Root(v)->xDelete(Root(v), name, sync_dir); }
int Access(sqlite3_vfs* v, const char* name, int flags, int* out) { return Root(v)->xAccess(Root(v), name, flags, out); }
int FullPathname(sqlite3_vfs* v, const char* name, int n, char* out) {
  return Root(v)->xFullPathname(Root(v), name, n, out);
}
void* DlOpen(sqlite3_vfs* v, const char* name) { return Root(v)->xDlOpen(Root(v), name); }
void DlError(sqlite3_vfs* v, int n, char* out) { Root(v)->xDlError(Root(v), n, out); }
void (*DlSym(sqlite3_vfs* v, void* h, const char* sym))(void) { return Root(v)->xDlSym(Root(v), h, sym); }
void DlClose(sqlite3_vfs* v, void* h) { Root(v)->xDlClose(Root(v), h); }
int Randomness(sqlite3_vfs* v, int n, char* out) { return Root(v)->xRandomness(Root(v), n, out); }
int Sleep(sqlite3_vfs* v, int us) { return Root(v)->xSleep(Root(v), us); }
int CurrentTime(sqlite3_vfs* v, double* out) { return Root(v)->xCurrentTime(Root(v), out); }
int GetLastError(sqlite3_vfs* v, int n, char* out) { return Root(v)->xGetLastError(Root(v), n, out); }
int CurrentTimeInt64(sqlite3_vfs* v, sqlite3_int64* out) { return Root(v)->xCurrentTimeInt64(Root(v), out); }
int SetSystemCall(sqlite3_vfs* v, const char* name, sqlite3_syscall_ptr p) {
  return Root(v)->xSetSystemCall(Root(v), name, p);
}
sqlite3_syscall_ptr GetSystemCall(sqlite3_vfs* v, const char* name) { return Root(v)->xGetSystemCall(Root(v), name); }
const char* NextSystemCall(sqlite3_vfs* v, const char* name) { return Root(v)->xNextSystemCall(Root(v), name); }

std::atomic<int> next_id{0};

}  // namespace

StorageFaults::StorageFaults() : vfs_(std::make_unique<Vfs>()) {}

std::shared_ptr<StorageFaults> StorageFaults::Create() {
  if (sqlite3_initialize() != SQLITE_OK) return nullptr;
  sqlite3_vfs* root = sqlite3_vfs_find(nullptr);
  if (root == nullptr) return nullptr;
  std::shared_ptr<StorageFaults> f(new StorageFaults());
  f->name_ = "spillway-faults-" + std::to_string(next_id++);
  Vfs& b = *f->vfs_;
  b.root = root;
  sqlite3_vfs& v = b.base;
  // The root's version, capped at 3: the methods below are those of version 3.
  v.iVersion = root->iVersion < 3 ? root->iVersion : 3;
  v.szOsFile = static_cast<int>(sizeof(FaultFile)) + root->szOsFile;
  v.mxPathname = root->mxPathname;
  v.zName = f->name_.c_str();
  v.xOpen = Open;
  v.xDelete = Delete;
  v.xAccess = Access;
  v.xFullPathname = FullPathname;
  v.xDlOpen = DlOpen;
  v.xDlError = DlError;
  v.xDlSym = DlSym;
  v.xDlClose = DlClose;
  v.xRandomness = Randomness;
  v.xSleep = Sleep;
  v.xCurrentTime = CurrentTime;
  v.xGetLastError = GetLastError;
  v.xCurrentTimeInt64 = CurrentTimeInt64;
  v.xSetSystemCall = SetSystemCall;
  v.xGetSystemCall = GetSystemCall;
  v.xNextSystemCall = NextSystemCall;
  if (sqlite3_vfs_register(&v, 0) != SQLITE_OK) return nullptr;
  b.faults = f.get();  // registered: the destructor unregisters it
  return f;
}

StorageFaults::~StorageFaults() {
  Clear();
  if (vfs_->faults) sqlite3_vfs_unregister(&vfs_->base);
}

void StorageFaults::FailWrites(int n) {
  std::lock_guard<std::mutex> lk(mu_);
  fail_writes_ = n;
}

void StorageFaults::SetDiskFull(bool on) {
  std::lock_guard<std::mutex> lk(mu_);
  disk_full_ = on;
}

void StorageFaults::FailSyncs(int n) {
  std::lock_guard<std::mutex> lk(mu_);
  fail_syncs_ = n;
}

void StorageFaults::FailLogReads(int n) {
  std::lock_guard<std::mutex> lk(mu_);
  fail_log_reads_ = n;
}

int StorageFaults::BeforeLogRead() {
  std::lock_guard<std::mutex> lk(mu_);
  if (fail_log_reads_ <= 0) return 0;
  --fail_log_reads_;
  return EIO;
}

void StorageFaults::StallSyncs(std::chrono::milliseconds d) {
  std::lock_guard<std::mutex> lk(mu_);
  stall_ = d;
}

void StorageFaults::BlockSyncs() {
  std::lock_guard<std::mutex> lk(mu_);
  block_ = true;
}

void StorageFaults::BlockWrites() {
  std::lock_guard<std::mutex> lk(mu_);
  block_writes_ = true;
}

void StorageFaults::PassSyncs(int n) {
  std::lock_guard<std::mutex> lk(mu_);
  passes_ += n;
  cv_.notify_all();
}

void StorageFaults::Unblock() {
  std::lock_guard<std::mutex> lk(mu_);
  block_ = block_writes_ = false;
  passes_ = 0;
  cv_.notify_all();
}

bool StorageFaults::WaitForHeldSyncs(int64_t total, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  return cv_.wait_for(lk, timeout, [&] { return held_total_ >= total; });
}

void StorageFaults::Clear() {
  std::lock_guard<std::mutex> lk(mu_);
  fail_writes_ = fail_syncs_ = fail_log_reads_ = passes_ = 0;
  disk_full_ = block_ = block_writes_ = false;
  stall_ = std::chrono::milliseconds(0);
  cv_.notify_all();
}

int64_t StorageFaults::writes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return writes_;
}

int64_t StorageFaults::syncs() const {
  std::lock_guard<std::mutex> lk(mu_);
  return syncs_;
}

int StorageFaults::BeforeWrite() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return !block_writes_; });
  if (disk_full_) return SQLITE_FULL;
  if (fail_writes_ > 0) {
    --fail_writes_;
    return SQLITE_IOERR_WRITE;
  }
  ++writes_;
  return SQLITE_OK;
}

int StorageFaults::BeforeSync() {
  std::unique_lock<std::mutex> lk(mu_);
  if (fail_syncs_ > 0) {
    --fail_syncs_;
    return SQLITE_IOERR_FSYNC;
  }
  if (block_) {
    ++held_total_;
    cv_.notify_all();  // WaitForHeldSyncs
    cv_.wait(lk, [&] { return !block_ || passes_ > 0; });
    if (block_) --passes_;
  }
  const auto stall = stall_;
  if (stall.count() > 0) {
    // Sleep without the lock so that tests can change faults meanwhile.
    lk.unlock();
    std::this_thread::sleep_for(stall);
    lk.lock();
  }
  ++syncs_;
  return SQLITE_OK;
}

}  // namespace spillway::journal
