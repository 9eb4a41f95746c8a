// spillway: the command-line entry point. Subcommands register themselves here.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <system_error>
#include <vector>

#include "cli/chaos_command.h"
#include "cli/doctor_command.h"
#include "cli/init_command.h"
#include "cli/mkmodel_command.h"
#include "cli/models_command.h"
#include "cli/plan_command.h"
#include "cli/serve_command.h"
#include "cli/sim_command.h"
#include "cli/status_command.h"

#ifndef SPILLWAY_VERSION
#define SPILLWAY_VERSION "unknown"
#endif

namespace {

// Levenshtein's distance between two words (a command's typo).
size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Spillway: a gateway and resource manager for local AI servers.\n"
               "It admits requests before accelerator memory runs out and fails over to a compatible CPU path."};
  app.set_version_flag("--version", std::string("spillway ") + SPILLWAY_VERSION);
  app.require_subcommand(1);
  int exit_code = 0;
  spillway::cli::AddMkmodelCommand(app, &exit_code);
  spillway::cli::AddSimCommand(app, &exit_code);
  spillway::cli::AddServeCommand(app, &exit_code);
  spillway::cli::AddPlanCommand(app, &exit_code);
  spillway::cli::AddModelsCommand(app, &exit_code);
  spillway::cli::AddChaosCommand(app, &exit_code);
  spillway::cli::AddDoctorCommand(app, &exit_code);
  spillway::cli::AddInitCommand(app, &exit_code);
  spillway::cli::AddStatusCommands(app, &exit_code);
  // A word that names no command (a typo: `spillway serv`) says so, and the
  // closest command; CLI11 said only "A subcommand is required".
  if (argc > 1 && argv[1][0] != '-') {
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands({})) names.push_back(sub->get_name());
    const std::string word = argv[1];
    if (std::find(names.begin(), names.end(), word) == names.end()) {
      std::string closest, all;
      size_t best = 3;  // at most two edits away
      for (const auto& n : names) {
        all += (all.empty() ? "" : ", ") + n;
        if (const size_t d = EditDistance(word, n); d < best) {
          best = d;
          closest = n;
        }
      }
      std::fprintf(stderr, "spillway: no command '%s'%s; the commands: %s (spillway --help)\n", word.c_str(),
                   closest.empty() ? "" : (" (did you mean '" + closest + "'?)").c_str(), all.c_str());
      return 2;
    }
  }
  // An option that takes a value, followed by another option instead
  // (`serve --state-dir --check`): CLI11 took "--check" as the value, and
  // serve started on the demo with a state directory named --check. Said so
  // instead; `--state-dir=--check` still means it.
  if (argc > 2 && argv[1][0] != '-') {  // (a command, named above: CLI11 throws for a name it has not)
    if (const CLI::App* sub = app.get_subcommand_ptr(argv[1]).get()) {
      for (int i = 2; i + 1 < argc; ++i) {
        const std::string arg = argv[i], next = argv[i + 1];
        if (arg.rfind("--", 0) != 0 || arg.find('=') != std::string::npos || next.rfind("--", 0) != 0) continue;
        for (const CLI::Option* opt : sub->get_options()) {
          if (opt->get_items_expected_min() > 0 && opt->check_lname(arg.substr(2))) {
            std::fprintf(stderr, "spillway %s: %s needs a value, and '%s' is an option (write %s=%s if you mean it)\n",
                         argv[1], arg.c_str(), next.c_str(), arg.c_str(), next.c_str());
            return 2;
          }
        }
      }
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const std::exception& e) {
    // A command that met what it did not expect (a server's odd answer, a
    // file's odd shape) says so and exits 1: never an abort and a core dump.
    // A thread that could not start (EAGAIN) names the limit it met.
    const auto* sys = dynamic_cast<const std::system_error*>(&e);
    const bool thread_limit = sys && sys->code() == std::errc::resource_unavailable_try_again;
    std::fprintf(stderr, "spillway: %s%s\n", e.what(), thread_limit ? " (the process or user thread limit, ulimit -u?)" : "");
    return 1;
  }
  return exit_code;
}
