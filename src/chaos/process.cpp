#include "chaos/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <cstring>
#include <thread>

#include "common/secret.h"

extern char** environ;

namespace spillway::chaos {

const std::string& WorkerSecret() {
  static const std::string secret = [] {
    const std::string s = RandomHex(16);
    setenv(kWorkerSecretEnv, s.c_str(), 1);
    return s;
  }();
  return secret;
}

std::vector<std::pair<std::string, std::string>> WorkerAuth() {
  return {{"Authorization", "Bearer " + WorkerSecret()}};
}

namespace {

// Every child of `spillway chaos` is forked by this one thread, which lives as
// long as the process: a child's parent-death signal (SIGTERM) then fires when
// the harness ends however it ends (Ctrl-C, a crash, kill -9), not when some
// thread that spawned it (the fault injector restarting a gateway) returns.
// Its children run in process groups of their own, out of reach of the
// terminal's Ctrl-C; a gateway stops its workers on that SIGTERM.
class Spawner {
 public:
  static Spawner& Get() {
    static Spawner* s = new Spawner();  // never destroyed: its thread must outlive every caller
    return *s;
  }
  pid_t Run(std::function<pid_t()> f) {
    std::packaged_task<pid_t()> task(std::move(f));
    auto result = task.get_future();
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
    return result.get();
  }

 private:
  Spawner() { std::thread([this] { Loop(); }).detach(); }
  [[noreturn]] void Loop() {
    while (true) {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return !queue_.empty(); });
      auto task = std::move(queue_.front());
      queue_.pop_front();
      lk.unlock();
      task();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<pid_t()>> queue_;
};

}  // namespace

bool Child::Spawn(const std::vector<std::string>& argv_in, const std::string& log_path,
                  const std::map<std::string, std::string>& env) {
  Stop();
  WorkerSecret();  // inherited by gateways, and by their workers through them
  std::vector<std::string> args = argv_in;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    if (env.count(kv.substr(0, kv.find('='))) == 0) envs.push_back(kv);
  }
  for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t spawned = Spawner::Get().Run([&]() -> pid_t {
    const pid_t pid = fork();
    if (pid != 0) return pid;  // -1: failed
    // The child: only async-signal-safe calls until exec.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);  // the harness died meanwhile
    const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  });
  std::lock_guard<std::mutex> lk(mu_);
  pid_ = spawned > 0 ? spawned : -1;
  return pid_ > 0;
}

bool Child::Alive() {
  std::lock_guard<std::mutex> lk(mu_);
  if (pid_ <= 0) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

void Child::Kill9() {
  std::lock_guard<std::mutex> lk(mu_);
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

void Child::Stop(int grace_ms) {
  // (The lock is held through the grace: Alive and Kill9 wait for the end.)
  std::lock_guard<std::mutex> lk(mu_);
  if (pid_ <= 0) return;
  kill(-pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(grace_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(-pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

}  // namespace spillway::chaos
