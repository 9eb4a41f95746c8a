// SimpleAnswer: a worker's common answer read without Beast's parser, and
// every other left to it. Whatever it takes whole, Beast's parser reads the
// same way (status, headers, body, keep-alive, bytes taken), on answers
// written out and on thousands of them changed at random.
#include "upstream/simple_answer.h"

#include <gtest/gtest.h>

#include <boost/asio/error.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/http.hpp>

#include <cctype>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "api/growing_body.h"

namespace spillway::upstream {
namespace {

namespace bhttp = boost::beast::http;
using boost::beast::error_code;

const std::string kAnswer =
    "HTTP/1.1 200 OK\r\nServer: spillway\r\nContent-Type: application/json\r\nContent-Length: 11\r\n"
    "X-Spillway-Timings: {\"prompt_ms\":1.5}\r\n\r\n{\"ok\":true}";

// What a reader made of some bytes, fed as ReadUntil feeds it: the whole
// unconsumed buffer at each step, `step` new bytes at a time.
struct Read {
  bool done = false, fallback = false, keep = false;
  error_code ec;
  size_t taken = 0;
  http::ClientResponse answer;
};

Read BySimple(const std::string& bytes, size_t step, bool eof = false) {
  SimpleAnswer s;
  Read r;
  std::string buffer;
  size_t fed = 0;
  while (true) {
    const size_t more = std::min(step, bytes.size() - fed);
    buffer.append(bytes, fed, more);
    fed += more;
    error_code ec;
    const size_t used = s.put(boost::asio::buffer(buffer), ec);
    buffer.erase(0, used);
    r.taken += used;
    r.ec = ec;
    if (ec != bhttp::error::need_more || fed == bytes.size()) break;
  }
  if (eof && r.ec == bhttp::error::need_more) {
    error_code ec;
    s.put_eof(ec);
    r.ec = ec;
  }
  r.done = s.is_done();
  r.fallback = s.fallback();
  r.keep = s.keep_alive();
  r.answer = s.answer();
  return r;
}

std::optional<Read> ByBeast(const std::string& bytes) {
  bhttp::response_parser<http::GrowingBody> p;
  p.body_limit(SimpleAnswer::kMaxBody);
  error_code ec;
  const size_t used = p.put(boost::asio::buffer(bytes), ec);
  size_t taken = used;
  if (!ec && !p.is_done() && used < bytes.size()) {  // (the body after the head)
    taken += p.put(boost::asio::buffer(bytes.data() + used, bytes.size() - used), ec);
  }
  if (ec || !p.is_done()) return std::nullopt;
  Read r;
  r.done = true;
  r.taken = taken;
  r.keep = p.keep_alive();
  auto res = p.release();
  r.answer.status = res.result_int();
  for (const auto& f : res) {
    std::string name(f.name_string());
    for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    r.answer.headers[name] = std::string(f.value());
  }
  r.answer.body = std::move(res.body());
  return r;
}

void ExpectSameAsBeast(const std::string& bytes, const Read& mine) {
  const auto beast = ByBeast(bytes);
  ASSERT_TRUE(beast) << "taken whole here, refused by Beast: " << bytes;
  EXPECT_EQ(mine.answer.status, beast->answer.status) << bytes;
  EXPECT_EQ(mine.answer.headers, beast->answer.headers) << bytes;
  EXPECT_EQ(mine.answer.body, beast->answer.body) << bytes;
  EXPECT_EQ(mine.keep, beast->keep) << bytes;
  EXPECT_EQ(mine.taken, beast->taken) << bytes;
}

TEST(SimpleAnswerTest, ReadsAWorkersAnswerHoweverItsBytesArrive) {
  for (const size_t step : {size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{64}, kAnswer.size()}) {
    const Read r = BySimple(kAnswer + "HTTP/1.1", step);  // (the next answer's first bytes stay)
    ASSERT_TRUE(r.done) << step;
    EXPECT_FALSE(r.fallback);
    EXPECT_FALSE(r.ec) << r.ec.message();
    EXPECT_EQ(r.answer.status, 200);
    EXPECT_EQ(r.answer.body, "{\"ok\":true}");
    EXPECT_EQ(r.answer.Header("x-spillway-timings"), "{\"prompt_ms\":1.5}");
    EXPECT_EQ(r.answer.Header("content-type"), "application/json");
    EXPECT_EQ(r.taken, kAnswer.size());
    EXPECT_TRUE(r.keep);
    ExpectSameAsBeast(kAnswer, r);
  }
}

TEST(SimpleAnswerTest, LeavesEveryOtherAnswerToBeastUntaken) {
  const std::vector<std::string> others = {
      "HTTP/1.1 100 Continue\r\n\r\n" + kAnswer,
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
      "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
      "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nread until the end",
      "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n",
      "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n",
      "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok",
      "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: upgrade\r\n\r\nok",
      "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nProxy-Connection: close\r\n\r\nok",
      "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Folded: a\r\n b\r\n\r\nok",
      "HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\nok",
      "HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok",
      "HTTP/1.1 200 OK\r\nContent-Length: 4294967297\r\n\r\n",
      "HTTP/1.1 200 OK\r\nX-Long: " + std::string(5000, 'x') + "\r\nContent-Length: 2\r\n\r\nok",
      "HTTP/1.1 200 OK\r\nX-Nul: a" + std::string(1, '\0') + "b\r\nContent-Length: 2\r\n\r\nok",
      "HTTP/1.1 2000 OK\r\nContent-Length: 2\r\n\r\nok",
      "HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
  };
  for (const auto& bytes : others) {
    const Read r = BySimple(bytes, bytes.size());
    EXPECT_TRUE(r.fallback) << bytes;
    EXPECT_EQ(r.ec, boost::asio::error::operation_not_supported) << bytes;
    EXPECT_EQ(r.taken, 0u) << bytes;
  }
  // "Connection: close" is taken: the connection is not kept.
  const Read closing = BySimple("HTTP/1.1 503 Busy\r\nContent-Length: 0\r\nConnection: Close\r\n\r\n", 5);
  ASSERT_TRUE(closing.done);
  EXPECT_FALSE(closing.keep);
  ExpectSameAsBeast("HTTP/1.1 503 Busy\r\nContent-Length: 0\r\nConnection: Close\r\n\r\n", closing);
}

TEST(SimpleAnswerTest, AnAnswerCutShortByTheEndOfTheStreamIsAPartialMessage) {
  const Read cut = BySimple(kAnswer.substr(0, kAnswer.size() - 3), 16, /*eof=*/true);
  EXPECT_FALSE(cut.done);
  EXPECT_EQ(cut.ec, bhttp::error::partial_message);
  const Read head_only = BySimple(kAnswer.substr(0, 20), 16, /*eof=*/true);
  EXPECT_EQ(head_only.ec, bhttp::error::partial_message);
}

// Answers changed at random (bytes replaced, inserted, dropped; header lines
// of many shapes): whenever SimpleAnswer takes one whole, Beast's parser
// reads it the same way.
TEST(SimpleAnswerTest, WhateverItTakesBeastReadsTheSameWay) {
  std::mt19937 rng(20261207);
  const std::vector<std::string> lines = {
      "Server: spillway",       "Content-Type: application/json", "X-Request-Id: r-1",   "Connection: keep-alive",
      "Connection: close",      "connection: KEEP-ALIVE",         "X-Empty:",             "X-Spaces:   a b  ",
      "X-Tab:\tv\t",            "Retry-After: 1",                 "X-Obs: caf\xc3\xa9",   "X-Dup: 1",
      "X-Dup: 2",               "Content-Length: 0",              "content-length: 0003", "Transfer-Encoding: identity",
      "X-Bad Name: v",          "X-Colon:: v",                    ": v",                  "X-Ctl: a\x01",
      "Proxy-Connection: close", "Proxy-Connection: a b",
  };
  const std::string chars = "HTP/1. 0239:\r\nabcXx-\t\x7f\x80";
  int taken = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string bytes = "HTTP/1.1 " + std::to_string(std::uniform_int_distribution<int>(100, 599)(rng)) +
                        (rng() % 4 ? " OK" : " ") + "\r\n";
    const int n = static_cast<int>(rng() % 6);
    for (int k = 0; k < n; ++k) bytes += lines[rng() % lines.size()] + "\r\n";
    const size_t body = rng() % 12;
    if (rng() % 8) bytes += "Content-Length: " + std::to_string(body) + "\r\n";
    bytes += "\r\n" + std::string(body + rng() % 3, 'b');
    for (int m = static_cast<int>(rng() % 3); m > 0; --m) {  // changed at random
      const size_t at = rng() % bytes.size();
      switch (rng() % 3) {
        case 0: bytes[at] = chars[rng() % chars.size()]; break;
        case 1: bytes.insert(at, 1, chars[rng() % chars.size()]); break;
        default: bytes.erase(at, 1);
      }
    }
    const Read r = BySimple(bytes, 1 + rng() % 40);
    if (!r.done) continue;
    ++taken;
    ExpectSameAsBeast(bytes, r);
    if (HasFailure()) return;
  }
  EXPECT_GT(taken, 2000);  // (the comparison ran on many)
}

}  // namespace
}  // namespace spillway::upstream
