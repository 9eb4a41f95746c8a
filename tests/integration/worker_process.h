// Starts a real spillway-worker process on port 0 for integration tests and
// stops it (SIGTERM, then SIGKILL) when destroyed.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace spillway::testing {

std::string BinDir();
std::string ModelPath(const std::string& name);  // e.g. "tiny-chat"

// The worker secret of this test process: set in its environment
// ($SPILLWAY_WORKER_SECRET) on first use, so that workers and gateways it
// starts (and their supervisors' workers) require it. Every process started
// through this file has it.
const std::string& TestWorkerSecret();
// Authorization: Bearer <TestWorkerSecret()>, plus `more`: for calls to workers.
std::vector<std::pair<std::string, std::string>> WorkerAuth(std::vector<std::pair<std::string, std::string>> more = {});

class WorkerProcess {
 public:
  // Starts `spillway-worker --model <model> --listen 127.0.0.1:0 <extra>` and
  // waits until it listens (or exits).
  WorkerProcess(const std::string& model, std::vector<std::string> extra = {},
                std::chrono::seconds timeout = std::chrono::seconds(60));
  ~WorkerProcess();
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  bool running() const { return port_ != 0; }
  uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }
  // Waits for the process to exit; returns its exit code (or -signal).
  int Wait(std::chrono::seconds timeout = std::chrono::seconds(30));
  std::string Stderr() const;  // what the worker wrote to stderr so far

 private:
  pid_t pid_ = -1;
  uint16_t port_ = 0;
  int exit_code_ = 0;
  bool exited_ = false;
  std::string dir_;
};

// Runs a shell command line; returns its stdout (and stderr when the command
// redirects it) and sets *exit_code.
std::string RunCommand(const std::string& command_line, int* exit_code);

// `args` run so that the process gets SIGTERM when the thread that starts it
// ends (setpriv --pdeathsig, which keeps the pid and execs `args`): a test
// process that is killed, or stopped by a broken pipe, leaves no gateway or
// worker behind (a gateway stops its workers on SIGTERM). Every process
// started through these files is. `args` as they are where setpriv is missing.
std::vector<std::string> DiesWithTest(std::vector<std::string> args);

// Starts `args` (args[0]: the binary's path) with stdout and stderr written
// to the given files; returns its pid. The caller stops and reaps it.
pid_t SpawnProcess(const std::vector<std::string>& args, const std::string& out, const std::string& err);
std::string MakeScratchDir();  // a fresh directory under the system's temp dir
std::string ReadTextFile(const std::string& path);  // "" when it cannot be read

// Starts any binary from BinDir() with its output discarded; returns its pid.
pid_t SpawnTool(const std::vector<std::string>& args_after_binary, const std::string& binary);
// Runs spillway-worker to completion (for startup-failure tests).
int RunWorkerToExit(const std::vector<std::string>& args, std::string* stderr_text);

}  // namespace spillway::testing
