// What the gateway needs of the processes that serve its placements: their
// ports and states, starting and stopping on-demand ones, and the credentials
// every request to them carries. The Supervisor (supervisor.h) implements it
// with real worker processes; tests give the gateway in-process fakes
// (tests/fakes/fake_workers.h), so its whole request lifecycle runs in one
// test process.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace spillway::upstream {

// How last_exit says a start the gate refused ("not admitted: <why>").
inline constexpr std::string_view kNotAdmitted = "not admitted: ";

enum class WorkerState { kStarting, kReady, kBackoff, kStopped };
const char* WorkerStateName(WorkerState s);

struct WorkerView {
  std::string key;
  WorkerState state = WorkerState::kStopped;
  pid_t pid = 0;
  uint16_t port = 0;
  int restarts = 0;
  int starts = 0;  // processes spawned for it (loads), restarts and on-demand starts included
  bool ever_ready = false;  // ready at least once since the gateway started (adopted included)
  // Spawns tried for it, those that failed at once (no free port, no
  // binary) included: a start the gate let through has happened, one way
  // or the other, once this moves (Gateway::PendingStarts).
  int spawn_attempts = 0;
  std::string last_exit;  // "exit 3", "signal 9", "unhealthy", ..., kNotAdmitted + why
  // Why the start gate last refused it, when that is how its last start ended; empty otherwise.
  std::string_view NotAdmittedWhy() const {
    return last_exit.rfind(kNotAdmitted, 0) == 0 ? std::string_view(last_exit).substr(kNotAdmitted.size())
                                                 : std::string_view();
  }
  std::string last_error;  // the worker's last stderr line before its last exit (its own reason)
  int failed_starts = 0;   // exits in a row without ever becoming ready
  // Ends in a row by its own hand (an exit, a signal other than SIGKILL)
  // within kCrashWindowMs of becoming ready: a worker that crashes at its
  // first requests. Backed off as a failed start is (to 30 s), not as a
  // killed one (2 s). Cleared once it has served that long.
  int crashes = 0;
  // A crash loop: crashed soon after becoming ready more than once in a row
  // (once: a worker that restarts now and then).
  bool crash_looping() const { return crashes > 1; }
  // How it last ended, then its own last word: "exit 3: <its line>" (either alone when the other is empty).
  std::string HowItEnded() const {
    return last_error.empty() ? last_exit : last_exit.empty() ? last_error : last_exit + ": " + last_error;
  }
  int64_t next_start_ms = 0;  // clock time of the next start (while in backoff)
  int64_t down_since_ms = 0;  // clock time its last process ended (0: none has)
  // Killed, and its process not ended yet: what that process holds is still
  // in use on its device (where it shows), and no new one starts before.
  bool exiting = false;
  std::string log_path;
  bool on_demand = false;
  // Stopped when idle or to give its room (Release), and not spawned since
  // (the start gate's refusals meanwhile included): what loads it again is
  // a request that wants it.
  bool released_idle = false;
  int64_t last_start_ms = 0;  // how long its last start took (spawn to ready), measured
  int64_t start_timeout_ms = 0;  // of its spec
  int64_t starting_since_ms = 0;  // clock time of its current start (while starting)
  int64_t ready_since_ms = 0;     // clock time it became ready (while ready)
  // While starting: how much of its model it has loaded, as the worker last
  // said (--load-progress-file); total 0 until it says.
  uint64_t load_bytes = 0, load_total_bytes = 0;
  // Clock time its load last advanced (0: not since it was spawned). A start
  // is timed out start_timeout_ms after the later of this and its spawn: a
  // large model on a slow disk loads as long as it keeps loading.
  int64_t load_progress_ms = 0;
  bool adopted = false;  // started by an earlier gateway on this state directory, adopted without a reload
  // The worker's last answer to GET /info (memory, slots, context), refreshed
  // by the supervisor every kInfoPeriodMs while it is ready, so that status
  // pages read a cache instead of asking each worker; null until fetched.
  std::shared_ptr<const std::string> info;
  int64_t info_ms = 0;  // clock time it was fetched
  // Its process's resident set (an external server's: its process group's),
  // sampled by the supervisor every kRssPeriodMs (kGroupRssPeriodMs) while it
  // starts or runs (0: not sampled yet, or no process of its own), so that
  // admission reads no procfs file under its lock.
  uint64_t rss_bytes = 0;
};

class Workers {
 public:
  virtual ~Workers() = default;
  // The port of a ready worker.
  virtual std::optional<uint16_t> ReadyPort(const std::string& key) const = 0;
  virtual std::vector<WorkerView> Snapshot() const = 0;
  // Starts an on-demand worker that is stopped (no-op otherwise).
  virtual void Demand(const std::string& key) = 0;
  // Stops an on-demand worker; it stays stopped until Demand().
  virtual void Release(const std::string& key) = 0;
  // After Release(): waits up to `timeout_ms` for its process to end (its
  // memory to be free); true once it has. (Fakes: at once.)
  virtual bool WaitReleased(const std::string& key, int64_t timeout_ms) {
    (void)key;
    (void)timeout_ms;
    return true;
  }
  virtual bool OnDemand(const std::string& key) const = 0;
  // Reports a failure seen by a caller (connection refused...): the worker is checked at once.
  virtual void Suspect(const std::string& key) = 0;
  // Told (no lock held) each time a worker exits or is replaced as unhealthy.
  virtual void SetOnExit(std::function<void(const std::string& key, const std::string& why)> f) = 0;
  // Asked (no lock held) for each ready on-demand worker now and then; true stops it.
  virtual void SetIdleCheck(std::function<bool(const std::string& key)> f) = 0;
  // Stops every worker (and asks the callbacks above nothing more).
  virtual void Stop() = 0;
  // What every request to a worker carries.
  virtual const std::vector<std::pair<std::string, std::string>>& AuthHeaders() const = 0;
};

}  // namespace spillway::upstream
