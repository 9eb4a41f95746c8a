// The request journal: SQLite in WAL mode under the state directory.
//
// Contract (docs/DESIGN.md invariant 1): a request is written before the client
// sees any acceptance, and every state change is written before it takes
// effect, so after a crash each acknowledged request is found in the journal.
// Every mutating call (Accept, StartAttempt, SetDecision, Requeue, Finish,
// Recover, Prune) returns only after the transaction holding its change has
// committed, i.e. is durable at the configured mode: nothing is acknowledged
// before the commit that covers it.
//
// Durability: synchronous=FULL by default (each commit is fsynced: survives
// power loss); "normal" survives a process crash but may lose the last
// commits on power loss. The mode in force is reported by synchronous_mode().
//
// Group commit (LevelDB's writer queue, DBImpl::Write): mutating calls queue
// in call order. One leader at a time takes the front of the queue (at most
// max_batch writes and about max_batch_bytes of payload), runs them in queue
// order inside one BEGIN IMMEDIATE ... COMMIT (one fsync at FULL), then tells
// each write its own result. Writes later in a batch see the earlier ones
// (two Accepts with one idempotency key: the first is new, the second in
// flight). Each write runs under its own SAVEPOINT: a write that fails
// (unknown id, duplicate id...) is rolled back alone and fails alone. A failed
// COMMIT fails the whole batch: none of its writes was acknowledged.
// max_batch = 1 turns grouping off.
//
// Who leads: a blocking call that finds nothing being written commits on its
// own thread; otherwise the journal's own thread leads whatever is queued.
// An asynchronous call (the ...Async forms, for the gateway's I/O threads)
// never waits and never commits on its caller's thread: a caller that led
// would run the whole queue's transaction (up to a batch of other requests'
// rows) and then the observer, which may read the journal, on an I/O thread.
// AcceptAsync, StartAttemptAsync and AcceptAndStartAsync overlap with what
// the caller does next (sending the attempt; the worker computes meanwhile);
// the logged ones (AcceptAndStartAsync, FinishAsync) are durable once their
// commit-log record is, on the caller's thread at NORMAL (a write, no sync).
// `done` runs on whichever thread committed. Calls queued in an order commit
// in that order, so an asynchronous Accept followed at once by a StartAttempt
// for the same request needs no wait in between (AcceptAndStartAsync makes
// them one write: one commit for certain). WAL checkpoints (which fsync) run
// on the journal's thread between batches, never inside a commit.
//
// A journal that cannot write (I/O error, disk full: a commit failed on the
// storage) says so in Health(), and every new Accept fails at once with
// Unavailable, the reason and a Retry-After, without touching the disk; what
// was acknowledged before stays as it was. Writes for requests already
// accepted still try the disk. After unwritable_retry_ms one Accept (or a
// Health() probe) tries again; any write that commits makes it writable.
//
// Idempotency (IETF httpapi Idempotency-Key draft): keys are scoped per
// client; the same key with the same payload returns the stored request, with
// another payload is a mismatch (422), while the first is running it is in
// flight (409). Keys expire after idempotency_ms; rows after retention_ms.
//
// The commit log (commit_log.h): the request path's two hot writes, a new
// request without an idempotency key running its first attempt
// (AcceptAndStartAsync) and a request's end (FinishAsync), are durable once
// their record is appended to <db>-log (fdatasync'ed at FULL, concurrent
// appends sharing one sync): a few hundred bytes instead of a transaction's
// pages, so the end of a request no longer waits for a SQLite commit. A
// caller that shows nothing of a request before its end (a non-streamed
// one) defers the first record's sync: the end's sync covers both, so such
// a request costs one fdatasync at FULL, not two. Their
// rows follow in the queue like any write (in log order, so a later write for
// the same request sees them), committed by the journal's thread. Reads
// (Get, Attempts, CountByState) first wait for the logged writes queued
// before them, so a caller reads what it was told is durable. The observer
// hears of a logged write once its rows are committed. A record whose rows
// did not commit stays in the log and is applied again first by the next
// batch (or read); a process that dies first leaves it for the next Open, which
// applies every record left (each applies idempotently) before anything else.
// A journal closed with every row committed leaves its log empty.
//
// Thread-safe: one connection; writes go through the queue, reads take the
// connection between batches.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "common/survive.h"
#include "journal/storage_faults.h"

struct sqlite3;

namespace spillway::journal {

class CommitLog;
namespace detail {
struct StartRecord;  // a logged start's fields, read back (journal_logged.cpp)
struct EndRecord;    // a logged end's
}  // namespace detail

enum class State { kQueued, kRunning, kCompleted, kFailedResumable, kFailed, kCancelled };
const char* StateName(State s);
bool IsTerminal(State s);

struct RequestRecord {
  std::string id;
  std::string client = "anonymous";
  std::string idempotency_key;  // empty: none
  std::string payload_hash;
  std::string service;
  std::string endpoint;         // chat | completion | embedding, or an external service's route ("/v1/rerank")
  bool stream = false;
  std::string body;             // the request as received, to re-run after a crash
  std::string body_type;        // its content type when not JSON (a multipart upload to an external service)
  State state = State::kQueued;
  std::string placement;
  int attempts = 0;
  std::string error;
  int result_status = 0;
  std::string result_type;      // content type of result_body
  std::string result_body;
  std::string decision;         // the admission decision, JSON
  int64_t created_ms = 0;
  int64_t updated_ms = 0;
  int64_t deadline_ms = 0;      // X-Request-Timeout as a time (unix ms; 0: none): a restart keeps it
  // Recover: an attempt of it was open when a gateway stopped (this start's
  // predecessor or an earlier one), which may have reached its server; not
  // only attempts that did not (requeued after them). Recover returns every
  // request queued.
  bool interrupted = false;
};

struct JournalOptions {
  bool synchronous_full = true;
  int64_t retention_ms = 7LL * 24 * 3600 * 1000;
  int64_t idempotency_ms = 24LL * 3600 * 1000;
  // Group commit bounds: writes per transaction, and payload bytes (request
  // and answer bodies) per transaction, past the first write.
  int max_batch = 256;
  size_t max_batch_bytes = 8u << 20;
  // After a failed commit: how long new requests are refused before a write
  // is tried again.
  int64_t unwritable_retry_ms = 5000;
  // How long the rows of a logged write (already durable in the commit log)
  // may wait for others to share their transaction; any other write, a read
  // or a Flush takes them along at once.
  int64_t log_apply_delay_ms = 100;
  // At FULL, how long a deferred commit-log record (AcceptAndStartAsync's
  // defer_sync) may wait for a later record to share its fdatasync.
  int64_t deferred_sync_ms = 50;
  // Test-only storage faults; null: SQLite's default VFS, untouched.
  std::shared_ptr<StorageFaults> faults;
};

// Counters, for tests and benchmarks.
struct JournalStats {
  int64_t writes = 0;          // mutating calls completed (ok or not)
  int64_t commits = 0;         // transactions committed: one fsync each at FULL
  int64_t logged = 0;          // commit-log records durable (their rows follow in commits)
  int64_t failed_commits = 0;  // batches that did not commit
  int64_t largest_batch = 0;
  int64_t paired = 0;          // requests whose start and end rows were applied together
  int64_t queued = 0;          // writes queued now, the running batch included
};

struct AttemptRecord {
  int n = 0;
  std::string placement, outcome, error;  // outcome: running | completed | failed | ... | interrupted
  int64_t started_ms = 0, ended_ms = 0;   // ended_ms 0: still running
};

enum class AcceptOutcome { kNew, kReplay, kInFlight, kMismatch };

struct AcceptResult {
  AcceptOutcome outcome;
  RequestRecord existing;  // for kReplay / kInFlight / kMismatch
};

// A request's transition, told to the observer once its commit is durable.
struct Transition {
  enum class Kind { kAttempt, kRequeued, kFinished };
  Kind kind = Kind::kAttempt;
  std::string id;
  std::string placement;  // kAttempt: where attempt `attempt` runs
  int64_t attempt = 0;    // kAttempt
  State state = State::kQueued;  // kFinished: the terminal state
  std::string error;      // kRequeued, kFinished: why
  std::string decision_json;  // kAttempt: its admission decision, as journaled ("" when none)
  int64_t status = 0;         // kFinished: the answer's HTTP status (0: not known)
};

class Journal {
 public:
  ~Journal();
  static StatusOr<std::unique_ptr<Journal>> Open(const std::string& path, JournalOptions opts, const Clock& clock);

  // Writes a new request (state queued) unless its idempotency key is known.
  StatusOr<AcceptResult> Accept(RequestRecord r);
  // queued -> running attempt k+1 on `placement`, with its admission decision
  // (JSON, optional) in the same transaction.
  Status StartAttempt(const std::string& id, const std::string& placement, const std::string& decision_json = "");
  // Records the admission decision (JSON) of the current attempt.
  Status SetDecision(const std::string& id, const std::string& decision_json);
  // An attempt failed but the request goes on (re-queued for another attempt).
  Status Requeue(const std::string& id, const std::string& error);
  // Terminal: completed / failed / failed-resumable / cancelled, with the answer.
  Status Finish(const std::string& id, State state, int status, const std::string& content_type,
                const std::string& body, const std::string& error = "");

  // The same writes, asynchronous: queued in call order, `done` called with
  // the result once the transaction holding the write has committed (or
  // failed), on the thread that committed it (see "Who leads" above). Keep
  // `done` short: post the result to where it is wanted.
  using OnCommit = std::function<void(Status)>;
  void AcceptAsync(RequestRecord r, std::function<void(StatusOr<AcceptResult>)> done);
  void StartAttemptAsync(std::string id, std::string placement, std::string decision_json, OnCommit done);
  // A new request and its first attempt in one write, for a request admitted
  // at once: without an idempotency key, a commit-log record (see above),
  // for an id nobody has used (the gateway's own: an id already journaled is
  // taken for this record applied before); with a key, one transaction.
  // `defer_sync` (a record in the log, at FULL): its fdatasync waits for the
  // next record that has one, for SyncNow(), or for the log's lazy wait
  // (commit_log.h): for a caller that shows nothing of the request before
  // its end, whose FinishAsync record then makes both durable in one sync.
  void AcceptAndStartAsync(const RequestRecord& r, std::string placement, std::string decision_json, OnCommit done,
                           bool defer_sync = false);
  // Makes deferred commit-log records durable now (a caller that needs one
  // before its next write).
  void SyncNow();
  void SetDecisionAsync(std::string id, std::string decision_json, OnCommit done);
  void RequeueAsync(std::string id, std::string error, OnCommit done);
  // A commit-log record (see above): `done` hears that it is durable; a
  // request that had already ended keeps its first terminal state (the
  // blocking Finish says Conflict instead).
  void FinishAsync(const std::string& id, State state, int status, const std::string& content_type,
                   const std::string& body, const std::string& error, OnCommit done);
  // Returns once every write queued before the call has committed or failed.
  void Flush();

  StatusOr<RequestRecord> Get(const std::string& id);
  // A request's attempts, in order.
  StatusOr<std::vector<AttemptRecord>> Attempts(const std::string& id);

  // After a crash: running/queued requests that can be re-run safely
  // (non-streaming) go back to queued and are returned; the others become
  // failed-resumable. One whose attempts were cut by kMaxInterruptedRuns
  // restarts is failed instead (it may be what stops the gateway).
  static constexpr int kMaxInterruptedRuns = 3;
  StatusOr<std::vector<RequestRecord>> Recover();
  // At a clean stop (SIGTERM): the attempts still open end as "stopped",
  // which Recover re-runs without counting them as cut by a crash (three
  // quick restarts by an operator are not a poison request).
  Status AttemptsStopped();
  // Drops expired idempotency keys, then rows older than the retention
  // whose keys (if any) have expired.
  StatusOr<int> Prune();

  // What the resource manager did on a device (a service loaded, unloaded,
  // evicted for another, refused room), kept like requests for the
  // retention: `detail` is JSON. Blocking (a write like the others).
  Status RecordEvent(const std::string& kind, const std::string& service, const std::string& detail_json);
  // The same, queued (in call order with the other writes); `done` once committed.
  void RecordEventAsync(std::string kind, std::string service, std::string detail_json, OnCommit done);
  struct Event {
    int64_t at_ms = 0;
    std::string kind, service, detail;
  };
  // The newest `limit` events, newest first.
  StatusOr<std::vector<Event>> RecentEvents(int limit);
  // How long a journal that cannot write waits before it tries again.
  int64_t unwritable_retry_ms() const { return opts_.unwritable_retry_ms; }
  // As SQLite reported it at Open (no read of the connection: never waits for a commit).
  const std::string& synchronous_mode() const { return synchronous_mode_; }
  int64_t CountByState(State s);

  // Ok, or Unavailable with why the journal cannot write and a retry-after.
  // When the retry time has come, probes with a small write first.
  Status Health();
  // What an Accept would be told now without touching the disk: Unavailable
  // while the journal refuses new requests, else Ok. No side effects.
  Status Refusal();
  JournalStats stats();
  // Called after each committed StartAttempt, Requeue and Finish that changed
  // a request, on the writing thread: keep it short, never call the journal
  // from it. Set before the first write (not synchronised with writers).
  void SetObserver(std::function<void(const Transition&)> f) { observer_ = std::move(f); }

  class StmtCache;  // the connection's prepared statements (journal.cpp)

 private:
  struct Writer;
  Journal(sqlite3* db, JournalOptions opts, const Clock& clock);
  Status Exec(const std::string& sql);
  // Queues `op` (run by a leader inside a transaction, connection held);
  // `done` gets its result once the transaction covering it has committed.
  // How a caller may lead: never (the journal's thread commits: an
  // asynchronous call), or when nothing else is being written (a blocking
  // call: it waits anyway).
  enum class Lead { kNever, kWhenIdle };
  void Submit(std::function<Status()> op, size_t bytes, OnCommit done, Lead lead);
  // Queues `w` (taken), as Submit does; a logged write's once its record is durable.
  void Enqueue(Writer* w, Lead lead);
  // What `x` does inside the batch's transaction.
  Status Apply(Writer* x);
  // Submit, then wait for the result (the blocking calls).
  Status Write(std::function<Status()> op, size_t bytes);
  // The write behind each public call; `lead` as in Submit.
  // The statements of an Accept and of a StartAttempt, for one write or two.
  std::function<Status()> AcceptOp(std::shared_ptr<const RequestRecord> rec,
                                   std::shared_ptr<std::optional<AcceptResult>> out, int64_t now);
  std::function<Status()> StartOp(std::string id, std::string placement, std::string decision_json, int64_t now,
                                  std::shared_ptr<int64_t> n);
  // Ends request `id`'s open attempts (ended_ms 0) as `outcome` with
  // `error` (a finish, a requeue, the next attempt's start). `what` names the
  // step in a database error.
  Status EndOpenAttempts(const std::string& id, std::string_view outcome, const std::string& error, int64_t now,
                         const char* what);
  // The commit log (journal_logged.cpp). A request's end, in rows.
  Status FinishRows(const std::string& id, State state, int64_t status, const std::string& content_type,
                    const std::string& body, const std::string& error, int64_t now, bool* changed);
  // Applies one record inside the open transaction (db_mu_ held): a new
  // request without an idempotency key as running its first attempt (the
  // rows an Accept then a StartAttempt would leave), or a request's end.
  // Idempotent. `told`: the transition to tell once committed, if any.
  Status ApplyRecord(const std::string& payload, std::optional<Transition>* told);
  // A new request's record and its end's record in one batch (what a short
  // request leaves): the start's write applies both as the rows they come to
  // (one insert each, not two inserts and two updates), the end's write runs
  // nothing. Only across logged writes: an unlogged one between them may be
  // about the same request.
  void PairLogged(const std::vector<Writer*>& batch);
  // Both records' rows at once, told as each alone would tell; applied one by
  // one when the request's row is there already (a replay came first).
  Status ApplyPair(const std::string& start, const std::string& end, std::optional<Transition>* told_start,
                   std::optional<Transition>* told_end);
  // A logged start's rows: running, or (with `end`) already ended as it.
  // `*existed`, and nothing written, when its request's row is there (a replay).
  Status InsertStarted(const detail::StartRecord& s, const detail::EndRecord* end, bool* existed);
  // Appends the record; `durable` once it is; its rows queued for the journal's thread.
  void AppendLogged(std::string payload, size_t bytes, OnCommit durable, bool defer_sync = false);
  void AcceptAndStartLogged(const RequestRecord& r, const std::string& placement, const std::string& decision_json,
                            int64_t now, OnCommit done, bool defer_sync);
  // Applies records in one transaction (db_mu_ held): the leftovers at Open,
  // the whole log after a logged write failed to apply.
  Status ApplyAll(const std::vector<std::string>& records, std::vector<Transition>* told = nullptr);
  // Under db_mu_, first in every batch (LeadBatch): applies the log's
  // records again when rows of it failed to commit (log_stuck_), what
  // changed in `told`; ok when nothing was due.
  Status ReplayLocked(std::vector<Transition>* told);
  // Unavailable while rows of the log could not be applied (storage
  // failing): a read would miss acknowledged requests or misstate them.
  Status RowsBehind() const;
  void AwaitApplied();  // a read waits for the logged writes queued before it
  void FlushQueue();    // Flush without waiting for the log's syncs
  // What a committed StartAttempt (alone or with its Accept) does: tell the
  // observer attempt *n began, then `done`.
  OnCommit AttemptStarted(std::string id, std::string placement, std::string decision_json, std::shared_ptr<int64_t> n,
                          OnCommit done);
  void AcceptImpl(RequestRecord r, std::function<void(StatusOr<AcceptResult>)> done, Lead lead);
  void StartAttemptImpl(std::string id, std::string placement, std::string decision_json, OnCommit done, Lead lead);
  void SetDecisionImpl(std::string id, std::string decision_json, OnCommit done, Lead lead);
  void RequeueImpl(std::string id, std::string error, OnCommit done, Lead lead);
  void FinishImpl(std::string id, State state, int status, std::string content_type, std::string body,
                  std::string error, OnCommit done, Lead lead);
  // Takes one batch off the front of the queue, commits it and tells its
  // writers (mu_ held on entry and on return, released meanwhile; `db`
  // holds db_mu_ or is taken here).
  void LeadBatch(std::unique_lock<std::mutex>& lk, std::unique_lock<std::mutex> db);
  void CommitBatch(const std::vector<Writer*>& batch);  // db_mu_ held
  void RunThread();   // the journal's thread: leads queued batches, checkpoints
  void Checkpoint();  // on the journal's thread
  static int OnWalCommit(void* self, sqlite3* db, const char* name, int pages);
  Status WriteGate(bool* retrying);
  // Refused until a restart: the commit log takes no more records (CommitLog::broken()).
  Status LogTakesNoMore() const;
  Status Probe();  // a one-row write that proves the storage takes writes
  Status CannotWrite(int64_t now) const;  // mu_ held
  Status StorageFailure(int rc, const std::string& msg);
  Status DbError(const std::string& what);
  Status Done(int step_rc, const std::string& what);  // a statement's step ran to its end, or DbError

  sqlite3* db_;
  JournalOptions opts_;
  const Clock& clock_;
  std::unique_ptr<CommitLog> log_;
  std::atomic<int64_t> deferred_{0};    // logged writes queued whose rows are not committed yet
  std::atomic<bool> log_stuck_{false};  // a logged write's rows did not commit: the log is applied again
  size_t urgent_ = 0;                   // under mu_: queued writes that are not logged ones
  std::mutex db_mu_;  // the connection: a batch, or one read
  std::unique_ptr<StmtCache> stmts_;  // under db_mu_

  std::mutex mu_;  // below
  std::deque<Writer*> writers_;  // queued, not yet in a batch (owned)
  bool leading_ = false;         // a batch is being committed
  size_t in_batch_ = 0;          // its writes
  bool stop_ = false;
  bool checkpoint_wanted_ = false;
  // Under mu_: when the journal's thread, idle since, empties an applied log (0: nothing to tidy).
  std::chrono::steady_clock::time_point tidy_log_at_{};
  std::atomic<int> wal_pages_{0};  // WAL pages after the last commit
  std::condition_variable lead_cv_;  // the journal's thread: a queue without a leader, a checkpoint, stop
  std::thread thread_;
  JournalStats stats_;
  bool writable_ = true;
  std::string unwritable_reason_;
  int64_t retry_at_ms_ = 0;
  std::string synchronous_mode_ = "unknown";
  std::function<void(const Transition&)> observer_;
  // (Survived: it runs on the journal's thread, or after a commit with the
  // batch's writers still to be told; a throw there ended the process or
  // left them waiting for good.)
  void Tell(Transition t) const {
    if (observer_) RunSurviving("spillway: the journal's observer", [&] { observer_(t); });
  }
};

}  // namespace spillway::journal
