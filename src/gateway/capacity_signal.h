// Waiting for capacity without a thread and without a sleep loop.
//
// A request that cannot start now (every slot taken, its worker still
// starting, its place in the CPU line not reached) waits on the signal: a
// timer on its own strand, woken at once by Notify() (an attempt released
// its cells or slot, a worker became ready or exited, a request was
// cancelled) or when `max_wait` passes, whichever comes first. The waiter
// then decides again with fresh state. `max_wait` is the bound for what no
// event announces (a breaker's ejection ending, a deadline): callers pass
// the time to their next such moment.
//
// Thread-safe. Notify() posts each wake to the waiter's own executor, so a
// wake that races with the start of a wait is not lost: it runs after the
// waiting coroutine has suspended.
#pragma once

#include <utility>  // before Asio's awaitable.hpp, which uses std::exchange without it (Boost 1.74)

#include <boost/asio/awaitable.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <list>
#include <memory>
#include <mutex>

namespace spillway::gateway {

class CapacitySignal {
 public:
  boost::asio::awaitable<void> Wait(std::chrono::milliseconds max_wait) {
    auto w = std::make_shared<Waiter>(co_await boost::asio::this_coro::executor);
    w->timer.expires_after(max_wait);
    std::list<std::shared_ptr<Waiter>>::iterator it;
    {
      std::lock_guard<std::mutex> lk(mu_);
      it = waiters_.insert(waiters_.end(), w);
    }
    boost::system::error_code ec;
    co_await w->timer.async_wait(boost::asio::redirect_error(boost::asio::use_awaitable, ec));
    std::lock_guard<std::mutex> lk(mu_);
    if (w->listed) waiters_.erase(it);  // timed out: Notify has not taken it
  }

  // Wakes every waiter now.
  void Notify() {
    std::list<std::shared_ptr<Waiter>> woken;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& w : waiters_) w->listed = false;
      woken.swap(waiters_);
    }
    for (auto& w : woken) {
      boost::asio::post(w->timer.get_executor(), [w] { w->timer.cancel(); });
    }
  }

  size_t waiting() const {
    std::lock_guard<std::mutex> lk(mu_);
    return waiters_.size();
  }

 private:
  struct Waiter {
    explicit Waiter(const boost::asio::any_io_executor& ex) : timer(ex) {}
    boost::asio::steady_timer timer;
    bool listed = true;  // guarded by mu_
  };
  mutable std::mutex mu_;
  std::list<std::shared_ptr<Waiter>> waiters_;
};

}  // namespace spillway::gateway
