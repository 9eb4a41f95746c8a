// A prompt's tokens, continued from an earlier prompt's where the two texts
// begin alike.
//
// A chat's next turn sends the whole conversation again: the template renders
// it and the tokenizer cuts all of it again, in llama.cpp's own code, though
// all but the last turn's text is the same as before (about a third of a
// 2,600-token chat's handling on this project's machine, the rest being the
// template's). llama.cpp's tokenizer (llama_vocab::impl::tokenize, SPM and BPE
// vocabularies) first splits the text at its special tokens' texts
// (tokenizer_st_partition: the longest texts first, each at its leftmost
// occurrences in what is left of plain text, a token's lstrip/rstrip taking
// the whitespace beside it) and then tokenizes each piece of plain text on its
// own; the only state carried from piece to piece is SPM's "a special token
// came before" (a space prefix), which a special token resets.
//
// So where the new text B and a kept text A (tokens TA) agree up to L, and
// both have at the same place c (c + |S| <= L) the text of a special token S
// that no special token's text overlaps in either but that S itself (and S
// neither begins nor ends with whitespace, which a neighbour's rstrip or
// lstrip could take), both are cut at c the same way: their
// pieces before c are the same, and what follows c is S and the pieces after
// it, which nothing before c touches. Then tokenize(B) is TA's tokens before
// c (TA less the tokens of A from c on, which must be TA's end) followed by
// the tokens of B from c on, tokenized alone without BOS. Only SPM and BPE
// vocabularies that add no EOS are cut; anything else is tokenized whole.
// prompt_tokens_test checks the result against whole tokenization for every
// vocabulary in llama.cpp's models/ (texts built to trip each condition).
//
// The kept prompt used is the one that leaves the least to tokenize (its own
// text after the common beginning and the new one's); none when that, or
// what is left after the place found, is half the new prompt or more. The kept texts are the last `max_entries` prompts tokenized (and at most
// `max_bytes` of text and tokens; a prompt over a quarter of that is not
// kept), least recently used leaving first. No lifetime: a text's tokens
// never change. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "common/status.h"

struct llama_vocab;

namespace spillway::worker {

// llama_tokenize of `text` (special tokens' texts parsed as them), BOS (and
// EOS) as the vocabulary adds them when `add_special`.
StatusOr<std::vector<int32_t>> TokenizeText(const llama_vocab* vocab, std::string_view text, bool add_special);

class PromptTokens {
 public:
  struct Stats {
    uint64_t hits = 0;            // prompts continued from a kept one
    uint64_t repeats = 0;         // prompts that were a kept one's text
    uint64_t misses = 0;          // prompts tokenized whole
    uint64_t reused_tokens = 0;   // tokens taken from kept prompts, in all
    size_t entries = 0, bytes = 0;
  };

  // `vocab` outlives this. max_entries 0: every prompt tokenized whole.
  PromptTokens(const llama_vocab* vocab, size_t max_entries, size_t max_bytes);

  // TokenizeText(vocab, text, /*add_special=*/true), continued from a kept
  // prompt's tokens where it can be; the text is kept when `keep` (not a
  // candidate that "truncate" tries and may not take).
  StatusOr<std::vector<int32_t>> Tokenize(const std::string& text, bool keep = true);

  // Where `a` and `b` are both cut alike (see above): the place c, or npos.
  size_t CutBetween(std::string_view a, std::string_view b) const;

  bool enabled() const { return enabled_; }
  Stats stats() const;

 private:
  struct Entry {
    std::string text;
    std::vector<int32_t> tokens;
    static size_t BytesOf(const std::string& text, const std::vector<int32_t>& tokens) {
      return text.size() + tokens.size() * sizeof(int32_t);
    }
    size_t bytes() const { return BytesOf(text, tokens); }
  };
  // The special token's text that begins at `at` in `t` and ends by `limit`
  // (empty: none, or more than one).
  std::string_view SpecialAt(std::string_view t, size_t at, size_t limit) const;
  // Whether no special token's text overlaps [c, c + s) in `t`, nor reaches
  // across c, but the one at c of length s.
  bool AloneAt(std::string_view t, size_t c, size_t s) const;
  void Keep(std::shared_ptr<const Entry> e);

  const llama_vocab* vocab_;
  const size_t max_entries_, max_bytes_;
  bool enabled_ = false;  // a vocabulary cut as above, and max_entries > 0
  std::vector<std::string> special_texts_;                 // owns what the views below see
  std::vector<std::unordered_set<std::string_view>> by_length_;  // [length]: the texts of that length
  std::vector<size_t> lengths_;                            // the lengths that have texts, ascending
  bool first_byte_[256] = {};                              // a special text begins with this byte
  size_t max_length_ = 0;

  mutable std::mutex mu_;
  std::vector<std::shared_ptr<const Entry>> kept_;  // most recently used last
  size_t bytes_ = 0;
  Stats stats_;
};

}  // namespace spillway::worker
