// How far the workers of a starting gateway have come, in the words a
// service manager shows (`systemctl status`: STATUS=) and the moment it may
// call the gateway started (READY=1). Pure: computed from the supervisor's
// WorkerViews, no clock, no I/O.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "upstream/workers.h"

namespace spillway::upstream {

struct StartupProgress {
  size_t workers = 0;   // loaded at start: every worker but the on-demand ones
  size_t ready = 0;     // ready and announced by the gateway (its /info read and compatible)
  size_t starting = 0;  // loading, or restarting after having served
  std::vector<std::string> failing;  // "chat.0 (its last error)": not ready, and failed a start at least once

  // Every worker is ready, or failed at least one start and is retried with
  // backoff (named in /readyz, /v1/status and `failing`): nothing is left
  // that a longer wait would settle. A gateway with no worker to load is
  // settled at once.
  bool settled() const { return starting == 0; }
};

// `announced`: the keys the gateway has told ready (the OnReady callback).
StartupProgress MeasureStartup(const std::vector<WorkerView>& workers, const std::set<std::string>& announced);

// One line: "serving on 127.0.0.1:8480; 1 of 2 workers ready, 1 loading;
// failing: chat.0 (model file not found)". Reasons are cut to 120 bytes, on a character boundary.
std::string StartupStatusLine(const StartupProgress& progress, const std::string& listening);

}  // namespace spillway::upstream
