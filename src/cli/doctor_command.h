// `spillway doctor`: checks this machine for what a configuration needs, one
// line per check with a verdict (ok | warn | FAIL) and, when not ok, a fix.
// Exit status 1 when something would fail, 2 when the config cannot be read.
#pragma once

#include <CLI/CLI.hpp>

namespace spillway::cli {

void AddDoctorCommand(CLI::App& app, int* exit_code);

}  // namespace spillway::cli
