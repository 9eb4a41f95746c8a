#include "journal/commit_log.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/crc.hpp>

#include <cerrno>
#include <cstring>

#include "journal/storage_faults.h"

namespace spillway::journal {

namespace {

// A record longer than this is damage, not data (the journal caps bodies far below).
constexpr uint32_t kMaxRecord = 256u << 20;

// A file is set aside past this size while records in it still wait for
// their rows (under a steady load it may never be all applied at once).
constexpr int64_t kRotateBytes = 8 << 20;
constexpr int64_t kMaxBytes = int64_t{256} << 20;
// An applied file is emptied once it holds this much (or once the journal
// is idle, EmptyIfApplied): a truncation per batch of rows cost the journal's
// thread as much as the batch's statements, and a restart that re-applies up
// to this much of applied records (each applies idempotently) takes milliseconds.
constexpr int64_t kEmptyAtBytes = 64 << 10;

uint32_t Crc(const char* p, size_t n) {
  boost::crc_32_type c;
  c.process_bytes(p, n);
  return c.checksum();
}

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

// The records of `data` up to the first that does not check out; `valid`:
// where that one begins (the end of the last good record).
std::vector<std::string> ParseRecords(const std::string& data, size_t* valid = nullptr) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (data.size() - pos >= 8) {
    const uint32_t len = GetU32(data.data() + pos), crc = GetU32(data.data() + pos + 4);
    if (len > kMaxRecord || data.size() - pos - 8 < len || Crc(data.data() + pos + 8, len) != crc) break;
    out.emplace_back(data, pos + 8, len);
    pos += 8 + len;
  }
  if (valid) *valid = pos;
  return out;
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

// The whole of `data` at the end of the file (O_APPEND), or an errno.
int WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    done += static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace

StatusOr<std::unique_ptr<CommitLog>> CommitLog::Open(const std::string& path, bool sync,
                                                     std::shared_ptr<StorageFaults> faults,
                                                     std::vector<std::string>* leftover) {
  leftover->clear();
  // A file set aside by a rotation first (its records are the older), then the current one.
  const std::string old = path + ".old";
  int old_fd = ::open(old.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (old_fd < 0 && errno != ENOENT) {
    return Status::Unavailable("cannot open the journal's log " + old + ": " + std::strerror(errno));
  }
  std::string data;
  int64_t old_bytes = 0;
  if (old_fd >= 0) {
    if (const int err = ReadFile(old_fd, &data); err != 0) {
      ::close(old_fd);
      return Status::Unavailable("cannot read the journal's log " + old + ": " + std::strerror(err));
    }
    *leftover = ParseRecords(data);
    old_bytes = static_cast<int64_t>(data.size());
  }
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
  int err = fd < 0 ? errno : 0;
  if (fd >= 0) {
    ::fchmod(fd, 0600);
    err = ReadFile(fd, &data);
    if (err != 0) ::close(fd);
  }
  if (err != 0) {
    if (old_fd >= 0) ::close(old_fd);
    return Status::Unavailable("cannot read the journal's log " + path + ": " + std::strerror(err));
  }
  size_t valid = 0;
  for (auto& r : ParseRecords(data, &valid)) leftover->push_back(std::move(r));
  // A torn tail (a crash in mid-write: never acknowledged) goes now, or the
  // records appended after it would hide behind it at the next replay.
  if (valid < data.size() && (::ftruncate(fd, static_cast<off_t>(valid)) != 0 || (sync && ::fdatasync(fd) != 0))) {
    const int err = errno;
    ::close(fd);
    if (old_fd >= 0) ::close(old_fd);
    return Status::Unavailable("cannot cut the torn end off the journal's log " + path + ": " + std::strerror(err));
  }
  if (sync && !SyncDir(path)) {  // the file's name durable before a record in it counts
    const int err = errno;
    ::close(fd);
    if (old_fd >= 0) ::close(old_fd);
    return Status::Unavailable("cannot sync the directory of the journal's log " + path + ": " + std::strerror(err));
  }
  std::unique_ptr<CommitLog> log(new CommitLog(path, fd, sync, std::move(faults), static_cast<int64_t>(valid)));
  // A file set aside and never applied stays set aside (no rotation
  // overwrites it) until the leftovers are applied: DropLeftovers, or the
  // first Applied after them (old_last_seq_ 0).
  log->old_fd_ = old_fd;
  log->old_size_ = old_bytes;
  return log;
}

CommitLog::CommitLog(std::string path, int fd, bool sync, std::shared_ptr<StorageFaults> faults, int64_t size)
    : path_(std::move(path)), fd_(fd), sync_(sync), faults_(std::move(faults)), max_bytes_(kMaxBytes), size_(size) {
  if (sync_) {
    syncer_ = std::thread([this] { SyncThread(); });
    sync_tid_ = syncer_.get_id();
  }
}

CommitLog::~CommitLog() {
  Stop();
  if (old_fd_ >= 0) ::close(old_fd_);
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
  drained_cv_.wait(lk, [&] { return done_seq_ >= target || sync_done_; });
}

void CommitLog::Rotate() {
  // A file whose records are not all applied, grown past kRotateBytes: set it
  // aside (it goes once they are) and go on in a new one. At most one aside:
  // while it waits, the current file grows on.
  if (old_fd_ >= 0 || size_ < kRotateBytes) return;
  const std::string old = path_ + ".old";
  if (::rename(path_.c_str(), old.c_str()) != 0) return;
  const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    (void)::rename(old.c_str(), path_.c_str());
    return;
  }
  // With sync, the sync thread's next round syncs the file set aside and
  // the directory (the new name and the old) before the records it covers
  // count as durable: nothing of that on an appender's thread.
  rotated_ = sync_;
  old_fd_ = fd_;
  old_last_seq_ = last_seq_;
  old_size_ = size_;
  fd_ = fd;
  size_ = 0;
}

void CommitLog::Append(const std::string& payload, Queued queued, Durable durable) {
  std::string rec;
  rec.reserve(payload.size() + 8);
  PutU32(rec, static_cast<uint32_t>(payload.size()));
  PutU32(rec, Crc(payload.data(), payload.size()));
  rec += payload;
  std::unique_lock<std::mutex> lk(mu_);
  // Stopped (teardown): no sync would ever come for it.
  if (sync_ && stop_) {
    lk.unlock();
    return durable(SQLITE_MISUSE, "the commit log is stopped");
  }
  if (size_ + old_size_ + static_cast<int64_t>(rec.size()) > max_bytes_) {
    lk.unlock();
    return durable(SQLITE_FULL, "the commit log holds " + std::to_string(max_bytes_ >> 20) +
                                    " MiB of records whose rows have not committed");
  }
  if (broken_) {
    lk.unlock();
    return durable(SQLITE_IOERR_WRITE, "the commit log could not cut off a failed record and takes no more; "
                                       "restart spillway once the disk is healthy (it cuts the record at start)");
  }
  int rc = faults_ ? faults_->BeforeWrite() : SQLITE_OK;
  if (rc == SQLITE_OK) {
    if (const int err = WriteAll(fd_, rec); err != 0) {
      rc = WriteRc(err);
      // A partial record would hide every later one at the next replay: cut
      // it off, and if that fails take no more records (Open cuts it).
      if (::ftruncate(fd_, size_) != 0) broken_ = true;
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
  unsynced_.push_back({last_seq_, written_fd, written_at, std::move(queued), std::move(durable)});
  lk.unlock();
  sync_cv_.notify_one();
}

std::vector<std::string> CommitLog::ReadAll(int64_t* last_seq) {
  std::lock_guard<std::mutex> lk(mu_);
  // Only records already handed to the journal: the last ones may still be
  // on their way to the disk (a sync that fails tells their callers so).
  *last_seq = queued_seq_;
  std::vector<std::string> out;
  std::string data;
  if (old_fd_ >= 0 && ReadFile(old_fd_, &data) == 0) out = ParseRecords(data);
  if (ReadFile(fd_, &data) == 0) {
    for (auto& r : ParseRecords(data)) out.push_back(std::move(r));
  }
  const auto unsynced = static_cast<size_t>(last_seq_ - queued_seq_);
  out.resize(out.size() > unsynced ? out.size() - unsynced : 0);
  return out;
}

void CommitLog::SyncThread() {
  std::unique_lock<std::mutex> lk(mu_);
  while (true) {
    sync_cv_.wait(lk, [&] { return stop_ || !unsynced_.empty(); });
    if (unsynced_.empty()) {  // stop_, with nothing left to sync
      sync_done_ = true;
      drained_cv_.notify_all();
      return;
    }
    // Everything written so far shares this sync (group commit); writes
    // meanwhile wait for the next one.
    std::vector<Unsynced> batch = std::move(unsynced_);
    unsynced_.clear();
    syncing_ = true;
    const int fd = fd_;
    // After a rotation: the file set aside (closed only once its records,
    // all in this round or earlier, are applied) and the directory.
    const int old_fd = rotated_ ? old_fd_ : -1;
    rotated_ = false;
    lk.unlock();
    int rc = faults_ ? faults_->BeforeSync() : SQLITE_OK;
    if (rc == SQLITE_OK && old_fd >= 0 && (::fdatasync(old_fd) != 0 || !SyncDir(path_))) rc = SQLITE_IOERR_FSYNC;
    if (rc == SQLITE_OK && ::fdatasync(fd) != 0) rc = SQLITE_IOERR_FSYNC;
    if (rc != SQLITE_OK) {
      lk.lock();
      CutFailed(batch);
      if (old_fd >= 0) rotated_ = true;  // the directory, after a rotation: synced again next round
      lk.unlock();
    } else {
      // Only this thread queues records at FULL, and in log order.
      for (auto& u : batch) u.queued(u.seq);
    }
    for (auto& u : batch) u.durable(rc, "log sync");
    lk.lock();
    if (rc == SQLITE_OK) queued_seq_ = batch.back().seq;
    done_seq_ = batch.back().seq;
    syncing_ = false;
    drained_cv_.notify_all();
  }
}

void CommitLog::CutFailed(std::vector<Unsynced>& batch) {
  // Their callers hear that they failed, so these records must never be
  // applied: each file goes back to before its first one, with those
  // written since (not acknowledged either; records before them synced
  // fine), and the cut is synced. Records of a file that cannot be cut stay
  // at the end of the log's records (a file written after a rotation in
  // this window holds only failed ones) and no record is taken after them:
  // ReadAll leaves them out by count, and only a restart (a disk that fails
  // its syncs) may still find them.
  for (auto& u : unsynced_) batch.push_back(std::move(u));
  unsynced_.clear();
  int64_t left = 0;
  for (const int fd : {old_fd_, fd_}) {
    if (fd < 0) continue;
    int64_t from = -1, n = 0;
    for (const auto& u : batch) {
      if (u.fd != fd) continue;
      ++n;
      if (from < 0 || u.offset < from) from = u.offset;
    }
    if (n == 0) continue;
    if (::ftruncate(fd, static_cast<off_t>(from)) != 0 || (faults_ && faults_->BeforeSync() != SQLITE_OK) ||
        ::fdatasync(fd) != 0) {
      left += n;
      continue;
    }
    (fd == fd_ ? size_ : old_size_) = from;
  }
  queued_seq_ = last_seq_ - left;  // (every record before them was handed over)
  if (left > 0) broken_ = true;
}

void CommitLog::Applied(int64_t seq) {
  std::lock_guard<std::mutex> lk(mu_);
  if (seq > applied_) applied_ = seq;
  if (old_fd_ >= 0 && applied_ >= old_last_seq_) {  // the file set aside holds nothing needed now
    (void)::unlink((path_ + ".old").c_str());
    ::close(old_fd_);
    old_fd_ = -1;
    old_size_ = 0;
  }
  EmptyAtLeast(kEmptyAtBytes);  // (smaller: EmptyIfApplied, once idle)
}

void CommitLog::EmptyIfApplied() {
  std::lock_guard<std::mutex> lk(mu_);
  EmptyAtLeast(1);
}

void CommitLog::EmptyAtLeast(int64_t min_bytes) {
  // Every record is in SQLite: none is needed at a restart. Not while a
  // sync runs: a truncation waits for the pages it is writing, and an
  // append (an I/O thread) would wait behind the truncation for the lock.
  // A later batch empties it, or a rotation sets it aside.
  if (applied_ < last_seq_ || size_ < min_bytes || syncing_ || !unsynced_.empty()) return;
  if (::ftruncate(fd_, 0) == 0) size_ = 0;
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
  if (::ftruncate(fd_, 0) == 0) size_ = 0;
}

void CommitLog::set_max_bytes(int64_t max_bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  max_bytes_ = max_bytes;
}

int64_t CommitLog::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return size_;
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
