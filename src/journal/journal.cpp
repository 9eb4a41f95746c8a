#include "journal/journal.h"

#include <sys/stat.h>

#include <sqlite3.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <string_view>
#include <utility>

namespace spillway::journal {

namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS requests(
  id TEXT PRIMARY KEY,
  client TEXT NOT NULL,
  idem_key TEXT,
  payload_hash TEXT NOT NULL,
  service TEXT NOT NULL,
  endpoint TEXT NOT NULL,
  stream INTEGER NOT NULL,
  body TEXT NOT NULL,
  state TEXT NOT NULL,
  placement TEXT NOT NULL DEFAULT '',
  attempts INTEGER NOT NULL DEFAULT 0,
  error TEXT NOT NULL DEFAULT '',
  result_status INTEGER NOT NULL DEFAULT 0,
  result_type TEXT NOT NULL DEFAULT '',
  result_body TEXT NOT NULL DEFAULT '',
  decision TEXT NOT NULL DEFAULT '',
  created_ms INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS requests_idem ON requests(client, idem_key) WHERE idem_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS requests_state ON requests(state);
CREATE INDEX IF NOT EXISTS requests_created ON requests(created_ms);
CREATE TABLE IF NOT EXISTS attempts(
  request_id TEXT NOT NULL,
  n INTEGER NOT NULL,
  placement TEXT NOT NULL,
  outcome TEXT NOT NULL DEFAULT 'running',
  error TEXT NOT NULL DEFAULT '',
  started_ms INTEGER NOT NULL,
  ended_ms INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY(request_id, n));
CREATE TABLE IF NOT EXISTS health_probe(id INTEGER PRIMARY KEY, at_ms INTEGER NOT NULL);
)sql";

}  // namespace

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

namespace {

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
  Stmt& Bind(int i, const std::string& v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& BindNullable(int i, const std::string& v) {
    if (v.empty()) sqlite3_bind_null(s_, i);
    else Bind(i, v);
    return *this;
  }
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

State ParseState(const std::string& s) {
  if (s == "queued") return State::kQueued;
  if (s == "running") return State::kRunning;
  if (s == "completed") return State::kCompleted;
  if (s == "failed_resumable") return State::kFailedResumable;
  if (s == "cancelled") return State::kCancelled;
  return State::kFailed;
}

constexpr const char* kColumns =
    "id, client, COALESCE(idem_key, ''), payload_hash, service, endpoint, stream, body, state, placement, attempts, "
    "error, result_status, result_type, result_body, created_ms, updated_ms, decision";

RequestRecord ReadRecord(const Stmt& s) {
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
  return r;
}

// Why the storage refuses to write, from a SQLite result code; empty when the
// error is not the storage's (a constraint, a bug).
std::string StorageProblem(int rc) {
  switch (rc & 0xff) {
    case SQLITE_FULL: return "disk full";
    case SQLITE_IOERR: return rc == SQLITE_IOERR_FSYNC || rc == SQLITE_IOERR_DIR_FSYNC ? "fsync failed" : "I/O error";
    case SQLITE_READONLY: return "read-only storage";
    case SQLITE_CANTOPEN: return "cannot open its files";
  }
  return "";
}

// The payload a write carries, for the batch's byte bound.
size_t Bytes(const std::string& a, const std::string& b = "") { return 256 + a.size() + b.size(); }

}  // namespace

const char* StateName(State s) {
  switch (s) {
    case State::kQueued: return "queued";
    case State::kRunning: return "running";
    case State::kCompleted: return "completed";
    case State::kFailedResumable: return "failed_resumable";
    case State::kFailed: return "failed";
    case State::kCancelled: return "cancelled";
  }
  return "failed";
}

bool IsTerminal(State s) { return s != State::kQueued && s != State::kRunning; }

// A queued mutating call: what to run and, once done, its result.
struct Journal::Writer {
  std::function<Status()> op;
  size_t bytes = 0;
  Status status;
  bool done = false;
  std::condition_variable cv;
};

Journal::Journal(sqlite3* db, JournalOptions opts, const Clock& clock)
    : db_(db), opts_(std::move(opts)), clock_(clock), stmts_(std::make_unique<StmtCache>(db)) {}

Journal::~Journal() {
  stmts_.reset();  // finalized before the connection closes
  sqlite3_close(db_);
}

Status Journal::Exec(const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string m = err ? err : "unknown";
    sqlite3_free(err);
    return Status::Internal("journal: " + m);
  }
  return Status::Ok();
}

Status Journal::DbError(const std::string& what) {
  const int rc = sqlite3_extended_errcode(db_);
  if (!StorageProblem(rc).empty()) return StorageFailure(rc, sqlite3_errmsg(db_));
  return Status::Internal("journal: " + what + ": " + sqlite3_errmsg(db_));
}

Status Journal::Done(int step_rc, const std::string& what) {
  return step_rc == SQLITE_DONE ? Status::Ok() : DbError(what);
}

StatusOr<std::unique_ptr<Journal>> Journal::Open(const std::string& path, JournalOptions opts, const Clock& clock) {
  std::error_code ec;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  sqlite3* db = nullptr;
  // Prompts and answers: the owner's only, never through a symbolic link.
  for (const char* suffix : {"", "-wal", "-shm"}) ::chmod((path + suffix).c_str(), 0600);
  const char* vfs = opts.faults ? opts.faults->vfs_name().c_str() : nullptr;
  if (sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX | SQLITE_OPEN_NOFOLLOW,
                      vfs) != SQLITE_OK) {
    std::string m = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return Status::Unavailable("cannot open journal " + path + ": " + m);
  }
  sqlite3_busy_timeout(db, 5000);
  const bool full = opts.synchronous_full;
  std::unique_ptr<Journal> j(new Journal(db, std::move(opts), clock));
  SPILLWAY_RETURN_IF_ERROR(j->Exec("PRAGMA journal_mode=WAL;"));
  SPILLWAY_RETURN_IF_ERROR(j->Exec(full ? "PRAGMA synchronous=FULL;" : "PRAGMA synchronous=NORMAL;"));
  SPILLWAY_RETURN_IF_ERROR(j->Exec(kSchema));
  // Journals written before decisions were recorded lack the column.
  (void)j->Exec("ALTER TABLE requests ADD COLUMN decision TEXT NOT NULL DEFAULT '';");
  // A first write: a journal that cannot write starts unhealthy (and says
  // why) rather than failing its first request; and the WAL's header is
  // written (and synced) here, not within a request's commit.
  (void)j->Probe();
  return j;
}

std::string Journal::synchronous_mode() {
  std::lock_guard<std::mutex> lk(db_mu_);
  Stmt s(*stmts_, "PRAGMA synchronous;");
  if (s.Step() != SQLITE_ROW) return "unknown";
  switch (s.Int(0)) {
    case 0: return "off";
    case 1: return "normal";
    case 2: return "full";
    case 3: return "extra";
  }
  return "unknown";
}

// --- group commit ---

Status Journal::Write(std::function<Status()> op, size_t bytes) {
  Writer w;
  w.op = std::move(op);
  w.bytes = bytes;
  std::unique_lock<std::mutex> lk(mu_);
  writers_.push_back(&w);
  w.cv.wait(lk, [&] { return w.done || writers_.front() == &w; });
  if (w.done) return w.status;  // a leader committed (or failed) it for us

  // The leader: the front of the queue, in arrival order, bounded.
  std::vector<Writer*> batch;
  size_t total = 0;
  const size_t max_batch = static_cast<size_t>(std::max(1, opts_.max_batch));
  for (Writer* x : writers_) {
    if (batch.size() == max_batch || (!batch.empty() && total + x->bytes > opts_.max_batch_bytes)) break;
    batch.push_back(x);
    total += x->bytes;
  }
  // Later callers queue meanwhile and form the next batch.
  lk.unlock();
  {
    std::lock_guard<std::mutex> db(db_mu_);
    CommitBatch(batch);
  }
  lk.lock();
  stats_.writes += static_cast<int64_t>(batch.size());
  stats_.largest_batch = std::max(stats_.largest_batch, static_cast<int64_t>(batch.size()));
  // Only now, after COMMIT returned, does any caller of the batch learn its result.
  for (Writer* x : batch) {
    writers_.pop_front();
    if (x == &w) continue;
    x->done = true;
    x->cv.notify_one();  // under mu_: x cannot return (and destroy its cv) before we let go
  }
  if (!writers_.empty()) writers_.front()->cv.notify_one();  // the next leader
  return w.status;
}

void Journal::CommitBatch(const std::vector<Writer*>& batch) {
  const int64_t changes_before = sqlite3_total_changes64(db_);
  // The batch as a whole did not commit: none of its writes was written.
  auto fail_all = [&](const Status& st) {
    for (Writer* x : batch) x->status = st;
    std::lock_guard<std::mutex> lk(mu_);
    ++stats_.failed_commits;
  };
  auto exec = [&](const char* sql) {
    Stmt st(*stmts_, sql);
    const int rc = st.Step();
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
  };
  if (exec("BEGIN IMMEDIATE;") != SQLITE_OK) return fail_all(DbError("begin"));
  for (Writer* x : batch) {
    if (exec("SAVEPOINT w;") != SQLITE_OK) {
      x->status = DbError("savepoint");
    } else {
      x->status = x->op();
      // A failed write is undone alone: the others of the batch stay.
      if (!x->status.ok() && !sqlite3_get_autocommit(db_)) (void)exec("ROLLBACK TO w;");
      if (!sqlite3_get_autocommit(db_)) (void)exec("RELEASE w;");
    }
    if (sqlite3_get_autocommit(db_)) {
      // SQLite rolled the whole transaction back (I/O error, disk full in
      // the middle of it): every write before this one is gone too.
      return fail_all(x->status.ok() ? DbError("write") : x->status);
    }
  }
  if (exec("COMMIT;") != SQLITE_OK) {
    Status st = DbError("commit");
    if (!sqlite3_get_autocommit(db_)) (void)exec("ROLLBACK;");
    return fail_all(st);
  }
  std::lock_guard<std::mutex> lk(mu_);
  ++stats_.commits;
  // A commit that wrote something proves the storage writes again.
  if (sqlite3_total_changes64(db_) != changes_before && !writable_) {
    writable_ = true;
    unwritable_reason_.clear();
  }
}

// --- a journal that cannot write ---

Status Journal::StorageFailure(int rc, const std::string& msg) {
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t now = clock_.NowMs();
  writable_ = false;
  unwritable_reason_ = StorageProblem(rc) + " (" + msg + ")";
  retry_at_ms_ = now + opts_.unwritable_retry_ms;
  return CannotWrite(now);
}

Status Journal::CannotWrite(int64_t now) const {
  const int64_t left_ms = std::max<int64_t>(retry_at_ms_ - now, 0);
  return Status::Unavailable("the request journal cannot write: " + unwritable_reason_)
      .WithRetryAfter(static_cast<int>(std::max<int64_t>(1, (left_ms + 999) / 1000)));
}

Status Journal::WriteGate(bool* retrying) {
  std::lock_guard<std::mutex> lk(mu_);
  if (writable_) return Status::Ok();
  const int64_t now = clock_.NowMs();
  if (now < retry_at_ms_) return CannotWrite(now);
  // Time to try again: this caller is the one to try; the others wait for
  // its answer (still refused until the next retry time).
  retry_at_ms_ = now + opts_.unwritable_retry_ms;
  if (retrying) *retrying = true;
  return Status::Ok();
}

Status Journal::Health() {
  bool retrying = false;
  SPILLWAY_RETURN_IF_ERROR(WriteGate(&retrying));
  if (!retrying) return Status::Ok();
  // A probe, so that a journal nobody writes to (clients sent away by
  // /readyz) still finds out that the disk has room again.
  (void)Probe();
  std::lock_guard<std::mutex> lk(mu_);
  return writable_ ? Status::Ok() : CannotWrite(clock_.NowMs());
}

Status Journal::Probe() {
  return Write(
      [this] {
        Stmt p(*stmts_, "INSERT OR REPLACE INTO health_probe(id, at_ms) VALUES(1, ?1);");
        p.Bind(1, clock_.NowMs());
        return Done(p.Step(), "probe");
      },
      Bytes(""));
}

JournalStats Journal::stats() {
  std::lock_guard<std::mutex> lk(mu_);
  JournalStats s = stats_;
  s.queued = static_cast<int64_t>(writers_.size());
  return s;
}

// --- the writes ---

StatusOr<AcceptResult> Journal::Accept(RequestRecord r) {
  SPILLWAY_RETURN_IF_ERROR(WriteGate(nullptr));
  const int64_t now = clock_.NowMs();
  std::optional<AcceptResult> out;
  const size_t bytes = Bytes(r.body);
  // Runs in queue order inside the batch: a second Accept with the same key
  // sees the first one's row.
  SPILLWAY_RETURN_IF_ERROR(Write(
      [&]() -> Status {
        if (!r.idempotency_key.empty()) {
          std::string sql = std::string("SELECT ") + kColumns + " FROM requests WHERE client=?1 AND idem_key=?2;";
          Stmt q(*stmts_, sql.c_str());
          q.Bind(1, r.client).Bind(2, r.idempotency_key);
          if (q.Step() == SQLITE_ROW) {
            RequestRecord old = ReadRecord(q);
            AcceptOutcome o = old.payload_hash != r.payload_hash ? AcceptOutcome::kMismatch
                              : IsTerminal(old.state)            ? AcceptOutcome::kReplay
                                                                 : AcceptOutcome::kInFlight;
            out = AcceptResult{o, std::move(old)};
            return Status::Ok();
          }
        }
        Stmt ins(*stmts_,
                 "INSERT INTO requests(id, client, idem_key, payload_hash, service, endpoint, stream, body, state, "
                 "created_ms, updated_ms) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,'queued',?9,?9);");
        ins.Bind(1, r.id).Bind(2, r.client).BindNullable(3, r.idempotency_key).Bind(4, r.payload_hash);
        ins.Bind(5, r.service).Bind(6, r.endpoint).Bind(7, int64_t{r.stream}).Bind(8, r.body).Bind(9, now);
        if (ins.Step() != SQLITE_DONE) {
          if (sqlite3_extended_errcode(db_) == SQLITE_CONSTRAINT_PRIMARYKEY) {
            return Status::Conflict("request id '" + r.id + "' already exists");
          }
          return DbError("insert");
        }
        out = AcceptResult{AcceptOutcome::kNew, r};
        return Status::Ok();
      },
      bytes));
  if (out->outcome == AcceptOutcome::kNew) {
    out->existing.state = State::kQueued;
    out->existing.created_ms = out->existing.updated_ms = now;
  }
  return std::move(*out);
}

Status Journal::StartAttempt(const std::string& id, const std::string& placement, const std::string& decision_json) {
  const int64_t now = clock_.NowMs();
  int64_t n = 0;
  Status st = Write(
      [&]() -> Status {
        Stmt up(*stmts_,
                "UPDATE requests SET state='running', placement=?2, attempts=attempts+1, updated_ms=?3, "
                "decision=CASE WHEN ?4 = '' THEN decision ELSE ?4 END "
                "WHERE id=?1 AND state IN ('queued','running') RETURNING attempts;");
        up.Bind(1, id).Bind(2, placement).Bind(3, now).Bind(4, decision_json);
        if (up.Step() != SQLITE_ROW) {
          if (!StorageProblem(sqlite3_extended_errcode(db_)).empty()) return DbError("attempt");
          return Status::NotFound("request '" + id + "' is not waiting to run");
        }
        n = up.Int(0);
        up.Step();
        Stmt at(*stmts_, "INSERT INTO attempts(request_id, n, placement, started_ms) VALUES(?1,?2,?3,?4);");
        at.Bind(1, id).Bind(2, n).Bind(3, placement).Bind(4, now);
        return Done(at.Step(), "attempt");
      },
      Bytes(decision_json));
  if (st.ok()) Tell({Transition::Kind::kAttempt, id, placement, n, State::kRunning, "", decision_json});
  return st;
}

Status Journal::SetDecision(const std::string& id, const std::string& decision_json) {
  const int64_t now = clock_.NowMs();
  return Write(
      [&]() -> Status {
        Stmt up(*stmts_, "UPDATE requests SET decision=?2, updated_ms=?3 WHERE id=?1;");
        up.Bind(1, id).Bind(2, decision_json).Bind(3, now);
        return Done(up.Step(), "decision");
      },
      Bytes(decision_json));
}

Status Journal::Requeue(const std::string& id, const std::string& error) {
  const int64_t now = clock_.NowMs();
  bool changed = false;
  Status st = Write(
      [&]() -> Status {
        Stmt a(*stmts_, "UPDATE attempts SET outcome='failed', error=?2, ended_ms=?3 WHERE request_id=?1 AND ended_ms=0;");
        a.Bind(1, id).Bind(2, error).Bind(3, now);
        SPILLWAY_RETURN_IF_ERROR(Done(a.Step(), "requeue"));
        Stmt up(*stmts_,
                "UPDATE requests SET state='queued', error=?2, updated_ms=?3 WHERE id=?1 AND state IN ('queued','running');");
        up.Bind(1, id).Bind(2, error).Bind(3, now);
        SPILLWAY_RETURN_IF_ERROR(Done(up.Step(), "requeue"));
        changed = sqlite3_changes(db_) > 0;
        return Status::Ok();
      },
      Bytes(error));
  if (st.ok() && changed) Tell({Transition::Kind::kRequeued, id, "", 0, State::kQueued, error, ""});
  return st;
}

Status Journal::Finish(const std::string& id, State state, int status, const std::string& content_type,
                       const std::string& body, const std::string& error) {
  const int64_t now = clock_.NowMs();
  bool changed = false;
  SPILLWAY_RETURN_IF_ERROR(Write(
      [&]() -> Status {
        Stmt a(*stmts_, "UPDATE attempts SET outcome=?2, error=?3, ended_ms=?4 WHERE request_id=?1 AND ended_ms=0;");
        a.Bind(1, id).Bind(2, std::string(StateName(state))).Bind(3, error).Bind(4, now);
        SPILLWAY_RETURN_IF_ERROR(Done(a.Step(), "finish"));
        // Only a non-terminal request changes: the first terminal state wins.
        Stmt up(*stmts_,
                "UPDATE requests SET state=?2, result_status=?3, result_type=?4, result_body=?5, error=?6, "
                "updated_ms=?7 WHERE id=?1 AND state IN ('queued','running');");
        up.Bind(1, id).Bind(2, std::string(StateName(state))).Bind(3, int64_t{status}).Bind(4, content_type);
        up.Bind(5, body).Bind(6, error).Bind(7, now);
        SPILLWAY_RETURN_IF_ERROR(Done(up.Step(), "finish"));
        changed = sqlite3_changes(db_) > 0;
        return Status::Ok();
      },
      Bytes(body, error)));
  if (!changed) return Status::Conflict("request '" + id + "' had already ended");
  Tell({Transition::Kind::kFinished, id, "", 0, state, error, ""});
  return Status::Ok();
}

StatusOr<std::vector<RequestRecord>> Journal::Recover() {
  const int64_t now = clock_.NowMs();
  std::vector<RequestRecord> requeued;
  SPILLWAY_RETURN_IF_ERROR(Write(
      [&]() -> Status {
        requeued.clear();
        std::string sql = std::string("SELECT ") + kColumns +
                          " FROM requests WHERE state IN ('queued','running') ORDER BY created_ms;";
        Stmt q(*stmts_, sql.c_str());
        while (q.Step() == SQLITE_ROW) {
          RequestRecord r = ReadRecord(q);
          if (!r.stream) requeued.push_back(std::move(r));
        }
        Stmt a(*stmts_, "UPDATE attempts SET outcome='interrupted', error='gateway restarted', ended_ms=?1 WHERE ended_ms=0;");
        a.Bind(1, now);
        SPILLWAY_RETURN_IF_ERROR(Done(a.Step(), "recover"));
        Stmt rq(*stmts_, "UPDATE requests SET state='queued', updated_ms=?1 WHERE state IN ('queued','running') AND stream=0;");
        rq.Bind(1, now);
        SPILLWAY_RETURN_IF_ERROR(Done(rq.Step(), "recover"));
        Stmt fr(*stmts_,
                "UPDATE requests SET state='failed_resumable', error='the gateway restarted while the stream was open; "
                "resubmit to continue', result_status=503, result_type='application/json', updated_ms=?1 "
                "WHERE state IN ('queued','running') AND stream=1;");
        fr.Bind(1, now);
        return Done(fr.Step(), "recover");
      },
      Bytes("")));
  for (auto& r : requeued) r.state = State::kQueued;
  return requeued;
}

StatusOr<int> Journal::Prune() {
  const int64_t now = clock_.NowMs();
  int deleted = 0;
  SPILLWAY_RETURN_IF_ERROR(Write(
      [&]() -> Status {
        Stmt k(*stmts_, "UPDATE requests SET idem_key=NULL WHERE idem_key IS NOT NULL AND created_ms < ?1 AND "
                    "state NOT IN ('queued','running');");
        k.Bind(1, now - opts_.idempotency_ms);
        SPILLWAY_RETURN_IF_ERROR(Done(k.Step(), "prune"));
        Stmt d(*stmts_, "DELETE FROM requests WHERE created_ms < ?1 AND state NOT IN ('queued','running');");
        d.Bind(1, now - opts_.retention_ms);
        SPILLWAY_RETURN_IF_ERROR(Done(d.Step(), "prune"));
        deleted = sqlite3_changes(db_);
        Stmt da(*stmts_, "DELETE FROM attempts WHERE request_id NOT IN (SELECT id FROM requests);");
        return Done(da.Step(), "prune");
      },
      Bytes("")));
  return deleted;
}

// --- reads: the connection between batches ---

StatusOr<RequestRecord> Journal::Get(const std::string& id) {
  std::lock_guard<std::mutex> lk(db_mu_);
  std::string sql = std::string("SELECT ") + kColumns + " FROM requests WHERE id=?1;";
  Stmt q(*stmts_, sql.c_str());
  q.Bind(1, id);
  if (q.Step() != SQLITE_ROW) return Status::NotFound("no request '" + id + "'");
  return ReadRecord(q);
}

StatusOr<std::vector<AttemptRecord>> Journal::Attempts(const std::string& id) {
  std::lock_guard<std::mutex> lk(db_mu_);
  Stmt q(*stmts_, "SELECT n, placement, outcome, error, started_ms, ended_ms FROM attempts WHERE request_id=?1 ORDER BY n;");
  q.Bind(1, id);
  std::vector<AttemptRecord> out;
  while (q.Step() == SQLITE_ROW) out.push_back({static_cast<int>(q.Int(0)), q.Text(1), q.Text(2), q.Text(3), q.Int(4), q.Int(5)});
  return out;
}

int64_t Journal::CountByState(State s) {
  std::lock_guard<std::mutex> lk(db_mu_);
  Stmt q(*stmts_, "SELECT COUNT(*) FROM requests WHERE state=?1;");
  q.Bind(1, std::string(StateName(s)));
  return q.Step() == SQLITE_ROW ? q.Int(0) : 0;
}

}  // namespace spillway::journal
