// Child processes of `spillway chaos` (gateways, llama-server, sim holds):
// spawned in their own process group with output to a log file, and always
// reaped.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace spillway::chaos {

class Child {
 public:
  Child() = default;
  ~Child() { Stop(); }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  // `env`: variables set on top of this process's environment.
  bool Spawn(const std::vector<std::string>& argv, const std::string& log_path,
             const std::map<std::string, std::string>& env = {});
  bool Alive();
  void Kill9();                      // the process only (its children see it die)
  void Stop(int grace_ms = 5000);    // SIGTERM to its group, SIGKILL after the grace
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

}  // namespace spillway::chaos
