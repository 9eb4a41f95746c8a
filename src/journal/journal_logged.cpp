// The journal's logged writes: a new request running its first attempt and a
// request's end are durable once their record is in the commit log
// (commit_log.h); the SQLite rows follow on the journal's thread. The same
// code applies a record live, again after an apply failed, and at Open for
// the records a previous process left.
#include <sqlite3.h>

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "journal/commit_log.h"
#include "journal/journal.h"
#include "journal/journal_internal.h"

namespace spillway::journal {

using detail::Bytes;
using detail::Stmt;

namespace {

enum RecordType : uint8_t { kNewRunning = 1, kFinish = 2 };

State StateOf(int64_t v) { return static_cast<State>(v); }

// Logged writes whose rows wait, past which a new one is acknowledged only
// once its rows commit, as an unlogged write is: the rows' transactions
// (SQLite statements on one thread) set the pace again, and the queue, with
// the bodies it holds, stays bounded whatever the log could take.
constexpr int64_t kMaxDeferred = 4096;

// A record that cannot be read (what a torn or damaged log may hold, or one
// of a type this build does not know): skipped by ApplyAll.
constexpr std::string_view kDamagedPrefix = "journal: unreadable log record: ";
Status Damaged(const std::string& what) { return Status::Internal(std::string(kDamagedPrefix) + what); }
bool IsDamaged(const Status& st) {
  return st.code() == StatusCode::kInternal && st.message().rfind(kDamagedPrefix, 0) == 0;
}

}  // namespace

Status Journal::EndOpenAttempts(const std::string& id, std::string_view outcome, const std::string& error, int64_t now,
                                const char* what) {
  Stmt a(*stmts_, "UPDATE attempts SET outcome=?2, error=?3, ended_ms=?4 WHERE request_id=?1 AND ended_ms=0;");
  a.Bind(1, id).Bind(2, std::string(outcome)).Bind(3, error).Bind(4, now);
  return Done(a.Step(), what);
}

Status Journal::FinishRows(const std::string& id, State state, int64_t status, const std::string& content_type,
                           const std::string& body, const std::string& error, int64_t now, bool* changed) {
  SPILLWAY_RETURN_IF_ERROR(EndOpenAttempts(id, StateName(state), error, now, "finish"));
  // Only a non-terminal request changes: the first terminal state wins. One
  // that failed or was cancelled before any attempt ran (its client went
  // away while it waited, admission refused it), or that its worker refused
  // as invalid (400, 413: it did not run either), leaves its
  // Idempotency-Key free: a retry with the key runs, rather than replay an
  // end it never reached (Stripe's rule: a result is kept only once the
  // request ran; its corrected body heard "used with a different body").
  Stmt up(*stmts_,
          "UPDATE requests SET state=?2, result_status=?3, result_type=?4, result_body=?5, error=?6, "
          "updated_ms=?7, idem_key=CASE WHEN ?2 IN ('failed','cancelled') AND (attempts=0 OR ?3 IN (400,413)) "
          "THEN NULL ELSE idem_key END "
          "WHERE id=?1 AND state IN ('queued','running');");
  up.Bind(1, id).Bind(2, std::string(StateName(state))).Bind(3, status).Bind(4, content_type);
  up.Bind(5, body).Bind(6, error).Bind(7, now);
  SPILLWAY_RETURN_IF_ERROR(Done(up.Step(), "finish"));
  *changed = sqlite3_changes(db_) > 0;
  return Status::Ok();
}

namespace detail {

struct StartRecord {
  RequestRecord r;
  std::string placement, decision;
  int64_t stream = 0, now = 0;
};
struct EndRecord {
  std::string id, content_type, body, error;
  int64_t state = 0, status = 0, now = 0;
};

}  // namespace detail

namespace {

using detail::EndRecord;
using detail::StartRecord;

// A record's fields, read back; false when it is damaged.
bool Read(RecordReader& in, StartRecord* x) {
  RequestRecord& r = x->r;
  return in.Str(&r.id) && in.Str(&r.client) && in.Str(&r.payload_hash) && in.Str(&r.service) && in.Str(&r.endpoint) &&
         in.I64(&x->stream) && in.Str(&r.body) && in.Str(&r.body_type) && in.Str(&x->placement) &&
         in.Str(&x->decision) && in.I64(&x->now) && (in.done() || in.I64(&r.deadline_ms)) && in.done();
  // (a record written before deadlines has none)
}
bool Read(RecordReader& in, EndRecord* x) {
  return in.Str(&x->id) && in.I64(&x->state) && in.I64(&x->status) && in.Str(&x->content_type) && in.Str(&x->body) &&
         in.Str(&x->error) && in.I64(&x->now) && in.done() && IsTerminal(StateOf(x->state));
}

Transition Started(const StartRecord& x) {
  return Transition{Transition::Kind::kAttempt, x.r.id, x.placement, 1, State::kRunning, "", x.decision};
}
Transition Ended(const EndRecord& x) {
  return Transition{Transition::Kind::kFinished, x.id, "", 0, StateOf(x.state), x.error, "", x.status};
}

// The type of a record and the request it is about ("" when damaged).
std::pair<uint8_t, std::string> TypeAndId(const std::string& payload) {
  RecordReader in(payload);
  uint8_t type = 0;
  std::string id;
  if (!in.U8(&type) || !in.Str(&id)) return {0, ""};
  return {type, std::move(id)};
}

}  // namespace

Status Journal::InsertStarted(const StartRecord& s, const EndRecord* end, bool* existed) {
  // Ended: the rows FinishRows would leave over these, the end's state and
  // answer, the attempt ended as it. (Its Idempotency-Key rule has nothing to
  // do: a logged start never has a key.) Running: the columns' defaults.
  const RequestRecord& r = s.r;
  const std::string state = end ? StateName(StateOf(end->state)) : StateName(State::kRunning);
  const std::string none;
  Stmt ins(*stmts_,
           "INSERT INTO requests(id, client, payload_hash, service, endpoint, stream, body, state, placement, "
           "attempts, decision, created_ms, updated_ms, body_type, deadline_ms, result_status, result_type, "
           "result_body, error) "
           "VALUES(?1,?2,?3,?4,?5,?6,?7,?13,?8,1,?9,?10,?14,?11,?12,?15,?16,?17,?18);");
  ins.Bind(1, r.id).Bind(2, r.client).Bind(3, r.payload_hash).Bind(4, r.service).Bind(5, r.endpoint);
  ins.Bind(6, s.stream).Bind(7, r.body).Bind(8, s.placement).Bind(9, s.decision).Bind(10, s.now).Bind(11, r.body_type);
  ins.Bind(12, r.deadline_ms).Bind(13, state).Bind(14, end ? end->now : s.now);
  ins.Bind(15, end ? end->status : int64_t{0}).Bind(16, end ? end->content_type : none);
  ins.Bind(17, end ? end->body : none).Bind(18, end ? end->error : none);
  *existed = false;
  if (ins.Step() != SQLITE_DONE) {
    if (sqlite3_extended_errcode(db_) != SQLITE_CONSTRAINT_PRIMARYKEY) return DbError("insert");
    *existed = true;
    return Status::Ok();
  }
  Stmt at(*stmts_,
          "INSERT INTO attempts(request_id, n, placement, outcome, error, started_ms, ended_ms) "
          "VALUES(?1,1,?2,?3,?4,?5,?6);");
  at.Bind(1, r.id).Bind(2, s.placement).Bind(3, state).Bind(4, end ? end->error : none);
  at.Bind(5, s.now).Bind(6, end ? end->now : int64_t{0});
  return Done(at.Step(), "attempt");
}

Status Journal::ApplyRecord(const std::string& payload, std::optional<Transition>* told) {
  RecordReader in(payload);
  uint8_t type = 0;
  if (!in.U8(&type)) return Damaged("an empty log record");
  if (type == kNewRunning) {
    StartRecord x;
    if (!Read(in, &x)) return Damaged("a damaged log record");
    bool existed = false;
    SPILLWAY_RETURN_IF_ERROR(InsertStarted(x, nullptr, &existed));
    // (Applied before, a replay: the row is there, with whatever came after.)
    if (told && !existed) *told = Started(x);
    return Status::Ok();
  }
  if (type == kFinish) {
    EndRecord x;
    if (!Read(in, &x)) return Damaged("a damaged log record");
    bool changed = false;
    SPILLWAY_RETURN_IF_ERROR(
        FinishRows(x.id, StateOf(x.state), x.status, x.content_type, x.body, x.error, x.now, &changed));
    if (told && changed) *told = Ended(x);
    return Status::Ok();
  }
  return Damaged("a log record of unknown type " + std::to_string(type));
}

Status Journal::ApplyPair(const std::string& start, const std::string& end, std::optional<Transition>* told_start,
                          std::optional<Transition>* told_end) {
  auto one_by_one = [&]() -> Status {
    SPILLWAY_RETURN_IF_ERROR(ApplyRecord(start, told_start));
    return ApplyRecord(end, told_end);
  };
  RecordReader in_start(start), in_end(end);
  uint8_t type_start = 0, type_end = 0;
  StartRecord s;
  EndRecord e;
  if (!in_start.U8(&type_start) || type_start != kNewRunning || !Read(in_start, &s) || !in_end.U8(&type_end) ||
      type_end != kFinish || !Read(in_end, &e) || e.id != s.r.id) {
    return one_by_one();  // (each says what is wrong with it)
  }
  bool existed = false;
  SPILLWAY_RETURN_IF_ERROR(InsertStarted(s, &e, &existed));
  if (existed) return one_by_one();  // (a replay of the log came first in this batch)
  if (told_start) *told_start = Started(s);
  if (told_end) *told_end = Ended(e);
  return Status::Ok();
}

void Journal::PairLogged(const std::vector<Writer*>& batch) {
  std::map<std::string, Writer*> started;  // request id: its start's write, earlier in the batch
  int64_t paired = 0;
  for (Writer* x : batch) {
    if (!x->log_seq) {
      started.clear();  // (an unlogged write may be about any request)
      continue;
    }
    auto [type, id] = TypeAndId(x->record);
    if (id.empty()) continue;
    if (type == kNewRunning) {
      started[id] = x;
      continue;
    }
    auto it = started.find(id);
    if (type != kFinish || it == started.end()) continue;
    it->second->pair_end = x;
    x->absorbed_by = it->second;
    started.erase(it);
    ++paired;
  }
  if (paired) {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.paired += paired;
  }
}

void Journal::AppendLogged(std::string payload, size_t bytes, OnCommit durable, bool defer_sync) {
  // The queue's entry, handed to it once the record is durable (`queued`),
  // and deleted here when the record is not written (then `queued` never runs).
  auto* w = new Writer;
  w->bytes = bytes;
  w->record = std::move(payload);
  // A backlog: this one's caller waits for its rows too (the log still holds it first).
  const bool paced = deferred_.load() >= kMaxDeferred;
  if (paced) w->paced = std::move(durable);
  log_->Append(
      w->record,  // (read before `queued` hands it on)
      [this, w](int64_t seq) {
        w->log_seq = seq;
        Enqueue(w, Lead::kNever);
      },
      [this, w, paced, durable = std::move(durable)](int rc, const std::string& what) {
        if (rc != SQLITE_OK) {
          // Not written: its rows never come. (Too large for the log, or a
          // large record with no room now, is this request's alone: the
          // journal writes on.)
          std::unique_ptr<Writer> owned(w);
          Status st = rc == CommitLog::kTooLargeRc ? Status::PayloadTooLarge("the request journal cannot hold " + what)
                      : rc == CommitLog::kNoRoomRc
                          ? Status::Unavailable("the request journal cannot take " + what).WithRetryAfter(5)
                          : StorageFailure(rc, what);
          return paced ? w->paced(std::move(st)) : durable(std::move(st));
        }
        // (`w` is the queue's now, perhaps applied and gone already.)
        {
          std::lock_guard<std::mutex> lk(mu_);
          ++stats_.logged;
        }
        if (!paced) durable(Status::Ok());
      },
      defer_sync);
}

void Journal::AcceptAndStartLogged(const RequestRecord& r, const std::string& placement, const std::string& decision_json,
                                   int64_t now, OnCommit done, bool defer_sync) {
  RecordWriter w(64 + 4 * 10 + 8 * 3 + r.id.size() + r.client.size() + r.payload_hash.size() + r.service.size() +
                 r.endpoint.size() + r.body.size() + r.body_type.size() + placement.size() + decision_json.size());
  w.U8(kNewRunning).Str(r.id).Str(r.client).Str(r.payload_hash).Str(r.service).Str(r.endpoint);
  w.I64(int64_t{r.stream}).Str(r.body).Str(r.body_type).Str(placement).Str(decision_json).I64(now).I64(r.deadline_ms);
  AppendLogged(std::move(w.out()), Bytes(r.body, decision_json), std::move(done), defer_sync);
}

void Journal::FinishAsync(const std::string& id, State state, int status, const std::string& content_type,
                          const std::string& body, const std::string& error, OnCommit done) {
  // (Read once, into the record: the strings are not kept.)
  RecordWriter w(64 + 4 * 4 + 8 * 4 + id.size() + content_type.size() + body.size() + error.size());
  w.U8(kFinish).Str(id).I64(static_cast<int64_t>(state)).I64(status).Str(content_type).Str(body).Str(error);
  w.I64(clock_.NowMs());
  AppendLogged(std::move(w.out()), Bytes(body, error), std::move(done));
}

Status Journal::ApplyAll(const std::vector<std::string>& records, std::vector<Transition>* told) {
  auto exec = [&](const char* sql) {
    Stmt st(*stmts_, sql);
    return st.Step() == SQLITE_DONE ? Status::Ok() : DbError(sql);
  };
  SPILLWAY_RETURN_IF_ERROR(exec("BEGIN IMMEDIATE;"));
  for (const auto& rec : records) {
    std::optional<Transition> t;
    Status st = ApplyRecord(rec, told ? &t : nullptr);
    if (st.ok() && t) told->push_back(std::move(*t));
    // A damaged record is skipped, not retried forever; any other failure
    // (the disk, a lock, memory) undoes the batch, which comes again: a
    // record is never dropped for a failure of SQLite's.
    if (st.ok() || IsDamaged(st)) continue;
    if (!sqlite3_get_autocommit(db_)) (void)exec("ROLLBACK;");
    return st;
  }
  Status st = exec("COMMIT;");
  if (!st.ok() && !sqlite3_get_autocommit(db_)) (void)exec("ROLLBACK;");
  return st;
}

Status Journal::ReplayLocked(std::vector<Transition>* told) {
  if (!log_stuck_) return Status::Ok();
  int64_t last = 0;
  auto records = log_->ReadAll(&last);
  if (!records.ok()) return Status::Unavailable("journal: " + records.status().message() + " (its records are kept)");
  SPILLWAY_RETURN_IF_ERROR(ApplyAll(*records, told));
  log_stuck_ = false;
  log_->Applied(last);
  // A replay that committed proves the storage writes again (the batch's
  // own writes may then change nothing: their rows came with the replay).
  std::lock_guard<std::mutex> lk(mu_);
  if (!writable_) {
    writable_ = true;
    unwritable_reason_.clear();
  }
  return Status::Ok();
}

void Journal::SyncNow() {
  if (log_) log_->SyncNow();
}

void Journal::AwaitApplied() {
  // The journal's own thread (an observer reading back) must not wait for
  // itself. Acknowledged records are in the queue already: no need to wait
  // for the log's syncs.
  // Rows that failed to commit are applied by the next batch (LeadBatch):
  // a read finds what was acknowledged even while nothing else is written.
  if ((deferred_.load() > 0 || log_stuck_) && std::this_thread::get_id() != thread_.get_id()) FlushQueue();
}

}  // namespace spillway::journal
