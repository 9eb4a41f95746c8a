// Reading a connection with Beast's parser by the socket's own reads: what
// the HTTP server's sessions (a request's head) and the worker connections
// (an answer, a relayed stream) share. Beast's composed reads (async_read,
// async_read_header, async_read_some on a basic_stream) go through layers of
// operations and arm and cancel the stream's timer around every read; here
// the caller parses what its buffer holds (parser.put), reads the socket
// when it needs more (ReadSize), ends a read at end of file as Beast does
// (AtEndOfFile), and bounds the reads with one ReadDeadline.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

namespace spillway::http {

// What one read of the socket into `b` takes, as Beast reads: the buffer's
// free room, at least 512 bytes, within its bound and `most`; 0 when it is full.
inline size_t ReadSize(const boost::beast::flat_buffer& b, size_t most = size_t{64} << 10) {
  return std::min({std::max<size_t>(512, b.capacity() - b.size()), b.max_size() - b.size(), most});
}

// A read's end of file, told as Beast tells it: the message ends there (an
// answer framed by the connection's end: no error) or is cut
// (partial_message); nothing of one begun: end_of_stream.
template <class Parser>
void AtEndOfFile(Parser& p, boost::beast::error_code& ec) {
  if (!p.got_some()) {
    ec = boost::beast::http::error::end_of_stream;
    return;
  }
  ec = {};
  p.put_eof(ec);
}

// A connection's read deadline, kept by one timer: armed when none waits or
// when the deadline comes sooner than the one it waits for, and armed again
// by its own handler when the deadline has moved later meanwhile. Reads move
// the deadline, not the timer (Beast's stream armed and cancelled its timer
// around each read). Once it passes, `on_expire` runs on the executor (the
// owner cancels or closes its socket) and Passed() says so.
// Owned by a shared_ptr (its timer's handler holds one); Stop() before what
// `on_expire` refers to goes away: it is dropped, and the timer cancelled.
class ReadDeadline : public std::enable_shared_from_this<ReadDeadline> {
 public:
  static std::shared_ptr<ReadDeadline> Make(const boost::asio::any_io_executor& ex, std::function<void()> on_expire) {
    return std::shared_ptr<ReadDeadline>(new ReadDeadline(ex, std::move(on_expire)));
  }

  // Reads from now on end by `when`.
  void Set(std::chrono::steady_clock::time_point when) {
    at_ = when;
    expired_ = false;
    if (!armed_ || at_ < timer_.expiry()) Arm();
  }
  void Stop() {
    on_expire_ = nullptr;
    timer_.cancel();
  }
  // Past the deadline. Asked before a read is begun: the timer's expiry finds
  // nothing to cancel when the read in flight has just completed (with
  // bytes, its completion queued), and the next read would have no bound.
  bool Passed() const { return expired_ || std::chrono::steady_clock::now() >= at_; }
  // A read's error, told as a timeout when this deadline ended it.
  void Tell(boost::beast::error_code& ec) const {
    if (ec == boost::asio::error::operation_aborted && expired_) ec = boost::beast::error::timeout;
  }

 private:
  ReadDeadline(const boost::asio::any_io_executor& ex, std::function<void()> on_expire)
      : timer_(ex), on_expire_(std::move(on_expire)) {}

  void Arm() {
    armed_ = true;
    timer_.expires_at(at_);  // (a wait it replaces ends, and is told apart by its number)
    timer_.async_wait([self = shared_from_this(), armed = ++arms_](const boost::beast::error_code& ec) {
      if (armed != self->arms_) return;
      self->armed_ = false;
      if (ec || !self->on_expire_) return;
      if (std::chrono::steady_clock::now() < self->at_) return self->Arm();
      self->expired_ = true;
      self->on_expire_();
    });
  }

  boost::asio::steady_timer timer_;
  std::function<void()> on_expire_;
  std::chrono::steady_clock::time_point at_;
  bool armed_ = false;    // timer_ waits
  uint64_t arms_ = 0;     // timer_'s waits so far (the latest is the one that counts)
  bool expired_ = false;  // the deadline passed since the last Set
};

}  // namespace spillway::http
