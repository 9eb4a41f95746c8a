// Supervisor: starts the workers the services need, learns their ports,
// health-checks them every 0.5 s, restarts a dead or unresponsive worker with backoff
// without touching the others, and stops them all on shutdown.
//
// Each worker runs in its own process group (posix_spawn, SETPGROUP), asks the
// kernel to end it if the gateway dies (--parent-pid), binds port 0 and writes
// its port to <state_dir>/run/<key>.port; its stdout/stderr are appended to
// <state_dir>/logs/<key>.log (mode 0600, never through a symbolic link).
//
// Workers are private: each gets the supervisor's worker secret in its
// environment ($SPILLWAY_WORKER_SECRET, never in argv or a file) and refuses
// any request without it (AuthHeaders()). The secret is random per
// supervisor unless the supervisor's own environment sets one (at least 16
// characters: the chaos harness and tests, which talk to workers too).
// Workers get a minimal environment: the locale, paths, GPU and ggml
// variables, $SPILLWAY_SIM_DIR, $SPILLWAY_FAULTS and $SPILLWAY_MUTATIONS (tests), not the gateway's keys.
//
// No exception leaves the supervisor thread: each round catches, logs and
// goes on (running out of file descriptors makes health checks fail, not the
// gateway).
//
// Worker states: starting -> ready -> (exited | unhealthy) -> backoff -> starting.
// An on-demand worker starts stopped; Demand() starts it, Release() stops it.
// Backoff doubles from 0.5 s, up to 30 s for a worker that never became ready
// (a crash loop at start: a model that cannot load), but only up to 2 s for
// one that had been serving (killed, device lost, hung): that one is needed
// back soon. It resets after 60 s of readiness.
//
// Thread-safe. One background thread polls every 50 ms.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace spillway::upstream {

struct WorkerSpec {
  std::string key;                 // unique, file-name safe: "<service>.<n>"
  std::vector<std::string> args;   // arguments after the worker binary
  bool on_demand = false;          // not started until Demand(); stopped by Release()
  // A worker not ready this long after its spawn is killed and counted as a
  // failed start (a load that hangs on a driver, a model on a dead disk).
  int64_t start_timeout_ms = 120000;
};

enum class WorkerState { kStarting, kReady, kBackoff, kStopped };
const char* WorkerStateName(WorkerState s);

struct WorkerView {
  std::string key;
  WorkerState state = WorkerState::kStopped;
  pid_t pid = 0;
  uint16_t port = 0;
  int restarts = 0;
  std::string last_exit;  // "exit 3", "signal 9", "unhealthy", ...
  std::string last_error;  // the worker's last stderr line before its last exit (its own reason)
  int failed_starts = 0;   // exits in a row without ever becoming ready
  int64_t next_start_ms = 0;  // clock time of the next start (while in backoff)
  std::string log_path;
  bool on_demand = false;
  int64_t last_start_ms = 0;  // how long its last start took (spawn to ready), measured
  int64_t start_timeout_ms = 0;  // of its spec
  int64_t starting_since_ms = 0;  // clock time of its current start (while starting)
};

class Supervisor {
 public:
  Supervisor(std::string worker_binary, std::string state_dir, const Clock& clock);
  ~Supervisor();

  void Add(WorkerSpec spec);  // before Start()
  // Asked before every (re)start of a worker; a refusal keeps it waiting (and
  // asking again after a backoff) instead of starting into an allocation failure.
  // Called from the supervisor thread without its lock held.
  void SetStartGate(std::function<Status(const std::string& key)> gate) { gate_ = std::move(gate); }
  // Told once each time a worker becomes ready (supervisor thread, no lock held).
  void SetOnReady(std::function<void(const std::string& key, uint16_t port)> f) { on_ready_ = std::move(f); }
  void Start();
  // SIGTERM to every worker's group, SIGKILL after `grace_ms`.
  void Stop(int64_t grace_ms = 5000);

  // The port of a ready worker.
  std::optional<uint16_t> ReadyPort(const std::string& key) const;
  std::vector<WorkerView> Snapshot() const;
  uint64_t total_restarts() const { return restarts_.load(); }
  // Starts an on-demand worker that is stopped (no-op otherwise).
  void Demand(const std::string& key);
  // Stops an on-demand worker (SIGTERM, SIGKILL after 5 s); it stays stopped until Demand().
  void Release(const std::string& key);
  // Starting or ready (an on-demand worker that is stopped is not).
  bool Running(const std::string& key) const;
  bool OnDemand(const std::string& key) const;
  // Told (no lock held) each time a worker exits or is replaced as unhealthy
  // (not when it is released or stopped): `why` as in WorkerView::last_exit.
  void SetOnExit(std::function<void(const std::string& key, const std::string& why)> f) { on_exit_ = std::move(f); }
  // Asked (no lock held) for each ready on-demand worker on every poll; true stops it.
  void SetIdleCheck(std::function<bool(const std::string& key)> f) { idle_ = std::move(f); }
  // A worker that became ready but cannot serve this gateway (it speaks
  // another protocol version): killed and counted as a failed start, `why`
  // its reason in the log and WorkerView.
  void Refuse(const std::string& key, const std::string& why);
  // Reports a failure seen by a caller (connection refused...): the worker is
  // health-checked at once.
  void Suspect(const std::string& key);
  // What every request to a worker carries: Authorization: Bearer <secret>.
  std::vector<std::pair<std::string, std::string>> AuthHeaders() const {
    return {{"Authorization", "Bearer " + secret_}};
  }

 private:
  struct Worker {
    WorkerSpec spec;
    WorkerView view;
    int64_t ready_since_ms = 0;
    int64_t next_health_ms = 0;
    int health_failures = 0;
    int backoff_level = 0;
    int64_t spawned_ms = 0;
    int64_t kill_at_ms = 0;  // a released worker still exiting
  };
  void Loop();
  void Round();
  void Spawn(Worker& w);
  void Poll(Worker& w);
  void Exited(Worker& w, const std::string& why);
  void HealthResult(Worker& w, pid_t pid, bool healthy, bool device_lost);

  std::function<Status(const std::string&)> gate_;
  std::function<void(const std::string&, uint16_t)> on_ready_;
  std::function<bool(const std::string&)> idle_;
  std::function<void(const std::string&, const std::string&)> on_exit_;
  const std::string binary_, state_dir_;
  const std::string secret_;
  const Clock& clock_;
  mutable std::mutex mu_;
  std::map<std::string, Worker> workers_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> restarts_{0};
  std::condition_variable cv_;
  std::thread thread_;
};

}  // namespace spillway::upstream
