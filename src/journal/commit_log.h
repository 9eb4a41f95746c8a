// The journal's commit log: where the request path's two hot writes (a new
// request running its first attempt, a request's end) become durable, in a
// few hundred bytes appended to one file instead of a SQLite transaction's
// 4 KiB pages. The SQLite transaction that applies a record follows on the
// journal's thread, in batches; reads wait for it (see Journal). This is
// LevelDB's log in front of its tables, with SQLite as the tables.
//
// A record is written (and at FULL fdatasync'ed, concurrent appends sharing
// one sync) before its caller hears it is durable; a deferred one (Append's
// defer_sync) waits for the next sync that another record, SyncNow or its
// bound asks for. Once every record
// appended so far has been applied in a committed transaction (and no sync
// is running), the file is begun again (a new generation in its header) once
// its records fill 4 KiB or the journal is idle: the next records overwrite
// the first pages of a file that keeps its size, so that at FULL their sync
// writes a page or two and no metadata. A process that dies between the two
// leaves records behind: Open returns them and the journal applies them
// again before it takes new writes (each record applies idempotently: a
// request's row is inserted once, its first terminal state wins).
//
// A file grown past 256 KiB while some of its records still wait for their
// rows (a steady load may never leave it all applied) is renamed <db>-log.old
// and the spare, <db>-log.spare, renamed <db>-log in its place (a new file
// when there is none). Once the records of <db>-log.old are applied it
// becomes the spare, under a new generation's header (synced by the sync
// thread before a rotation may take it). Under a steady
// load the two files take turns, and records keep overwriting written blocks.
// Open reads <db>-log.old, then <db>-log, and puts the latter's records in a
// new file of a new generation, preallocated (1 MiB of zeros) and synced,
// which replaces it by a rename; a spare left behind is deleted.
//
// On disk, <db>-log:
//   header (32 bytes): "SPWLOG3\n" | u64 generation | u32 CRC-32C of the 16 bytes before | zeros
//   records back to back:
//     u32 payload length | u32 CRC-32C of the payload then the generation | u64 generation | payload
//   (little-endian)
// The version before ("SPWLOG2\n") is the same with CRC-32 (zlib's) in
// place of CRC-32C; Open reads it (a log an earlier release left) and
// replaces it as it replaces any file.
// A replay ends at the first record that fails its length, generation or CRC
// check: a torn last record (a crash in mid-write: its caller never heard it
// was durable), zeros, or a record of an earlier generation. The generation is
// random, so no payload (clients' text is in them) can pass for a record of
// a later one. A header that does not check out (damage) over a first record
// that does is read by that record's generation (and checksum), so that damage to the
// header hides no record; Open says so and keeps the file as
// <db>-log.damaged. A file without the header is an earlier version's:
// records back to back, each CRC over its payload alone; Open reads it and
// replaces it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/status.h"

namespace spillway::journal {

class StorageFaults;

class CommitLog {
 public:
  // The result an append past the log's cap gets (set_max_bytes): SQLite's
  // SQLITE_FULL with an extended code of its own, so that the journal says
  // "commit log full", not "disk full", while the disk may have room.
  static constexpr int kCapRc = 13 /* SQLITE_FULL */ | (64 << 8);
  // The result of a record larger than the log could hold even empty (a
  // body past it): that request's refusal alone (SQLITE_TOOBIG's family), not
  // a storage failure, which refused every request for a while.
  static constexpr int kTooLargeRc = 18 /* SQLITE_TOOBIG */ | (64 << 8);
  // The result of a large record (over a quarter of the cap) that does not
  // fit beside the records the log holds now: that request's refusal alone,
  // to be sent again (it fits once they are applied), not a full log's. A
  // body of 100 MiB, where max_body_bytes allows one, made the whole journal
  // refuse every request for a while each time it came while some records
  // were there. Not a storage failure either (SQLITE_TOOBIG's family).
  static constexpr int kNoRoomRc = 18 /* SQLITE_TOOBIG */ | (65 << 8);

  // Opens (creating it 0600, never through a symbolic link) the log at
  // `path`; the records a previous process left are put in `leftover`, in
  // order. `sync`: fdatasync before a record counts as durable (FULL).
  // `faults` (tests): the journal's storage faults apply to the log too.
  static StatusOr<std::unique_ptr<CommitLog>> Open(const std::string& path, bool sync,
                                                   std::shared_ptr<StorageFaults> faults,
                                                   std::vector<std::string>* leftover);
  ~CommitLog();  // after every durable callback has run
  CommitLog(const CommitLog&) = delete;
  CommitLog& operator=(const CommitLog&) = delete;

  // What a write or a sync came to: a SQLite result code (SQLITE_OK,
  // SQLITE_FULL, SQLITE_IOERR_WRITE, SQLITE_IOERR_FSYNC), so the journal
  // names a failing log as it names a failing database, and what failed.
  using Durable = std::function<void(int rc, const std::string& what)>;

  // Appends `payload`. Once the record is durable, `queued(seq)` runs (so
  // that records reach the journal's queue in log order: under the log's
  // lock without sync, in order on the sync thread with it), then
  // `durable(SQLITE_OK)`: at once on the caller's thread without sync, on
  // the log's sync thread with it. A write or sync that fails calls
  // `durable` with its error and `queued` not at all. A failed sync zeroes
  // the records it covered in their files (and fails the records written
  // meanwhile) and syncs the zeros, so no replay applies a record
  // whose caller heard it failed. A cut that fails leaves them out of
  // replays and takes no more records until the next Open; only that Open
  // (after a restart on a disk that fails its syncs) may still find them.
  //
  // `defer_sync` (with sync): the record does not ask for a sync of its own.
  // It becomes durable with the next record that does (a sync covers every
  // record written before it), on SyncNow() or Drain(), or once it has
  // waited lazy_wait() (default 50 ms), whichever comes first. For a writer
  // that shows nothing to anyone before its next record: a non-streamed
  // request's first attempt, whose end's record follows it and shares its
  // sync (one fdatasync per request instead of two).
  using Queued = std::function<void(int64_t seq)>;
  void Append(const std::string& payload, Queued queued, Durable durable, bool defer_sync = false);
  // Syncs what has been written, deferred records included, without waiting.
  void SyncNow();
  // How long a deferred record may wait for a record that shares its sync.
  void set_lazy_wait(std::chrono::milliseconds wait);

  // The records in the files now that are durable and handed to the
  // journal (leftovers not yet applied included) and the sequence number of
  // the last one, for applying them again after an apply failed; an error
  // (kUnavailable) when a file cannot be read.
  StatusOr<std::vector<std::string>> ReadAll(int64_t* last_seq);

  // Every record up to `seq` is applied in a committed transaction (and any
  // leftovers before them: call it only once they are). When that is every
  // record written and they fill 4 KiB or more, the file is begun again; the
  // file set aside, once its records are, becomes the spare.
  void Applied(int64_t seq);
  // A torn or failed record could not be cut off: it takes no more records
  // until the next Open (every Append fails, saying so).
  bool broken() const;
  // Begins the file again, whatever its records fill, if every record in it
  // is applied (the journal's thread, once the queue has been idle a while).
  void EmptyIfApplied();

  // After the leftovers were applied and committed: they are not needed.
  void DropLeftovers();

  // The records in the log at `path` and the file it set aside, read
  // without changing them (tests, checks of a stopped gateway's state).
  static std::vector<std::string> ReadRecords(const std::string& path);

  // Waits until every record written before the call has been synced and
  // its callbacks have run (nothing of the log's is left to reach a caller).
  void Drain();
  // Syncs and tells what was written, then stops the sync thread (the
  // destructor's first step; the journal calls it before its own thread stops).
  void Stop();

  // The most bytes the log's files may hold together (default 256 MiB):
  // past it an append fails as a full disk does (kCapRc), so records
  // whose rows cannot commit never fill the disk. Records that fit wait.
  void set_max_bytes(int64_t max_bytes);

  int64_t size() const;      // bytes of records in the current file (0: begun again)
  int64_t last_seq() const;  // the last record written (0: none yet)

 private:
  CommitLog(std::string path, int fd, bool sync, std::shared_ptr<StorageFaults> faults, int64_t size,
            uint64_t gen);
  void SyncThread();
  void Rotate();  // mu_ held
  // Begins the file again if every record is applied, no sync runs and it
  // holds at least `min_bytes` of them (mu_ held).
  void EmptyAtLeast(int64_t min_bytes);
  void BeginAgain();  // a new generation's header (mu_ held)

  const std::string path_;
  int fd_;  // under mu_ (a rotation replaces it)
  int old_fd_ = -1;           // the file set aside, until its records are applied
  int64_t old_last_seq_ = 0;  // its last record
  int64_t old_size_ = 0;      // where its records end
  int spare_fd_ = -1;         // <db>-log.spare: a file whose records are all applied, for the next rotation
  uint64_t spare_gen_ = 0;    // the generation its header names (no record yet)
  bool spare_ready_ = false;  // its header is durable (at FULL the sync thread syncs it first)
  int syncing_old_ = -1;      // the file set aside that a sync round holds (not recycled meanwhile)
  const bool sync_;
  const std::shared_ptr<StorageFaults> faults_;

  mutable std::mutex mu_;
  int64_t max_bytes_;
  int64_t size_;     // where the next record goes in the current file
  uint64_t gen_;     // the current file's generation
  std::random_device random_;  // generations (mu_)
  int64_t last_seq_ = 0;
  int64_t queued_seq_ = 0;  // the last record handed to `queued` (durable)
  int64_t done_seq_ = 0;    // the last record whose callbacks have run
  int64_t applied_ = 0;
  // A torn or failed record could not be zeroed: no more records until Open
  // (read without mu_: checked on every request, and mu_ waits on the disk).
  std::atomic<bool> broken_{false};
  // FULL: records written and waiting for the next fdatasync.
  struct Unsynced {
    int64_t seq;
    int fd;          // the file it was written to
    int64_t offset;  // where it begins there
    Queued queued;
    Durable durable;
  };
  std::vector<Unsynced> unsynced_;
  // The last record that is to be synced without waiting (a record that
  // asked for its sync, SyncNow, Drain); deferred records after it wait
  // until lazy_deadline_ (set by the first of them into an empty batch).
  int64_t urgent_seq_ = 0;
  // Records up to `seq` are to be synced without waiting: raises urgent_seq_
  // and wakes the sync thread when it was lower (mu_ held).
  void SyncUpToLocked(int64_t seq);
  std::chrono::milliseconds lazy_wait_{50};
  std::chrono::steady_clock::time_point lazy_deadline_{};
  // After a failed sync (mu_ held): the batch's records and those written
  // since are zeroed in their files, or, failing that, left out and no more taken.
  void CutFailed(std::vector<Unsynced>& batch);
  bool stop_ = false;
  bool syncing_ = false;  // the sync thread has records in hand
  bool rotated_ = false;  // with sync: a rotation the next sync round must make durable
  std::condition_variable sync_cv_;
  std::condition_variable drained_cv_;
  std::thread syncer_;
  std::thread::id sync_tid_;  // set once, before any Drain
  bool sync_done_ = false;    // under mu_: the sync thread has returned (Stop)
};

// The payload's fields: fixed-width little-endian integers and
// length-prefixed strings. Reading past the end fails instead of reading
// out of bounds (a record from a damaged file is rejected, never trusted).
class RecordWriter {
 public:
  RecordWriter() = default;
  // Room for `bytes` of fields: a record of known size grows once.
  explicit RecordWriter(size_t bytes) { out_.reserve(bytes); }
  RecordWriter& U8(uint8_t v);
  RecordWriter& I64(int64_t v);
  RecordWriter& Str(const std::string& s);
  std::string& out() { return out_; }

 private:
  std::string out_;
};

class RecordReader {
 public:
  explicit RecordReader(const std::string& in) : in_(in) {}
  bool U8(uint8_t* v);
  bool I64(int64_t* v);
  bool Str(std::string* s);
  bool done() const { return pos_ == in_.size(); }

 private:
  const std::string& in_;
  size_t pos_ = 0;
};

}  // namespace spillway::journal
