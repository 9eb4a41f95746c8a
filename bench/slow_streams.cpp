#include "slow_streams.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include <array>
#include <cstdlib>
#include <optional>
#include <vector>

namespace spillway::bench {

namespace net = boost::asio;
using tcp = net::ip::tcp;

struct SlowStreams::Shared {
  net::io_context ioc{1};
  std::optional<net::executor_work_guard<net::io_context::executor_type>> guard;
  std::atomic<int> connected{0}, answered{0}, with_data{0}, done{0}, refused{0}, failed{0}, last_refusal{0};
  std::atomic<uint64_t> events{0};
  bool closing = false;  // only touched on the client thread
};

namespace {

// One stream: connect, send, then one event per tick. Everything runs on the
// client thread; a handler keeps its reader alive.
class Reader : public std::enable_shared_from_this<Reader> {
 public:
  Reader(SlowStreams::Shared& s, const std::string& request, std::chrono::milliseconds interval)
      : s_(s), request_(request), interval_(interval), socket_(s.ioc), timer_(s.ioc) {}

  void Start(uint16_t port) {
    socket_.async_connect(tcp::endpoint(net::ip::address_v4::loopback(), port),
                          [self = shared_from_this()](boost::system::error_code ec) {
                            if (ec) return self->Fail();
                            net::async_write(self->socket_, net::buffer(self->request_),
                                             [self](boost::system::error_code ec, size_t) {
                                               if (ec) return self->Fail();
                                               ++self->s_.connected;
                                               self->next_ = std::chrono::steady_clock::now();
                                               self->ReadOne();  // the head and first event as soon as they come
                                             });
                          });
  }

  void Close() {
    boost::system::error_code ec;
    timer_.cancel();
    socket_.close(ec);
  }

 private:
  // Takes one unit (the head, then one event) from what was read, reading
  // more only when no whole unit is there yet: the rest stays in the socket.
  void ReadOne() {
    if (s_.closing) return;
    if (!head_) {
      const size_t end = buf_.find("\r\n\r\n");
      if (end != std::string::npos) {
        const int status = std::atoi(buf_.c_str() + buf_.find(' ') + 1);
        if (status != 200) {
          ++s_.refused;
          s_.last_refusal = status;
          return Close();
        }
        head_ = true;
        ++s_.answered;
        buf_.erase(0, end + 4);
        return ReadOne();  // the first event belongs to the same tick
      }
      return ReadMore();
    }
    const size_t end = buf_.find("\n\n");
    if (end == std::string::npos) return ReadMore();
    const std::string_view event(buf_.data(), end);
    const bool data = event.find("data: ") != std::string_view::npos;  // not a ": comment" (chunk sizes precede it)
    if (event.find("data: [DONE]") != std::string_view::npos) {
      ++s_.done;
      return Close();
    }
    buf_.erase(0, end + 2);
    if (!data) return ReadOne();  // comments do not count as the tick's event
    ++s_.events;
    if (!seen_data_) {
      seen_data_ = true;
      ++s_.with_data;
    }
    next_ += interval_;
    timer_.expires_at(next_);
    timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (!ec) self->ReadOne();
    });
  }

  void ReadMore() {
    socket_.async_read_some(net::buffer(chunk_), [self = shared_from_this()](boost::system::error_code ec, size_t n) {
      if (ec) return self->Fail();
      self->buf_.append(self->chunk_.data(), n);
      self->ReadOne();
    });
  }

  void Fail() {
    if (!s_.closing) ++s_.failed;
    Close();
  }

  SlowStreams::Shared& s_;
  const std::string& request_;
  const std::chrono::milliseconds interval_;
  tcp::socket socket_;
  net::steady_timer timer_;
  std::chrono::steady_clock::time_point next_;
  std::array<char, 512> chunk_{};  // small reads: a slow reader takes little at a time
  std::string buf_;
  bool head_ = false, seen_data_ = false;
};

}  // namespace

SlowStreams::SlowStreams(Options o) : o_(std::move(o)), shared_(std::make_shared<Shared>()) {}

SlowStreams::~SlowStreams() { Close(); }

void SlowStreams::Open() {
  auto s = shared_;
  s->guard.emplace(s->ioc.get_executor());
  auto request = std::make_shared<std::string>(
      "POST " + o_.target + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(o_.port) +
      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(o_.body.size()) + "\r\n\r\n" + o_.body);
  auto readers = std::make_shared<std::vector<std::shared_ptr<Reader>>>();
  for (int i = 0; i < o_.streams; ++i) readers->push_back(std::make_shared<Reader>(*s, *request, o_.interval));
  net::post(s->ioc, [readers, port = o_.port] {
    for (auto& r : *readers) r->Start(port);
  });
  thread_ = std::thread([s, readers, request] {
    s->ioc.run();
    readers->clear();  // sockets go before the io_context
  });
  // Close() reaches the readers through a posted job on the same thread.
  close_ = [s, readers] {
    s->closing = true;
    for (auto& r : *readers) r->Close();
    s->guard.reset();
  };
}

SlowStreams::Counts SlowStreams::counts() const {
  const Shared& s = *shared_;
  return {s.connected, s.answered, s.with_data, s.done, s.refused, s.failed, s.last_refusal, s.events};
}

void SlowStreams::Close() {
  if (!thread_.joinable()) return;
  net::post(shared_->ioc, close_);
  thread_.join();
}

}  // namespace spillway::bench
