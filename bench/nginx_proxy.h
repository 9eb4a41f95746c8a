// Debian's nginx as a plain reverse proxy in front of one worker: the
// yardstick for what a proxy hop costs, next to the gateway's.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace spillway::bench {

class NginxProxy {
 public:
  // Starts nginx in the foreground (`daemon off`) with a generated config in
  // a temporary directory: 127.0.0.1:<free port> -> 127.0.0.1:<worker_port>,
  // keep-alive upstream connections, the worker's secret added as a bearer
  // token. running() is false when nginx is not installed or did not start
  // (why() says which).
  // `wrap`: a command nginx runs under (valgrind); nginx is then one process
  // (master_process off), the one that serves, so that pid() is measured.
  NginxProxy(uint16_t worker_port, const std::string& worker_secret, const std::vector<std::string>& wrap = {});
  ~NginxProxy();
  NginxProxy(const NginxProxy&) = delete;
  NginxProxy& operator=(const NginxProxy&) = delete;

  bool running() const { return port_ != 0; }
  uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }  // the master; its worker is a child
  const std::string& why() const { return why_; }

  // nginx on $PATH, else /usr/sbin/nginx (not on a non-root user's PATH); "" if neither.
  static std::string Binary();

 private:
  pid_t pid_ = -1;
  uint16_t port_ = 0;
  std::string dir_, why_;
};

}  // namespace spillway::bench
