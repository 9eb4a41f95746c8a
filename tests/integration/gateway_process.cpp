#include "gateway_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>
#include <thread>
#include <vector>

#include "api/http_client.h"
#include "upstream/process_group.h"
#include "upstream/worker_record.h"
#include "worker_process.h"

extern char** environ;

namespace spillway::testing {

namespace fs = std::filesystem;

std::string TestConfig(int chat_slots, const std::string& extra) {
  std::ostringstream os;
  os << "max_queue = 64\n" << extra << "\n"
     << "[[service]]\nname = \"chat\"\nmodel = \"" << ModelPath("tiny-chat") << "\"\nmax_tokens = 4000\n"
     << "[[service.placement]]\ndevice = \"cpu\"\nctx = " << 4096 * chat_slots << "\nslots = " << chat_slots << "\nthreads = 1\n"
     << "[[service]]\nname = \"embed\"\nmodel = \"" << ModelPath("tiny-embed") << "\"\n"
     << "[[service.placement]]\ndevice = \"cpu\"\nctx = 512\nslots = 2\nthreads = 1\n";
  return os.str();
}

GatewayProcess::GatewayProcess(const std::string& config_toml, std::string state_dir) {
  std::string tmpl = (fs::temp_directory_path() / "spillway-gw-XXXXXX").string();
  dir_ = mkdtemp(tmpl.data());
  config_path_ = dir_ + "/spillway.toml";
  // Stopped at once (Stop, the destructor) unless a test asks for the
  // graceful stop: a test that ends with requests still waiting waited out
  // the default shutdown_grace_s (Start passes --shutdown-grace 0).
  grace_set_ = config_toml.find("shutdown_grace_s") != std::string::npos;
  std::ofstream(config_path_) << config_toml;
  own_state_ = state_dir.empty();
  state_dir_ = own_state_ ? dir_ + "/state" : state_dir;
}

bool GatewayProcess::Start(std::chrono::seconds timeout, bool wait_ready) {
  const std::string port_file = dir_ + "/port";
  fs::remove(port_file);
  std::vector<std::string> args = {BinDir() + "/spillway", "serve", "--config", config_path_, "--state-dir",
                                   state_dir_, "--listen", "127.0.0.1:0", "--port-file", port_file};
  if (!grace_set_) args.insert(args.end(), {"--shutdown-grace", "0"});
  TestWorkerSecret();  // its workers require the test's secret, so tests may call them too
  args.insert(args.begin(), prefix_.begin(), prefix_.end());
  args.insert(args.end(), extra_.begin(), extra_.end());
  args = DiesWithTest(std::move(args));
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (char** e = environ; *e; ++e) {
    const std::string_view kv(*e);
    bool drop = false;
    for (const auto& name : unset_env_) drop |= kv.substr(0, kv.find('=')) == name;
    if (!drop) envp.push_back(*e);
  }
  envp.push_back(nullptr);
  crashed_ = false;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  const std::string out = dir_ + "/gateway.log";
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  if (posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), envp.data()) != 0) return false;
  posix_spawn_file_actions_destroy(&fa);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  port_ = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      exit_status_ = status;
      return false;
    }
    if (!port_) {
      std::ifstream f(port_file);
      int p = 0;
      if (f >> p) port_ = static_cast<uint16_t>(p);
    }
    if (port_ && !wait_ready) return true;
    if (port_) {
      auto r = http::Fetch("127.0.0.1", port_, "GET", "/readyz", "", {}, std::chrono::seconds(2));
      if (r.ok() && r->status == 200) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  return false;
}

void GatewayProcess::Kill9() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
  crashed_ = true;
}

bool GatewayProcess::WaitExit(std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (pid_ > 0) {
    if (waitpid(pid_, &exit_status_, WNOHANG) == pid_) {
      pid_ = -1;
      return true;
    }
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

void GatewayProcess::Stop() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  for (int i = 0; i < 500; ++i) {
    if (waitpid(pid_, &exit_status_, WNOHANG) == pid_) {
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
  crashed_ = true;  // (killed: its workers are ended by the destructor, not left to their orphan timeout)
}

std::string GatewayProcess::Output() const {
  std::ifstream f(dir_ + "/gateway.log");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

GatewayProcess::~GatewayProcess() {
  Stop();
  if (crashed_) {
    // Nobody adopted the workers of the killed gateway: end them now rather
    // than at their orphan timeout (by pid + start time: never a stranger).
    for (const auto& f : upstream::ReadWorkerRecords(state_dir_ + "/run")) {
      if (f.record.ok()) upstream::StopGroup({f.record->pid, f.record->start_time, /*child=*/false}, 0);
    }
  }
  std::error_code ec;
  fs::remove_all(dir_, ec);
  if (own_state_) fs::remove_all(state_dir_, ec);
}

}  // namespace spillway::testing
