#include "journal/commit_log.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/crc32c.h"
#include "common/survive.h"
#include "common/thread_name.h"
#include "journal/storage_faults.h"

namespace spillway::journal {

namespace {

// A record longer than this is damage, not data (the journal caps bodies far below).
constexpr uint32_t kMaxRecord = 256u << 20;

// A file is set aside past this size while records in it still wait for
// their rows (under a steady load it may never be all applied at once), and
// the spare (the file set aside before, once applied) taken in its place.
constexpr int64_t kRotateBytes = 256 << 10;
constexpr int64_t kMaxBytes = int64_t{256} << 20;
// An applied file is begun again once its records fill this much (or once
// the journal is idle, EmptyIfApplied): the next records then overwrite the
// first pages, which the disk already holds, so that their syncs write a
// page or two and no file size.
constexpr int64_t kEmptyAtBytes = 4 << 10;
// A new file's size, in zeros written and synced once (Open): records up to
// this much of them overwrite written blocks, and a sync has no metadata to
// journal (on ext4, a third less time and half the CPU of one that grows the file).
constexpr int64_t kPreallocate = 1 << 20;

// The file header: magic, generation, checksum of the two, zeros to 32 bytes.
// This version's files ("SPWLOG3\n") checksum with CRC-32C; the version
// before ("SPWLOG2\n") and the one before it (no header) with CRC-32, as
// zlib computes it. Those are read (a log an earlier release left), never
// written.
constexpr char kMagic[8] = {'S', 'P', 'W', 'L', 'O', 'G', '3', '\n'};
constexpr char kMagicV2[8] = {'S', 'P', 'W', 'L', 'O', 'G', '2', '\n'};
constexpr int64_t kHeaderBytes = 32;
constexpr size_t kRecordHeader = 16;  // u32 length, u32 checksum, u64 generation
constexpr size_t kLegacyRecordHeader = 8;  // the first version's: u32 length, u32 CRC-32

// Which checksum a file's records carry.
enum class Sum { kCrc32c, kCrc32 };

// A checksum computed in pieces. CRC-32C by the CPU's crc32 instruction
// (common/crc32c.h): zlib's CRC-32 took ~4,300 instructions a request on the
// I/O thread, and an 8 KiB table brought into the cache each time, for the
// two records of a one-token request.
class Checksum {
 public:
  explicit Checksum(Sum sum = Sum::kCrc32c) : sum_(sum), v_(sum == Sum::kCrc32 ? ::crc32_z(0, Z_NULL, 0) : 0) {}
  void process_bytes(const void* p, size_t n) {
    if (sum_ == Sum::kCrc32c) {
      v_ = Crc32cExtend(static_cast<uint32_t>(v_), p, n);
    } else {
      v_ = ::crc32_z(v_, static_cast<const Bytef*>(p), n);
    }
  }
  uint32_t checksum() const { return static_cast<uint32_t>(v_); }

 private:
  Sum sum_;
  uLong v_;
};

uint32_t Crc(const char* p, size_t n, Sum sum = Sum::kCrc32c) {
  Checksum c(sum);
  c.process_bytes(p, n);
  return c.checksum();
}

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

uint64_t GetU64(const char* p) {
  return static_cast<uint64_t>(GetU32(p)) | static_cast<uint64_t>(GetU32(p + 4)) << 32;
}

// A record's checksum: its payload's (`c`, computed outside the log's lock),
// then its generation. (The generation is compared as a field too: a CRC is
// linear, so for one pair of generations in 2^32 every record of the one
// would pass a check under the other.)
uint32_t RecordCrc(Checksum c, uint64_t gen) {
  char g[8];
  for (int i = 0; i < 8; ++i) g[i] = static_cast<char>((gen >> (8 * i)) & 0xFF);
  c.process_bytes(g, sizeof g);
  return c.checksum();
}

std::string Header(uint64_t gen) {
  std::string h(kMagic, sizeof kMagic);
  PutU64(h, gen);
  PutU32(h, Crc(h.data(), h.size()));
  h.resize(kHeaderBytes, '\0');
  return h;
}

// A random generation (unknown to clients, whose text is in the payloads,
// so that no payload can pass for a record of a later generation), never 0
// (zeros never pass for a record).
uint64_t NewGeneration(std::random_device& random) {
  while (true) {
    const uint64_t gen = static_cast<uint64_t>(random()) << 32 | random();
    if (gen != 0) return gen;
  }
}

// A record in two steps, so that the payload's copy and CRC (`c`) are
// computed outside the log's lock and only its generation under it:
// Unsealed leaves the CRC and generation fields zero, Seal fills them in.
std::string Unsealed(const std::string& payload, Checksum* c) {
  c->process_bytes(payload.data(), payload.size());
  std::string rec;
  rec.reserve(payload.size() + kRecordHeader);
  PutU32(rec, static_cast<uint32_t>(payload.size()));
  rec.resize(kRecordHeader, '\0');
  rec += payload;
  return rec;
}

void Seal(std::string& rec, const Checksum& c, uint64_t gen) {
  const uint32_t crc = RecordCrc(c, gen);
  for (size_t i = 0; i < 4; ++i) rec[4 + i] = static_cast<char>((crc >> (8 * i)) & 0xFF);
  for (size_t i = 0; i < 8; ++i) rec[8 + i] = static_cast<char>((gen >> (8 * i)) & 0xFF);
}

std::string Encode(const std::string& payload, uint64_t gen) {
  Checksum c;
  std::string rec = Unsealed(payload, &c);
  Seal(rec, c, gen);
  return rec;
}

// A file's records up to the first that does not check out; `end`: where
// that one begins (the end of the last good record). A file begins with the
// header, or (written by an earlier version) with its first record, whose
// CRC covers its payload alone. `current`: the file has the header.
struct Parsed {
  std::vector<std::string> records;
  size_t end = 0;
  bool current = false;
  size_t damaged_bytes = 0;  // skipped between good records of the file's generation
  bool header_damaged = false;  // the generation was read from the first record instead
};

// Whether a record of generation `gen` that checks out (under `sum`) begins
// at `pos`; its payload's length in `*len`.
bool GoodRecordAt(const std::string& data, size_t pos, uint64_t gen, Sum sum, uint32_t* len) {
  if (data.size() - pos < kRecordHeader) return false;
  *len = GetU32(data.data() + pos);
  if (*len > kMaxRecord || data.size() - pos - kRecordHeader < *len) return false;
  if (GetU64(data.data() + pos + 8) != gen) return false;
  Checksum c(sum);
  c.process_bytes(data.data() + pos + kRecordHeader, *len);
  return RecordCrc(c, gen) == GetU32(data.data() + pos + 4);
}

Parsed ParseFile(const std::string& data) {
  Parsed p;
  size_t pos = 0;
  uint64_t gen = 0;
  Sum sum = Sum::kCrc32;  // (the first version's: no header)
  if (data.size() >= static_cast<size_t>(kHeaderBytes)) {
    const bool v3 = std::memcmp(data.data(), kMagic, sizeof kMagic) == 0;
    const bool v2 = std::memcmp(data.data(), kMagicV2, sizeof kMagicV2) == 0;
    const bool first = data.size() > static_cast<size_t>(kHeaderBytes) + kRecordHeader;
    const uint64_t first_gen = first ? GetU64(data.data() + kHeaderBytes + 8) : 0;  // the first record's
    const uint32_t header_sum = GetU32(data.data() + 16);
    uint32_t n = 0;
    if ((v3 && header_sum == Crc(data.data(), 16, Sum::kCrc32c)) ||
        (v2 && header_sum == Crc(data.data(), 16, Sum::kCrc32))) {
      p.current = true;
      sum = v3 ? Sum::kCrc32c : Sum::kCrc32;
      gen = GetU64(data.data() + 8);
      pos = p.end = kHeaderBytes;
    } else if (first_gen != 0 && (GoodRecordAt(data, kHeaderBytes, first_gen, Sum::kCrc32c, &n) ||
                                  GoodRecordAt(data, kHeaderBytes, first_gen, Sum::kCrc32, &n))) {
      // A header that does not check out (flipped bits, a stray write) over
      // a record that does: each record carries its generation, under its
      // checksum, so the first one's is the file's (and its checksum, the
      // file's version). Reading the records by it loses none that were
      // acknowledged. A header written over applied records (begun again,
      // the spare) zeroes the first one's header with it (WriteHeader):
      // those are never found this way.
      p.current = true;
      p.header_damaged = true;
      gen = first_gen;
      sum = GoodRecordAt(data, kHeaderBytes, first_gen, Sum::kCrc32c, &n) ? Sum::kCrc32c : Sum::kCrc32;
      pos = p.end = kHeaderBytes;
    } else if (v3 || v2) {
      // A torn header is written only over records all applied (EmptyAtLeast)
      // or before any record of a new file is synced: nothing to replay.
      p.current = true;
      return p;
    }
  }
  const size_t head = p.current ? kRecordHeader : kLegacyRecordHeader;
  while (data.size() - pos >= head) {
    const uint32_t len = GetU32(data.data() + pos), crc = GetU32(data.data() + pos + 4);
    if (len > kMaxRecord || data.size() - pos - head < len) break;
    if (p.current && GetU64(data.data() + pos + 8) != gen) break;
    Checksum c(sum);
    c.process_bytes(data.data() + pos + head, len);
    if ((p.current ? RecordCrc(c, gen) : c.checksum()) != crc) break;
    p.records.emplace_back(data, pos + head, len);
    pos += head + len;
  }
  p.end = pos;
  // Where the records end, what follows is zeros, a record torn by a crash
  // (the last write) or records of earlier generations: never a good record
  // of this generation after bytes that are not all zeros, since the log is
  // written in order. One found there means damage in the middle (a stray
  // write, flipped bits): the records after it were acknowledged, and are
  // kept; the damage is skipped. Behind zeros only, good records are not
  // damage: the rest of a cut (zeros over failed records, written in parts)
  // or pages a power loss wrote back out of order, none of them ever
  // acknowledged: the replay ends there.
  if (!p.current) return p;
  size_t at = pos + 1;
  while (at + kRecordHeader <= data.size()) {
    uint32_t n = 0;
    if (!GoodRecordAt(data, at, gen, sum, &n)) {
      ++at;
      continue;
    }
    if (std::all_of(data.begin() + static_cast<std::ptrdiff_t>(p.end), data.begin() + static_cast<std::ptrdiff_t>(at),
                    [](char c) { return c == '\0'; })) {
      break;
    }
    p.damaged_bytes += at - p.end;
    do {  // this one and the good ones right after it
      p.records.emplace_back(data, at + kRecordHeader, n);
      at += kRecordHeader + n;
    } while (GoodRecordAt(data, at, gen, sum, &n));
    p.end = at++;
  }
  return p;
}

// Makes the directory holding `path` durable (a new name in it).
bool SyncDir(const std::string& path) {
  const std::string dir = path.substr(0, path.find_last_of('/') + 1);
  const int d = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d < 0) return false;
  const bool ok = ::fsync(d) == 0;
  ::close(d);
  return ok;
}

// The whole file, or an errno.
int ReadFile(int fd, std::string* data) {
  data->clear();
  char buf[1 << 16];
  ssize_t n;
  while ((n = ::pread(fd, buf, sizeof buf, static_cast<off_t>(data->size()))) != 0) {
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data->append(buf, static_cast<size_t>(n));
  }
  return 0;
}

int WriteRc(int err) { return err == ENOSPC || err == EDQUOT ? SQLITE_FULL : SQLITE_IOERR_WRITE; }

// `n` bytes at `offset`, or an errno; `done`: how many made it.
int WriteAt(int fd, const char* p, size_t n, int64_t offset, size_t* done = nullptr) {
  size_t at = 0;
  while (at < n) {
    const ssize_t w = ::pwrite(fd, p + at, n - at, static_cast<off_t>(offset + static_cast<int64_t>(at)));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (done) *done = at;
      return w < 0 ? errno : EIO;
    }
    at += static_cast<size_t>(w);
  }
  if (done) *done = at;
  return 0;
}

// A new file's bytes, written a page per call, or an errno. The page cache
// then holds the file in pages of its own: written at once, it would hold it
// in large folios, and every record written later into one costs ext4 a walk
// over all of the folio's blocks (a 300-byte record's write took 2.5 us
// instead of 1.5 here, more with cold caches between requests).
int WritePages(int fd, const std::string& data) {
  constexpr size_t kPage = 4096;
  for (size_t at = 0; at < data.size(); at += kPage) {
    if (const int err = WriteAt(fd, data.data() + at, std::min(kPage, data.size() - at), static_cast<int64_t>(at)); err != 0) {
      return err;
    }
  }
  return 0;
}

// The header of generation `gen` over the file's first bytes, or an errno.
// With zeros over the first record's header, in the same write: the file's
// records are all applied when a header is written over them (or it is
// new), and a damaged header over them must not find a first record to
// read the rest by (ParseFile), which would apply them again.
int WriteHeader(int fd, uint64_t gen) {
  std::string header = Header(gen);
  header.append(kRecordHeader, '\0');
  return WriteAt(fd, header.data(), header.size(), 0);
}

// Zeros over [from, to), bytes that were written before (no block to
// allocate): what a replay must no longer find there.
bool Zero(int fd, int64_t from, int64_t to) {
  static const std::string zeros(64 << 10, '\0');
  for (int64_t at = from; at < to; at += static_cast<int64_t>(zeros.size())) {
    const auto n = static_cast<size_t>(std::min<int64_t>(to - at, static_cast<int64_t>(zeros.size())));
    if (WriteAt(fd, zeros.data(), n, at) != 0) return false;
  }
  return true;
}

// A file with damage (a header or bytes between good records that do not check out): said on stderr, and kept as it
// was (<file>.damaged, for a post-mortem) before Open rewrites it.
void KeepDamaged(const std::string& file, const std::string& data, const Parsed& p) {
  if (p.damaged_bytes == 0 && !p.header_damaged) return;
  const std::string copy = file + ".damaged";
  const int fd = ::open(copy.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  const bool kept = fd >= 0 && WriteAt(fd, data.data(), data.size(), 0) == 0 && ::fdatasync(fd) == 0;
  if (fd >= 0) ::close(fd);
  const std::string kept_as = kept ? "; the file as it was is kept as " + copy : "";
  if (p.header_damaged) {
    std::fprintf(stderr,
                 "spillway: the journal's log %s has a damaged header: its records were read by the generation "
                 "they carry (%zu replayed)%s\n",
                 file.c_str(), p.records.size(), kept_as.c_str());
  }
  if (p.damaged_bytes > 0) {
    std::fprintf(stderr,
                 "spillway: the journal's log %s is damaged: %zu bytes between good records were skipped (the "
                 "records in them are lost; the %zu good ones are replayed)%s\n",
                 file.c_str(), p.damaged_bytes, p.records.size(), kept_as.c_str());
  }
}

}  // namespace

StatusOr<std::unique_ptr<CommitLog>> CommitLog::Open(const std::string& path, bool sync,
                                                     std::shared_ptr<StorageFaults> faults,
                                                     std::vector<std::string>* leftover) {
  leftover->clear();
  auto fail = [&](const std::string& what, const std::string& file, int err, std::initializer_list<int> fds) {
    for (const int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
    return Status::Unavailable("cannot " + what + " the journal's log " + file + ": " + std::strerror(err));
  };
  // A file set aside by a rotation first (its records are the older), then the current one.
  const std::string old = path + ".old";
  (void)::unlink((path + ".spare").c_str());  // (never holds a record needed: made again at the next rotation)
  int old_fd = ::open(old.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (old_fd < 0 && errno != ENOENT) return fail("open", old, errno, {});
  std::string data;
  int64_t old_bytes = 0;
  if (old_fd >= 0) {
    if (const int err = ReadFile(old_fd, &data); err != 0) return fail("read", old, err, {old_fd});
    Parsed p = ParseFile(data);
    KeepDamaged(old, data, p);
    *leftover = std::move(p.records);
    old_bytes = static_cast<int64_t>(p.end);
  }
  const int cur = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (cur < 0 && errno != ENOENT) return fail("open", path, errno, {old_fd});
  data.clear();
  if (cur >= 0) {
    const int err = ReadFile(cur, &data);
    ::close(cur);
    if (err != 0) return fail("read", path, err, {old_fd});
  }
  Parsed parsed = ParseFile(data);
  KeepDamaged(path, data, parsed);
  std::vector<std::string> current = std::move(parsed.records);
  // The current file's records go into a new file of a new generation,
  // preallocated, put in its place by a rename: whatever followed them (a
  // torn record never acknowledged, records of earlier generations) is gone,
  // and a file of an earlier version's format becomes one of this one's.
  const std::string fresh = path + ".new";
  (void)::unlink(fresh.c_str());  // (left by a start that died here)
  const int fd = ::open(fresh.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return fail("create", fresh, errno, {old_fd});
  std::random_device random;
  const uint64_t gen = NewGeneration(random);
  std::string file = Header(gen);
  for (const auto& r : current) file += Encode(r, gen);
  const auto size = static_cast<int64_t>(file.size());
  file.resize(static_cast<size_t>(std::max(size, kPreallocate)), '\0');
  if (const int err = WritePages(fd, file); err != 0) return fail("write", fresh, err, {fd, old_fd});
  // Synced at both settings: the leftovers were on the disk before (once per start).
  if (::fdatasync(fd) != 0) return fail("sync", fresh, errno, {fd, old_fd});
  if (::rename(fresh.c_str(), path.c_str()) != 0) return fail("rename", fresh, errno, {fd, old_fd});
  // The file's name durable before a record in it counts.
  if (!SyncDir(path)) return fail("sync the directory of", path, errno, {fd, old_fd});
  for (auto& r : current) leftover->push_back(std::move(r));
  std::unique_ptr<CommitLog> log(new CommitLog(path, fd, sync, std::move(faults), size, gen));
  // A file set aside and never applied stays set aside (no rotation
  // overwrites it) until the leftovers are applied: DropLeftovers, or the
  // first Applied after them (old_last_seq_ 0).
  log->old_fd_ = old_fd;
  log->old_size_ = old_bytes;
  return log;
}

std::vector<std::string> CommitLog::ReadRecords(const std::string& path) {
  std::vector<std::string> out;
  for (const std::string& file : {path + ".old", path}) {
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;
    std::string data;
    if (ReadFile(fd, &data) == 0) {
      for (auto& r : ParseFile(data).records) out.push_back(std::move(r));
    }
    ::close(fd);
  }
  return out;
}

CommitLog::CommitLog(std::string path, int fd, bool sync, std::shared_ptr<StorageFaults> faults, int64_t size,
                     uint64_t gen)
    : path_(std::move(path)),
      fd_(fd),
      sync_(sync),
      faults_(std::move(faults)),
      max_bytes_(kMaxBytes),
      size_(size),
      gen_(gen) {
  if (sync_) {
    syncer_ = std::thread([this] { SyncThread(); });
    sync_tid_ = syncer_.get_id();
  }
}

CommitLog::~CommitLog() {
  Stop();
  if (old_fd_ >= 0) ::close(old_fd_);
  if (spare_fd_ >= 0) ::close(spare_fd_);
  ::close(fd_);
}

void CommitLog::Stop() {
  if (!syncer_.joinable()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  sync_cv_.notify_one();
  syncer_.join();  // after it synced and told what was written
}

void CommitLog::Drain() {
  if (!sync_ || std::this_thread::get_id() == sync_tid_) return;  // (a callback of its own: it would wait for itself)
  std::unique_lock<std::mutex> lk(mu_);
  const int64_t target = last_seq_;  // what was written before the call: later appends cannot starve it
  SyncUpToLocked(target);  // deferred records among them: synced now
  drained_cv_.wait(lk, [&] { return done_seq_ >= target || sync_done_; });
}

void CommitLog::Rotate() {
  // A file whose records are not all applied, grown past kRotateBytes: set it
  // aside (it becomes the spare once they are) and go on in the spare, or
  // in a new file. At most one aside: while it waits, the current file grows on.
  if (old_fd_ >= 0 || size_ < kRotateBytes) return;
  const std::string old = path_ + ".old";
  if (::rename(path_.c_str(), old.c_str()) != 0) return;
  int fd = -1;
  uint64_t gen = 0;
  if (spare_fd_ >= 0 && spare_ready_ && ::rename((path_ + ".spare").c_str(), path_.c_str()) == 0) {
    // Blocks the disk already holds, under a header of a new generation (Applied), synced (SyncThread).
    fd = std::exchange(spare_fd_, -1);
    spare_ready_ = false;
    gen = spare_gen_;
  } else {
    gen = NewGeneration(random_);
    fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 || WriteHeader(fd, gen) != 0) {
      if (fd >= 0) ::close(fd);
      (void)::rename(old.c_str(), path_.c_str());
      return;
    }
  }
  // With sync, the sync thread's next round syncs the file set aside and
  // the directory (the new name and the old) before the records it covers
  // count as durable: nothing of that on an appender's thread.
  rotated_ = sync_;
  old_fd_ = fd_;
  old_last_seq_ = last_seq_;
  old_size_ = size_;
  fd_ = fd;
  size_ = kHeaderBytes;
  gen_ = gen;
}

void CommitLog::Append(const std::string& payload, Queued queued, Durable durable, bool defer_sync) {
  Checksum crc;  // the payload's, outside the lock
  std::string rec = Unsealed(payload, &crc);
  std::unique_lock<std::mutex> lk(mu_);
  // Stopped (teardown): no sync would ever come for it.
  if (sync_ && stop_) {
    lk.unlock();
    return durable(SQLITE_MISUSE, "the commit log is stopped");
  }
  if (static_cast<int64_t>(rec.size()) > max_bytes_ || payload.size() > kMaxRecord) {
    lk.unlock();
    return durable(kTooLargeRc, "a record of " + std::to_string(rec.size() >> 20) + " MiB, larger than the " +
                                    std::to_string(max_bytes_ >> 20) + " MiB the commit log holds");
  }
  if (size_ - kHeaderBytes + old_size_ + static_cast<int64_t>(rec.size()) > max_bytes_) {
    lk.unlock();
    if (static_cast<int64_t>(rec.size()) > max_bytes_ / 4) {
      return durable(kNoRoomRc, "a record of " + std::to_string(rec.size() >> 20) + " MiB, with no room for it now in the " +
                                    std::to_string(max_bytes_ >> 20) + " MiB the commit log holds");
    }
    return durable(kCapRc, "the commit log holds " + std::to_string(max_bytes_ >> 20) +
                                    " MiB of records whose rows have not committed");
  }
  if (broken_) {
    lk.unlock();
    return durable(SQLITE_IOERR_WRITE, "the commit log could not cut off a failed record and takes no more; "
                                       "restart spillway once the disk is healthy");
  }
  Seal(rec, crc, gen_);
  int rc = faults_ ? faults_->BeforeWrite() : SQLITE_OK;
  if (rc == SQLITE_OK) {
    size_t done = 0;
    if (const int err = WriteAt(fd_, rec.data(), rec.size(), size_, &done); err != 0) {
      rc = WriteRc(err);
      // A partial record of this generation could pass for one at the next
      // replay once later records are written over its beginning: zero what
      // of it was written, and if that fails take no more records (Open
      // leaves it out).
      if (!Zero(fd_, size_, size_ + static_cast<int64_t>(done))) broken_ = true;
    }
  }
  if (rc != SQLITE_OK) {
    lk.unlock();
    return durable(rc, "log write");
  }
  const int written_fd = fd_;
  const int64_t written_at = size_;  // (before a rotation swaps the files)
  size_ += static_cast<int64_t>(rec.size());
  ++last_seq_;
  Rotate();
  if (!sync_) {
    queued(last_seq_);
    queued_seq_ = done_seq_ = last_seq_;
    lk.unlock();
    return durable(SQLITE_OK, "");
  }
  // A deferred record wakes the sync thread only to arm its deadline (the
  // first one of a batch); the others ride along with what comes next.
  const bool wake = !defer_sync || unsynced_.empty();
  if (!defer_sync) {
    urgent_seq_ = last_seq_;
  } else if (unsynced_.empty()) {
    lazy_deadline_ = std::chrono::steady_clock::now() + lazy_wait_;
  }
  unsynced_.push_back({last_seq_, written_fd, written_at, std::move(queued), std::move(durable)});
  lk.unlock();
  if (wake) sync_cv_.notify_one();
}

void CommitLog::SyncNow() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!unsynced_.empty()) SyncUpToLocked(last_seq_);  // (nothing waits: nothing to ask for)
}

void CommitLog::SyncUpToLocked(int64_t seq) {
  if (urgent_seq_ >= seq) return;  // its sync is asked for already
  urgent_seq_ = seq;
  sync_cv_.notify_one();
}

void CommitLog::set_lazy_wait(std::chrono::milliseconds wait) {
  std::lock_guard<std::mutex> lk(mu_);
  lazy_wait_ = wait;
}

StatusOr<std::vector<std::string>> CommitLog::ReadAll(int64_t* last_seq) {
  std::lock_guard<std::mutex> lk(mu_);
  // Only records already handed to the journal: the last ones may still be
  // on their way to the disk (a sync that fails tells their callers so).
  *last_seq = queued_seq_;
  std::vector<std::string> out;
  std::string data;
  // A file that cannot be read is an error, never fewer records: the
  // caller counts every record up to `last_seq` applied once it commits
  // what it got (the missing ones' rows would never be written).
  auto read = [&](int fd) -> Status {
    int err = faults_ ? faults_->BeforeLogRead() : 0;
    if (err == 0) err = ReadFile(fd, &data);
    if (err != 0) return Status::Unavailable("cannot read the commit log " + path_ + ": " + std::strerror(err));
    return Status::Ok();
  };
  if (old_fd_ >= 0) {
    SPILLWAY_RETURN_IF_ERROR(read(old_fd_));
    out = ParseFile(data).records;
  }
  SPILLWAY_RETURN_IF_ERROR(read(fd_));
  for (auto& r : ParseFile(data).records) out.push_back(std::move(r));
  const auto unsynced = static_cast<size_t>(last_seq_ - queued_seq_);
  out.resize(out.size() > unsynced ? out.size() - unsynced : 0);
  return out;
}

void CommitLog::SyncThread() {
  NameThisThread("sw-log-sync");
  std::unique_lock<std::mutex> lk(mu_);
  while (true) {
    // Records that asked for their sync go at once; deferred ones alone wait
    // for one of those, SyncNow, or their deadline.
    const auto due = [&] {
      return stop_ || (spare_fd_ >= 0 && !spare_ready_) ||
             (!unsynced_.empty() && urgent_seq_ >= unsynced_.front().seq);
    };
    while (!due()) {
      if (unsynced_.empty()) {
        sync_cv_.wait(lk);
      } else if (sync_cv_.wait_until(lk, lazy_deadline_) == std::cv_status::timeout) {
        break;
      }
    }
    if (spare_fd_ >= 0 && !spare_ready_) {  // a new spare's header (Applied): durable before a rotation takes it
      const int fd = spare_fd_;  // (no one else takes or closes it until it is ready)
      lk.unlock();
      const bool ok = (!faults_ || faults_->BeforeSync() == SQLITE_OK) && ::fdatasync(fd) == 0;
      lk.lock();
      spare_ready_ = ok;
      if (!ok) {
        (void)::unlink((path_ + ".spare").c_str());
        ::close(std::exchange(spare_fd_, -1));
      }
    }
    if (unsynced_.empty()) {
      if (!stop_) continue;
      sync_done_ = true;  // stopped, with nothing left to sync
      drained_cv_.notify_all();
      return;
    }
    // Everything written so far shares this sync (group commit); writes
    // meanwhile wait for the next one.
    std::vector<Unsynced> batch = std::move(unsynced_);
    unsynced_.clear();
    syncing_ = true;
    const int fd = fd_;
    // After a rotation: the file set aside (not recycled while this round
    // holds it: syncing_old_) and the directory.
    const bool rotated = rotated_;
    const int old_fd = rotated ? old_fd_ : -1;
    syncing_old_ = old_fd;
    rotated_ = false;
    lk.unlock();
    int rc = faults_ ? faults_->BeforeSync() : SQLITE_OK;
    if (rc == SQLITE_OK && rotated && ((old_fd >= 0 && ::fdatasync(old_fd) != 0) || !SyncDir(path_))) {
      rc = SQLITE_IOERR_FSYNC;
    }
    if (rc == SQLITE_OK && ::fdatasync(fd) != 0) rc = SQLITE_IOERR_FSYNC;
    if (rc != SQLITE_OK) {
      lk.lock();
      CutFailed(batch);
      if (rotated) rotated_ = true;  // the directory, after a rotation: synced again next round
      lk.unlock();
    } else {
      // Counted as handed to the journal before it is: a replay that reads
      // the log meanwhile (ReadAll) takes them in (applied twice, as a
      // replay may), rather than cut them off as not yet synced and then
      // count them applied, their rows never written.
      lk.lock();
      queued_seq_ = batch.back().seq;
      lk.unlock();
      // Only this thread queues records at FULL, and in log order.
      for (auto& u : batch) RunSurviving("spillway: a commit-log record's queued callback", [&] { u.queued(u.seq); });
    }
    // (Each survived: one that threw left the batch's other writers waiting for good.)
    for (auto& u : batch) RunSurviving("spillway: a commit-log record's durable callback", [&] { u.durable(rc, "log sync"); });
    lk.lock();
    done_seq_ = batch.back().seq;
    syncing_ = false;
    syncing_old_ = -1;
    drained_cv_.notify_all();
  }
}

void CommitLog::CutFailed(std::vector<Unsynced>& batch) {
  // Their callers hear that they failed, so these records must never be
  // applied: in each file they and those written since (not acknowledged
  // either; records before them synced fine) are zeroed, and the zeros
  // synced. Records of a file whose zeros cannot be written stay at the end
  // of the log's records (a file written after a rotation in this window
  // holds only failed ones) and no record is taken after them: ReadAll
  // leaves them out by count. Zeros written but not synced hide them from
  // ReadAll already; only a restart (a disk that fails its syncs) may still
  // find them.
  for (auto& u : unsynced_) batch.push_back(std::move(u));
  unsynced_.clear();
  int64_t readable = 0;  // failed records still in the files (their zeros not written)
  bool cut = true;
  for (const int fd : {old_fd_, fd_}) {
    if (fd < 0) continue;
    int64_t from = -1, n = 0;
    for (const auto& u : batch) {
      if (u.fd != fd) continue;
      ++n;
      if (from < 0 || u.offset < from) from = u.offset;
    }
    if (n == 0) continue;
    int64_t& end = fd == fd_ ? size_ : old_size_;
    if (!Zero(fd, from, end)) {
      readable += n;
      cut = false;
      continue;
    }
    // Zeroed, so no longer read back; not synced, a restart may find them.
    if ((faults_ && faults_->BeforeSync() != SQLITE_OK) || ::fdatasync(fd) != 0) {
      cut = false;
      continue;
    }
    end = from;
  }
  // Every record before them was handed over; ReadAll leaves out by count
  // only those still there to read (counting the zeroed ones too dropped as
  // many acknowledged records).
  queued_seq_ = last_seq_ - readable;
  if (!cut) broken_ = true;
}

bool CommitLog::broken() const { return broken_.load(); }

void CommitLog::Applied(int64_t seq) {
  std::lock_guard<std::mutex> lk(mu_);
  if (seq > applied_) applied_ = seq;
  // The file set aside holds nothing needed now (and the sync thread is not
  // syncing it: else the next call takes it).
  if (old_fd_ >= 0 && applied_ >= old_last_seq_ && old_fd_ != syncing_old_) {
    const int fd = std::exchange(old_fd_, -1);
    old_size_ = 0;
    const std::string old = path_ + ".old", spare = path_ + ".spare";
    // It becomes the spare that the next rotation takes (one at most): its
    // records no longer check out under a new generation's header. At FULL
    // the sync thread syncs the header before a rotation may take it: no
    // sync here (this may be a request's thread leading a batch).
    const uint64_t gen = NewGeneration(random_);
    if (spare_fd_ >= 0 || WriteHeader(fd, gen) != 0 ||
        ::rename(old.c_str(), spare.c_str()) != 0) {
      (void)::unlink(old.c_str());
      ::close(fd);
    } else {
      spare_fd_ = fd;
      spare_gen_ = gen;
      spare_ready_ = !sync_;
      if (sync_) sync_cv_.notify_one();
    }
  }
  EmptyAtLeast(kEmptyAtBytes);  // (smaller: EmptyIfApplied, once idle)
}

void CommitLog::EmptyIfApplied() {
  std::lock_guard<std::mutex> lk(mu_);
  EmptyAtLeast(1);
}

void CommitLog::EmptyAtLeast(int64_t min_bytes) {
  // Every record is in SQLite: none is needed at a restart. Not while a
  // sync runs (it may be writing the header's page) or records wait for one
  // (they are of the generation the header names). A later batch empties
  // it, or a rotation sets it aside.
  if (applied_ < last_seq_ || size_ - kHeaderBytes < min_bytes || syncing_ || !unsynced_.empty()) return;
  BeginAgain();
}

void CommitLog::BeginAgain() {
  // A new generation's header: the records after it no longer check out.
  // Not synced: the next record's sync covers it (a crash before leaves the
  // old header, under which the new records fail their check and were
  // never acknowledged; the old ones apply again, idempotently).
  const uint64_t gen = NewGeneration(random_);
  if (WriteHeader(fd_, gen) == 0) {
    gen_ = gen;
    size_ = kHeaderBytes;
    return;
  }
  // A header that may be torn hides every record after it: the old one
  // back, or no more records until the next Open.
  if (WriteHeader(fd_, gen_) != 0) broken_ = true;
}

void CommitLog::DropLeftovers() {
  std::lock_guard<std::mutex> lk(mu_);
  if (last_seq_ != 0) return;
  if (old_fd_ >= 0) {
    (void)::unlink((path_ + ".old").c_str());
    ::close(old_fd_);
    old_fd_ = -1;
    old_size_ = 0;
  }
  if (size_ > kHeaderBytes) BeginAgain();
}

void CommitLog::set_max_bytes(int64_t max_bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  max_bytes_ = max_bytes;
}

int64_t CommitLog::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return size_ - kHeaderBytes;
}

int64_t CommitLog::last_seq() const {
  std::lock_guard<std::mutex> lk(mu_);
  return last_seq_;
}

RecordWriter& RecordWriter::U8(uint8_t v) {
  out_.push_back(static_cast<char>(v));
  return *this;
}

RecordWriter& RecordWriter::I64(int64_t v) {
  const auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((u >> (8 * i)) & 0xFF));
  return *this;
}

RecordWriter& RecordWriter::Str(const std::string& s) {
  PutU32(out_, static_cast<uint32_t>(s.size()));
  out_ += s;
  return *this;
}

bool RecordReader::U8(uint8_t* v) {
  if (in_.size() - pos_ < 1) return false;
  *v = static_cast<uint8_t>(in_[pos_++]);
  return true;
}

bool RecordReader::I64(int64_t* v) {
  if (in_.size() - pos_ < 8) return false;
  uint64_t u = 0;
  for (int i = 0; i < 8; ++i) u |= static_cast<uint64_t>(static_cast<unsigned char>(in_[pos_ + i])) << (8 * i);
  pos_ += 8;
  *v = static_cast<int64_t>(u);
  return true;
}

bool RecordReader::Str(std::string* s) {
  if (in_.size() - pos_ < 4) return false;
  const uint32_t len = GetU32(in_.data() + pos_);
  if (in_.size() - pos_ - 4 < len) return false;
  s->assign(in_, pos_ + 4, len);
  pos_ += 4 + len;
  return true;
}

}  // namespace spillway::journal
