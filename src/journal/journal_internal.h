// What journal.cpp and journal_writes.cpp share: the connection's statement
// cache, a borrowed statement, row decoding and the storage's error names.
#pragma once

#include <sqlite3.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "journal/commit_log.h"
#include "journal/journal.h"

namespace spillway::journal {

// The connection's prepared statements, by SQL text, kept for its life: a
// request's three commits no longer parse a dozen statements (BEGIN, SAVEPOINT
// and COMMIT included), which was a fifth of the gateway's CPU per request.
// Used under db_mu_ only.
class Journal::StmtCache {
 public:
  explicit StmtCache(sqlite3* db) : db_(db) {}
  ~StmtCache() {
    for (auto& [sql, s] : map_) sqlite3_finalize(s);
  }
  sqlite3_stmt* Get(const char* sql, int* rc) {
    auto it = map_.find(std::string_view(sql));
    if (it != map_.end()) {
      *rc = SQLITE_OK;
      return it->second;
    }
    sqlite3_stmt* s = nullptr;
    *rc = sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, &s, nullptr);
    if (*rc != SQLITE_OK) {
      sqlite3_finalize(s);
      return nullptr;
    }
    map_.emplace(std::string(sql), s);
    return s;
  }

 private:
  sqlite3* db_;
  std::map<std::string, sqlite3_stmt*, std::less<>> map_;
};

namespace detail {

// A statement borrowed from the cache for one use: reset (bindings cleared)
// when it goes out of scope, so it holds no read lock and no stale values.
class Stmt {
 public:
  Stmt(Journal::StmtCache& cache, const char* sql) { s_ = cache.Get(sql, &rc_); }
  Stmt(Journal::StmtCache& cache, const std::string& sql) : Stmt(cache, sql.c_str()) {}
  ~Stmt() {
    if (!s_) return;
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
  }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  bool ok() const { return rc_ == SQLITE_OK; }
  // A named string outlives the statement's use (the bindings are cleared
  // when the Stmt goes): SQLite reads it in place. A temporary is copied.
  Stmt& Bind(int i, const std::string& v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_STATIC);
    return *this;
  }
  Stmt& Bind(int i, std::string&& v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& Bind(int i, const std::string&& v) = delete;  // a const temporary: copy it into a named string
  Stmt& BindNullable(int i, const std::string& v) {
    if (v.empty()) sqlite3_bind_null(s_, i);
    else Bind(i, v);
    return *this;
  }
  Stmt& BindNullable(int i, const std::string&& v) = delete;
  Stmt& Bind(int i, int64_t v) {
    sqlite3_bind_int64(s_, i, v);
    return *this;
  }
  int Step() { return s_ ? sqlite3_step(s_) : rc_; }
  std::string Text(int col) const {
    const auto* p = sqlite3_column_text(s_, col);
    return p ? std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(sqlite3_column_bytes(s_, col))) : "";
  }
  int64_t Int(int col) const { return sqlite3_column_int64(s_, col); }
  sqlite3_stmt* raw() { return s_; }

 private:
  sqlite3_stmt* s_ = nullptr;
  int rc_;
};

inline State ParseState(const std::string& s) {
  if (s == "queued") return State::kQueued;
  if (s == "running") return State::kRunning;
  if (s == "completed") return State::kCompleted;
  if (s == "failed_resumable") return State::kFailedResumable;
  if (s == "cancelled") return State::kCancelled;
  return State::kFailed;
}

inline constexpr const char* kColumns =
    "id, client, COALESCE(idem_key, ''), payload_hash, service, endpoint, stream, body, state, placement, attempts, "
    "error, result_status, result_type, result_body, created_ms, updated_ms, decision, body_type, deadline_ms";

inline constexpr int kColumnCount = 20;  // of kColumns

inline RequestRecord ReadRecord(const Stmt& s) {
  RequestRecord r;
  r.id = s.Text(0);
  r.client = s.Text(1);
  r.idempotency_key = s.Text(2);
  r.payload_hash = s.Text(3);
  r.service = s.Text(4);
  r.endpoint = s.Text(5);
  r.stream = s.Int(6) != 0;
  r.body = s.Text(7);
  r.state = ParseState(s.Text(8));
  r.placement = s.Text(9);
  r.attempts = static_cast<int>(s.Int(10));
  r.error = s.Text(11);
  r.result_status = static_cast<int>(s.Int(12));
  r.result_type = s.Text(13);
  r.result_body = s.Text(14);
  r.created_ms = s.Int(15);
  r.updated_ms = s.Int(16);
  r.decision = s.Text(17);
  r.body_type = s.Text(18);
  r.deadline_ms = s.Int(19);
  return r;
}

// Why the storage refuses to write, from a SQLite result code; empty when the
// error is not the storage's (a constraint, a bug).
inline std::string StorageProblem(int rc) {
  if (rc == CommitLog::kCapRc) return "commit log full";
  switch (rc & 0xff) {
    case SQLITE_FULL: return "disk full";
    case SQLITE_IOERR: return rc == SQLITE_IOERR_FSYNC || rc == SQLITE_IOERR_DIR_FSYNC ? "fsync failed" : "I/O error";
    case SQLITE_READONLY: return "read-only storage";
    case SQLITE_CANTOPEN: return "cannot open its files";
  }
  return "";
}

// The payload a write carries, for the batch's byte bound.
inline size_t Bytes(const std::string& a, const std::string& b = "") { return 256 + a.size() + b.size(); }

}  // namespace detail

// A queued mutating call: what to run, then who hears its result.
struct Journal::Writer {
  std::function<Status()> op;
  size_t bytes = 0;
  Status status;
  std::function<void(Status)> done;
  int64_t log_seq = 0;  // the commit-log record it applies (0: none)
  std::chrono::steady_clock::time_point queued_at = std::chrono::steady_clock::now();
  // A logged write (log_seq set; no op, no done): its record, the transition
  // its rows tell once committed, and its caller when it waits for its rows
  // too (a backlog: AppendLogged).
  std::string record;
  std::optional<Transition> told;
  std::function<void(Status)> paced;
  // A request's start whose end's rows it applies with its own (PairLogged),
  // and that end, which runs nothing of its own and shares the start's result.
  Writer* pair_end = nullptr;
  Writer* absorbed_by = nullptr;
};

}  // namespace spillway::journal
