// A second kind of service: whisper.cpp's whisper-server (1.9.1, built by
// scripts/whisper.sh into ~/.cache/spillway) on a random-weight whisper model
// written by `spillway mkmodel --kind whisper`, with WAV clips the test
// writes; and that model writer's file and errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "whisper_server.h"
#include "worker_process.h"

namespace spillway::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

class WhisperServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = WhisperServerMissing(); !why.empty()) GTEST_SKIP() << why;
    ASSERT_TRUE(fs::exists(Gpt2Vocab())) << Gpt2Vocab() << " missing (LLAMA_SRC unset? run through ctest)";
    dir_ = MakeScratchDir();
  }
  std::string dir_;
};

TEST_F(WhisperServerTest, TranscribesDeterministicallyAndDependsOnTheAudio) {
  const std::string model = WriteWhisperModelFile(dir_ + "/tiny-whisper.bin");
  WhisperServer server(model, dir_);
  ASSERT_TRUE(server.ready()) << server.Stderr();

  const std::string a = TranscriptText(server.Transcribe(WavBytes(440, 1)));
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(TranscriptText(server.Transcribe(WavBytes(440, 1))), a) << "same clip, temperature 0: same text";
  EXPECT_NE(TranscriptText(server.Transcribe(WavBytes(880, 2))), a) << "another clip, another transcript";

  // Another process on a copy written from the same seed: the same text.
  const std::string copy = WriteWhisperModelFile(dir_ + "/tiny-whisper-copy.bin");
  ASSERT_EQ(ReadAll(copy), ReadAll(model)) << "same seed: byte-identical files";
  const std::string dir2 = MakeScratchDir();
  WhisperServer second(copy, dir2);
  ASSERT_TRUE(second.ready()) << second.Stderr();
  EXPECT_EQ(TranscriptText(second.Transcribe(WavBytes(440, 1))), a);
  std::printf("transcript of the 440 Hz clip: %s\n", json(a).dump().c_str());
}

TEST_F(WhisperServerTest, QuantizedModelsTranscribe) {
  for (const char* type : {"q8_0", "q4_0"}) {
    SCOPED_TRACE(type);
    WhisperServer server(WriteWhisperModelFile(dir_ + "/" + type + ".bin", std::string("--type ") + type),
                         MakeScratchDir());
    ASSERT_TRUE(server.ready()) << server.Stderr();
    EXPECT_FALSE(TranscriptText(server.Transcribe(WavBytes(440, 1))).empty());
  }
}

TEST_F(WhisperServerTest, AnsweredWithoutAFile400) {
  WhisperServer server(WriteWhisperModelFile(dir_ + "/tiny-whisper.bin"), dir_);
  ASSERT_TRUE(server.ready()) << server.Stderr();
  auto r = http::Fetch("127.0.0.1", server.port(), "POST", "/inference", "", {}, 10s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 400) << r->body;
}

// A model whose structure is damaged is refused at load: whisper-server exits
// 3 at once and never listens. (Damage inside the weights' bytes is not
// detected: the format has no checksum, and such a model loads.)
TEST_F(WhisperServerTest, DamagedModelMakesTheServerExitNonZero) {
  const std::string bytes = ReadAll(WriteWhisperModelFile(dir_ + "/good.bin"));
  struct Damage {
    std::string name, bytes;
  };
  std::string bad_magic = bytes, huge_vocab = bytes;
  bad_magic.replace(0, 4, std::string(4, '\0'));
  huge_vocab.replace(4, 4, "\xff\xff\xff\x7f");  // n_vocab = 2^31 - 1
  const std::vector<Damage> damages = {
      {"truncated", bytes.substr(0, bytes.size() / 2)}, {"bad-magic", bad_magic}, {"huge-vocab", huge_vocab}};
  for (const auto& d : damages) {
    SCOPED_TRACE(d.name);
    const std::string path = dir_ + "/" + d.name + ".bin";
    std::ofstream(path, std::ios::binary) << d.bytes;
    const std::string dir = MakeScratchDir();
    WhisperServer server(path, dir, "", 30s);
    EXPECT_FALSE(server.ready());
    const auto code = server.ExitCode(30s);
    ASSERT_TRUE(code.has_value()) << "whisper-server still runs on a damaged model";
    EXPECT_EQ(*code, 3) << server.Stderr();
    EXPECT_NE(server.Stderr().find("failed to initialize whisper context"), std::string::npos) << server.Stderr();
  }
}

// `spillway mkmodel --kind whisper`: its file and its errors (no whisper-server needed).
class WhisperMkmodelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(Gpt2Vocab())) << Gpt2Vocab() << " missing (LLAMA_SRC unset? run through ctest)";
    dir_ = MakeScratchDir();
  }
  std::string dir_;
};

TEST_F(WhisperMkmodelTest, SameSeedSameBytesAndASmallFile) {
  const std::string a = ReadAll(WriteWhisperModelFile(dir_ + "/a.bin"));
  EXPECT_EQ(ReadAll(WriteWhisperModelFile(dir_ + "/b.bin")), a);
  EXPECT_NE(ReadAll(WriteWhisperModelFile(dir_ + "/c.bin", "--seed 7")), a);
  ASSERT_GE(a.size(), 4u);
  EXPECT_EQ(a.substr(0, 4), std::string("lmgg")) << "ggml magic 0x67676d6c, little-endian";
  // Mostly the f16 token embedding (51864 x 64 x 2 bytes = 6.6 MB) and the vocabulary.
  EXPECT_GT(a.size(), 51864u * 64 * 2);
  EXPECT_LT(a.size(), 9u << 20);
  const auto q8 = ReadAll(WriteWhisperModelFile(dir_ + "/q8.bin", "--type q8_0"));
  const auto q4 = ReadAll(WriteWhisperModelFile(dir_ + "/q4.bin", "--type q4_0"));
  EXPECT_LT(q8.size(), a.size() - 51864u * 64 * 2 / 3) << "q8_0: 34 bytes per 32 weights instead of 64";
  EXPECT_LT(q4.size(), q8.size());
  EXPECT_FALSE(fs::exists(dir_ + "/a.bin.tmp"));
}

TEST_F(WhisperMkmodelTest, BadArgumentsAndPathsAreRefusedClearly) {
  const std::string v = "--vocab " + Gpt2Vocab() + " ";
  struct Case {
    std::string args, message;
    int code;
  };
  const std::string file = dir_ + "/a-file";
  std::ofstream(file) << "x";
  const std::vector<Case> cases = {
      {v + "--out " + dir_ + "/m.bin --layers 0", "layers must be in [1, 64]", 2},
      {v + "--out " + dir_ + "/m.bin --width 72", "width must be a multiple of 16", 2},
      {v + "--out " + dir_ + "/m.bin --heads 3", "heads must divide the width", 2},
      {v + "--out " + dir_ + "/m.bin --ctx 8", "context (decoder positions) must be in [16, 4096]", 2},
      {v + "--out " + dir_ + "/m.bin --audio-ctx 2000", "audio context must be in [16, 1500]", 2},
      {v + "--out " + dir_ + "/m.bin --type q5_1", "a whisper model is f16, q8_0 or q4_0", 2},
      {v + "--out " + dir_ + "/m.bin --type f32", "aborts at its first transcription", 2},
      {v + "--out " + dir_ + "/m.bin --type q8_0 --width 48 --heads 4", "multiple of 32", 2},
      {v + "--out " + dir_ + "/m.bin --ffn 64", "--ffn does not apply to --kind whisper", 2},
      {v + "--out " + dir_ + "/m.bin --layers many", "--layers", 2},  // CLI11's conversion error
      {"--vocab " + EnvOr("SPILLWAY_VOCAB") + " --out " + dir_ + "/m.bin", "is not GPT-2's vocabulary", 2},
      {"--vocab " + dir_ + "/none.gguf --out " + dir_ + "/m.bin", "cannot read vocabulary GGUF", 2},
      {v + "--out " + file + "/m.bin", "cannot write " + file + "/m.bin.tmp: Not a directory", 1},
      {v + "--out /proc/m.bin", "cannot write /proc/m.bin.tmp", 1},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    int code = -1;
    const std::string out = MkmodelWhisper(c.args, &code);
    EXPECT_EQ(code, c.code) << out;
    EXPECT_NE(out.find(c.message), std::string::npos) << out;
  }
  EXPECT_FALSE(fs::exists(dir_ + "/m.bin"));
}

}  // namespace
}  // namespace spillway::testing
