// Supervisor: starts the workers the services need, learns their ports,
// health-checks them every 0.5 s, restarts a dead or unresponsive worker with backoff
// without touching the others, and stops them all on shutdown.
//
// Each worker runs in its own session and process group (posix_spawn,
// SETSID), binds port 0 and writes its port to <state_dir>/run/<key>.port;
// its stdout/stderr are appended to <state_dir>/logs/<key>.log (mode 0600,
// never through a symbolic link).
//
// What survives a crash of the gateway. Workers are not tied to the gateway
// (no parent-death signal): a gateway killed with -9 leaves them serving, and
// the next gateway on the same state directory adopts them instead of
// reloading every model. Each spawned worker is recorded in
// <state_dir>/run/<key>.json (worker_record.h: pid, process start time, port,
// spec hash, protocol version). Start() goes through the records before it
// spawns anything:
//   - pid gone, or now another process (start time differs): record dropped,
//     nothing signalled;
//   - ours, same spec hash and protocol version, GET /v1/worker/info answers
//     on the recorded port with the secret, from the recorded pid: adopted,
//     ready at once (WorkerView::adopted, a log line). What it was still
//     running for the dead gateway is cancelled first (DELETE
//     /v1/worker/requests) and drained: nobody can receive it, and the
//     journal re-runs non-streamed requests under the same ids, which the
//     worker would refuse as "already running";
//   - ours but not matching (config changed, other version, not answering,
//     still loading, placement gone): its group gets SIGTERM, SIGKILL after
//     5 s, and it is waited for before a new worker is spawned: never two
//     workers for one placement.
// An adopted worker is not a child of this process: its end is seen by pid +
// start time (process_group.h) and by the health checks, and it is stopped by
// process group like the others. Stop() (SIGTERM or SIGINT to the gateway)
// still stops every worker, adopted ones included, and removes the records.
//
// The orphan rule: a worker that hears no authenticated request (health
// checks included) for SetOrphanTimeout() seconds exits (the worker's
// --orphan-timeout), so a crashed gateway that is never restarted frees its
// devices after that long.
//
// Workers are private: each gets the worker secret in its environment
// ($SPILLWAY_WORKER_SECRET, never in argv) and refuses any request without it
// (AuthHeaders()). The secret is kept in <state_dir>/run/worker.secret (0600,
// created once, reused by every later gateway there, so that it can talk to
// the workers it adopts) unless the supervisor's own environment sets one (at
// least 16 characters: the chaos harness and tests, which talk to workers too).
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
// back soon. One that ends by its own hand (an exit, a signal other than
// SIGKILL) within 60 s of becoming ready is a crash loop too (it crashes at
// its first requests): up to 30 s, counted in WorkerView::crashes. SIGKILL
// (the OOM killer, an operator, the chaos harness) and the supervisor's own
// kills (unhealthy, device lost) keep the 2 s. The backoff resets after 60 s
// of readiness.
//
// Thread-safe. One background thread polls every 50 ms. The readers the
// request path calls (ReadyPort, OnDemand, Running, Snapshot) take no lock:
// they read a table published whenever a change under the lock is done.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "api/http_client.h"
#include "common/clock.h"
#include "common/status.h"
#include "upstream/process_group.h"
#include "upstream/worker_record.h"
#include "upstream/workers.h"

namespace spillway::upstream {

struct WorkerSpec {
  std::string key;                 // unique, file-name safe: "<service>.<n>"
  std::vector<std::string> args;   // arguments after the worker binary
  bool on_demand = false;          // not started until Demand(); stopped by Release()
  // An on-demand worker that exits waits, stopped, for the next Demand();
  // with this (keep_alive residency: loaded at start) it is started again
  // after its backoff, as a pinned one is.
  bool restart_on_exit = false;
  // A worker not ready this long after its spawn is killed and counted as a
  // failed start (a load that hangs on a driver, a model on a dead disk).
  int64_t start_timeout_ms = 120000;
  // An external server (config::ExternalConfig) instead of a spillway-worker:
  // `command` is its whole argv (found on $PATH), ${PORT} replaced by a free
  // loopback port chosen at each start; it is ready, and healthy, while GET
  // `health_path` answers 200; `stop_signal` stops it. It gets no worker
  // secret and has no /info. It runs under spillway-tie (upstream/tie_main.cpp,
  // beside the worker binary), which leads its group and stops the whole
  // group when the gateway dies. Left behind anyway (that leader killed
  // too), it is stopped (not adopted) by the next gateway.
  std::vector<std::string> command;
  std::string health_path = "/health";
  int stop_signal = 15;  // SIGTERM
  // The CPU scheduling niceness it runs at, from its first instruction (a
  // worker's --nice, an external server started through coreutils' nice), so
  // for every thread it starts; never less nice than the gateway: a batch
  // service's processes yield the host's cores to interactive ones (its CPU
  // placements' decoding, a GPU placement's feeding threads).
  int nice = 0;
  bool external() const { return !command.empty(); }
};

// What a worker's record keeps to tell whether a later config still asks for
// the same process: its argv (an external server's command) and, when set,
// its niceness (a service moved between priorities is started anew at its
// new niceness, not adopted at its old one).
std::string SpecHashOf(const WorkerSpec& spec);

// Where spillway-tie (upstream/tie_main.cpp), which every external server is
// started through, is looked for: beside the worker binary, as an absolute
// path; "" for a binary named without a folder.
std::string TieBeside(const std::string& worker_binary);

class Supervisor : public Workers {
 public:
  Supervisor(std::string worker_binary, std::string state_dir, const Clock& clock);
  ~Supervisor();

  void Add(WorkerSpec spec);  // before Start()
  // Asked before every (re)start of a worker; a refusal keeps it waiting (and
  // asking again after a backoff: 1 s, or the next round when the refusal is
  // Unavailable, i.e. waiting on another start) instead of starting into an
  // allocation failure.
  // Called from the supervisor thread without its lock held.
  void SetStartGate(std::function<Status(const std::string& key)> gate) { gate_ = std::move(gate); }
  // Told once each time a worker becomes ready (supervisor thread, no lock held).
  void SetOnReady(std::function<void(const std::string& key, uint16_t port)> f) { on_ready_ = std::move(f); }
  // One supervisor per state directory: claims <state_dir>/run/supervisor.lock
  // (flock, released by the kernel when this process ends, however it ends).
  // Refused while another live gateway holds it: adopting that one's workers
  // would cancel its requests, and stopping them would take down its service.
  // Start() adopts nothing without the claim.
  Status Claim();
  // Passed to every worker it spawns as --orphan-timeout (before Start()); 0: never.
  void SetOrphanTimeout(double seconds) { orphan_timeout_s_ = seconds; }
  // The workers earlier gateways left on this state directory, sorted out
  // before placement admission (one pass: each record is judged once here):
  // those that none of `specs` would adopt (a spec changed, a placement gone,
  // one that never became ready) are stopped, claiming the state directory
  // first, so that admission does not refuse their replacements for the
  // memory they hold; the keys that Start() will adopt are returned, whose
  // memory admission counts as their placements' own.
  std::set<std::string> StopUnadoptable(const std::vector<WorkerSpec>& specs);
  // Adopts or stops the workers of earlier gateways (see above), then starts the others.
  void Start();
  // SIGTERM to every worker's group (adopted ones included), SIGKILL after `grace_ms`.
  void Stop(int64_t grace_ms);
  void Stop() override { Stop(5000); }

  // The port of a ready worker.
  std::optional<uint16_t> ReadyPort(const std::string& key) const override;
  std::vector<WorkerView> Snapshot() const override;
  uint64_t total_restarts() const { return restarts_.load(); }
  uint64_t total_adopted() const { return adopted_.load(); }
  // Starts an on-demand worker that is stopped (no-op otherwise).
  void Demand(const std::string& key) override;
  // Stops an on-demand worker (SIGTERM, SIGKILL after 5 s); it stays stopped until Demand().
  void Release(const std::string& key) override;
  bool WaitReleased(const std::string& key, int64_t timeout_ms) override;
  // Starting or ready (an on-demand worker that is stopped is not).
  bool Running(const std::string& key) const;
  bool OnDemand(const std::string& key) const override;
  // Told (no lock held) each time a worker exits or is replaced as unhealthy
  // (not when it is released or stopped): `why` as in WorkerView::last_exit.
  void SetOnExit(std::function<void(const std::string& key, const std::string& why)> f) override { on_exit_ = std::move(f); }
  // Asked (no lock held) for each ready on-demand worker on every poll; true stops it.
  void SetIdleCheck(std::function<bool(const std::string& key)> f) override { idle_ = std::move(f); }
  // A worker that became ready but cannot serve this gateway (it speaks
  // another protocol version): killed and counted as a failed start, `why`
  // its reason in the log and WorkerView.
  void Refuse(const std::string& key, const std::string& why);
  // Reports a failure seen by a caller (connection refused...): the worker is
  // health-checked at once.
  void Suspect(const std::string& key) override;
  // What every request to a worker carries: Authorization: Bearer <secret>.
  const std::vector<std::pair<std::string, std::string>>& AuthHeaders() const override { return auth_headers_; }
  // Runs `f` with the supervisor's lock held, as its own thread holds it
  // while it spawns, kills and writes records (tests: the readers above
  // answer meanwhile).
  void TEST_WhileLocked(const std::function<void()>& f) {
    Held lk(*this);
    f();
  }

 private:
  struct Worker {
    WorkerSpec spec;
    WorkerView view;
    int64_t ready_since_ms = 0;
    int64_t next_health_ms = 0;
    int64_t next_info_ms = 0;
    int64_t next_rss_ms = 0;
    pid_t rss_pid = 0;  // the process view.rss_bytes was sampled from
    int health_failures = 0;
    int backoff_level = 0;
    int64_t spawned_ms = 0;
    int64_t log_from = 0;  // its log's size when it was spawned: what it wrote itself follows
    int64_t listening_ms = 0;  // when its port file appeared (0: not yet)
    int64_t kill_at_ms = 0;  // a released worker still exiting
    uint64_t start_time = 0;  // of its process (/proc/<pid>/stat field 22)
    std::string spec_hash;    // SpecHashOf(spec)
    bool announce_ready = false;  // adopted: on_ready_ not told yet
    // Killed (Kill) and not yet ended: reaped by Poll without waiting, and
    // no new process starts for this worker until it has ended (its device
    // memory is not free before).
    std::optional<WorkerPid> dying;
  };
  // Health and progress are checked this often (a hung worker is replaced
  // within its progress timeout plus this); also what keeps a worker from
  // counting as an orphan.
  static constexpr int64_t kHealthPeriodMs = 500;
  static constexpr int64_t kInfoPeriodMs = 1000;
  static constexpr int64_t kRssPeriodMs = 100;  // WorkerView::rss_bytes
  static constexpr int64_t kGroupRssPeriodMs = 2000;  // an external server's: its whole process group
  static constexpr int64_t kStartProbePeriodMs = 200;  // an external server's health path while it starts
  WorkerPid Process(const Worker& w) const { return {w.view.pid, w.start_time, !w.view.adopted}; }
  // Whether nothing killed before still holds `w`'s memory (w.dying ended,
  // reaped and forgotten; or none). mu_ held.
  bool DyingEnded(Worker& w);
  // Whether `w`'s released process has ended (reaped, its record removed). mu_ held.
  bool ReleasedEnded(Worker& w);
  // Adoption (supervisor_adoption.cpp).
  void Adopt();
  // A previous gateway's worker to stop (AdoptOrStop), and why.
  struct Previous {
    std::string key;
    WorkerPid process;
    std::string reason;
    int stop_signal = 15;  // as its record says
  };
  // `adopted`: the processes adopted so far (one serves one placement);
  // those that must go are added to `to_stop`, for StopPrevious.
  void AdoptOrStop(const RecordFile& file, std::set<pid_t>* adopted, std::vector<Previous>* to_stop);
  void StopPrevious(const std::vector<Previous>& previous);
  // A previous gateway's process that may still hold `key`'s memory (it
  // could not be stopped, or cannot be told alive or gone): `key` starts no
  // worker until Poll sees it ended; `why` is the placement's last exit.
  void WaitOutPrevious(const std::string& key, const WorkerPid& process, const std::string& why);
  // Whether the record's process was started as this key's worker (its
  // command line names the key's port file in this state directory), or
  // may have been: one exiting has no command line left.
  bool RunsAsWorkerOf(const WorkerRecord& record) const;
  // `external`: an external server's record, never asked anything.
  AdoptDecision Judge(WorkerRecord& record, const std::optional<std::string>& configured_hash, bool external) const;
  // Cancels what an adopted worker still runs for the previous gateway and waits for its slots to empty.
  Status ClearLeftovers(pid_t pid, uint16_t port) const;
  // A request with the worker secret to `port`, only while process `pid`
  // alone listens there (ListensAlone); PermissionDenied, nothing sent, otherwise.
  StatusOr<http::ClientResponse> FetchFromWorker(pid_t pid, uint16_t port, const std::string& method,
                                                 const std::string& path) const;
  uint16_t PortFromFile(const std::string& key) const;
  void ReadLoadProgress(Worker& w) const;  // the worker's --load-progress-file, while it starts
  void WriteRecord(const Worker& w);
  void RemoveRecord(const std::string& key);

  void Loop();
  void Round();
  void RotateLogs();  // every 10 s, from Loop
  void Spawn(Worker& w);
  // The argv, environment and port of one start (a worker's or an external server's).
  std::vector<std::string> Argv(Worker& w, const std::string& port_file, const std::string& load_file);
  // `may_start`: a start that is due may happen now (it passed the start
  // gate this round); false leaves a worker in backoff for the next round.
  void Poll(Worker& w, bool may_start);
  // `by_itself`: it ended on its own (an exit, a signal other than SIGKILL),
  // not killed from outside or by the supervisor.
  // `log_says_why`: the worker's last log line is kept as its own reason
  // (last_error); not for a kill from outside, about which its log knows
  // nothing (its last line was whatever it printed last: its banner).
  void Exited(Worker& w, const std::string& why, bool by_itself = false, bool log_says_why = true);
  // SIGKILL to its group, without waiting for its end (the lock is held:
  // a process stuck in the kernel must not stall callers; see Worker::dying),
  // then Exited(w, why).
  void Kill(Worker& w, const std::string& why);
  void HealthResult(Worker& w, pid_t pid, bool healthy, bool device_lost);
  // Fetches a worker's /info into its view (no lock held while asking);
  // returns it, or null when it did not answer 200 (or the worker changed);
  // `http_status`: its answer's status (0: none).
  std::shared_ptr<const std::string> RefreshInfo(const std::string& key, pid_t pid, uint16_t port,
                                                 int* http_status = nullptr);
  // How long a listening worker may take to answer its /info before it counts as a failed start.
  static constexpr int64_t kInfoTimeoutMs = 30000;
  // A worker that ends by its own hand this soon after becoming ready counts
  // as crashing (WorkerView::crashes); serving this long clears the count and the backoff.
  static constexpr int64_t kCrashWindowMs = 60000;

  // mu_ held over the workers. When it is released, what the readers
  // (ReadyPort, OnDemand, Running, Snapshot: the request path) see is
  // published anew from workers_ (Publish), so they take no lock: they never
  // wait for this thread's spawns, kills, waits and record files under it,
  // nor for its being descheduled while it holds it, and they see every
  // change once the scope that made it ends, as before.
  class Held {
   public:
    explicit Held(Supervisor& s) : s_(s), lk_(s.mu_) {}
    ~Held() { s_.Publish(); }
    Held(const Held&) = delete;
    Held& operator=(const Held&) = delete;
    std::unique_lock<std::mutex>& lock() { return lk_; }

   private:
    Supervisor& s_;
    std::unique_lock<std::mutex> lk_;
  };
  // The workers' views as Snapshot() returns them, in workers_'s (key) order.
  struct Published {
    std::vector<WorkerView> views;
  };
  void Publish() noexcept;  // mu_ held
  static const WorkerView* Find(const Published& table, const std::string& key);

  bool memory_freed_ = false;  // a worker's process ended since the last round (under mu_)
  std::function<Status(const std::string&)> gate_;
  std::function<void(const std::string&, uint16_t)> on_ready_;
  std::function<bool(const std::string&)> idle_;
  std::function<void(const std::string&, const std::string&)> on_exit_;
  const std::string binary_, state_dir_, run_dir_;
  const std::string secret_;
  const std::vector<std::pair<std::string, std::string>> auth_headers_{{"Authorization", "Bearer " + secret_}};
  double orphan_timeout_s_ = 0;
  const Clock& clock_;
  mutable std::mutex mu_;
  std::map<std::string, Worker> workers_;
  std::atomic<std::shared_ptr<const Published>> published_{std::make_shared<const Published>()};
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> restarts_{0};
  std::atomic<uint64_t> adopted_{0};
  int lock_fd_ = -1;  // the claim on the state directory
  std::condition_variable cv_;
  bool wake_ = false;  // under mu_: a round is wanted now (a demand), not at the next tick
  // The start (key: its pid) whose port file names another process's port,
  // already said (the supervisor's thread only: Round's readiness probes).
  std::map<std::string, pid_t> foreign_port_said_;
  std::thread thread_;
};

}  // namespace spillway::upstream
