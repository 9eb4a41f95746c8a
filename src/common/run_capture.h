// Runs a program with arguments (no shell: nothing in them is interpreted)
// and returns what it wrote on stdout, and the end of what it wrote on stderr.
// The program gets none of the caller's descriptors beyond 0-2 (a gateway's
// sockets and files stay its own) and, when given, only the environment asked.
#pragma once

#include <spawn.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace spillway {

struct Captured {
  int exit_code = -1;  // -1: ended by a signal
  std::string out;
  std::string err;  // the last 64 KiB of its stderr
};

struct RunOptions {
  int64_t timeout_ms = 0;                       // > 0: killed (SIGKILL) when it runs longer: kDeadlineExceeded
  size_t max_out = 16 << 20;                    // more on stdout: killed, kResourceExhausted
  std::optional<std::vector<std::string>> env;  // unset: the caller's environment
};

// argv[0] is the program's path (not searched on PATH).
StatusOr<Captured> RunCapture(const std::vector<std::string>& argv, const RunOptions& options = {});

// What a child of the gateway starts with, whatever the gateway's own
// state: no blocked signal, and the default action for those a server or
// the gateway may have changed (SIGPIPE ignored, SIGINT under `&`, ...).
// Sets `attr`'s flags to `flags` plus the two this needs.
void ResetSignalsOnSpawn(posix_spawnattr_t* attr, short flags = 0);

// The environment a helper process of the gateway needs (locale, paths,
// ggml's, llama.cpp's and the GPU runtimes' settings, the simulated
// devices'), and nothing else of the gateway's: no API keys, no secrets.
std::vector<std::string> HelperEnvironment();

}  // namespace spillway
