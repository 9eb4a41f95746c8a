// A prompt's tokens continued from a kept prompt's (worker/prompt_tokens.h)
// are the prompt's own tokens: for every vocabulary in llama.cpp's models/
// (SPM and BPE; the others are tokenized whole), texts built from that
// vocabulary's special tokens' texts, parts of them, runs of them that
// overlap, whitespace beside them and plain text are tokenized once after
// another that begins alike, and must equal their tokenization whole. The
// test also checks that most of them were continued (a test that never cut
// would prove nothing).
#include "worker/prompt_tokens.h"

#include <gtest/gtest.h>
#include <llama.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace spillway::worker {
namespace {

namespace fs = std::filesystem;

struct Vocab {
  llama_model* model = nullptr;
  const llama_vocab* vocab = nullptr;
  Vocab(const Vocab&) = delete;
  explicit Vocab(const std::string& path) {
    llama_model_params p = llama_model_default_params();
    p.vocab_only = true;
    model = llama_model_load_from_file(path.c_str(), p);
    if (model) vocab = llama_model_get_vocab(model);
  }
  ~Vocab() {
    if (model) llama_model_free(model);
  }
};

std::vector<std::string> SpecialTexts(const llama_vocab* v) {
  std::vector<std::string> out;
  const int kSpecial = LLAMA_TOKEN_ATTR_CONTROL | LLAMA_TOKEN_ATTR_USER_DEFINED | LLAMA_TOKEN_ATTR_UNKNOWN;
  for (int32_t id = 0; id < llama_vocab_n_tokens(v); ++id) {
    if (!(llama_vocab_get_attr(v, id) & kSpecial)) continue;
    const char* t = llama_vocab_get_text(v, id);
    if (t && *t) out.emplace_back(t);
  }
  return out;
}

// Texts of the kinds the cut must get right, from one vocabulary's special texts.
class Texts {
 public:
  Texts(std::vector<std::string> specials, uint64_t seed) : specials_(std::move(specials)), rng_(seed) {
    // A few specials come back often (as a template's markers do), so that
    // texts share and repeat them; the rest now and then.
    for (size_t i = 0; i < std::min<size_t>(6, specials_.size()); ++i) {
      favourites_.push_back(specials_[Pick(specials_.size())]);
    }
  }
  std::string Piece() {
    static const char* kPlain[] = {"Hello", " world", "the", " quick", "x", "123", " 4567", "\xc3\xa9",
                                   "\xe6\x97\xa5\xe6\x9c\xac", "\xf0\x9f\x99\x82", "\n", "\n\n", " ", "  ", "    ", "        ", "\t",
                                   "<", ">", "|", "<|", "|>", "[", "]", "</", "user", "assistant", ":", "."};
    switch (specials_.empty() ? 0 : Pick(9)) {
      case 0: case 1: case 2: return kPlain[Pick(std::size(kPlain))];
      case 3: case 4: return favourites_[Pick(favourites_.size())];
      case 5: return specials_[Pick(specials_.size())];
      case 6: {  // a part of one: its beginning or its end
        const std::string& s = favourites_[Pick(favourites_.size())];
        const size_t k = Pick(s.size());
        return Pick(2) ? s.substr(0, k) : s.substr(k);
      }
      case 7: {  // whitespace on both sides of one
        const char* ws[] = {" ", "\n", "  ", "\t", ""};
        return std::string(ws[Pick(5)]) + favourites_[Pick(favourites_.size())] + ws[Pick(5)];
      }
      default: {  // the end of one run into another's beginning (they may overlap)
        const std::string& a = favourites_[Pick(favourites_.size())];
        const std::string& b = specials_[Pick(specials_.size())];
        return a.substr(Pick(a.size())) + b.substr(0, 1 + Pick(b.size()));
      }
    }
  }
  std::string Text(size_t pieces) {
    std::string t;
    for (size_t i = 0; i < pieces; ++i) t += Piece();
    return t;
  }
  size_t Pick(size_t n) { return n == 0 ? 0 : std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }

 private:
  std::vector<std::string> specials_, favourites_;
  std::mt19937_64 rng_;
};

std::vector<std::string> VocabFiles() {
  const char* src = std::getenv("LLAMA_SRC");
  std::vector<std::string> files;
  if (!src || !*src) return files;
  for (const auto& e : fs::directory_iterator(fs::path(src) / "models")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("ggml-vocab-", 0) == 0 && e.path().extension() == ".gguf") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// llama.cpp's models/ggml-vocab-<name>.gguf ("" without LLAMA_SRC).
std::string VocabPath(const std::string& name) {
  const char* src = std::getenv("LLAMA_SRC");
  return src && *src ? (fs::path(src) / "models" / ("ggml-vocab-" + name + ".gguf")).string() : "";
}

class PromptTokensTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { llama_backend_init(); }
};

#define SKIP_WITHOUT_LLAMA_SRC() \
  if (VocabPath("x").empty()) GTEST_SKIP() << "LLAMA_SRC is not set (the llama.cpp source, for its models/ggml-vocab-*.gguf)"

TEST_F(PromptTokensTest, AContinuedPromptHasTheTokensOfItsWholeTokenization) {
  SKIP_WITHOUT_LLAMA_SRC();
  size_t cut_vocabs = 0;
  for (const std::string& file : VocabFiles()) {
    Vocab v(file);
    ASSERT_NE(v.vocab, nullptr) << file;
    PromptTokens kept(v.vocab, 4, 32 << 20);
    if (!kept.enabled()) continue;  // (WPM, UGM, a vocabulary that adds EOS, or no special tokens: tokenized whole)
    ++cut_vocabs;
    Texts texts(SpecialTexts(v.vocab), std::hash<std::string>{}(file));
    size_t tried = 0;
    for (int i = 0; i < 400; ++i) {
      const std::string a = texts.Text(5 + texts.Pick(40));
      // b: a's beginning (all of it, most of it, or any of it), and then more, or nothing more.
      const size_t choice = texts.Pick(3);
      const size_t keep = choice == 0   ? a.size()
                          : choice == 1 ? a.size() - texts.Pick(a.size() / 3 + 1)
                                        : texts.Pick(a.size() + 1);
      std::string b = a.substr(0, keep);
      if (texts.Pick(4) != 0) b += texts.Text(1 + texts.Pick(12));
      PromptTokens p(v.vocab, 4, 32 << 20);
      auto ta = p.Tokenize(a);
      ASSERT_TRUE(ta.ok()) << ta.status().message();
      ASSERT_EQ(*ta, *TokenizeText(v.vocab, a, true)) << file;
      auto tb = p.Tokenize(b);
      ASSERT_TRUE(tb.ok()) << tb.status().message();
      ASSERT_EQ(*tb, *TokenizeText(v.vocab, b, true))
          << file << "\na: " << ::testing::PrintToString(a) << "\nb: " << ::testing::PrintToString(b)
          << "\ncut at " << p.CutBetween(a, b);
      tried += p.stats().hits;
    }
    // Many pairs were continued, not tokenized whole (one whose common
    // beginning is short is tokenized whole: PromptTokens' choice).
    EXPECT_GT(tried, 100u) << file;
  }
  EXPECT_GE(cut_vocabs, 8u);  // (SPM and BPE vocabularies of llama.cpp's models/)
}

// A conversation of ChatML turns on a vocabulary that has its markers, each
// turn's prompt the whole conversation again: each is continued from the last
// and is its own tokenization.
TEST_F(PromptTokensTest, AChatsTurnsAreContinuedFromTheTurnBefore) {
  SKIP_WITHOUT_LLAMA_SRC();
  Vocab v(VocabPath("qwen2"));
  ASSERT_NE(v.vocab, nullptr);
  PromptTokens kept(v.vocab, 4, 32 << 20);
  ASSERT_TRUE(kept.enabled());
  std::string conversation = "<|im_start|>system\nYou answer briefly. You are a helpful assistant who knows about "
                             "rivers, mountains, lakes, forests, deserts, oceans, islands and the weather over all of "
                             "them, and you say so in plain words, one sentence at a time.<|im_end|>\n";
  size_t reused = 0;
  std::string before;  // the turn before's prompt
  for (int turn = 0; turn < 8; ++turn) {
    conversation += "<|im_start|>user\nQuestion " + std::to_string(turn) + ": what comes next?<|im_end|>\n";
    const std::string prompt = conversation + "<|im_start|>assistant\n";
    auto tokens = kept.Tokenize(prompt);
    ASSERT_TRUE(tokens.ok());
    ASSERT_EQ(*tokens, *TokenizeText(v.vocab, prompt, true)) << "turn " << turn;
    if (turn > 0) {
      // The turn before's tokens up to its answer's header (where the two
      // prompts part: its answer follows the header in this one) came from it.
      EXPECT_EQ(kept.stats().reused_tokens - reused,
                TokenizeText(v.vocab, before.substr(0, before.rfind("<|im_start|>assistant")), true)->size())
          << "turn " << turn;
    }
    reused = kept.stats().reused_tokens;
    before = prompt;
    conversation += "<|im_start|>assistant\nAn answer, " + std::to_string(turn * 7) + " words long.<|im_end|>\n";
  }
  EXPECT_EQ(kept.stats().hits, 7u);
  EXPECT_EQ(kept.stats().misses, 1u);
  // A long document after the last marker, edited at its end: the place is
  // far back, so continuing would tokenize more than the prompt whole.
  std::string doc;
  for (int i = 0; i < 2000; ++i) doc += "word" + std::to_string(i) + " ";
  const std::string head = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n" + doc;
  ASSERT_TRUE(kept.Tokenize(head + "first ending").ok());
  const auto edited = kept.Tokenize(head + "second ending");
  ASSERT_TRUE(edited.ok());
  EXPECT_EQ(*edited, *TokenizeText(v.vocab, head + "second ending", true));
  EXPECT_EQ(kept.stats().hits, 7u);
  EXPECT_EQ(kept.stats().misses, 3u);
}

// GPT-NeoX's vocabulary has runs of 2 to 24 spaces as special tokens: the
// cut never falls in a run of whitespace, where the run's own tokens (the
// longest first) may reach across it, and each text's tokens are still its own.
TEST_F(PromptTokensTest, NoCutFallsInsideARunThatASpecialTokenMayTake) {
  SKIP_WITHOUT_LLAMA_SRC();
  Vocab v(VocabPath("gpt-neox"));
  ASSERT_NE(v.vocab, nullptr);
  PromptTokens kept(v.vocab, 4, 32 << 20);
  ASSERT_TRUE(kept.enabled());
  for (int a_run = 2; a_run <= 30; ++a_run) {
    for (int b_run = 2; b_run <= 30; ++b_run) {
      const std::string a = "x" + std::string(static_cast<size_t>(a_run), ' ') + "y";
      const std::string b = "x" + std::string(static_cast<size_t>(b_run), ' ') + "z";
      EXPECT_EQ(kept.CutBetween(a, b), std::string::npos) << a_run << " and " << b_run << " spaces";
      PromptTokens p(v.vocab, 4, 32 << 20);
      ASSERT_TRUE(p.Tokenize(a).ok());
      EXPECT_EQ(*p.Tokenize(b), *TokenizeText(v.vocab, b, true)) << a_run << " and " << b_run << " spaces";
    }
  }
}

// What is not cut: a vocabulary that adds no special token at the places the
// texts share (the tiny test models' SPM vocabulary has only <s>, </s> and
// <unk>: ChatML's markers are plain text there), and kept prompts bounded.
TEST_F(PromptTokensTest, WithoutASpecialTokenInCommonAPromptIsTokenizedWhole) {
  SKIP_WITHOUT_LLAMA_SRC();
  Vocab v(VocabPath("llama-spm"));
  ASSERT_NE(v.vocab, nullptr);
  PromptTokens kept(v.vocab, 2, 32 << 20);
  const std::string a = "<|im_start|>user\nHello<|im_end|>\n";
  ASSERT_TRUE(kept.Tokenize(a).ok());
  EXPECT_EQ(kept.CutBetween(a, a + "<|im_start|>assistant\n"), std::string::npos);
  ASSERT_TRUE(kept.Tokenize(a + "<|im_start|>assistant\n").ok());
  EXPECT_EQ(kept.stats().hits, 0u);
  // The same text again is its kept tokens.
  ASSERT_TRUE(kept.Tokenize(a).ok());
  EXPECT_EQ(kept.stats().repeats, 1u);
  EXPECT_EQ(kept.stats().hits, 0u);
  // At most two kept.
  ASSERT_TRUE(kept.Tokenize("one").ok());
  ASSERT_TRUE(kept.Tokenize("two").ok());
  EXPECT_EQ(kept.stats().entries, 2u);
  // None kept: nothing continued, nothing kept.
  PromptTokens none(v.vocab, 0, 32 << 20);
  EXPECT_FALSE(none.enabled());
  ASSERT_TRUE(none.Tokenize(a).ok());
  ASSERT_TRUE(none.Tokenize(a).ok());
  EXPECT_EQ(none.stats().hits, 0u);
  EXPECT_EQ(none.stats().entries, 0u);
}

}  // namespace
}  // namespace spillway::worker
