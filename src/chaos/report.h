// The report of a `spillway chaos` run: a Markdown summary (readable in a
// terminal as well), one JSON document with everything that was recorded, and
// self-contained SVG plots per scenario of the Spillway run.
//
// The three vectors are the Spillway run itself (target "spillway"), the same
// scenarios against the baselines (target "plain-proxy" or "llama-server",
// matched by scenario name) and the placement profiles (target = profile name).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "chaos/record.h"
#include "common/status.h"

namespace spillway::chaos {

std::string MarkdownSummary(const std::vector<ScenarioResult>& spillway, const std::vector<ScenarioResult>& baselines,
                            const std::vector<ScenarioResult>& profiles, uint64_t seed);

// {"seed", "replay", "passed", "spillway": [...], "baselines": [...], "profiles": [...]}.
nlohmann::json ReportJson(const std::vector<ScenarioResult>& spillway, const std::vector<ScenarioResult>& baselines,
                          const std::vector<ScenarioResult>& profiles, uint64_t seed);

// Self-contained SVG documents; a scenario without data gives one saying "no data".
std::string LatencySvg(const ScenarioResult& r);  // latency per request over time, by outcome, fault markers
std::string MemorySvg(const ScenarioResult& r);   // device memory; host RSS per worker and the CPU path budget
std::string QueueSvg(const ScenarioResult& r);    // CPU queue waiting/running over time, fault markers

// A scenario or target name as a file name: lower case, [a-z0-9_-], others become '_'.
std::string FileNameFor(const std::string& name);

// Writes <dir>/<name>.json (the whole ScenarioResult, records included) as soon
// as a scenario ends; for a target other than "spillway" the file is
// <name>-<target>.json so that baselines and profiles do not overwrite it.
Status WriteScenario(const std::string& dir, const ScenarioResult& r);

// Creates dir and writes summary.md, report.json and, per scenario of the
// Spillway run, <name>-latency.svg, <name>-memory.svg and <name>-queue.svg.
Status WriteReport(const std::string& dir, const std::vector<ScenarioResult>& spillway,
                   const std::vector<ScenarioResult>& baselines, const std::vector<ScenarioResult>& profiles,
                   uint64_t seed);

}  // namespace spillway::chaos
