// A fixed pool of threads running accepted requests (each blocks on its
// upstream call), behind a bounded queue. Submit() refuses when the queue is
// full; the caller then answers 503 + Retry-After. An exception thrown by a
// task is caught and logged; the thread goes on.
#pragma once

#include <condition_variable>
#include <cstdio>
#include <exception>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "common/survive.h"

namespace spillway::gateway {

class Dispatcher {
 public:
  Dispatcher(int threads, size_t max_queue) : max_queue_(max_queue) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
  }
  ~Dispatcher() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  // Thread-safe. False when the queue is full (the task is not run).
  bool Submit(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (queue_.size() >= max_queue_) return false;
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
    return true;
  }
  size_t queued() const {
    std::lock_guard<std::mutex> lk(mu_);
    return queue_.size();
  }

 private:
  void Run() {
    while (true) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (stop_ && queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      // The request's exchange (if any) answers 500 as it is dropped; its
      // journal row is recovered at the next start.
      RunSurviving("spillway: a dispatcher task", task);
    }
  }

  const size_t max_queue_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace spillway::gateway
