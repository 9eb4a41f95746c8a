#include "bench_gateway.h"
#include "worker_secret.h"

#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "api/http_client.h"
#include "common/proc_file.h"

extern char** environ;

namespace spillway::bench {

namespace fs = std::filesystem;

double Pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

double Us(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); }

namespace {

double TasksCpuNs(pid_t pid) {
  double ns = 0;
  std::error_code ec;
  for (const auto& task : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream f(task.path() / "schedstat");
    double run = 0;
    if (f >> run) ns += run;
  }
  return ns;
}

}  // namespace

double CpuNs(pid_t pid, bool children) {
  double ns = TasksCpuNs(pid);
  if (!children) return ns;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t child = std::stoi(name);
    if (const auto stat = ReadProcStat(child); stat && stat->ppid == pid) ns += TasksCpuNs(child);
  }
  return ns;
}

std::string OneChatOnCpu(const std::string& model, bool full_journal) {
  return "[journal]\nsynchronous = \"" + std::string(full_journal ? "full" : "normal") + "\"\n" +
         "[[service]]\nname = \"chat\"\nmodel = \"" + model + "\"\n" +
         "[[service.placement]]\ndevice = \"cpu\"\nctx = 1024\nslots = 1\nthreads = 1\n";
}

std::vector<std::string> DiesWithBench(std::vector<std::string> args) {
  if (::access("/usr/bin/setpriv", X_OK) == 0) args.insert(args.begin(), {"/usr/bin/setpriv", "--pdeathsig", "TERM", "--"});
  return args;
}

GatewayRun StartGateway(const std::string& bin_dir, const std::string& config_toml, const std::string& tag,
                        std::chrono::seconds timeout, const std::vector<std::string>& wrap) {
  GatewayRun g;
  g.dir = fs::temp_directory_path() / ("spillway-bench-" + tag + "-" + std::to_string(getpid()));
  fs::remove_all(g.dir);
  fs::create_directories(g.dir);
  std::ofstream(g.dir + "/c.toml") << config_toml;
  std::vector<std::string> cmd = wrap;
  for (std::string a : {bin_dir + "/spillway", std::string("serve"), std::string("--config"), g.dir + "/c.toml",
                        std::string("--state-dir"), g.dir + "/state", std::string("--listen"),
                        std::string("127.0.0.1:0"), std::string("--port-file"), g.dir + "/port"}) {
    cmd.push_back(std::move(a));
  }
  std::vector<std::string> args = DiesWithBench(std::move(cmd));
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, (g.dir + "/log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  const int rc = posix_spawn(&g.pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    std::fprintf(stderr, "cannot start %s\n", argv[0]);
    g.pid = -1;
    return g;
  }
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (waitpid(g.pid, nullptr, WNOHANG) == g.pid) {  // refused its config, or crashed
      g.pid = -1;
      break;
    }
    std::ifstream f(g.dir + "/port");
    int p = 0;
    if (f >> p) {
      auto r = http::Fetch("127.0.0.1", static_cast<uint16_t>(p), "GET", "/readyz", "", {}, std::chrono::seconds(2));
      if (r.ok() && r->status == 200) {
        g.port = static_cast<uint16_t>(p);
        return g;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::fprintf(stderr, "the gateway did not become ready; see %s/log\n", g.dir.c_str());
  return g;
}

void StopGateway(GatewayRun& g, bool keep_dir) {
  if (g.pid > 0) {
    kill(g.pid, SIGTERM);
    // It stops its workers first (SIGTERM, SIGKILL after 5 s): give it that and more.
    bool gone = false;
    for (int i = 0; i < 1500 && !gone; ++i) {
      gone = waitpid(g.pid, nullptr, WNOHANG) == g.pid;
      if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!gone) {
      std::fprintf(stderr, "the gateway ignored SIGTERM for 30 s; killing it\n");
      kill(g.pid, SIGKILL);
      waitpid(g.pid, nullptr, 0);
    }
    g.pid = -1;
  }
  if (!keep_dir && !g.dir.empty()) fs::remove_all(g.dir);
}

uint16_t WorkerPort(uint16_t gateway_port, const std::string& service) {
  auto st = http::Fetch("127.0.0.1", gateway_port, "GET", "/v1/status");
  if (!st.ok() || st->status != 200) return 0;
  const auto j = nlohmann::json::parse(st->body, nullptr, false);
  if (!j.is_object()) return 0;
  for (const auto& s : j["services"]) {
    if (s.value("name", "") == service && !s["placements"].empty()) return s["placements"][0].value("port", uint16_t{0});
  }
  return 0;
}

std::pair<pid_t, uint16_t> StartBareProxy(uint16_t worker, const std::vector<std::string>& wrap) {
  const fs::path self = fs::read_symlink("/proc/self/exe");
  const std::string bin = (self.parent_path() / "bare_proxy").string();
  const uint16_t port = FreePort();
  if (::access(bin.c_str(), X_OK) != 0 || port == 0) return {-1, 0};
  std::vector<std::string> cmd = wrap;
  for (std::string a : {bin, std::to_string(port), std::to_string(worker)}) cmd.push_back(std::move(a));
  std::vector<std::string> args = DiesWithBench(std::move(cmd));
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return {-1, 0};
  for (int i = 0; i < 1000; ++i) {  // listening? (10 s: under valgrind it starts slowly)
    if (http::Fetch("127.0.0.1", port, "GET", "/health", "", WorkerAuth(), std::chrono::seconds(1)).ok()) {
      return {pid, port};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return {-1, 0};
}

uint16_t FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  uint16_t port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

}  // namespace spillway::bench
