#include "gguf/demo_model.h"
#include "gguf/whisper_model.h"

#include <gguf.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>
#include <memory>

namespace spillway {
namespace {

namespace fs = std::filesystem;

std::string Vocab() {
  const char* v = std::getenv("SPILLWAY_VOCAB");
  return v ? v : "";
}

std::string ReadAll(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

DemoModelSpec Tiny(uint64_t seed, const std::string& type = "f16") {
  auto s = *DemoModelPreset("tiny");
  s.vocab_path = Vocab();
  s.seed = seed;
  s.type = type;
  return s;
}

TEST(DemoModelTest, SameSeedGivesByteIdenticalFiles) {
  const auto dir = fs::temp_directory_path();
  ASSERT_TRUE(WriteDemoModel(Tiny(1), (dir / "sw-a.gguf").string()).ok());
  ASSERT_TRUE(WriteDemoModel(Tiny(1), (dir / "sw-b.gguf").string()).ok());
  ASSERT_TRUE(WriteDemoModel(Tiny(2), (dir / "sw-c.gguf").string()).ok());
  const auto a = ReadAll(dir / "sw-a.gguf");
  EXPECT_GT(a.size(), 1u << 20);
  EXPECT_EQ(a, ReadAll(dir / "sw-b.gguf"));
  EXPECT_NE(a, ReadAll(dir / "sw-c.gguf"));
  for (auto n : {"sw-a.gguf", "sw-b.gguf", "sw-c.gguf"}) fs::remove(dir / n);
}

TEST(DemoModelTest, FileCarriesArchitectureTokenizerAndTemplate) {
  const auto path = (fs::temp_directory_path() / "sw-q.gguf").string();
  ASSERT_TRUE(WriteDemoModel(Tiny(3, "q8_0"), path).ok());
  gguf_init_params p{true, nullptr};
  gguf_context* g = gguf_init_from_file(path.c_str(), p);
  ASSERT_NE(g, nullptr);
  EXPECT_STREQ(gguf_get_val_str(g, gguf_find_key(g, "general.architecture")), "llama");
  EXPECT_GE(gguf_find_key(g, "tokenizer.ggml.tokens"), 0);
  EXPECT_GE(gguf_find_key(g, "tokenizer.chat_template"), 0);
  EXPECT_EQ(gguf_get_val_u32(g, gguf_find_key(g, "llama.block_count")), 2u);
  EXPECT_EQ(gguf_get_val_u32(g, gguf_find_key(g, "general.file_type")), 7u);  // MOSTLY_Q8_0
  EXPECT_EQ(gguf_get_n_tensors(g), 3 + 2 * 9);  // token_embd, output_norm, untied output
  gguf_free(g);
  fs::remove(path);
}

TEST(DemoModelTest, InvalidSpecsAreRejected) {
  auto s = Tiny(1);
  s.n_embd = 50;
  EXPECT_EQ(ValidateDemoModelSpec(s).code(), StatusCode::kInvalidArgument);
  s = Tiny(1);
  s.n_head_kv = 3;
  EXPECT_EQ(ValidateDemoModelSpec(s).code(), StatusCode::kInvalidArgument);
  s = Tiny(1);
  s.type = "q3_weird";
  EXPECT_EQ(ValidateDemoModelSpec(s).code(), StatusCode::kInvalidArgument);
  s = Tiny(1);
  s.vocab_path = "/nonexistent/vocab.gguf";
  EXPECT_EQ(WriteDemoModel(s, "/tmp/sw-never.gguf").code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(DemoModelPreset("huge").ok());
}

// A vocabulary file whose tokens are not strings (an array of numbers under
// the key) is a clear error: ggml asserted the element type and aborted the
// process (mkmodel, --kind whisper too).
TEST(DemoModelTest, AVocabularyWhoseTokensAreNotStringsIsRefused) {
  const std::string path = (fs::temp_directory_path() / ("sw-bad-vocab-" + std::to_string(::getpid()) + ".gguf")).string();
  {
    std::unique_ptr<gguf_context, void (*)(gguf_context*)> g(gguf_init_empty(), &gguf_free);
    std::vector<int32_t> numbers(60000, 7);
    gguf_set_arr_data(g.get(), "tokenizer.ggml.tokens", GGUF_TYPE_INT32, numbers.data(), numbers.size());
    ASSERT_TRUE(gguf_write_to_file(g.get(), path.c_str(), /*only_meta=*/false));
  }
  auto s = Tiny(1);
  s.vocab_path = path;
  const Status demo = WriteDemoModel(s, path + ".out");
  EXPECT_EQ(demo.code(), StatusCode::kInvalidArgument) << demo.ToString();
  WhisperModelSpec w;
  w.vocab_path = path;
  const Status whisper = WriteWhisperModel(w, path + ".out");
  EXPECT_EQ(whisper.code(), StatusCode::kInvalidArgument) << whisper.ToString();
  std::error_code ec;
  fs::remove(path, ec);
  fs::remove(path + ".out", ec);
}

}  // namespace
}  // namespace spillway
