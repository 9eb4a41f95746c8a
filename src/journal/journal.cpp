#include "journal/journal.h"

#include <sys/stat.h>

#include <sqlite3.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <utility>

#include "journal/commit_log.h"
#include "journal/journal_internal.h"

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
  body_type TEXT NOT NULL DEFAULT '',
  deadline_ms INTEGER NOT NULL DEFAULT 0,
  created_ms INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS requests_idem ON requests(client, idem_key) WHERE idem_key IS NOT NULL;
-- No index on state: each would cost every commit a page (a request's state
-- changes in each of its commits), for what only a restart's Recover reads.
DROP INDEX IF EXISTS requests_state;
CREATE INDEX IF NOT EXISTS requests_created ON requests(created_ms);
CREATE TABLE IF NOT EXISTS attempts(
  request_id TEXT NOT NULL,
  n INTEGER NOT NULL,
  placement TEXT NOT NULL,
  outcome TEXT NOT NULL DEFAULT 'running',
  error TEXT NOT NULL DEFAULT '',
  started_ms INTEGER NOT NULL,
  ended_ms INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY(request_id, n)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events(
  at_ms INTEGER NOT NULL,
  kind TEXT NOT NULL,
  service TEXT NOT NULL,
  detail TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_at ON events(at_ms);
CREATE TABLE IF NOT EXISTS health_probe(id INTEGER PRIMARY KEY, at_ms INTEGER NOT NULL);
)sql";

}  // namespace

using detail::Bytes;
using detail::Stmt;
using detail::kColumns;
using detail::ReadRecord;
using detail::StorageProblem;

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

Journal::Journal(sqlite3* db, JournalOptions opts, const Clock& clock)
    : db_(db), opts_(std::move(opts)), clock_(clock), stmts_(std::make_unique<StmtCache>(db)) {}

Journal::~Journal() {
  // The log's last records reach the queue before the journal's thread leads it dry.
  if (log_) log_->Stop();
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;  // the thread leads what is still queued first
    }
    lead_cv_.notify_one();
    thread_.join();
  }
  // Every record's rows committed: the next Open has nothing to apply, and a
  // reader of the stopped journal's files finds the log empty.
  if (log_ && !log_stuck_) log_->EmptyIfApplied();
  log_.reset();  // after its syncs' callbacks
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
  // The connection is used under db_mu_ only (a batch, or one read): SQLite's
  // own mutex per call (FULLMUTEX) was a tenth of the journal thread's time.
  if (sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_NOFOLLOW,
                      vfs) != SQLITE_OK) {
    std::string m = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return Status::Unavailable("cannot open journal " + path + ": " + m);
  }
  sqlite3_busy_timeout(db, 5000);
  const bool full = opts.synchronous_full;
  const char* sync_sql = full ? "PRAGMA synchronous=FULL;" : "PRAGMA synchronous=NORMAL;";
  std::unique_ptr<Journal> j(new Journal(db, std::move(opts), clock));
  SPILLWAY_RETURN_IF_ERROR(j->Exec("PRAGMA journal_mode=WAL;"));
  SPILLWAY_RETURN_IF_ERROR(j->Exec(sync_sql));
  {
    Stmt mode(*j->stmts_, "PRAGMA synchronous;");
    static const char* const kModes[] = {"off", "normal", "full", "extra"};
    const int64_t m = mode.Step() == SQLITE_ROW ? mode.Int(0) : -1;
    if (m >= 0 && m < 4) j->synchronous_mode_ = kModes[m];
  }
  SPILLWAY_RETURN_IF_ERROR(j->Exec(kSchema));
  // Journals written before decisions were recorded lack the column.
  (void)j->Exec("ALTER TABLE requests ADD COLUMN decision TEXT NOT NULL DEFAULT '';");
  // ... and those written before external services, the body's content type.
  (void)j->Exec("ALTER TABLE requests ADD COLUMN body_type TEXT NOT NULL DEFAULT '';");
  // ... and those written before deadlines outlived a restart, the deadline.
  (void)j->Exec("ALTER TABLE requests ADD COLUMN deadline_ms INTEGER NOT NULL DEFAULT 0;");
  // Checkpoints (they fsync, even at NORMAL) move out of the commits, onto
  // the journal's thread: this hook replaces SQLite's automatic checkpoint.
  sqlite3_wal_hook(db, &Journal::OnWalCommit, j.get());
  // The commit log, and what a previous process left in it: applied before
  // anything else, Recover included (which must see those rows). A journal
  // that cannot apply them does not open: they stay in the log for the next try.
  std::vector<std::string> leftover;
  auto log = CommitLog::Open(path + "-log", full, j->opts_.faults, &leftover);
  if (!log.ok()) return log.status();
  j->log_ = std::move(*log);
  j->log_->set_lazy_wait(std::chrono::milliseconds(j->opts_.deferred_sync_ms));
  if (!leftover.empty()) {
    if (Status st = j->ApplyAll(leftover); !st.ok()) {
      j->log_stuck_ = true;  // this journal, dropped here, must not empty the log on its way out
      return Status::Unavailable("journal " + path + ": cannot apply the " + std::to_string(leftover.size()) +
                                 " records its commit log holds from before (they are kept): " + st.message());
    }
    j->log_->DropLeftovers();
  }
  j->thread_ = std::thread([jp = j.get()] { jp->RunThread(); });
  // A first write: a journal that cannot write starts unhealthy (and says
  // why) rather than failing its first request; and the WAL's header is
  // written (and synced) here, not within a request's commit.
  (void)j->Probe();
  return j;
}

StatusOr<std::vector<RequestRecord>> Journal::Recover() {
  const int64_t now = clock_.NowMs();
  std::vector<RequestRecord> requeued;
  SPILLWAY_RETURN_IF_ERROR(Write(
      [&]() -> Status {
        requeued.clear();
        Stmt a(*stmts_, "UPDATE attempts SET outcome='interrupted', error='gateway restarted', ended_ms=?1 WHERE ended_ms=0;");
        a.Bind(1, now);
        SPILLWAY_RETURN_IF_ERROR(Done(a.Step(), "recover"));
        // A request that was running at each of the last restarts may be what
        // ends the gateway (a poison request): not run again at every start.
        Stmt poison(*stmts_,
                    "UPDATE requests SET state='failed', error='running when the gateway crashed ' || ?2 || "
                    "' times; not run again', result_status=503, result_type='application/json', "
                    "result_body='{\"error\":{\"message\":\"request ' || id || ' was running each of the ' || ?2 || "
                    "' times the gateway crashed; it is not run again (resubmit it, with a new Idempotency-Key if it had one, to try once more)\",\"type\":"
                    "\"server_error\",\"code\":\"gateway_restarted\",\"request_id\":\"' || id || '\"}}', "
                    "updated_ms=?1 WHERE state IN ('queued','running') AND stream=0 AND (SELECT COUNT(*) FROM "
                    "attempts WHERE request_id=requests.id AND outcome='interrupted') >= ?2;");
        poison.Bind(1, now);
        poison.Bind(2, int64_t{kMaxInterruptedRuns});
        SPILLWAY_RETURN_IF_ERROR(Done(poison.Step(), "recover"));
        // Whether an attempt of it was open when a gateway stopped, at this
        // start or an earlier one: a start that recovered it and stopped
        // before it ran again left it queued, and it was sent once more
        // (a non-idempotent server's work done twice).
        std::string sql = std::string("SELECT ") + kColumns +
                          ", EXISTS(SELECT 1 FROM attempts WHERE request_id=requests.id AND outcome IN "
                          "('interrupted','stopped')) FROM requests WHERE state IN ('queued','running') AND stream=0 "
                          "ORDER BY created_ms;";
        Stmt q(*stmts_, sql.c_str());
        int rc;
        while ((rc = q.Step()) == SQLITE_ROW) {
          requeued.push_back(ReadRecord(q));
          requeued.back().interrupted = q.Int(detail::kColumnCount) != 0;
        }
        // (A read that failed part-way is an error, not a shorter list: the
        // rows left out would stay queued, never run, until the next start.)
        SPILLWAY_RETURN_IF_ERROR(Done(rc, "recover"));
        Stmt rq(*stmts_, "UPDATE requests SET state='queued', updated_ms=?1 WHERE state IN ('queued','running') AND stream=0;");
        rq.Bind(1, now);
        SPILLWAY_RETURN_IF_ERROR(Done(rq.Step(), "recover"));
        // Its answer (what GET and its Idempotency-Key's replay show) says
        // so too: it was an empty 503. The key stays bound: what the stream
        // delivered (tool calls among it) is not run again under it.
        Stmt fr(*stmts_,
                "UPDATE requests SET state='failed_resumable', error='the gateway restarted while the stream was open; "
                "resubmit to continue', result_status=503, result_type='application/json', "
                "result_body='{\"error\":{\"message\":\"the gateway restarted while the stream of request ' || id || "
                "' was open; resubmit to continue (with a new Idempotency-Key if it had one: this answer is what it "
                "replays)\",\"type\":\"server_error\",\"code\":\"gateway_restarted\",\"request_id\":\"' || id || "
                "'\"}}', updated_ms=?1 WHERE state IN ('queued','running') AND stream=1;");
        fr.Bind(1, now);
        return Done(fr.Step(), "recover");
      },
      Bytes("")));
  for (auto& r : requeued) r.state = State::kQueued;
  return requeued;
}

Status Journal::AttemptsStopped() {
  const int64_t now = clock_.NowMs();
  return Write(
      [&]() -> Status {
        Stmt a(*stmts_, "UPDATE attempts SET outcome='stopped', error='gateway stopped', ended_ms=?1 WHERE ended_ms=0;");
        a.Bind(1, now);
        return Done(a.Step(), "stop");
      },
      Bytes(""));
}

StatusOr<int> Journal::Prune() {
  const int64_t now = clock_.NowMs();
  int deleted = 0;
  SPILLWAY_RETURN_IF_ERROR(Write(
      [&]() -> Status {
        // A key lives idempotency_ms after its request ended (its last
        // change): counted from its creation, a request that ran or waited
        // long (one recovered after an outage) lost its key as it ended,
        // and a retry with the key ran it again.
        Stmt k(*stmts_, "UPDATE requests SET idem_key=NULL WHERE idem_key IS NOT NULL AND updated_ms < ?1 AND "
                    "state NOT IN ('queued','running');");
        k.Bind(1, now - opts_.idempotency_ms);
        SPILLWAY_RETURN_IF_ERROR(Done(k.Step(), "prune"));
        // A row past its retention whose key still lives stays until the key
        // expires (retention counts from creation, the key from the end).
        Stmt d(*stmts_, "DELETE FROM requests WHERE created_ms < ?1 AND idem_key IS NULL AND "
                    "state NOT IN ('queued','running');");
        d.Bind(1, now - opts_.retention_ms);
        SPILLWAY_RETURN_IF_ERROR(Done(d.Step(), "prune"));
        deleted = sqlite3_changes(db_);
        Stmt da(*stmts_, "DELETE FROM attempts WHERE request_id NOT IN (SELECT id FROM requests);");
        SPILLWAY_RETURN_IF_ERROR(Done(da.Step(), "prune"));
        Stmt de(*stmts_, "DELETE FROM events WHERE at_ms < ?1;");
        de.Bind(1, now - opts_.retention_ms);
        return Done(de.Step(), "prune");
      },
      Bytes("")));
  return deleted;
}

// --- reads: the connection between batches ---

StatusOr<std::vector<Journal::Event>> Journal::RecentEvents(int limit) {
  std::lock_guard<std::mutex> lk(db_mu_);
  Stmt q(*stmts_, "SELECT at_ms, kind, service, detail FROM events ORDER BY at_ms DESC, rowid DESC LIMIT ?1;");
  q.Bind(1, int64_t{limit});
  std::vector<Event> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) out.push_back({q.Int(0), q.Text(1), q.Text(2), q.Text(3)});
  if (rc != SQLITE_DONE) return DbError("events");
  return out;
}

Status Journal::RowsBehind() const {
  if (!log_stuck_) return Status::Ok();
  return Status::Unavailable("the request journal holds records it cannot apply yet (its storage fails); they are "
                             "kept, and applied once it writes again")
      .WithRetryAfter(static_cast<int>(std::max<int64_t>(1, opts_.unwritable_retry_ms / 1000)));
}

StatusOr<RequestRecord> Journal::Get(const std::string& id) {
  AwaitApplied();
  std::lock_guard<std::mutex> lk(db_mu_);
  SPILLWAY_RETURN_IF_ERROR(RowsBehind());
  std::string sql = std::string("SELECT ") + kColumns + " FROM requests WHERE id=?1;";
  Stmt q(*stmts_, sql.c_str());
  q.Bind(1, id);
  // (A read that failed is not "no such request": told 404, a client that
  // polls before resubmitting ran its request twice.)
  const int rc = q.Step();
  if (rc == SQLITE_ROW) return ReadRecord(q);
  if (rc == SQLITE_DONE) return Status::NotFound("no request '" + id + "'");
  return DbError("request " + id);
}

StatusOr<std::vector<AttemptRecord>> Journal::Attempts(const std::string& id) {
  AwaitApplied();
  std::lock_guard<std::mutex> lk(db_mu_);
  SPILLWAY_RETURN_IF_ERROR(RowsBehind());
  Stmt q(*stmts_, "SELECT n, placement, outcome, error, started_ms, ended_ms FROM attempts WHERE request_id=?1 ORDER BY n;");
  q.Bind(1, id);
  std::vector<AttemptRecord> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    out.push_back({static_cast<int>(q.Int(0)), q.Text(1), q.Text(2), q.Text(3), q.Int(4), q.Int(5)});
  }
  if (rc != SQLITE_DONE) return DbError("attempts of " + id);  // (not a shorter list)
  return out;
}

int64_t Journal::CountByState(State s) {
  AwaitApplied();
  std::lock_guard<std::mutex> lk(db_mu_);
  Stmt q(*stmts_, "SELECT COUNT(*) FROM requests WHERE state=?1;");
  q.Bind(1, std::string(StateName(s)));
  return q.Step() == SQLITE_ROW ? q.Int(0) : 0;
}

}  // namespace spillway::journal
