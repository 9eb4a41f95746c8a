// spillway: the command-line entry point. Subcommands register themselves here.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <system_error>

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
