// The request journal: SQLite in WAL mode under the state directory.
//
// Contract (DESIGN.md invariant 1): a request is written before the client
// sees any acceptance, and every state change is written before it takes
// effect, so after a crash each acknowledged request is found in the journal.
//
// Durability: synchronous=FULL by default (each commit is fsynced: survives
// power loss); "normal" survives a process crash but may lose the last
// commits on power loss. The mode in force is reported by synchronous_mode().
//
// Idempotency (IETF httpapi Idempotency-Key draft): keys are scoped per
// client; the same key with the same payload returns the stored request, with
// another payload is a mismatch (422), while the first is running it is in
// flight (409). Keys expire after idempotency_ms; rows after retention_ms.
//
// Thread-safe: one connection behind a mutex.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

struct sqlite3;

namespace spillway::journal {

enum class State { kQueued, kRunning, kCompleted, kFailedResumable, kFailed, kCancelled };
const char* StateName(State s);
bool IsTerminal(State s);

struct RequestRecord {
  std::string id;
  std::string client = "anonymous";
  std::string idempotency_key;  // empty: none
  std::string payload_hash;
  std::string service;
  std::string endpoint;         // chat | completion | embedding
  bool stream = false;
  std::string body;             // the request as received, to re-run after a crash
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
};

struct JournalOptions {
  bool synchronous_full = true;
  int64_t retention_ms = 7LL * 24 * 3600 * 1000;
  int64_t idempotency_ms = 24LL * 3600 * 1000;
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
  StatusOr<RequestRecord> Get(const std::string& id);
  // A request's attempts, in order.
  StatusOr<std::vector<AttemptRecord>> Attempts(const std::string& id);

  // After a crash: running/queued requests that can be re-run safely
  // (non-streaming) go back to queued and are returned; the others become
  // failed-resumable.
  StatusOr<std::vector<RequestRecord>> Recover();
  // Drops expired idempotency keys and rows older than the retention.
  StatusOr<int> Prune();
  std::string synchronous_mode();
  int64_t CountByState(State s);

 private:
  Journal(sqlite3* db, JournalOptions opts, const Clock& clock) : db_(db), opts_(opts), clock_(clock) {}
  Status Exec(const std::string& sql);

  sqlite3* db_;
  JournalOptions opts_;
  const Clock& clock_;
  std::mutex mu_;
};

}  // namespace spillway::journal
