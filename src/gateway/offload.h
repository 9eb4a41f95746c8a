// Runs blocking work (a journal commit, a status snapshot) on a small pool of
// its own and resumes the calling coroutine on its own executor with the
// result: nothing that can wait on a disk blocks an I/O thread. The pool's
// threads are fixed; requests cost coroutine frames, not threads.
#pragma once

#include <utility>  // before Asio's awaitable.hpp, which uses std::exchange without it (Boost 1.74)

#include <boost/asio/associated_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "common/status.h"
#include "common/thread_pool.h"

namespace spillway::gateway {

template <typename F>
boost::asio::awaitable<std::invoke_result_t<F&>> Offload(ThreadPool& pool, F f) {
  using R = std::invoke_result_t<F&>;
  std::optional<R> result;
  std::exception_ptr error;
  co_await boost::asio::async_initiate<decltype(boost::asio::use_awaitable), void()>(
      [&](auto handler) {
        boost::asio::post(pool.get_executor(), [&, handler = std::move(handler)]() mutable {
          try {
            result.emplace(f());
          } catch (...) {
            error = std::current_exception();
          }
          auto ex = boost::asio::get_associated_executor(handler);
          boost::asio::post(ex, std::move(handler));
        });
      },
      boost::asio::use_awaitable);
  if (error) std::rethrow_exception(error);
  co_return std::move(*result);
}

// A result that arrives later, awaited on the caller's strand: a journal
// commit queued now (it runs while the caller goes on, e.g. while the attempt
// it covers is sent) and awaited before its outcome is acted on. The
// completer may run on any thread; the result is delivered on `strand` (at
// once when the completer runs there), where Wait() is also called: no lock.
class PendingStatus : public std::enable_shared_from_this<PendingStatus> {
 public:
  static std::shared_ptr<PendingStatus> Make(boost::asio::any_io_executor strand) {
    return std::shared_ptr<PendingStatus>(new PendingStatus(std::move(strand)));
  }
  // What the producer calls with the result, once.
  std::function<void(Status)> Completer() {
    return [p = shared_from_this()](Status st) {
      boost::asio::dispatch(p->timer_.get_executor(), [p, st = std::move(st)]() mutable {
        p->result_ = std::move(st);
        p->timer_.cancel();
      });
    };
  }
  boost::asio::awaitable<Status> Wait() {
    if (!result_) {
      boost::system::error_code ec;
      co_await timer_.async_wait(boost::asio::redirect_error(boost::asio::use_awaitable, ec));
    }
    co_return result_.value_or(Status::Internal("a pending commit was abandoned"));
  }
  // The result, when it has arrived (on the strand).
  const std::optional<Status>& result() const { return result_; }

 private:
  explicit PendingStatus(boost::asio::any_io_executor strand) : timer_(std::move(strand)) {
    timer_.expires_at(boost::asio::steady_timer::time_point::max());
  }
  boost::asio::steady_timer timer_;
  std::optional<Status> result_;
};

}  // namespace spillway::gateway
