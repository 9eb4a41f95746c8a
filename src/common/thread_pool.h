// A few threads running posted work (Asio's thread_pool, minus its start-up
// hang): when a thread cannot be created (the process or user thread limit),
// the ones already running are stopped and joined and the constructor
// throws std::system_error naming the pool (main names the limit). boost::asio::thread_pool's own
// constructor joined its running threads without stopping them first, and
// hung for ever (the gateway never listened, never said why).
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace spillway {

class ThreadPool {
 public:
  using executor_type = boost::asio::io_context::executor_type;

  // `name` says whose threads they are in an error; `thread_name` is what
  // each thread is called (common/thread_name.h: top -H, perf).
  ThreadPool(size_t threads, std::string name, std::string thread_name = "sw-pool");
  ~ThreadPool();  // stops (work not begun is dropped) and joins
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  executor_type get_executor() noexcept { return ctx_.get_executor(); }
  // Runs what was posted, then the threads end; posting after it runs nothing.
  void join();

 private:
  boost::asio::io_context ctx_;
  std::optional<boost::asio::executor_work_guard<executor_type>> work_;
  std::vector<std::thread> threads_;
};

}  // namespace spillway
