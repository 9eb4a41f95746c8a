#include "worker_process.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

extern char** environ;

namespace spillway::testing {

namespace fs = std::filesystem;

std::string BinDir() {
  const char* b = std::getenv("SPILLWAY_BIN");
  return b ? b : "build/bin";
}

std::string ModelPath(const std::string& name) {
  const char* m = std::getenv("SPILLWAY_MODELS");
  return std::string(m ? m : "build/models") + "/" + name + ".gguf";
}

const std::string& TestWorkerSecret() {
  static const std::string secret = [] {
    const std::string s = "test-secret-" + std::to_string(getpid()) + "-" + std::to_string(std::random_device{}());
    setenv("SPILLWAY_WORKER_SECRET", s.c_str(), 1);
    return s;
  }();
  return secret;
}

std::vector<std::pair<std::string, std::string>> WorkerAuth(std::vector<std::pair<std::string, std::string>> more) {
  more.insert(more.begin(), {"Authorization", "Bearer " + TestWorkerSecret()});
  return more;
}

std::vector<std::string> DiesWithTest(std::vector<std::string> args) {
  static const bool has_setpriv = ::access("/usr/bin/setpriv", X_OK) == 0;
  if (has_setpriv) args.insert(args.begin(), {"/usr/bin/setpriv", "--pdeathsig", "TERM", "--"});
  return args;
}

namespace {

pid_t Spawn(const std::vector<std::string>& given, const std::string& out, const std::string& err) {
  TestWorkerSecret();  // children inherit it
  const std::vector<std::string> args = DiesWithTest(given);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error("posix_spawn failed for " + args[0]);
  return pid;
}

int DecodeStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return -WTERMSIG(status);
  return -1000;
}


std::string MakeTempDir() {
  std::string tmpl = (fs::temp_directory_path() / "spillway-test-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  return tmpl;
}

}  // namespace

WorkerProcess::WorkerProcess(const std::string& model, std::vector<std::string> extra, std::chrono::seconds timeout) {
  dir_ = MakeTempDir();
  const std::string port_file = dir_ + "/port";
  std::vector<std::string> args = {BinDir() + "/spillway-worker", "--model", model, "--listen", "127.0.0.1:0",
                                   "--port-file", port_file};
  args.insert(args.end(), extra.begin(), extra.end());
  pid_ = Spawn(args, dir_ + "/stdout", dir_ + "/stderr");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (fs::exists(port_file)) {
      port_ = static_cast<uint16_t>(std::stoi(ReadTextFile(port_file)));
      return;
    }
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      exit_code_ = DecodeStatus(status);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

int WorkerProcess::Wait(std::chrono::seconds timeout) {
  if (exited_) return exit_code_;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      exit_code_ = DecodeStatus(status);
      return exit_code_;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -2000;
}

std::string WorkerProcess::Stderr() const { return ReadTextFile(dir_ + "/stderr"); }

WorkerProcess::~WorkerProcess() {
  if (!exited_ && pid_ > 0) {
    kill(pid_, SIGTERM);
    if (Wait(std::chrono::seconds(10)) == -2000) {
      kill(pid_, SIGKILL);
      Wait(std::chrono::seconds(10));
    }
  }
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

std::string RunCommand(const std::string& command_line, int* exit_code) {
  std::string out;
  FILE* f = popen(command_line.c_str(), "r");
  if (!f) {
    *exit_code = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  const int status = pclose(f);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

pid_t SpawnProcess(const std::vector<std::string>& args, const std::string& out, const std::string& err) {
  return Spawn(args, out, err);
}

// Scratch directories go when the test binary exits with every test passed
// (a failure's are kept to look at). They were never removed: 1,600 of them
// under /tmp on a machine that had run the suite for a few weeks.
std::string MakeScratchDir() {
  static std::mutex mu;
  static std::vector<std::string>* made = nullptr;
  const std::string dir = MakeTempDir();
  std::lock_guard<std::mutex> lk(mu);
  if (!made) {
    made = new std::vector<std::string>();  // (left to the exit handler, never destroyed before it)
    std::atexit([] {
      if (!::testing::UnitTest::GetInstance()->Passed()) return;
      std::error_code ec;
      for (const auto& d : *made) fs::remove_all(d, ec);
    });
  }
  made->push_back(dir);
  return dir;
}

std::string ReadTextFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

pid_t SpawnTool(const std::vector<std::string>& args_after_binary, const std::string& binary) {
  std::vector<std::string> full = {BinDir() + "/" + binary};
  full.insert(full.end(), args_after_binary.begin(), args_after_binary.end());
  return Spawn(full, "/dev/null", "/dev/null");
}

int RunWorkerToExit(const std::vector<std::string>& args, std::string* stderr_text) {
  const std::string dir = MakeTempDir();
  std::vector<std::string> full = {BinDir() + "/spillway-worker"};
  full.insert(full.end(), args.begin(), args.end());
  pid_t pid = Spawn(full, dir + "/stdout", dir + "/stderr");
  int status = 0;
  waitpid(pid, &status, 0);
  if (stderr_text) *stderr_text = ReadTextFile(dir + "/stderr");
  std::error_code ec;
  fs::remove_all(dir, ec);
  return DecodeStatus(status);
}

}  // namespace spillway::testing
