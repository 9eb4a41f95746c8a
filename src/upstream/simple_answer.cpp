#include "upstream/simple_answer.h"

#include <boost/asio/error.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>

#include <algorithm>
#include <cstring>
#include <string_view>

namespace spillway::upstream {

namespace beast = boost::beast;

namespace {

bool TokenChar(unsigned char c) {
  // RFC 9110's tchar.
  if (c >= '0' && c <= '9') return true;
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return true;
  return std::strchr("!#$%&'*+-.^_`|~", c) != nullptr && c != 0;
}

// A field value's bytes: visible, obs-text, space and tab (no CR, LF, NUL or other controls).
bool ValueChar(unsigned char c) { return c >= 0x20 ? c != 0x7f : c == '\t'; }

}  // namespace

bool SimpleAnswer::Head(const char* p, size_t n) {
  std::string_view head(p, n - 2);  // (without the empty line's CRLF)
  // The status line: "HTTP/1.1 DDD reason".
  if (head.size() < 13 || head.substr(0, 9) != "HTTP/1.1 " || head[12] != ' ') return false;
  int status = 0;
  for (size_t i = 9; i < 12; ++i) {
    if (head[i] < '0' || head[i] > '9') return false;
    status = status * 10 + (head[i] - '0');
  }
  if (status < 200 || status > 599 || status == 204 || status == 304) return false;
  size_t eol = head.find("\r\n");
  if (eol == std::string_view::npos) return false;
  for (size_t i = 13; i < eol; ++i) {
    if (!ValueChar(static_cast<unsigned char>(head[i]))) return false;
  }
  answer_.status = status;
  bool length = false;
  size_t at = eol + 2;
  while (at < head.size()) {
    eol = head.find("\r\n", at);
    if (eol == std::string_view::npos) return false;
    const std::string_view line = head.substr(at, eol - at);
    at = eol + 2;
    const size_t colon = line.find(':');
    if (colon == 0 || colon == std::string_view::npos) return false;  // (a folded line starts with SP: no colon, or a bad name)
    std::string name(line.substr(0, colon));
    for (char& c : name) {
      if (!TokenChar(static_cast<unsigned char>(c))) return false;
      c = static_cast<char>(c >= 'A' && c <= 'Z' ? c | 0x20 : c);
    }
    std::string_view value = line.substr(colon + 1);
    for (const char c : value) {
      if (!ValueChar(static_cast<unsigned char>(c))) return false;
    }
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    if (name == "content-length") {
      if (length || value.empty() || value.size() > 18) return false;
      uint64_t v = 0;
      for (const char c : value) {
        if (c < '0' || c > '9') return false;
        v = v * 10 + static_cast<uint64_t>(c - '0');
      }
      if (v > kMaxBody) return false;
      length = true;
      remaining_ = v;
    } else if (name == "transfer-encoding" || name == "proxy-connection") {
      return false;  // (Beast reads Proxy-Connection as it reads Connection: its to say)
    } else if (name == "connection") {
      const beast::string_view token(value.data(), value.size());  // (Boost 1.74's, not std's)
      if (beast::iequals(token, "close")) {
        keep_alive_ = false;
      } else if (!beast::iequals(token, "keep-alive")) {
        return false;
      }
    }
    answer_.headers[std::move(name)] = std::string(value);  // (the last of a repeated name, as before)
  }
  return length;
}

size_t SimpleAnswer::put(boost::asio::const_buffer buf, boost::beast::error_code& ec) {
  const char* p = static_cast<const char*>(buf.data());
  const size_t n = buf.size();
  if (n > 0) got_some_ = true;
  size_t used = 0;
  if (!head_) {
    // The head's end, searched for in what was not searched before. A line
    // ended by a bare LF is Beast's to read (and refuse), now, not once a
    // deadline passes waiting for a CRLF that never comes.
    const std::string_view text(p, std::min(n, kSearched));
    size_t end = std::string_view::npos;
    for (size_t i = scanned_; i < text.size(); ++i) {
      if (text[i] != '\n') continue;
      if (i == 0 || text[i - 1] != '\r') {
        fallback_ = true;
        ec = boost::asio::error::operation_not_supported;
        return 0;
      }
      if (i >= 3 && text[i - 2] == '\n') {
        end = i - 3;
        break;
      }
    }
    if (end == std::string_view::npos) {
      scanned_ = text.size();
      if (n >= kSearched) {  // (a long head: Beast's parser reads it, and says whether it is past its limit)
        fallback_ = true;
        ec = boost::asio::error::operation_not_supported;
        return 0;
      }
      ec = boost::beast::http::error::need_more;
      return 0;
    }
    if (!Head(p, end + 4)) {
      answer_ = {};
      fallback_ = true;
      ec = boost::asio::error::operation_not_supported;
      return 0;
    }
    head_ = true;
    used = end + 4;
  }
  const size_t take = static_cast<size_t>(std::min<uint64_t>(remaining_, n - used));
  answer_.body.append(p + used, take);
  remaining_ -= take;
  used += take;
  done_ = remaining_ == 0;
  ec = done_ ? boost::beast::error_code{} : boost::beast::http::error::need_more;
  return used;
}

void SimpleAnswer::put_eof(boost::beast::error_code& ec) {
  // (As Beast's parser: a message cut short by the end of the stream.)
  ec = done_ ? boost::beast::error_code{} : boost::beast::http::error::partial_message;
}

}  // namespace spillway::upstream
