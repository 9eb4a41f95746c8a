// In-process stand-ins for the gateway's workers (upstream::Workers): each
// placement key points at a port (a FakeWorker's, or one where nothing
// listens) that the test sets, takes down or brings back; what the gateway
// asks of them (suspects, demands, releases) is recorded.
#pragma once

#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "upstream/workers.h"

namespace spillway::testing {

// How a worker looks to the gateway (FakeWorkers::SetView): its state, pid,
// when its current start began, and how many spawns were tried for it.
inline upstream::WorkerView ViewOf(const std::string& key, upstream::WorkerState state, pid_t pid,
                                   int64_t starting_since_ms = 0, int spawn_attempts = 0) {
  upstream::WorkerView v;
  v.key = key;
  v.state = state;
  v.pid = pid;
  v.starting_since_ms = starting_since_ms;
  v.spawn_attempts = spawn_attempts;
  return v;
}

class FakeWorkers : public upstream::Workers {
 public:
  void SetReady(const std::string& key, uint16_t port) {
    std::lock_guard<std::mutex> lk(mu_);
    views_.erase(key);
    ports_[key] = port;
  }
  // The worker exits: its port is gone, and the gateway is told as the supervisor would.
  void Exit(const std::string& key, const std::string& why) {
    std::function<void(const std::string&, const std::string&)> f;
    {
      std::lock_guard<std::mutex> lk(mu_);
      ports_.erase(key);
      f = on_exit_;
    }
    if (f) f(key, why);
  }
  // How a worker looks to the gateway beyond "ready on a port" (starting,
  // waiting in backoff, its pid): replaces what SetReady would show for it.
  void SetView(const upstream::WorkerView& v) {
    std::lock_guard<std::mutex> lk(mu_);
    views_[v.key] = v;
  }
  // Its state as the gateway sees it (a worker shown only by a port: ready).
  upstream::WorkerState StateOf(const std::string& key) const {
    for (const auto& w : Snapshot()) {
      if (w.key == key) return w.state;
    }
    return upstream::WorkerState::kStopped;
  }
  // The worker is starting (a model loading since `since_ms`): no port yet.
  void SetStarting(const std::string& key, int64_t since_ms, int64_t start_timeout_ms = 120'000) {
    std::lock_guard<std::mutex> lk(mu_);
    ports_.erase(key);
    upstream::WorkerView v;
    v.key = key;
    v.state = upstream::WorkerState::kStarting;
    v.starting_since_ms = since_ms;
    v.start_timeout_ms = start_timeout_ms;
    views_[key] = v;
  }
  // Ready again on `port`, looking as SetReady shows it.
  void SetReadyAgain(const std::string& key, uint16_t port) {
    std::lock_guard<std::mutex> lk(mu_);
    views_.erase(key);
    ports_[key] = port;
  }
  void SetOnDemand(const std::string& key) {
    std::lock_guard<std::mutex> lk(mu_);
    on_demand_.insert(key);
  }
  std::vector<std::string> suspected() const {
    std::lock_guard<std::mutex> lk(mu_);
    return suspected_;
  }

  std::optional<uint16_t> ReadyPort(const std::string& key) const override {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = ports_.find(key);
    if (it == ports_.end()) return std::nullopt;
    return it->second;
  }
  std::vector<upstream::WorkerView> Snapshot() const override {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<upstream::WorkerView> out;
    for (const auto& [key, port] : ports_) {
      if (views_.count(key)) continue;
      upstream::WorkerView v;
      v.key = key;
      v.state = upstream::WorkerState::kReady;
      v.port = port;
      out.push_back(v);
    }
    for (const auto& [key, v] : views_) out.push_back(v);
    return out;
  }
  void Demand(const std::string& key) override {
    std::lock_guard<std::mutex> lk(mu_);
    ++demanded_[key];
  }
  int demanded(const std::string& key) const {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = demanded_.find(key);
    return it == demanded_.end() ? 0 : it->second;
  }
  // (An on-demand worker released shows as stopped, as the supervisor's does.)
  void Release(const std::string& key) override {
    std::lock_guard<std::mutex> lk(mu_);
    ports_.erase(key);
    if (on_demand_.count(key)) {
      upstream::WorkerView v;
      v.key = key;
      v.state = upstream::WorkerState::kStopped;
      v.released_idle = true;
      views_[key] = v;
    }
  }
  // After Release(): what waiting for its process's end does (default: it
  // ended at once). The hook runs on the caller's thread.
  void SetWaitReleased(std::function<bool(const std::string&)> f) {
    std::lock_guard<std::mutex> lk(mu_);
    wait_released_ = std::move(f);
  }
  bool WaitReleased(const std::string& key, int64_t) override {
    std::function<bool(const std::string&)> f;
    {
      std::lock_guard<std::mutex> lk(mu_);
      f = wait_released_;
    }
    return !f || f(key);
  }
  bool OnDemand(const std::string& key) const override {
    std::lock_guard<std::mutex> lk(mu_);
    return on_demand_.count(key) > 0;
  }
  void Suspect(const std::string& key) override {
    std::lock_guard<std::mutex> lk(mu_);
    suspected_.push_back(key);
  }
  void SetOnExit(std::function<void(const std::string&, const std::string&)> f) override {
    std::lock_guard<std::mutex> lk(mu_);
    on_exit_ = std::move(f);
  }
  void SetIdleCheck(std::function<bool(const std::string&)> f) override {
    std::lock_guard<std::mutex> lk(mu_);
    idle_check_ = std::move(f);
  }
  // What the supervisor's idle round asks of the gateway for `key`: whether
  // it released the worker (its port is gone then, as Release does).
  bool IdleCheck(const std::string& key) {
    std::function<bool(const std::string&)> f;
    {
      std::lock_guard<std::mutex> lk(mu_);
      f = idle_check_;
    }
    return f && f(key);
  }
  void Stop() override {}
  const std::vector<std::pair<std::string, std::string>>& AuthHeaders() const override {
    static const std::vector<std::pair<std::string, std::string>> kAuth = {{"Authorization", "Bearer fake-secret"}};
    return kAuth;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, uint16_t> ports_;
  std::map<std::string, upstream::WorkerView> views_;
  std::set<std::string> on_demand_;
  std::map<std::string, int> demanded_;  // Demand() calls per key
  std::function<bool(const std::string&)> idle_check_;
  std::function<bool(const std::string&)> wait_released_;
  std::vector<std::string> suspected_;
  std::function<void(const std::string&, const std::string&)> on_exit_;
};

}  // namespace spillway::testing
