// Assembles generated text from token pieces: applies stop strings and decides
// which text is final enough to stream. Pure logic, no llama.cpp.
//
// Text is "ready" when no stop string could still begin inside it and it does
// not end in an incomplete UTF-8 sequence. Streamed and non-streamed answers
// are built by the same object, so they carry the same text.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

namespace spillway::worker {

class OutputText {
 public:
  explicit OutputText(std::vector<std::string> stops);

  // Appends one token's text. Returns true when a stop string completed; the
  // text is then cut just before it and further appends are ignored.
  bool Append(std::string_view piece);

  // Returns the ready text not yet taken.
  std::string TakeReady();
  // Returns everything not yet taken (generation has ended).
  std::string TakeRest();

  // Marks the first `bytes` of the text as already delivered (a continuation).
  void MarkSent(size_t bytes) { sent_ = std::max(sent_, std::min(bytes, text_.size())); }
  const std::string& text() const { return text_; }
  bool stopped() const { return stopped_; }

 private:
  size_t HeldBackSuffix() const;

  std::vector<std::string> stops_;
  size_t max_stop_ = 0;
  std::string text_;
  size_t sent_ = 0;
  bool stopped_ = false;
};

// The length of `s` without a trailing incomplete UTF-8 sequence.
size_t Utf8CompletePrefix(std::string_view s);

}  // namespace spillway::worker
