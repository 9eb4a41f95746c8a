// Waiting for capacity without a thread and without a sleep loop.
//
// Two kinds of waiters:
//
// - The line (admission): requests of one service that cannot start now
//   (every slot taken, no room in a KV pool, the worker still starting)
//   queue in arrival order and keep their place across waits (Join returns
//   the place; it is left when the Ticket goes). Only the head decides:
//   Notify() (an attempt released its cells or slot, a worker became ready
//   or exited) wakes the head alone, and when the head leaves (admitted,
//   refused, cancelled, past its deadline) the next one becomes head and is
//   woken at once, so that capacity freed for several goes to as many in
//   turn. The others sleep until they are head or their own bound passes
//   (their deadline; a stream's next wait comment): a release costs one
//   decision, not one per waiter, and nobody overtakes (first come, first
//   served; the head waits for what it needs, as vLLM's FCFS scheduler and
//   Ollama's queue do). WakeOne() wakes one of them (a cancel, which the
//   cancelled request must see wherever it stands); NotifyAll() wakes the
//   whole line (a stop).
//
// - Plain waiters (Wait): any Notify wakes them, or `max_wait` passing.
//
// `max_wait` / the bounds are for what no event announces (a breaker's
// ejection ending, memory another program frees on the device, a deadline):
// callers pass the time to their next such moment.
//
// Thread-safe. A wake is posted to the waiter's own executor and also
// recorded, so one that comes while its waiter is busy deciding is not lost:
// its next WaitInLine returns at once.
#pragma once

#include <utility>  // before Asio's awaitable.hpp, which uses std::exchange without it (Boost 1.74)

#include <boost/asio/awaitable.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <cstddef>
#include <iterator>
#include <atomic>
#include <list>
#include <memory>
#include <mutex>

namespace spillway::gateway {

class CapacitySignal {
  struct Waiter {
    explicit Waiter(const boost::asio::any_io_executor& ex) : timer(ex) {}
    boost::asio::steady_timer timer;
    bool listed = true;   // plain: still in waiters_ (guarded by mu_)
    bool pending = false;  // line: woken since its last wait (guarded by mu_)
  };

 public:
  // A place in the line; leaving it (destruction) hands the head on.
  class Ticket {
   public:
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket() { signal_->Leave(it_); }

   private:
    friend class CapacitySignal;
    Ticket(CapacitySignal* s, std::list<std::shared_ptr<Waiter>>::iterator it) : signal_(s), it_(it) {}
    CapacitySignal* signal_;
    std::list<std::shared_ptr<Waiter>>::iterator it_;
  };

  // Joins the line at its end; woken on `ex` (the waiting coroutine's executor).
  std::unique_ptr<Ticket> Join(const boost::asio::any_io_executor& ex) {
    auto w = std::make_shared<Waiter>(ex);
    std::lock_guard<std::mutex> lk(mu_);
    return std::unique_ptr<Ticket>(new Ticket(this, line_.insert(line_.end(), std::move(w))));
  }
  // The same, on the calling coroutine's executor.
  boost::asio::awaitable<std::unique_ptr<Ticket>> Join() { co_return Join(co_await boost::asio::this_coro::executor); }

  bool IsHead(const Ticket& t) const {
    std::lock_guard<std::mutex> lk(mu_);
    return line_.begin() == t.it_;
  }

  // How many are ahead of `t` in the line (0: the head).
  size_t Ahead(const Ticket& t) const {
    std::lock_guard<std::mutex> lk(mu_);
    return static_cast<size_t>(std::distance(line_.cbegin(), decltype(line_)::const_iterator(t.it_)));
  }

  // Sleeps until woken (see above) or `bound` passes; at once when a wake
  // came since the last call.
  boost::asio::awaitable<void> WaitInLine(Ticket& t, std::chrono::milliseconds bound) {
    const std::shared_ptr<Waiter> w = *t.it_;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (w->pending) {
        w->pending = false;
        co_return;
      }
    }
    co_await Sleep(*w, bound);
    std::lock_guard<std::mutex> lk(mu_);
    w->pending = false;
  }

  // A plain wait: any Notify, or `max_wait`.
  boost::asio::awaitable<void> Wait(std::chrono::milliseconds max_wait) {
    auto w = std::make_shared<Waiter>(co_await boost::asio::this_coro::executor);
    std::list<std::shared_ptr<Waiter>>::iterator it;
    {
      std::lock_guard<std::mutex> lk(mu_);
      it = waiters_.insert(waiters_.end(), w);
    }
    co_await Sleep(*w, max_wait);  // (a wake posted to its strand meanwhile runs once this suspends)
    std::lock_guard<std::mutex> lk(mu_);
    if (w->listed) waiters_.erase(it);  // timed out: Notify has not taken it
  }

  // The waiter behind `t`, to wake it alone (WakeOne) from any thread; it
  // stays valid after the ticket is gone (a wake then does nothing).
  std::shared_ptr<void> Handle(const Ticket& t) const {
    std::lock_guard<std::mutex> lk(mu_);
    return *t.it_;
  }
  void WakeOne(const std::shared_ptr<void>& handle) {
    if (!handle) return;
    std::lock_guard<std::mutex> lk(mu_);
    Tell(std::static_pointer_cast<Waiter>(handle));
  }

  // Capacity may be free: the head of the line decides again, and every plain waiter.
  void Notify() { Wake(false); }
  // Everyone in the line too.
  void NotifyAll() { Wake(true); }

  // A request of the service was admitted at `now_ms` (the line moved):
  // how long a line waits is counted from the last one, not from when each
  // of its requests came (RequestAdmission::WaitedSinceUp).
  void Admitted(int64_t now_ms) { last_admitted_ms_.store(now_ms, std::memory_order_relaxed); }
  int64_t last_admitted_ms() const { return last_admitted_ms_.load(std::memory_order_relaxed); }

  // Waiting now, in the line and plain.
  size_t waiting() const {
    std::lock_guard<std::mutex> lk(mu_);
    return waiters_.size() + line_.size();
  }
  size_t in_line() const {
    std::lock_guard<std::mutex> lk(mu_);
    return line_.size();
  }

 private:
  // Until the waiter's timer is cancelled (a wake) or `bound` passes.
  static boost::asio::awaitable<void> Sleep(Waiter& w, std::chrono::milliseconds bound) {
    w.timer.expires_after(bound);
    boost::system::error_code ec;
    co_await w.timer.async_wait(boost::asio::redirect_error(boost::asio::use_awaitable, ec));
  }
  static void Post(const std::shared_ptr<Waiter>& w) {
    boost::asio::post(w->timer.get_executor(), [w] { w->timer.cancel(); });
  }
  // (mu_ held) A line waiter is told.
  static void Tell(const std::shared_ptr<Waiter>& w) {
    w->pending = true;
    Post(w);
  }

  void Wake(bool whole_line) {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& w : waiters_) {
      w->listed = false;
      Post(w);
    }
    waiters_.clear();
    for (auto& w : line_) {
      Tell(w);
      if (!whole_line) break;
    }
  }

  void Leave(std::list<std::shared_ptr<Waiter>>::iterator it) {
    std::lock_guard<std::mutex> lk(mu_);
    const bool head = it == line_.begin();
    line_.erase(it);
    if (head && !line_.empty()) Tell(line_.front());  // the next decides at once
  }

  mutable std::mutex mu_;
  std::atomic<int64_t> last_admitted_ms_{0};
  std::list<std::shared_ptr<Waiter>> waiters_;  // plain
  std::list<std::shared_ptr<Waiter>> line_;     // in arrival order
};

}  // namespace spillway::gateway
