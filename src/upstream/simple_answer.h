// A worker's answer in its commonest form, read without Beast's parser:
// HTTP/1.1, a final status with a body (200-599, not 204 or 304), header
// lines as RFC 9112 writes them, one Content-Length, no Transfer-Encoding
// or Proxy-Connection, and a Connection header of "keep-alive" or "close" at
// most. That is every
// one-shot answer a Spillway worker sends, and on a request's way Beast's
// response parser and its fields (an allocation a field, copied again into
// the ClientResponse) were some 150 lines of code run cold each time.
//
// Anything else (a 1xx, chunked, an HTTP/1.0 answer, a header line this
// reader does not take whole, a head past 4 KiB) is left to Beast's parser:
// fallback() says so, and the bytes stay in the caller's buffer (nothing of
// a head is consumed until it is taken), so the caller reads them again
// with Beast's parser, whose answer and errors are what they were.
//
// The interface is the part of Beast's parser that ReadUntil
// (connection_pool.cpp) drives: put() what the buffer holds, is_done(),
// got_some() and put_eof() at the end of the stream.
#pragma once

#include <boost/asio/buffer.hpp>
#include <boost/beast/core/error.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

#include "api/http_client.h"

namespace spillway::upstream {

class SimpleAnswer {
 public:
  // How far the head's end is looked for (half of Beast's response parser's
  // 8 KiB limit: no head this reader takes is one Beast would refuse), and
  // the pool's body limit (a larger Content-Length: Beast's parser refuses it).
  static constexpr size_t kSearched = 4 * 1024;
  static constexpr uint64_t kMaxBody = uint64_t{1} << 32;

  // Takes what `buf` holds; returns how much of it was taken. `ec`:
  // need_more until the answer is whole (then clear), or
  // net::error::operation_not_supported when it is not one this reader
  // takes (fallback(): nothing was taken).
  size_t put(boost::asio::const_buffer buf, boost::beast::error_code& ec);
  void put_eof(boost::beast::error_code& ec);
  bool is_done() const { return done_; }
  bool got_some() const { return got_some_; }
  bool fallback() const { return fallback_; }
  // Whether the connection may carry the next request (HTTP/1.1 without "Connection: close").
  bool keep_alive() const { return keep_alive_; }
  // The answer: status, headers by lower-case name, body. Once is_done().
  http::ClientResponse& answer() { return answer_; }

 private:
  // Parses a whole head (`n` bytes, through its empty line); false: not one this reader takes.
  bool Head(const char* p, size_t n);

  http::ClientResponse answer_;
  uint64_t remaining_ = 0;  // body bytes still to come
  size_t scanned_ = 0;      // bytes of the buffer already searched for the head's end
  bool head_ = false, done_ = false, got_some_ = false, fallback_ = false, keep_alive_ = true;
};

}  // namespace spillway::upstream
