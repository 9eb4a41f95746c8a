// Runs a program with arguments (no shell: nothing in them is interpreted)
// and returns what it wrote on stdout, and the end of what it wrote on stderr.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace spillway {

struct Captured {
  int exit_code = -1;  // -1: ended by a signal
  std::string out;
  std::string err;  // the last 64 KiB of its stderr
};

// argv[0] is the program's path (not searched on PATH).
StatusOr<Captured> RunCapture(const std::vector<std::string>& argv);

}  // namespace spillway
