// Runs a program with arguments (no shell: nothing in them is interpreted)
// and returns what it wrote on stdout; stderr goes to /dev/null.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace spillway {

struct Captured {
  int exit_code = -1;  // -1: ended by a signal
  std::string out;
};

// argv[0] is the program's path (not searched on PATH).
StatusOr<Captured> RunCapture(const std::vector<std::string>& argv);

}  // namespace spillway
