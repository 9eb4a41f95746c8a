// The journal's storage seam (LevelDB's Env idea, for SQLite): a sqlite3_vfs
// that wraps the default VFS and passes every call through, except where a
// test has armed a fault.
//
// Faults (all off until armed; each may be combined with the others):
//   FailWrites(n)     the next n xWrite calls fail with SQLITE_IOERR_WRITE;
//   SetDiskFull(on)   every xWrite fails with SQLITE_FULL until cleared, as a
//                     full disk does (ENOSPC);
//   FailSyncs(n)      the next n xSync calls fail with SQLITE_IOERR_FSYNC;
//   StallSyncs(d)     every xSync sleeps d before it syncs (a slow disk);
//   BlockSyncs()      every xSync waits until the test lets it through with
//                     PassSyncs(n) or turns blocking off with Unblock(): a
//                     stall the test controls without sleeping;
//   BlockWrites()     every xWrite and commit-log write waits until the test
//                     calls Unblock() (or Clear()): which work a pending
//                     write holds up, seen without sleeping;
//   FailLogReads(n)   the commit log's next n reads of a file (to apply its
//                     records again) fail with EIO; SQLite's reads pass.
//
// Each StorageFaults registers its own VFS ("spillway-faults-<n>") so that
// journals in one process (parallel tests) never see each other's faults, and
// unregisters it when destroyed: it must outlive every connection opened on
// it (Journal keeps a shared_ptr). Production never creates one: a journal
// without faults opens on the default VFS with no indirection at all.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace spillway::journal {

class StorageFaults {
 public:
  // Registers the VFS; null when SQLite has no default VFS to wrap.
  static std::shared_ptr<StorageFaults> Create();
  ~StorageFaults();
  StorageFaults(const StorageFaults&) = delete;
  StorageFaults& operator=(const StorageFaults&) = delete;

  // The name to pass to sqlite3_open_v2.
  const std::string& vfs_name() const { return name_; }

  void FailWrites(int n);
  void SetDiskFull(bool on);
  void FailSyncs(int n);
  void StallSyncs(std::chrono::milliseconds d);
  void BlockSyncs();
  void BlockWrites();
  void FailLogReads(int n);
  void PassSyncs(int n);  // lets n blocked (or future) syncs through while blocking stays on
  void Unblock();         // blocking off; every waiting sync and write goes on
  // Waits until `total` syncs in all (since Create) have been held by
  // BlockSyncs (false on timeout): e.g. a commit has reached its fsync.
  bool WaitForHeldSyncs(int64_t total, std::chrono::milliseconds timeout);
  void Clear();           // every fault off (and every blocked sync released)

  // What went through, for tests: writes and syncs passed on to the disk.
  int64_t writes() const;
  int64_t syncs() const;

  // Called by the VFS: the SQLite result code the operation should fail with,
  // or SQLITE_OK to pass it through (after any stall).
  int BeforeWrite();
  int BeforeSync();
  // Called by the commit log before it reads a file back: an errno, or 0.
  int BeforeLogRead();

  struct Vfs;  // the registered sqlite3_vfs and the VFS it wraps (opaque)

 private:
  StorageFaults();

  std::string name_;
  std::unique_ptr<Vfs> vfs_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  int fail_writes_ = 0;
  bool disk_full_ = false;
  int fail_syncs_ = 0;
  int fail_log_reads_ = 0;
  std::chrono::milliseconds stall_{0};
  bool block_ = false;
  bool block_writes_ = false;
  int passes_ = 0;
  int64_t held_total_ = 0;
  int64_t writes_ = 0;
  int64_t syncs_ = 0;
};

}  // namespace spillway::journal
