#include "upstream/startup_progress.h"

namespace spillway::upstream {

namespace {

std::string Reason(const WorkerView& w) {
  std::string why = !w.last_error.empty() ? w.last_error : !w.last_exit.empty() ? w.last_exit : "failed to start";
  if (why.size() > 80) why = why.substr(0, 77) + "...";
  return w.key + " (" + why + ")";
}

}  // namespace

StartupProgress MeasureStartup(const std::vector<WorkerView>& workers, const std::set<std::string>& announced) {
  StartupProgress p;
  for (const auto& w : workers) {
    if (w.on_demand) continue;
    ++p.workers;
    if (w.state == WorkerState::kReady && announced.count(w.key)) {
      ++p.ready;
    } else if (w.failed_starts > 0) {
      p.failing.push_back(Reason(w));
    } else {
      ++p.starting;
    }
  }
  return p;
}

std::string StartupStatusLine(const StartupProgress& p, const std::string& listening) {
  std::string line = "serving on " + listening + "; " + std::to_string(p.ready) + " of " + std::to_string(p.workers) +
                     (p.workers == 1 ? " worker" : " workers") + " ready";
  if (p.starting) line += ", " + std::to_string(p.starting) + " loading";
  if (!p.failing.empty()) {
    line += "; failing:";
    for (const auto& f : p.failing) line += " " + f;
  }
  return line;
}

}  // namespace spillway::upstream
