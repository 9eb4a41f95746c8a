// whisper.cpp's whisper-server (built by scripts/whisper.sh; its path in
// $WHISPER_SERVER) for integration tests, with the models and audio they use:
// a random-weight model from `spillway mkmodel --kind whisper` and generated
// WAV clips. The server binds port 0; its port is read back from /proc.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "api/http_client.h"

namespace spillway::testing {

std::string EnvOr(const char* name, const std::string& fallback = "");

// Why whisper-server cannot be used here ("" when it can): it is not built
// ($WHISPER_SERVER unset or not executable). Tests skip with this reason.
std::string WhisperServerMissing();

// GPT-2's vocabulary (Whisper's English tokenizer) in llama.cpp's tree ($LLAMA_SRC).
std::string Gpt2Vocab();

// Runs `spillway mkmodel --kind whisper <args>`; returns what it printed (stdout and stderr).
std::string MkmodelWhisper(const std::string& args, int* exit_code);
// Writes a whisper model to `path` with the GPT-2 vocabulary and `more` options
// (a failure is a test failure); returns `path`.
std::string WriteWhisperModelFile(const std::string& path, const std::string& more = "");

std::string ReadAll(const std::string& path);

// One second of 16 kHz mono PCM16 WAV: a sine of `hz` plus a little seeded noise.
std::string WavBytes(double hz, uint32_t seed);

// The TCP port process `pid` listens on, 0 if none (yet).
uint16_t ListeningPort(pid_t pid);

// whisper-server --model M --host 127.0.0.1 --port 0 -t 2, with
// GGML_BACKEND_PATH=`backend_module` when one is given; stopped (SIGTERM, then
// SIGKILL) when destroyed. The constructor returns once /health answers 200,
// the process exited, or `timeout` passed.
class WhisperServer {
 public:
  WhisperServer(const std::string& model, const std::string& dir, const std::string& backend_module = "",
                std::chrono::seconds timeout = std::chrono::seconds(60));
  ~WhisperServer();
  WhisperServer(const WhisperServer&) = delete;
  WhisperServer& operator=(const WhisperServer&) = delete;

  bool ready() const { return port_ != 0 && !exited_; }
  uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }
  // Waits up to `timeout` for the process to exit: its exit code or
  // -signal; nullopt while it still runs.
  std::optional<int> ExitCode(std::chrono::seconds timeout);
  std::string Stderr() const;

  // POST /inference (multipart): the clip, greedy decoding without
  // temperature fallback, response_format json.
  StatusOr<http::ClientResponse> Transcribe(const std::string& wav) const;

 private:
  bool Reap(int flags);  // true once the process has exited
  std::string dir_;
  pid_t pid_ = -1;
  uint16_t port_ = 0;
  bool exited_ = false;
  int exit_code_ = 0;
};

// The transcript in an /inference answer; a test failure unless it is a 200
// JSON object with a string "text".
std::string TranscriptText(const StatusOr<http::ClientResponse>& r);

}  // namespace spillway::testing
