// A second kind of service: whisper.cpp's whisper-server (1.9.1, built by
// scripts/whisper.sh into ~/.cache/spillway) on a random-weight whisper model
// written by `spillway mkmodel --kind whisper`, with a WAV file the test
// writes. The server binds port 0; its port is read back from /proc.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "api/http_client.h"
#include "worker_process.h"

namespace spillway::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// GPT-2's vocabulary: Whisper's English tokenizer, shipped with llama.cpp.
std::string Gpt2Vocab() { return Env("LLAMA_SRC") + "/models/ggml-vocab-gpt-2.gguf"; }

// Runs `spillway mkmodel --kind whisper <args>`; returns its output (stdout and stderr).
std::string Mkmodel(const std::string& args, int* code) {
  return RunCommand(BinDir() + "/spillway mkmodel --kind whisper " + args + " 2>&1", code);
}

std::string WriteModel(const std::string& path, const std::string& more = "") {
  int code = -1;
  const std::string out = Mkmodel("--vocab " + Gpt2Vocab() + " --out " + path + " " + more, &code);
  EXPECT_EQ(code, 0) << out;
  return path;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// One second of 16 kHz mono PCM16: a sine of `hz` plus a little seeded noise.
std::string WavBytes(double hz, uint32_t seed) {
  constexpr uint32_t kRate = 16000, kSamples = 16000;
  std::string pcm;
  uint32_t x = seed;
  for (uint32_t i = 0; i < kSamples; ++i) {
    x = x * 1664525u + 1013904223u;
    const double noise = (static_cast<double>(x >> 8) / (1 << 24) - 0.5) * 1000.0;
    const auto v = static_cast<int16_t>(8000.0 * std::sin(2.0 * M_PI * hz * i / kRate) + noise);
    pcm.append(reinterpret_cast<const char*>(&v), 2);
  }
  auto u32 = [](uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); };
  auto u16 = [](uint16_t v) { return std::string(reinterpret_cast<const char*>(&v), 2); };
  return "RIFF" + u32(36 + static_cast<uint32_t>(pcm.size())) + "WAVE" + "fmt " + u32(16) + u16(1) + u16(1) +
         u32(kRate) + u32(kRate * 2) + u16(2) + u16(16) + "data" + u32(static_cast<uint32_t>(pcm.size())) + pcm;
}

// The TCP port `pid` listens on (0 if none yet): its socket inodes matched
// against the listening sockets in /proc/<pid>/net/tcp.
uint16_t ListeningPort(pid_t pid) {
  std::set<std::string> inodes;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    const std::string target = fs::read_symlink(e.path(), ec).string();
    if (target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::ifstream tcp("/proc/" + std::to_string(pid) + "/net/tcp");
  std::string line;
  std::getline(tcp, line);  // header
  while (std::getline(tcp, line)) {
    std::istringstream in(line);
    std::string slot, local, remote, state, queues, timer, retr, uid, timeout, inode;
    in >> slot >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
    if (state == "0A" && inodes.count(inode)) return static_cast<uint16_t>(std::stoul(local.substr(local.find(':') + 1), nullptr, 16));
  }
  return 0;
}

// whisper-server --model M --host 127.0.0.1 --port 0, stopped (SIGTERM, then
// SIGKILL) when destroyed. Ready once /health answers 200; or it exited.
class WhisperServer {
 public:
  WhisperServer(const std::string& model, const std::string& dir, std::chrono::seconds timeout = 60s) : dir_(dir) {
    pid_ = SpawnProcess({Env("WHISPER_SERVER"), "--model", model, "--host", "127.0.0.1", "--port", "0", "-t", "2"},
                        dir + "/whisper-server.out", dir + "/whisper-server.err");
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline && !exited_) {
      if (port_ == 0) port_ = ListeningPort(pid_);
      if (port_ != 0) {
        auto r = http::Fetch("127.0.0.1", port_, "GET", "/health", "", {}, 2s);
        if (r.ok() && r->status == 200) return;
      }
      Reap(WNOHANG);
      std::this_thread::sleep_for(20ms);
    }
    port_ = 0;
  }
  ~WhisperServer() {
    if (exited_) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 100 && !exited_; ++i) {
      if (!Reap(WNOHANG)) std::this_thread::sleep_for(50ms);
    }
    if (!exited_) {
      ::kill(pid_, SIGKILL);
      Reap(0);
    }
  }
  bool ready() const { return port_ != 0 && !exited_; }
  uint16_t port() const { return port_; }
  // Waits up to `timeout` for the process to exit: its exit code, -signal, or
  // nullopt if it still runs.
  std::optional<int> ExitCode(std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!exited_ && std::chrono::steady_clock::now() < deadline) {
      if (!Reap(WNOHANG)) std::this_thread::sleep_for(20ms);
    }
    return exited_ ? std::optional<int>(exit_code_) : std::nullopt;
  }
  std::string Stderr() const { return ReadAll(dir_ + "/whisper-server.err"); }

  // POST /inference: the file and greedy decoding without temperature fallback.
  StatusOr<http::ClientResponse> Transcribe(const std::string& wav) const {
    const std::string b = "spillway-whisper-test-boundary";
    std::string body = "--" + b + "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"clip.wav\"\r\n" +
                       "Content-Type: audio/wav\r\n\r\n" + wav + "\r\n";
    for (const auto& [k, v] : {std::pair{"temperature", "0.0"}, {"temperature_inc", "0.0"}, {"response_format", "json"}}) {
      body += "--" + b + "\r\nContent-Disposition: form-data; name=\"" + k + "\"\r\n\r\n" + v + "\r\n";
    }
    body += "--" + b + "--\r\n";
    return http::Fetch("127.0.0.1", port_, "POST", "/inference", body,
                       {{"Content-Type", "multipart/form-data; boundary=" + b}}, 60s);
  }

 private:
  bool Reap(int flags) {
    int status = 0;
    if (waitpid(pid_, &status, flags) != pid_) return false;
    exited_ = true;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    return true;
  }
  std::string dir_;
  pid_t pid_ = -1;
  uint16_t port_ = 0;
  bool exited_ = false;
  int exit_code_ = 0;
};

// The transcript's text, after checking the answer is a 200 JSON object with one.
std::string TextOf(const StatusOr<http::ClientResponse>& r) {
  if (!r.ok()) {
    ADD_FAILURE() << r.status().ToString();
    return "";
  }
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_NE(r->Header("content-type").find("application/json"), std::string::npos) << r->Header("content-type");
  const json j = json::parse(r->body, nullptr, false);
  if (!j.is_object() || !j.contains("text") || !j["text"].is_string()) {
    ADD_FAILURE() << "no string 'text' in " << r->body;
    return "";
  }
  return j["text"].get<std::string>();
}

class WhisperServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string bin = Env("WHISPER_SERVER");
    if (bin.empty() || ::access(bin.c_str(), X_OK) != 0) {
      GTEST_SKIP() << "whisper-server is not built ('" << bin << "'): scripts/whisper.sh builds it at configure "
                   << "time unless -DSPILLWAY_WHISPER=OFF; run through ctest";
    }
    ASSERT_TRUE(fs::exists(Gpt2Vocab())) << Gpt2Vocab() << " missing (LLAMA_SRC unset? run through ctest)";
    dir_ = MakeScratchDir();
  }
  std::string dir_;
};

TEST_F(WhisperServerTest, TranscribesDeterministicallyAndDependsOnTheAudio) {
  const std::string model = WriteModel(dir_ + "/tiny-whisper.bin");
  WhisperServer server(model, dir_);
  ASSERT_TRUE(server.ready()) << server.Stderr();

  const std::string a = TextOf(server.Transcribe(WavBytes(440, 1)));
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(TextOf(server.Transcribe(WavBytes(440, 1))), a) << "same clip, temperature 0: same text";
  EXPECT_NE(TextOf(server.Transcribe(WavBytes(880, 2))), a) << "another clip, another transcript";

  // Another process on a copy written from the same seed: the same text.
  const std::string copy = WriteModel(dir_ + "/tiny-whisper-copy.bin");
  ASSERT_EQ(ReadAll(copy), ReadAll(model)) << "same seed: byte-identical files";
  const std::string dir2 = MakeScratchDir();
  WhisperServer second(copy, dir2);
  ASSERT_TRUE(second.ready()) << second.Stderr();
  EXPECT_EQ(TextOf(second.Transcribe(WavBytes(440, 1))), a);
  std::printf("transcript of the 440 Hz clip: %s\n", json(a).dump().c_str());
}

TEST_F(WhisperServerTest, AnsweredWithoutAFile400) {
  WhisperServer server(WriteModel(dir_ + "/tiny-whisper.bin"), dir_);
  ASSERT_TRUE(server.ready()) << server.Stderr();
  auto r = http::Fetch("127.0.0.1", server.port(), "POST", "/inference", "", {}, 10s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 400) << r->body;
}

// A model whose structure is damaged is refused at load: whisper-server exits
// 3 at once and never listens. (Damage inside the weights' bytes is not
// detected: the format has no checksum, and such a model loads.)
TEST_F(WhisperServerTest, DamagedModelMakesTheServerExitNonZero) {
  const std::string bytes = ReadAll(WriteModel(dir_ + "/good.bin"));
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
    WhisperServer server(path, dir, 30s);
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
  const std::string a = ReadAll(WriteModel(dir_ + "/a.bin"));
  EXPECT_EQ(ReadAll(WriteModel(dir_ + "/b.bin")), a);
  EXPECT_NE(ReadAll(WriteModel(dir_ + "/c.bin", "--seed 7")), a);
  ASSERT_GE(a.size(), 4u);
  EXPECT_EQ(a.substr(0, 4), std::string("lmgg")) << "ggml magic 0x67676d6c, little-endian";
  // Mostly the f16 token embedding (51864 x 64 x 2 bytes = 6.6 MB) and the vocabulary.
  EXPECT_GT(a.size(), 51864u * 64 * 2);
  EXPECT_LT(a.size(), 9u << 20);
  const auto f32 = ReadAll(WriteModel(dir_ + "/f32.bin", "--type f32"));
  EXPECT_GT(f32.size(), a.size() + 51864u * 64 * 2 - 1) << "f32 doubles the matrices";
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
      {v + "--out " + dir_ + "/m.bin --type q4_0", "a whisper model is f32 or f16", 2},
      {v + "--out " + dir_ + "/m.bin --ffn 64", "--ffn does not apply to --kind whisper", 2},
      {v + "--out " + dir_ + "/m.bin --layers many", "--layers", 2},  // CLI11's conversion error
      {"--vocab " + Env("SPILLWAY_VOCAB") + " --out " + dir_ + "/m.bin", "is not GPT-2's vocabulary", 2},
      {"--vocab " + dir_ + "/none.gguf --out " + dir_ + "/m.bin", "cannot read vocabulary GGUF", 2},
      {v + "--out " + file + "/m.bin", "cannot write " + file + "/m.bin.tmp: Not a directory", 1},
      {v + "--out /proc/m.bin", "cannot write /proc/m.bin.tmp", 1},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    int code = -1;
    const std::string out = Mkmodel(c.args, &code);
    EXPECT_EQ(code, c.code) << out;
    EXPECT_NE(out.find(c.message), std::string::npos) << out;
  }
  EXPECT_FALSE(fs::exists(dir_ + "/m.bin"));
}

}  // namespace
}  // namespace spillway::testing
