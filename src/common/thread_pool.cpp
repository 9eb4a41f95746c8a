#include "common/thread_pool.h"

#include <system_error>

#include "common/thread_name.h"

namespace spillway {

ThreadPool::ThreadPool(size_t threads, std::string name, std::string thread_name) : work_(ctx_.get_executor()) {
  threads_.reserve(threads);
  try {
    for (size_t i = 0; i < threads; ++i) {
      threads_.emplace_back([this, thread_name] {
        NameThisThread(thread_name);
        ctx_.run();
      });
    }
  } catch (const std::system_error& e) {
    ctx_.stop();
    for (auto& t : threads_) t.join();
    throw std::system_error(e.code(), "cannot start the " + name + " threads (" + std::to_string(threads_.size()) +
                                          " of " + std::to_string(threads) + " started)");
  }
}

ThreadPool::~ThreadPool() {
  ctx_.stop();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void ThreadPool::join() {
  work_.reset();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

}  // namespace spillway
