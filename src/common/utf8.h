// UTF-8 text from bytes that may not be (a process's log, a cut string):
// JSON written from it by nlohmann::json's dump() throws on invalid UTF-8.
#pragma once

#include <string>
#include <string_view>

namespace spillway {

// `s` with each invalid or incomplete sequence (a stray continuation byte,
// an overlong form, a surrogate, a character cut at either end) replaced by
// U+FFFD; valid text comes back unchanged.
std::string ValidUtf8(std::string_view s);

// `s` cut to at most `n` bytes on a character boundary, the cut marked
// "..." (within the n, when n >= 4); `s` itself when it fits. (Cut by bytes alone, a
// character split in two made the text invalid: systemd ignores such a
// STATUS= line.)
std::string Abbreviated(std::string_view s, size_t n);

// `s` safe to print on a terminal: each control character but newline and
// tab (C0, DEL, and C1 as UTF-8: U+0080-U+009F) replaced by '?'. A server's
// words (an error body, a worker's last line) could carry an escape
// sequence that set the terminal's title or clipboard.
std::string TerminalSafe(std::string_view s);

}  // namespace spillway
