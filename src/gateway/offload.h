// Runs blocking work (a journal commit, a status snapshot) on a small pool of
// its own and resumes the calling coroutine on its own executor with the
// result: nothing that can wait on a disk blocks an I/O thread. The pool's
// threads are fixed; requests cost coroutine frames, not threads.
#pragma once

#include <utility>  // before Asio's awaitable.hpp, which uses std::exchange without it (Boost 1.74)

#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <exception>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "common/status.h"

namespace spillway::gateway {

template <typename F>
boost::asio::awaitable<std::invoke_result_t<F&>> Offload(boost::asio::thread_pool& pool, F f) {
  using R = std::invoke_result_t<F&>;
  std::optional<R> result;
  std::exception_ptr error;
  co_await boost::asio::async_initiate<decltype(boost::asio::use_awaitable), void()>(
      [&](auto handler) {
        boost::asio::post(pool, [&, handler = std::move(handler)]() mutable {
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

// A blocking call that returns a Status, started now and awaited later: it
// runs on `pool` while the caller goes on (a journal commit overlapped with
// sending the attempt it covers); Wait() resumes the caller with its result.
// Start and Wait are called from the same strand (`strand`, the caller's
// executor), where the result is also delivered: no lock is needed.
class PendingStatus : public std::enable_shared_from_this<PendingStatus> {
 public:
  template <typename F>
  static std::shared_ptr<PendingStatus> Start(boost::asio::thread_pool& pool, boost::asio::any_io_executor strand, F f) {
    auto p = std::shared_ptr<PendingStatus>(new PendingStatus(strand));
    boost::asio::post(pool, [p, f = std::move(f)]() mutable {
      Status st;
      try {
        st = f();
      } catch (const std::exception& e) {
        st = Status::Internal(e.what());
      }
      boost::asio::post(p->timer_.get_executor(), [p, st = std::move(st)]() mutable {
        p->result_ = std::move(st);
        p->timer_.cancel();
      });
    });
    return p;
  }
  boost::asio::awaitable<Status> Wait() {
    if (!result_) {
      boost::system::error_code ec;
      co_await timer_.async_wait(boost::asio::redirect_error(boost::asio::use_awaitable, ec));
    }
    co_return result_.value_or(Status::Internal("a pending commit was abandoned"));
  }

 private:
  explicit PendingStatus(boost::asio::any_io_executor strand) : timer_(strand) {
    timer_.expires_at(boost::asio::steady_timer::time_point::max());
  }
  boost::asio::steady_timer timer_;
  std::optional<Status> result_;
};

}  // namespace spillway::gateway
