#include "whisper_server.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "worker_process.h"

namespace spillway::testing {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

std::string WhisperServerMissing() {
  const std::string bin = EnvOr("WHISPER_SERVER");
  if (!bin.empty() && ::access(bin.c_str(), X_OK) == 0) return "";
  return "whisper-server is not built ('" + bin + "'): scripts/whisper.sh builds it at configure time unless "
         "-DSPILLWAY_WHISPER=OFF; run through ctest";
}

std::string Gpt2Vocab() { return EnvOr("LLAMA_SRC") + "/models/ggml-vocab-gpt-2.gguf"; }

std::string MkmodelWhisper(const std::string& args, int* exit_code) {
  return RunCommand(BinDir() + "/spillway mkmodel --kind whisper " + args + " 2>&1", exit_code);
}

std::string WriteWhisperModelFile(const std::string& path, const std::string& more) {
  int code = -1;
  const std::string out = MkmodelWhisper("--vocab " + Gpt2Vocab() + " --out " + path + " " + more, &code);
  EXPECT_EQ(code, 0) << out;
  return path;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

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

// The process's socket inodes, matched against the listening sockets in its
// network namespace's TCP table.
uint16_t ListeningPort(pid_t pid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  std::set<std::string> inodes;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(proc + "/fd", ec)) {
    const std::string target = fs::read_symlink(e.path(), ec).string();
    if (target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::ifstream tcp(proc + "/net/tcp");
  std::string line;
  std::getline(tcp, line);  // the header
  while (std::getline(tcp, line)) {
    std::istringstream in(line);
    std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
    in >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
    if (state == "0A" && inodes.count(inode)) {
      return static_cast<uint16_t>(std::stoul(local.substr(local.find(':') + 1), nullptr, 16));
    }
  }
  return 0;
}

WhisperServer::WhisperServer(const std::string& model, const std::string& dir, const std::string& backend_module,
                             std::chrono::seconds timeout)
    : dir_(dir) {
  std::vector<std::string> args;
  if (!backend_module.empty()) args = {"/usr/bin/env", "GGML_BACKEND_PATH=" + backend_module};  // execs in place
  for (std::string a : {EnvOr("WHISPER_SERVER"), std::string("--model"), model, std::string("--host"),
                        std::string("127.0.0.1"), std::string("--port"), std::string("0"), std::string("-t"),
                        std::string("2")}) {
    args.push_back(std::move(a));
  }
  pid_ = SpawnProcess(args, dir + "/whisper-server.out", dir + "/whisper-server.err");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline && !Reap(WNOHANG)) {
    if (port_ == 0) port_ = ListeningPort(pid_);
    if (port_ != 0) {
      auto r = http::Fetch("127.0.0.1", port_, "GET", "/health", "", {}, 2s);
      if (r.ok() && r->status == 200) return;
    }
    std::this_thread::sleep_for(20ms);
  }
  port_ = 0;
}

WhisperServer::~WhisperServer() {
  if (exited_) return;
  ::kill(pid_, SIGTERM);
  if (!ExitCode(5s)) {
    ::kill(pid_, SIGKILL);
    Reap(0);
  }
}

bool WhisperServer::Reap(int flags) {
  if (exited_) return true;
  int status = 0;
  if (waitpid(pid_, &status, flags) != pid_) return false;
  exited_ = true;
  exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  return true;
}

std::optional<int> WhisperServer::ExitCode(std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!Reap(WNOHANG) && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(20ms);
  return exited_ ? std::optional<int>(exit_code_) : std::nullopt;
}

std::string WhisperServer::Stderr() const { return ReadAll(dir_ + "/whisper-server.err"); }

StatusOr<http::ClientResponse> WhisperServer::Transcribe(const std::string& wav) const {
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

std::string TranscriptText(const StatusOr<http::ClientResponse>& r) {
  if (!r.ok()) {
    ADD_FAILURE() << r.status().ToString();
    return "";
  }
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_NE(r->Header("content-type").find("application/json"), std::string::npos) << r->Header("content-type");
  const auto j = nlohmann::json::parse(r->body, nullptr, false);
  if (!j.is_object() || !j.contains("text") || !j["text"].is_string()) {
    ADD_FAILURE() << "no string 'text' in " << r->body;
    return "";
  }
  return j["text"].get<std::string>();
}

}  // namespace spillway::testing
