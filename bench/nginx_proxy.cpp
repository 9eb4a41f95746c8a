#include "nginx_proxy.h"

#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "api/http_client.h"
#include "bench_gateway.h"

extern char** environ;

namespace spillway::bench {

namespace fs = std::filesystem;

std::string NginxProxy::Binary() {
  std::istringstream path(std::getenv("PATH") ? std::getenv("PATH") : "");
  std::string dir;
  while (std::getline(path, dir, ':')) {
    if (!dir.empty() && access((dir + "/nginx").c_str(), X_OK) == 0) return dir + "/nginx";
  }
  return access("/usr/sbin/nginx", X_OK) == 0 ? "/usr/sbin/nginx" : "";
}

NginxProxy::NginxProxy(uint16_t worker_port, const std::string& worker_secret, const std::vector<std::string>& wrap) {
  const std::string bin = Binary();
  if (bin.empty()) {
    why_ = "nginx is not installed (scripts/deps.sh installs it)";
    return;
  }
  dir_ = fs::temp_directory_path() / ("spillway-bench-nginx-" + std::to_string(getpid()) + "-" + std::to_string(worker_port));
  fs::remove_all(dir_);
  fs::create_directories(dir_);
  const uint16_t port = FreePort();
  std::ofstream conf(dir_ + "/nginx.conf");
  // One worker process: the requests are sequential, and the gateway has two
  // I/O threads on the same two cores. Run as root, the master would hand
  // the worker to `nobody`; keep this user so it can use the temp paths.
  if (geteuid() == 0) conf << "user root;\n";
  if (!wrap.empty()) conf << "master_process off;\n";
  conf << "daemon off;\nworker_processes 1;\npid " << dir_ << "/nginx.pid;\nerror_log " << dir_ << "/error.log warn;\n"
       << "events { worker_connections 1024; }\n"
       << "http {\n  access_log off;\n"
       // The compiled-in temp paths are under /var/lib/nginx, not writable by everyone.
       << "  client_body_temp_path " << dir_ << "/body;\n  proxy_temp_path " << dir_ << "/proxy;\n"
       << "  fastcgi_temp_path " << dir_ << "/fastcgi;\n  uwsgi_temp_path " << dir_ << "/uwsgi;\n"
       << "  scgi_temp_path " << dir_ << "/scgi;\n"
       << "  upstream worker { server 127.0.0.1:" << worker_port << "; keepalive 32; }\n"
       << "  server {\n    listen 127.0.0.1:" << port << ";\n"
       << "    location / {\n      proxy_pass http://worker;\n      proxy_http_version 1.1;\n"
       << "      proxy_set_header Connection \"\";\n"
       // A worker answers loopback Host names only (DNS rebinding), not the upstream's name.
       << "      proxy_set_header Host 127.0.0.1:" << worker_port << ";\n"
       << "      proxy_set_header Authorization \"Bearer " << worker_secret << "\";\n"
       // How nginx is set up in front of an SSE server: events pass as they come.
       << "      proxy_buffering off;\n    }\n  }\n}\n";
  conf.close();
  std::vector<std::string> cmd = wrap;
  for (std::string a : {bin, std::string("-p"), dir_, std::string("-c"), dir_ + "/nginx.conf", std::string("-e"),
                        dir_ + "/error.log"}) {
    cmd.push_back(std::move(a));
  }
  std::vector<std::string> args = DiesWithBench(std::move(cmd));
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, (dir_ + "/stderr").c_str(), O_WRONLY | O_CREAT, 0644);
  const int rc = posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    pid_ = -1;
    why_ = "cannot run " + bin;
    return;
  }
  for (int i = 0; i < 1000; ++i) {  // 20 s (under valgrind it starts slowly)
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      why_ = "nginx exited at start; see " + dir_ + "/error.log";
      return;
    }
    // Any answer will do: the worker's, relayed, or nginx's own 502.
    if (http::Fetch("127.0.0.1", port, "GET", "/healthz", "", {}, std::chrono::seconds(1)).ok()) {
      port_ = port;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  why_ = "nginx did not answer within 20 s; see " + dir_ + "/error.log";
}

NginxProxy::~NginxProxy() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);  // fast shutdown: the master stops its worker and exits
    waitpid(pid_, nullptr, 0);
  }
  if (!dir_.empty() && port_) fs::remove_all(dir_);  // kept after a failure, for its error log
}

}  // namespace spillway::bench
