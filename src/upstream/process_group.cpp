#include "upstream/process_group.h"

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <thread>

#include "devices/sim_ledger.h"

namespace spillway::upstream {

bool Ended(const WorkerPid& p, int* status) {
  *status = -1;
  if (p.pid <= 0) return true;
  if (p.child) return waitpid(p.pid, status, WNOHANG) == p.pid;
  return !devices::ProcessAlive(p.pid, p.start_time);  // a zombie counts as ended
}

std::string DescribeEnd(int status) {
  if (status == -1) return "exited (adopted: its exit status is not ours to read)";
  return WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status)) : "signal " + std::to_string(WTERMSIG(status));
}

bool StopGroup(const WorkerPid& p, int64_t grace_ms, int stop_signal) {
  int status = 0;
  if (Ended(p, &status)) return true;  // checked first: an adopted pid may be someone else's now
  using Clock = std::chrono::steady_clock;
  auto wait_until = [&](Clock::time_point deadline) {
    while (Clock::now() < deadline) {
      if (Ended(p, &status)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return Ended(p, &status);
  };
  if (grace_ms > 0) {
    kill(-p.pid, stop_signal);
    if (wait_until(Clock::now() + std::chrono::milliseconds(grace_ms))) return true;
  }
  kill(-p.pid, SIGKILL);
  if (p.child) return waitpid(p.pid, &status, 0) == p.pid;  // SIGKILL ends it: reap it, leave no zombie
  return wait_until(Clock::now() + std::chrono::seconds(5));
}

}  // namespace spillway::upstream
