#include "worker/prompt_tokens.h"

#include <llama.h>

#include <algorithm>
#include <cctype>
#include <climits>

namespace spillway::worker {

StatusOr<std::vector<int32_t>> TokenizeText(const llama_vocab* vocab, std::string_view text, bool add_special) {
  if (text.size() > static_cast<size_t>(INT32_MAX / 2)) return Status::PayloadTooLarge("text too long");
  std::vector<llama_token> out(text.size() + 8);
  int n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), out.data(),
                         static_cast<int32_t>(out.size()), add_special, /*parse_special=*/true);
  if (n < 0) {
    out.resize(static_cast<size_t>(-n));
    n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), out.data(),
                       static_cast<int32_t>(out.size()), add_special, true);
  }
  if (n < 0) return Status::InvalidArgument("text could not be tokenized");
  out.resize(static_cast<size_t>(n));
  return std::vector<int32_t>(out.begin(), out.end());
}

namespace {

bool IsSpace(unsigned char c) { return std::isspace(c) != 0; }  // (as llama.cpp's lstrip/rstrip test)

size_t CommonPrefix(std::string_view a, std::string_view b) {
  const size_t n = std::min(a.size(), b.size());
  return static_cast<size_t>(std::mismatch(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(n), b.begin()).first -
                             a.begin());
}

// How many places are looked at for a special token's text, and how many
// found are tried, from the end of the common beginning back (then the prompt
// is tokenized whole: a vocabulary whose special texts begin with common
// bytes must not make the search cost more than it saves).
constexpr int kMaxProbes = 4096;
constexpr int kMaxCandidates = 64;

}  // namespace

PromptTokens::PromptTokens(const llama_vocab* vocab, size_t max_entries, size_t max_bytes)
    : vocab_(vocab), max_entries_(max_entries), max_bytes_(max_bytes) {
  const auto type = llama_vocab_type(vocab);
  if (max_entries == 0 || (type != LLAMA_VOCAB_TYPE_SPM && type != LLAMA_VOCAB_TYPE_BPE) ||
      llama_vocab_get_add_eos(vocab)) {
    return;
  }
  // The tokens tokenizer_st_partition cuts at (llama_vocab::impl's cache_special_tokens).
  const int32_t n = llama_vocab_n_tokens(vocab);
  const int kSpecial = LLAMA_TOKEN_ATTR_CONTROL | LLAMA_TOKEN_ATTR_USER_DEFINED | LLAMA_TOKEN_ATTR_UNKNOWN;
  std::vector<char> piece(256);
  for (int32_t id = 0; id < n; ++id) {
    if (!(llama_vocab_get_attr(vocab, id) & kSpecial)) continue;
    // (Its whole text, as the partition matches it: llama_vocab_get_text
    // stops at a NUL. A special token's piece is its text.)
    int32_t len = llama_token_to_piece(vocab, id, piece.data(), static_cast<int32_t>(piece.size()), 0, true);
    if (len < 0) {
      piece.resize(static_cast<size_t>(-len));
      len = llama_token_to_piece(vocab, id, piece.data(), static_cast<int32_t>(piece.size()), 0, true);
    }
    if (len > 0) special_texts_.emplace_back(piece.data(), static_cast<size_t>(len));
  }
  for (const std::string& t : special_texts_) max_length_ = std::max(max_length_, t.size());
  by_length_.resize(max_length_ + 1);
  for (const std::string& t : special_texts_) {
    by_length_[t.size()].insert(std::string_view(t));
    first_byte_[static_cast<unsigned char>(t[0])] = true;
  }
  for (size_t len = 1; len <= max_length_; ++len) {
    if (!by_length_[len].empty()) lengths_.push_back(len);
  }
  enabled_ = !lengths_.empty();
}

std::string_view PromptTokens::SpecialAt(std::string_view t, size_t at, size_t limit) const {
  std::string_view found;
  for (const size_t len : lengths_) {
    if (at + len > limit) break;
    const std::string_view s = t.substr(at, len);
    if (!by_length_[len].count(s)) continue;
    if (!found.empty()) return {};  // two texts begin here: the longer one could take it
    found = s;
  }
  return found;
}

bool PromptTokens::AloneAt(std::string_view t, size_t c, size_t s) const {
  const size_t from = c + 1 > max_length_ ? c + 1 - max_length_ : 0;
  for (size_t p = from; p < c + s; ++p) {
    if (!first_byte_[static_cast<unsigned char>(t[p])]) continue;
    for (const size_t len : lengths_) {
      if (p + len > t.size()) break;
      if (p + len <= c) continue;  // ends before c: no overlap
      if (p == c && len == s) continue;  // (S itself)
      if (by_length_[len].count(t.substr(p, len))) return false;
    }
  }
  return true;
}

size_t PromptTokens::CutBetween(std::string_view a, std::string_view b) const {
  if (!enabled_) return std::string_view::npos;
  const size_t common = CommonPrefix(a, b);
  int tried = 0, probes = 0;
  for (size_t c = common; c-- > 1;) {  // (a cut at 0 would keep nothing)
    const unsigned char ch = static_cast<unsigned char>(b[c]);
    if (!first_byte_[ch] || IsSpace(ch)) continue;
    if (++probes > kMaxProbes) break;
    const std::string_view s = SpecialAt(b, c, common);
    // (Nor one that ends with whitespace: a longer special token after it
    // with lstrip, taken first, could strip that whitespace and so S.)
    if (s.empty() || IsSpace(static_cast<unsigned char>(s.back()))) continue;
    if (AloneAt(a, c, s.size()) && AloneAt(b, c, s.size())) return c;
    if (++tried >= kMaxCandidates) break;
  }
  return std::string_view::npos;
}

StatusOr<std::vector<int32_t>> PromptTokens::Tokenize(const std::string& text, bool keep) {
  if (!enabled_) return TokenizeText(vocab_, text, true);
  // The kept prompt that leaves the least to tokenize: its text after the
  // common beginning (tokenized again, to find where its tokens for that part
  // begin) and this one's. None if that is not well under tokenizing this one
  // whole (a short prompt after a long one that begins alike).
  std::vector<std::shared_ptr<const Entry>> kept;
  {
    std::lock_guard<std::mutex> lk(mu_);
    kept = kept_;  // (compared outside the lock)
  }
  std::shared_ptr<const Entry> best;
  const size_t most = text.size() / 2;  // what may be left to tokenize
  {
    size_t least = most;
    for (const auto& e : kept) {
      if (e->text == text) {
        best = e;
        break;
      }
      const size_t common = CommonPrefix(e->text, text);
      const size_t left = (e->text.size() - common) + (text.size() - common);
      if (left < least) {
        least = left;
        best = e;
      }
    }
  }
  std::vector<int32_t> tokens;
  bool repeated = false, reused = false;
  size_t taken = 0;
  if (best && best->text == text) {
    tokens = best->tokens;
    repeated = true;
  } else if (best) {
    const size_t c = CutBetween(best->text, text);
    // (The place may lie well before the common beginning's end: what is
    // then left to tokenize must still be under the bound.)
    if (c != std::string_view::npos && (best->text.size() - c) + (text.size() - c) < most) {
      auto old_rest = TokenizeText(vocab_, std::string_view(best->text).substr(c), false);
      // (A's tokens must end with those of A from c on: they do where the cut holds.)
      if (old_rest.ok() && old_rest->size() <= best->tokens.size() &&
          std::equal(old_rest->rbegin(), old_rest->rend(), best->tokens.rbegin())) {
        auto rest = TokenizeText(vocab_, std::string_view(text).substr(c), false);
        if (!rest.ok()) return rest.status();
        taken = best->tokens.size() - old_rest->size();
        tokens.reserve(taken + rest->size());
        tokens.assign(best->tokens.begin(), best->tokens.begin() + static_cast<std::ptrdiff_t>(taken));
        tokens.insert(tokens.end(), rest->begin(), rest->end());
        reused = true;
      }
    }
  }
  if (!reused && !repeated) {
    auto whole = TokenizeText(vocab_, text, true);
    if (!whole.ok()) return whole.status();
    tokens = std::move(*whole);
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (repeated) {
      ++stats_.repeats;
    } else if (reused) {
      ++stats_.hits;
      stats_.reused_tokens += taken;
    } else {
      ++stats_.misses;
    }
  }
  if (repeated) {
    if (keep) Keep(std::move(best));  // (the kept entry itself, now the most recent: nothing copied)
  } else if (keep && Entry::BytesOf(text, tokens) <= max_bytes_ / 4) {
    auto entry = std::make_shared<Entry>();
    entry->text = text;
    entry->tokens = tokens;
    Keep(std::move(entry));
  }
  return tokens;
}

void PromptTokens::Keep(std::shared_ptr<const Entry> e) {
  const size_t size = e->bytes();
  if (size > max_bytes_ / 4) return;
  std::vector<std::shared_ptr<const Entry>> gone;  // (freed outside the lock)
  std::lock_guard<std::mutex> lk(mu_);
  // The same text again: the kept one moves to the end.
  for (auto it = kept_.begin(); it != kept_.end(); ++it) {
    if (*it == e || (*it)->text == e->text) {
      gone.push_back(std::move(*it));
      bytes_ -= gone.back()->bytes();
      kept_.erase(it);
      break;
    }
  }
  kept_.push_back(std::move(e));
  bytes_ += size;
  while (!kept_.empty() && (kept_.size() > max_entries_ || bytes_ > max_bytes_)) {
    gone.push_back(std::move(kept_.front()));
    bytes_ -= gone.back()->bytes();
    kept_.erase(kept_.begin());
  }
}

PromptTokens::Stats PromptTokens::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  Stats s = stats_;
  s.entries = kept_.size();
  s.bytes = bytes_;
  return s;
}

}  // namespace spillway::worker
