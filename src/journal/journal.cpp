#include "journal/journal.h"

#include <sys/stat.h>

#include <sqlite3.h>

#include <filesystem>

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
)sql";

// A prepared statement that finalizes itself.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &s_, nullptr); }
  ~Stmt() { sqlite3_finalize(s_); }
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
  int Step() { return sqlite3_step(s_); }
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

Status DbError(sqlite3* db, const std::string& what) {
  return Status::Internal("journal: " + what + ": " + sqlite3_errmsg(db));
}

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

Journal::~Journal() { sqlite3_close(db_); }

Status Journal::Exec(const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string m = err ? err : "unknown";
    sqlite3_free(err);
    return Status::Internal("journal: " + m);
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<Journal>> Journal::Open(const std::string& path, JournalOptions opts, const Clock& clock) {
  std::error_code ec;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  sqlite3* db = nullptr;
  // Prompts and answers: the owner's only, never through a symbolic link.
  for (const char* suffix : {"", "-wal", "-shm"}) ::chmod((path + suffix).c_str(), 0600);
  if (sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX | SQLITE_OPEN_NOFOLLOW,
                      nullptr) !=
      SQLITE_OK) {
    std::string m = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return Status::Unavailable("cannot open journal " + path + ": " + m);
  }
  sqlite3_busy_timeout(db, 5000);
  std::unique_ptr<Journal> j(new Journal(db, opts, clock));
  SPILLWAY_RETURN_IF_ERROR(j->Exec("PRAGMA journal_mode=WAL;"));
  SPILLWAY_RETURN_IF_ERROR(j->Exec(opts.synchronous_full ? "PRAGMA synchronous=FULL;" : "PRAGMA synchronous=NORMAL;"));
  SPILLWAY_RETURN_IF_ERROR(j->Exec(kSchema));
  // Journals written before decisions were recorded lack the column.
  (void)j->Exec("ALTER TABLE requests ADD COLUMN decision TEXT NOT NULL DEFAULT '';");
  return j;
}

std::string Journal::synchronous_mode() {
  std::lock_guard<std::mutex> lk(mu_);
  Stmt s(db_, "PRAGMA synchronous;");
  if (s.Step() != SQLITE_ROW) return "unknown";
  switch (s.Int(0)) {
    case 0: return "off";
    case 1: return "normal";
    case 2: return "full";
    case 3: return "extra";
  }
  return "unknown";
}

StatusOr<AcceptResult> Journal::Accept(RequestRecord r) {
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t now = clock_.NowMs();
  SPILLWAY_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE;"));
  auto rollback = [&](Status st) {
    (void)Exec("ROLLBACK;");
    return st;
  };
  if (!r.idempotency_key.empty()) {
    std::string sql = std::string("SELECT ") + kColumns + " FROM requests WHERE client=?1 AND idem_key=?2;";
    Stmt q(db_, sql.c_str());
    q.Bind(1, r.client).Bind(2, r.idempotency_key);
    if (q.Step() == SQLITE_ROW) {
      RequestRecord old = ReadRecord(q);
      (void)Exec("COMMIT;");
      AcceptOutcome o = old.payload_hash != r.payload_hash ? AcceptOutcome::kMismatch
                        : IsTerminal(old.state)            ? AcceptOutcome::kReplay
                                                           : AcceptOutcome::kInFlight;
      return AcceptResult{o, std::move(old)};
    }
  }
  Stmt ins(db_,
           "INSERT INTO requests(id, client, idem_key, payload_hash, service, endpoint, stream, body, state, "
           "created_ms, updated_ms) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,'queued',?9,?9);");
  ins.Bind(1, r.id).Bind(2, r.client).BindNullable(3, r.idempotency_key).Bind(4, r.payload_hash).Bind(5, r.service);
  ins.Bind(6, r.endpoint).Bind(7, int64_t{r.stream}).Bind(8, r.body).Bind(9, now);
  if (ins.Step() != SQLITE_DONE) {
    if (sqlite3_extended_errcode(db_) == SQLITE_CONSTRAINT_PRIMARYKEY) {
      return rollback(Status::Conflict("request id '" + r.id + "' already exists"));
    }
    return rollback(DbError(db_, "insert"));
  }
  SPILLWAY_RETURN_IF_ERROR(Exec("COMMIT;"));
  r.state = State::kQueued;
  r.created_ms = r.updated_ms = now;
  return AcceptResult{AcceptOutcome::kNew, std::move(r)};
}

Status Journal::StartAttempt(const std::string& id, const std::string& placement, const std::string& decision_json) {
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t now = clock_.NowMs();
  SPILLWAY_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE;"));
  Stmt up(db_,
          "UPDATE requests SET state='running', placement=?2, attempts=attempts+1, updated_ms=?3, "
          "decision=CASE WHEN ?4 = '' THEN decision ELSE ?4 END "
          "WHERE id=?1 AND state IN ('queued','running') RETURNING attempts;");
  up.Bind(1, id).Bind(2, placement).Bind(3, now).Bind(4, decision_json);
  if (up.Step() != SQLITE_ROW) {
    (void)Exec("ROLLBACK;");
    return Status::NotFound("request '" + id + "' is not waiting to run");
  }
  const int64_t n = up.Int(0);
  up.Step();
  Stmt at(db_, "INSERT INTO attempts(request_id, n, placement, started_ms) VALUES(?1,?2,?3,?4);");
  at.Bind(1, id).Bind(2, n).Bind(3, placement).Bind(4, now);
  if (at.Step() != SQLITE_DONE) {
    (void)Exec("ROLLBACK;");
    return DbError(db_, "attempt");
  }
  return Exec("COMMIT;");
}

Status Journal::SetDecision(const std::string& id, const std::string& decision_json) {
  std::lock_guard<std::mutex> lk(mu_);
  Stmt up(db_, "UPDATE requests SET decision=?2, updated_ms=?3 WHERE id=?1;");
  up.Bind(1, id).Bind(2, decision_json).Bind(3, clock_.NowMs());
  if (up.Step() != SQLITE_DONE) return DbError(db_, "decision");
  return Status::Ok();
}

Status Journal::Requeue(const std::string& id, const std::string& error) {
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t now = clock_.NowMs();
  SPILLWAY_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE;"));
  Stmt a(db_, "UPDATE attempts SET outcome='failed', error=?2, ended_ms=?3 WHERE request_id=?1 AND ended_ms=0;");
  a.Bind(1, id).Bind(2, error).Bind(3, now);
  a.Step();
  Stmt up(db_, "UPDATE requests SET state='queued', error=?2, updated_ms=?3 WHERE id=?1 AND state IN ('queued','running');");
  up.Bind(1, id).Bind(2, error).Bind(3, now);
  up.Step();
  return Exec("COMMIT;");
}

Status Journal::Finish(const std::string& id, State state, int status, const std::string& content_type,
                       const std::string& body, const std::string& error) {
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t now = clock_.NowMs();
  SPILLWAY_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE;"));
  Stmt a(db_, "UPDATE attempts SET outcome=?2, error=?3, ended_ms=?4 WHERE request_id=?1 AND ended_ms=0;");
  a.Bind(1, id).Bind(2, std::string(StateName(state))).Bind(3, error).Bind(4, now);
  a.Step();
  // Only a non-terminal request changes: the first terminal state wins.
  Stmt up(db_,
          "UPDATE requests SET state=?2, result_status=?3, result_type=?4, result_body=?5, error=?6, updated_ms=?7 "
          "WHERE id=?1 AND state IN ('queued','running');");
  up.Bind(1, id).Bind(2, std::string(StateName(state))).Bind(3, int64_t{status}).Bind(4, content_type);
  up.Bind(5, body).Bind(6, error).Bind(7, now);
  if (up.Step() != SQLITE_DONE) {
    (void)Exec("ROLLBACK;");
    return DbError(db_, "finish");
  }
  const bool changed = sqlite3_changes(db_) > 0;
  SPILLWAY_RETURN_IF_ERROR(Exec("COMMIT;"));
  if (!changed) return Status::Conflict("request '" + id + "' had already ended");
  return Status::Ok();
}

StatusOr<RequestRecord> Journal::Get(const std::string& id) {
  std::lock_guard<std::mutex> lk(mu_);
  std::string sql = std::string("SELECT ") + kColumns + " FROM requests WHERE id=?1;";
  Stmt q(db_, sql.c_str());
  q.Bind(1, id);
  if (q.Step() != SQLITE_ROW) return Status::NotFound("no request '" + id + "'");
  return ReadRecord(q);
}

StatusOr<std::vector<AttemptRecord>> Journal::Attempts(const std::string& id) {
  std::lock_guard<std::mutex> lk(mu_);
  Stmt q(db_, "SELECT n, placement, outcome, error, started_ms, ended_ms FROM attempts WHERE request_id=?1 ORDER BY n;");
  q.Bind(1, id);
  std::vector<AttemptRecord> out;
  while (q.Step() == SQLITE_ROW) out.push_back({static_cast<int>(q.Int(0)), q.Text(1), q.Text(2), q.Text(3), q.Int(4), q.Int(5)});
  return out;
}

StatusOr<std::vector<RequestRecord>> Journal::Recover() {
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t now = clock_.NowMs();
  std::vector<RequestRecord> requeued;
  SPILLWAY_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE;"));
  {
    std::string sql = std::string("SELECT ") + kColumns + " FROM requests WHERE state IN ('queued','running') ORDER BY created_ms;";
    Stmt q(db_, sql.c_str());
    while (q.Step() == SQLITE_ROW) {
      RequestRecord r = ReadRecord(q);
      if (!r.stream) requeued.push_back(std::move(r));
    }
  }
  Stmt a(db_, "UPDATE attempts SET outcome='interrupted', error='gateway restarted', ended_ms=?1 WHERE ended_ms=0;");
  a.Bind(1, now);
  a.Step();
  Stmt rq(db_, "UPDATE requests SET state='queued', updated_ms=?1 WHERE state IN ('queued','running') AND stream=0;");
  rq.Bind(1, now);
  rq.Step();
  Stmt fr(db_,
          "UPDATE requests SET state='failed_resumable', error='the gateway restarted while the stream was open; "
          "resubmit to continue', result_status=503, result_type='application/json', updated_ms=?1 "
          "WHERE state IN ('queued','running') AND stream=1;");
  fr.Bind(1, now);
  fr.Step();
  SPILLWAY_RETURN_IF_ERROR(Exec("COMMIT;"));
  for (auto& r : requeued) r.state = State::kQueued;
  return requeued;
}

StatusOr<int> Journal::Prune() {
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t now = clock_.NowMs();
  Stmt k(db_, "UPDATE requests SET idem_key=NULL WHERE idem_key IS NOT NULL AND created_ms < ?1 AND "
              "state NOT IN ('queued','running');");
  k.Bind(1, now - opts_.idempotency_ms);
  k.Step();
  Stmt d(db_, "DELETE FROM requests WHERE created_ms < ?1 AND state NOT IN ('queued','running');");
  d.Bind(1, now - opts_.retention_ms);
  d.Step();
  const int deleted = sqlite3_changes(db_);
  Stmt da(db_, "DELETE FROM attempts WHERE request_id NOT IN (SELECT id FROM requests);");
  da.Step();
  return deleted;
}

int64_t Journal::CountByState(State s) {
  std::lock_guard<std::mutex> lk(mu_);
  Stmt q(db_, "SELECT COUNT(*) FROM requests WHERE state=?1;");
  q.Bind(1, std::string(StateName(s)));
  return q.Step() == SQLITE_ROW ? q.Int(0) : 0;
}

}  // namespace spillway::journal
