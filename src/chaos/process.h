// Child processes of `spillway chaos` (gateways, llama-server, sim holds):
// spawned in their own process group with output to a log file, and always
// reaped.
#pragma once

#include <sys/types.h>

#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace spillway::chaos {

// The worker secret of this harness: put in its environment
// ($SPILLWAY_WORKER_SECRET) on first use, so the gateways it starts hand it
// to their workers, and the harness may arm faults on them.
const std::string& WorkerSecret();
// Authorization: Bearer <WorkerSecret()>, for calls to workers.
std::vector<std::pair<std::string, std::string>> WorkerAuth();

class Child {
 public:
  Child() = default;
  ~Child() { Stop(); }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  // `env`: variables set on top of this process's environment.
  bool Spawn(const std::vector<std::string>& argv, const std::string& log_path,
             const std::map<std::string, std::string>& env = {});
  // Thread-safe: the fault injector kills while the monitor asks Alive. Each
  // signals the pid it read under the lock (reaped and set to -1 between a
  // check and a kill, it was kill(-1, SIGKILL): every process we may signal).
  bool Alive();
  void Kill9();                      // the process only (its children see it die)
  void Stop(int grace_ms = 5000);    // SIGTERM to its group, SIGKILL after the grace
  pid_t pid() const {
    std::lock_guard<std::mutex> lk(mu_);
    return pid_;
  }

 private:
  mutable std::mutex mu_;
  pid_t pid_ = -1;
};

}  // namespace spillway::chaos
