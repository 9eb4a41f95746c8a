// Starts a real `spillway serve` on port 0 with a test config, for
// integration tests; stops it (and its workers) when destroyed, and after a
// Kill9() that no Start() followed, also the workers it left serving.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace spillway::testing {

// A config with services "chat" (tiny-chat) and "embed" (tiny-embed) plus `extra` TOML.
std::string TestConfig(int chat_slots = 2, const std::string& extra = "");

class GatewayProcess {
 public:
  // `state_dir` empty: a fresh temporary directory (removed at the end).
  explicit GatewayProcess(const std::string& config_toml, std::string state_dir = "");
  ~GatewayProcess();
  // Waits for /readyz (or, without `wait_ready`, for the port only).
  bool Start(std::chrono::seconds timeout = std::chrono::seconds(60), bool wait_ready = true);
  // The gateway only: its workers live on (see upstream/supervisor.h), for
  // the next Start() on the same state directory to adopt, or until their
  // orphan timeout.
  void Kill9();
  void Stop();    // SIGTERM and wait
  // Waits (without a signal) for the process to end on its own: false when it
  // still runs after `timeout`.
  bool WaitExit(std::chrono::milliseconds timeout);
  uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }
  // Runs the gateway through a wrapper, e.g. {"/usr/bin/prlimit", "--nofile=200:200", "--"} (before Start()).
  void SetCommandPrefix(std::vector<std::string> prefix) { prefix_ = std::move(prefix); }
  // Arguments after `spillway serve ...`, e.g. {"--keep-going"} (before Start()).
  void SetExtraArgs(std::vector<std::string> extra) { extra_ = std::move(extra); }
  // Starts the gateway without this variable of the test's environment
  // (e.g. $SPILLWAY_WORKER_SECRET, to have it keep its own).
  void UnsetEnv(std::string name) { unset_env_.push_back(std::move(name)); }
  const std::string& state_dir() const { return state_dir_; }
  std::string Output() const;
  // How the process ended (waitpid's status), once Start() saw it exit or Stop() ended it; -1 before.
  int exit_status() const { return exit_status_; }

 private:
  std::string dir_, state_dir_, config_path_;
  std::vector<std::string> prefix_, extra_, unset_env_;
  bool own_state_ = false;
  bool grace_set_ = false;  // the config sets shutdown_grace_s (else it is 0 here)
  bool crashed_ = false;  // killed with -9 and not started again: its workers are ours to clean up
  pid_t pid_ = -1;
  uint16_t port_ = 0;
  int exit_status_ = -1;
};

}  // namespace spillway::testing
