// The journal's writes: the queue and its leaders (group commit), the
// journal's thread and its checkpoints, a journal that cannot write, and each
// mutating call in its blocking and asynchronous forms.
#include <sqlite3.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <memory>
#include <optional>
#include <utility>

#include "common/thread_name.h"
#include "journal/commit_log.h"
#include "journal/journal.h"
#include "journal/journal_internal.h"

namespace spillway::journal {

using detail::Bytes;
using detail::Stmt;
using detail::kColumns;
using detail::ReadRecord;
using detail::StorageProblem;

namespace {

// WAL pages past which the journal's thread checkpoints (SQLite's own default).
constexpr int kCheckpointPages = 1000;

// Logged writes are already durable: their rows wait for company, up to
// log_apply_delay_ms or this many, so that one transaction carries many (its
// fixed cost, a few pages and the WAL's locks, paid once). Any other write, a
// read, a Flush or a stop takes them along at once.
constexpr size_t kApplyBatch = 64;

// How long the queue stays idle after rows were applied before the journal's
// thread empties the commit log (CommitLog::EmptyIfApplied).
constexpr std::chrono::milliseconds kTidyLogAfter{200};

// Runs `start(done)` and waits for `done`'s value.
template <typename T, typename Start>
T AwaitResult(Start start) {
  std::mutex m;
  std::condition_variable cv;
  std::optional<T> out;
  start([&](T v) {
    std::lock_guard<std::mutex> lk(m);
    out.emplace(std::move(v));
    cv.notify_one();  // under m: the waiter cannot return (and destroy cv) before we let go
  });
  std::unique_lock<std::mutex> lk(m);
  cv.wait(lk, [&] { return out.has_value(); });
  return std::move(*out);
}

}  // namespace

// --- group commit ---

void Journal::Submit(std::function<Status()> op, size_t bytes, OnCommit done, Lead lead) {
  auto* w = new Writer;
  w->op = std::move(op);
  w->bytes = bytes;
  w->done = std::move(done);
  Enqueue(w, lead);
}

void Journal::Enqueue(Writer* w, Lead lead) {
  const bool logged = w->log_seq != 0;
  // (A logged write's wait for company counts from here, not from its record's write: at FULL that was up to a sync earlier.)
  if (logged) w->queued_at = std::chrono::steady_clock::now();
  if (logged) ++deferred_;
  std::unique_lock<std::mutex> lk(mu_);
  writers_.push_back(w);
  if (!logged) ++urgent_;
  if (leading_) return;  // the leader (or a checkpoint) hands the queue on when done
  if (logged) {
    // The journal's thread needs to hear of the first (it times the wait) and of a full batch.
    if (writers_.size() == 1 || writers_.size() >= kApplyBatch) lead_cv_.notify_one();
    return;
  }
  if (writers_.front() == w && !checkpoint_wanted_) {  // (a wanted checkpoint goes first)
    if (lead == Lead::kWhenIdle) return LeadBatch(lk, std::unique_lock<std::mutex>(db_mu_, std::defer_lock));
  }
  lead_cv_.notify_one();
}

Status Journal::Apply(Writer* x) {
  if (x->pair_end) return ApplyPair(x->record, x->pair_end->record, &x->told, &x->pair_end->told);
  if (x->log_seq) return ApplyRecord(x->record, &x->told);
  return x->op();
}

Status Journal::Write(std::function<Status()> op, size_t bytes) {
  return AwaitResult<Status>([&](OnCommit done) { Submit(std::move(op), bytes, std::move(done), Lead::kWhenIdle); });
}

void Journal::LeadBatch(std::unique_lock<std::mutex>& lk, std::unique_lock<std::mutex> db) {
  // The front of the queue, in call order, bounded.
  std::vector<Writer*> batch;
  size_t total = 0;
  const size_t max_batch = static_cast<size_t>(std::max(1, opts_.max_batch));
  while (!writers_.empty()) {
    Writer* x = writers_.front();
    if (batch.size() == max_batch || (!batch.empty() && total + x->bytes > opts_.max_batch_bytes)) break;
    batch.push_back(x);
    total += x->bytes;
    writers_.pop_front();
    if (!x->log_seq) --urgent_;
  }
  leading_ = true;
  in_batch_ = batch.size();
  // Later calls queue meanwhile and form the next batch.
  lk.unlock();
  if (!db.owns_lock()) db.lock();
  // Rows of the log that failed to commit go in first: a write of this
  // batch may be about one of their requests (its requeue, attempt or end
  // would find no row, or be undone by a later replay). Still failing: so
  // does the batch when the storage is what fails (a failure of one
  // record's own, say SQLite's corruption, must not stop every write: the
  // batch goes on, and the replay is tried again with the next).
  std::vector<Transition> replayed;
  const bool was_stuck = log_stuck_;
  if (Status st = ReplayLocked(&replayed); !st.ok() && st.code() == StatusCode::kUnavailable) {
    for (Writer* x : batch) x->status = st;
  } else {
    PairLogged(batch);
    CommitBatch(batch);
  }
  // Logged writes whose rows committed: their records are no longer needed
  // (unless one before them did not commit: then the log is applied again).
  int64_t applied = 0, logged = 0;
  bool unapplied = false;
  for (const Writer* x : batch) {
    if (!x->log_seq) continue;
    ++logged;
    applied = std::max(applied, x->log_seq);
    unapplied |= !x->status.ok();
  }
  if (unapplied) log_stuck_ = true;
  else if (applied && !log_stuck_) log_->Applied(applied);
  const bool tidy = (applied || was_stuck) && !log_stuck_;
  db.unlock();
  deferred_ -= logged;
  lk.lock();
  if (tidy) tidy_log_at_ = std::chrono::steady_clock::now() + kTidyLogAfter;
  stats_.writes += static_cast<int64_t>(batch.size());
  stats_.largest_batch = std::max(stats_.largest_batch, static_cast<int64_t>(batch.size()));
  leading_ = false;
  in_batch_ = 0;
  if (wal_pages_ >= kCheckpointPages) checkpoint_wanted_ = true;
  // The journal's thread goes on (and times the log's tidying, when a
  // caller's batch set it: the thread may be asleep without a timeout).
  if (!writers_.empty() || checkpoint_wanted_ || stop_ || tidy) lead_cv_.notify_one();
  // Only now, after COMMIT returned, does any writer of the batch learn its
  // result, and the observer what the replay changed: no longer leading, so
  // an observer that reads the journal (and flushes its queue) cannot wait
  // for this thread.
  lk.unlock();
  for (const auto& t : replayed) Tell(t);
  for (Writer* x : batch) {
    std::unique_ptr<Writer> owned(x);
    if (x->log_seq) {
      // Durable before (its record); told once its rows are committed, on this thread.
      if (x->status.ok() && x->told) Tell(*x->told);
      // Its caller, when it waited for its rows too: durable either way (rows that failed come again from the log).
      if (x->paced) x->paced(Status::Ok());
      continue;
    }
    if (x->done) x->done(std::move(x->status));
  }
  lk.lock();
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
  // A write alone in its batch needs no savepoint: if it fails, the whole
  // transaction is rolled back, which is it.
  const bool alone = batch.size() == 1;
  for (Writer* x : batch) {
    if (x->absorbed_by) {  // (an earlier write of the batch applied it)
      x->status = x->absorbed_by->status;
      continue;
    }
    if (!alone && exec("SAVEPOINT w;") != SQLITE_OK) {
      x->status = DbError("savepoint");
    } else {
      x->status = Apply(x);
      // A failed write is undone alone: the others of the batch stay.
      if (alone && !x->status.ok()) {
        if (!sqlite3_get_autocommit(db_)) (void)exec("ROLLBACK;");
        return;  // (its own failure, not the batch's: no failed commit)
      }
      if (!x->status.ok() && !sqlite3_get_autocommit(db_)) (void)exec("ROLLBACK TO w;");
      if (!alone && !sqlite3_get_autocommit(db_)) (void)exec("RELEASE w;");
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

int Journal::OnWalCommit(void* self, sqlite3*, const char*, int pages) {
  static_cast<Journal*>(self)->wal_pages_ = pages;
  return SQLITE_OK;
}

void Journal::RunThread() {
  NameThisThread("sw-journal");
  std::unique_lock<std::mutex> lk(mu_);
  while (true) {
    auto work = [&] { return !leading_ && (stop_ || checkpoint_wanted_ || !writers_.empty()); };
    if (tidy_log_at_ == std::chrono::steady_clock::time_point{}) {
      lead_cv_.wait(lk, [&] { return work() || tidy_log_at_ != std::chrono::steady_clock::time_point{}; });
      if (!work()) continue;  // a tidying to time
    } else if (!lead_cv_.wait_until(lk, tidy_log_at_, work)) {
      // Idle a while after rows were applied: the log is begun again even
      // when its records fill less than the 4 KiB that Applied waits for.
      tidy_log_at_ = {};
      lk.unlock();
      log_->EmptyIfApplied();
      lk.lock();
      continue;
    }
    if (checkpoint_wanted_) {
      // Holds the queue like a batch: callers queue meanwhile, nobody leads.
      checkpoint_wanted_ = false;
      leading_ = true;
      lk.unlock();
      Checkpoint();
      lk.lock();
      leading_ = false;
    } else if (!writers_.empty()) {
      // Only logged writes, fewer than a batch, the oldest recent: they wait for more.
      const auto due = writers_.front()->queued_at + std::chrono::milliseconds(opts_.log_apply_delay_ms);
      if (!urgent_ && !stop_ && writers_.size() < kApplyBatch && std::chrono::steady_clock::now() < due) {
        lead_cv_.wait_until(lk, due);
        continue;
      }
      LeadBatch(lk, std::unique_lock<std::mutex>(db_mu_, std::defer_lock));
    } else if (stop_) {
      return;
    }
  }
}

void Journal::Checkpoint() {
  // Between batches (the connection held): PASSIVE copies what no reader of
  // another connection still needs, and the next commit restarts the WAL.
  std::lock_guard<std::mutex> db(db_mu_);
  int log = 0, copied = 0;
  if (sqlite3_wal_checkpoint_v2(db_, nullptr, SQLITE_CHECKPOINT_PASSIVE, &log, &copied) != SQLITE_OK) return;
  if (copied >= log) wal_pages_ = 0;  // asked again only after the next commits fill it
}

void Journal::Flush() {
  log_->Drain();  // records still on their way to the disk join the queue first
  FlushQueue();
}

void Journal::FlushQueue() {
  (void)AwaitResult<Status>([&](OnCommit done) { Submit([] { return Status::Ok(); }, 0, std::move(done), Lead::kNever); });
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

Status Journal::LogTakesNoMore() const {
  if (!log_ || !log_->broken()) return Status::Ok();
  return Status::Unavailable(
             "the request journal cannot write: its commit log could not cut off a failed record and takes no "
             "more records; restart spillway once the disk is healthy")
      .WithRetryAfter(30);
}

Status Journal::WriteGate(bool* retrying) {
  // Until a restart: neither the retry time nor a probe's row changes it.
  SPILLWAY_RETURN_IF_ERROR(LogTakesNoMore());
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

Status Journal::Refusal() {
  SPILLWAY_RETURN_IF_ERROR(LogTakesNoMore());
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t now = clock_.NowMs();
  return writable_ || now >= retry_at_ms_ ? Status::Ok() : CannotWrite(now);
}

Status Journal::Health() {
  bool retrying = false;
  SPILLWAY_RETURN_IF_ERROR(WriteGate(&retrying));
  if (!retrying) return Status::Ok();
  // A probe, so that a journal nobody writes to (clients sent away by
  // /readyz) still finds out that the disk has room again.
  (void)Probe();
  SPILLWAY_RETURN_IF_ERROR(LogTakesNoMore());
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
  s.queued = static_cast<int64_t>(writers_.size() + in_batch_);
  return s;
}

// --- the writes ---
// Each op runs on the leader's thread inside the batch's transaction and
// owns what it needs (captured by value): an asynchronous caller has moved on.

std::function<Status()> Journal::AcceptOp(std::shared_ptr<const RequestRecord> rec,
                                          std::shared_ptr<std::optional<AcceptResult>> out, int64_t now) {
  // Runs in queue order inside the batch: a second Accept with the same key
  // sees the first one's row.
  return [this, rec = std::move(rec), out = std::move(out), now]() -> Status {
    const RequestRecord& r = *rec;
    if (!r.idempotency_key.empty()) {
      std::string sql = std::string("SELECT ") + kColumns + " FROM requests WHERE client=?1 AND idem_key=?2;";
      Stmt q(*stmts_, sql.c_str());
      q.Bind(1, r.client).Bind(2, r.idempotency_key);
      const int found = q.Step();
      if (found != SQLITE_ROW && found != SQLITE_DONE) return DbError("idempotency key");  // (not "no such key")
      if (found == SQLITE_ROW) {
        RequestRecord old = ReadRecord(q);
        AcceptOutcome o = old.payload_hash != r.payload_hash ? AcceptOutcome::kMismatch
                          : IsTerminal(old.state)            ? AcceptOutcome::kReplay
                                                             : AcceptOutcome::kInFlight;
        *out = AcceptResult{o, std::move(old)};
        return Status::Ok();
      }
    }
    Stmt ins(*stmts_,
             "INSERT INTO requests(id, client, idem_key, payload_hash, service, endpoint, stream, body, state, "
             "created_ms, updated_ms, body_type, deadline_ms) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,'queued',?9,?9,?10,?11);");
    ins.Bind(1, r.id).Bind(2, r.client).BindNullable(3, r.idempotency_key).Bind(4, r.payload_hash);
    ins.Bind(5, r.service).Bind(6, r.endpoint).Bind(7, int64_t{r.stream}).Bind(8, r.body).Bind(9, now).Bind(10, r.body_type);
    ins.Bind(11, r.deadline_ms);
    if (ins.Step() != SQLITE_DONE) {
      if (sqlite3_extended_errcode(db_) == SQLITE_CONSTRAINT_PRIMARYKEY) {
        return Status::Conflict("request id '" + r.id + "' already exists");
      }
      return DbError("insert");
    }
    *out = AcceptResult{AcceptOutcome::kNew, r};
    return Status::Ok();
  };
}

std::function<Status()> Journal::StartOp(std::string id, std::string placement, std::string decision_json, int64_t now,
                                         std::shared_ptr<int64_t> n) {
  return [this, id = std::move(id), placement = std::move(placement), decision_json = std::move(decision_json), now,
          n = std::move(n)]() -> Status {
    Stmt up(*stmts_,
            "UPDATE requests SET state='running', placement=?2, attempts=attempts+1, updated_ms=?3, "
            "decision=CASE WHEN ?4 = '' THEN decision ELSE ?4 END "
            "WHERE id=?1 AND state IN ('queued','running') RETURNING attempts;");
    up.Bind(1, id).Bind(2, placement).Bind(3, now).Bind(4, decision_json);
    if (const int rc = up.Step(); rc != SQLITE_ROW) {
      // (An error, such as a lock another program held past the busy
      // timeout, is not "not waiting": it read as the request ended.)
      if (rc != SQLITE_DONE) return DbError("attempt");
      return Status::NotFound("request '" + id + "' is not waiting to run");
    }
    *n = up.Int(0);
    up.Step();
    // An attempt still open (its requeue could not be recorded) ended before
    // this one began: left open beside it, a crash interrupted both, and the
    // poison rule counted two restarts for one.
    SPILLWAY_RETURN_IF_ERROR(EndOpenAttempts(id, "failed", "its end was not recorded", now, "attempt"));
    Stmt at(*stmts_, "INSERT INTO attempts(request_id, n, placement, started_ms) VALUES(?1,?2,?3,?4);");
    at.Bind(1, id).Bind(2, *n).Bind(3, placement).Bind(4, now);
    return Done(at.Step(), "attempt");
  };
}

void Journal::AcceptImpl(RequestRecord r, std::function<void(StatusOr<AcceptResult>)> done, Lead lead) {
  if (Status gate = WriteGate(nullptr); !gate.ok()) return done(gate);
  const int64_t now = clock_.NowMs();
  const size_t bytes = Bytes(r.body);
  auto out = std::make_shared<std::optional<AcceptResult>>();
  Submit(AcceptOp(std::make_shared<const RequestRecord>(std::move(r)), out, now), bytes,
         [out, now, done = std::move(done)](Status st) {
           if (!st.ok()) return done(std::move(st));
           AcceptResult res = std::move(**out);
           if (res.outcome == AcceptOutcome::kNew) {
             res.existing.state = State::kQueued;
             res.existing.created_ms = res.existing.updated_ms = now;
           }
           done(std::move(res));
         },
         lead);
}

Journal::OnCommit Journal::AttemptStarted(std::string id, std::string placement, std::string decision_json,
                                         std::shared_ptr<int64_t> n, OnCommit done) {
  return [this, id = std::move(id), placement = std::move(placement), decision_json = std::move(decision_json),
          n = std::move(n), done = std::move(done)](Status st) {
    if (st.ok()) Tell({Transition::Kind::kAttempt, id, placement, *n, State::kRunning, "", decision_json});
    done(std::move(st));
  };
}

void Journal::StartAttemptImpl(std::string id, std::string placement, std::string decision_json, OnCommit done,
                               Lead lead) {
  const int64_t now = clock_.NowMs();
  auto n = std::make_shared<int64_t>(0);
  const size_t bytes = Bytes(decision_json);
  Submit(StartOp(id, placement, decision_json, now, n), bytes,
         AttemptStarted(id, placement, decision_json, n, std::move(done)),
         lead);
}

void Journal::AcceptAndStartAsync(const RequestRecord& r, std::string placement, std::string decision_json, OnCommit done,
                                  bool defer_sync) {
  if (Status gate = WriteGate(nullptr); !gate.ok()) return done(gate);
  const int64_t now = clock_.NowMs();
  if (r.idempotency_key.empty()) {
    // Nothing to look up: a commit-log record (the rows an Accept and then a
    // StartAttempt would leave), its observer told once they are committed.
    return AcceptAndStartLogged(r, placement, decision_json, now, std::move(done), defer_sync);
  }
  const size_t bytes = Bytes(r.body, decision_json);
  auto out = std::make_shared<std::optional<AcceptResult>>();
  auto n = std::make_shared<int64_t>(0);
  const std::string id = r.id;
  auto accept = AcceptOp(std::make_shared<const RequestRecord>(r), out, now);
  auto start = StartOp(id, placement, decision_json, now, n);
  // One write: both or neither (a failed start rolls the Accept back with it).
  auto op = [accept = std::move(accept), start = std::move(start), out, id]() -> Status {
    SPILLWAY_RETURN_IF_ERROR(accept());
    if ((*out)->outcome != AcceptOutcome::kNew) return Status::Conflict("request '" + id + "' is already known");
    return start();
  };
  Submit(std::move(op), bytes, AttemptStarted(id, placement, decision_json, n, std::move(done)), Lead::kNever);
}

void Journal::SetDecisionImpl(std::string id, std::string decision_json, OnCommit done, Lead lead) {
  const int64_t now = clock_.NowMs();
  const size_t bytes = Bytes(decision_json);
  auto op = [this, id = std::move(id), decision_json = std::move(decision_json), now]() -> Status {
    Stmt up(*stmts_, "UPDATE requests SET decision=?2, updated_ms=?3 WHERE id=?1;");
    up.Bind(1, id).Bind(2, decision_json).Bind(3, now);
    return Done(up.Step(), "decision");
  };
  Submit(std::move(op), bytes, std::move(done), lead);
}

void Journal::RequeueImpl(std::string id, std::string error, OnCommit done, Lead lead) {
  const int64_t now = clock_.NowMs();
  auto changed = std::make_shared<bool>(false);
  const size_t bytes = Bytes(error);
  auto op = [this, id, error, now, changed]() -> Status {
    SPILLWAY_RETURN_IF_ERROR(EndOpenAttempts(id, "failed", error, now, "requeue"));
    Stmt up(*stmts_,
            "UPDATE requests SET state='queued', error=?2, updated_ms=?3 WHERE id=?1 AND state IN ('queued','running');");
    up.Bind(1, id).Bind(2, error).Bind(3, now);
    SPILLWAY_RETURN_IF_ERROR(Done(up.Step(), "requeue"));
    *changed = sqlite3_changes(db_) > 0;
    return Status::Ok();
  };
  Submit(std::move(op), bytes,
         [this, id, error, changed, done = std::move(done)](Status st) {
           if (st.ok() && *changed) Tell({Transition::Kind::kRequeued, id, "", 0, State::kQueued, error, ""});
           done(std::move(st));
         },
         lead);
}

void Journal::FinishImpl(std::string id, State state, int status, std::string content_type, std::string body,
                         std::string error, OnCommit done, Lead lead) {
  const int64_t now = clock_.NowMs();
  auto changed = std::make_shared<bool>(false);
  const size_t bytes = Bytes(body, error);
  auto op = [this, id, state, status, content_type = std::move(content_type), body = std::move(body), error, now,
             changed]() -> Status { return FinishRows(id, state, status, content_type, body, error, now, changed.get()); };
  Submit(std::move(op), bytes,
         [this, id, state, status, error, changed, done = std::move(done)](Status st) {
           if (!st.ok()) return done(std::move(st));
           if (!*changed) return done(Status::Conflict("request '" + id + "' had already ended"));
           Tell({Transition::Kind::kFinished, id, "", 0, state, error, "", status});
           done(Status::Ok());
         },
         lead);
}

// The blocking forms commit on the caller's thread when nothing else is being
// written; the asynchronous ones never (see journal.h).

StatusOr<AcceptResult> Journal::Accept(RequestRecord r) {
  return AwaitResult<StatusOr<AcceptResult>>(
      [&](auto done) { AcceptImpl(std::move(r), std::move(done), Lead::kWhenIdle); });
}
Status Journal::StartAttempt(const std::string& id, const std::string& placement, const std::string& decision_json) {
  return AwaitResult<Status>(
      [&](OnCommit done) { StartAttemptImpl(id, placement, decision_json, std::move(done), Lead::kWhenIdle); });
}
Status Journal::SetDecision(const std::string& id, const std::string& decision_json) {
  return AwaitResult<Status>(
      [&](OnCommit done) { SetDecisionImpl(id, decision_json, std::move(done), Lead::kWhenIdle); });
}
Status Journal::Requeue(const std::string& id, const std::string& error) {
  return AwaitResult<Status>([&](OnCommit done) { RequeueImpl(id, error, std::move(done), Lead::kWhenIdle); });
}
Status Journal::Finish(const std::string& id, State state, int status, const std::string& content_type,
                       const std::string& body, const std::string& error) {
  return AwaitResult<Status>([&](OnCommit done) {
    FinishImpl(id, state, status, content_type, body, error, std::move(done), Lead::kWhenIdle);
  });
}

Status Journal::RecordEvent(const std::string& kind, const std::string& service, const std::string& detail_json) {
  return AwaitResult<Status>([&](OnCommit done) { RecordEventAsync(kind, service, detail_json, std::move(done)); });
}

void Journal::RecordEventAsync(std::string kind, std::string service, std::string detail_json, OnCommit done) {
  const int64_t now = clock_.NowMs();
  const size_t bytes = Bytes(detail_json);
  auto op = [this, now, kind = std::move(kind), service = std::move(service), detail = std::move(detail_json)]() -> Status {
    Stmt ins(*stmts_, "INSERT INTO events(at_ms, kind, service, detail) VALUES(?1,?2,?3,?4);");
    ins.Bind(1, now).Bind(2, kind).Bind(3, service).Bind(4, detail);
    return Done(ins.Step(), "event");
  };
  Submit(std::move(op), bytes, std::move(done), Lead::kNever);
}

// The journal's thread commits them all: an I/O thread never runs SQLite.
void Journal::AcceptAsync(RequestRecord r, std::function<void(StatusOr<AcceptResult>)> done) {
  AcceptImpl(std::move(r), std::move(done), Lead::kNever);
}
void Journal::StartAttemptAsync(std::string id, std::string placement, std::string decision_json, OnCommit done) {
  StartAttemptImpl(std::move(id), std::move(placement), std::move(decision_json), std::move(done), Lead::kNever);
}
void Journal::SetDecisionAsync(std::string id, std::string decision_json, OnCommit done) {
  SetDecisionImpl(std::move(id), std::move(decision_json), std::move(done), Lead::kNever);
}
void Journal::RequeueAsync(std::string id, std::string error, OnCommit done) {
  RequeueImpl(std::move(id), std::move(error), std::move(done), Lead::kNever);
}
}  // namespace spillway::journal
