// A body for Beast's parsers: Beast's string_body, except that a declared
// Content-Length is not reserved at once. The string grows as the body
// arrives (doubling, at most to that length), so a peer that declares 8 MiB
// and then trickles holds what it sent, not 8 MiB (http_server.cpp's
// Session::ReadInSteps), and an answer that declares 4 GB (a broken or
// hostile server behind the gateway) allocates nothing it did not send.
// A body with no declared length (chunked) grows at most to its `cap` (the
// parser's body limit, set by whoever reads it): doubling past that let a
// chunked request body hold twice the limit, where the server's budget
// counted a body as at most its limit.
#pragma once

#include <boost/asio/buffer.hpp>
#include <boost/beast/core/buffers_range.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/optional.hpp>

#include <algorithm>
#include <cstdint>
#include <string>

namespace spillway::http {

struct GrowingBody {
  // The body's string, and the most it grows to with no declared length
  // (0: unbounded). Moves into a std::string as it is.
  struct value_type : std::string {
    size_t cap = 0;
  };
  static std::uint64_t size(const value_type& v) { return v.size(); }
  class reader {
   public:
    template <bool isRequest, class Fields>
    reader(boost::beast::http::header<isRequest, Fields>&, value_type& body) : body_(body) {}
    void init(const boost::optional<std::uint64_t>& length, boost::beast::error_code& ec) {
      limit_ = length ? *length : body_.cap;
      ec = {};
    }
    template <class ConstBufferSequence>
    std::size_t put(const ConstBufferSequence& buffers, boost::beast::error_code& ec) {
      const size_t n = boost::asio::buffer_size(buffers);
      const size_t want = body_.size() + n;
      if (want > body_.capacity()) {
        size_t grown = std::max(want, body_.capacity() * 2);
        if (limit_ > 0) grown = std::max<size_t>(want, std::min<uint64_t>(grown, limit_));
        // Exactly that: reserve() on a string that holds some would take
        // at least twice its capacity (libstdc++), past a declared length.
        std::string bigger;
        bigger.reserve(grown);
        bigger.append(body_);
        static_cast<std::string&>(body_).swap(bigger);
      }
      for (const auto b : boost::beast::buffers_range_ref(buffers)) body_.append(static_cast<const char*>(b.data()), b.size());
      ec = {};
      return n;
    }
    void finish(boost::beast::error_code& ec) { ec = {}; }

   private:
    value_type& body_;
    uint64_t limit_ = 0;  // the declared length, else the body's cap (0: none)
  };
};

}  // namespace spillway::http
