// `spillway status` and `spillway requests`: the dashboard's picture in a
// terminal, from a running gateway (--url, or the listen address of
// --config; the API key from $SPILLWAY_API_KEY, sent as a Bearer header).
#pragma once

#include <CLI/CLI.hpp>

#include <nlohmann/json.hpp>

#include <string>

namespace spillway::cli {

void AddStatusCommands(CLI::App& app, int* exit_code);

// The compact table `spillway status` prints for a /v1/status body (for tests).
std::string StatusTable(const nlohmann::json& status);

}  // namespace spillway::cli
