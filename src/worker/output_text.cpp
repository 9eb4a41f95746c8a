#include "worker/output_text.h"

#include <algorithm>

namespace spillway::worker {

size_t Utf8CompletePrefix(std::string_view s) {
  // Look back at most 3 bytes for the lead byte of the last character.
  const size_t n = s.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte
    size_t need = 1;
    if ((c & 0xE0) == 0xC0) need = 2;
    else if ((c & 0xF0) == 0xE0) need = 3;
    else if ((c & 0xF8) == 0xF0) need = 4;
    return need > back ? n - back : n;
  }
  return n;
}

OutputText::OutputText(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const auto& s : stops_) max_stop_ = std::max(max_stop_, s.size());
}

bool OutputText::Append(std::string_view piece) {
  if (stopped_) return true;
  const size_t old = text_.size();
  text_.append(piece);
  size_t best = std::string::npos;
  for (const auto& stop : stops_) {
    const size_t from = std::max(sent_, old >= stop.size() ? old - stop.size() + 1 : size_t{0});
    const size_t pos = text_.find(stop, from);
    if (pos != std::string::npos) best = std::min(best, pos);
  }
  if (best != std::string::npos) {
    text_.resize(best);
    stopped_ = true;
  }
  return stopped_;
}

size_t OutputText::HeldBackSuffix() const {
  if (stopped_ || max_stop_ == 0) return 0;
  size_t hold = 0;
  const size_t avail = text_.size() - sent_;
  for (const auto& stop : stops_) {
    // The longest proper prefix of `stop` that ends the text.
    for (size_t k = std::min(stop.size() - 1, avail); k > hold; --k) {
      if (text_.compare(text_.size() - k, k, stop, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  return hold;
}

std::string OutputText::TakeReady() {
  size_t end = text_.size() - HeldBackSuffix();
  end = sent_ + Utf8CompletePrefix(std::string_view(text_).substr(sent_, end - sent_));
  std::string out = text_.substr(sent_, end - sent_);
  sent_ = end;
  return out;
}

std::string OutputText::TakeRest() {
  std::string out = text_.substr(sent_);
  sent_ = text_.size();
  return out;
}

}  // namespace spillway::worker
