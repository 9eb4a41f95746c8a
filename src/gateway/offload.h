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
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <exception>
#include <optional>
#include <type_traits>
#include <utility>

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

}  // namespace spillway::gateway
