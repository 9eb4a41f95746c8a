// Starts a real `spillway serve` on port 0 with a test config, for
// integration tests; stops it (and its workers) when destroyed.
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
  void Kill9();   // the gateway only; its workers die with it (parent-death signal)
  void Stop();    // SIGTERM and wait
  uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }
  // Runs the gateway through a wrapper, e.g. {"/usr/bin/prlimit", "--nofile=200:200", "--"} (before Start()).
  void SetCommandPrefix(std::vector<std::string> prefix) { prefix_ = std::move(prefix); }
  // Arguments after `spillway serve ...`, e.g. {"--keep-going"} (before Start()).
  void SetExtraArgs(std::vector<std::string> extra) { extra_ = std::move(extra); }
  const std::string& state_dir() const { return state_dir_; }
  std::string Output() const;

 private:
  std::string dir_, state_dir_, config_path_;
  std::vector<std::string> prefix_, extra_;
  bool own_state_ = false;
  pid_t pid_ = -1;
  uint16_t port_ = 0;
};

}  // namespace spillway::testing
