#include "upstream/startup_progress.h"

#include "common/utf8.h"

namespace spillway::upstream {

namespace {

// How it ended, then its own last word ("did not become ready within 120 s
// (start_timeout_s): llama_model_load: ..."): the last line alone may be
// the last thing it loaded, not why it was stopped.
std::string Reason(const WorkerView& w) {
  std::string why = w.HowItEnded();
  if (why.empty()) why = "failed to start";
  if (w.failed_starts == 0 && w.crash_looping()) why = "crashed " + std::to_string(w.crashes) + " times soon after starting, " + why;
  return w.key + " (" + Abbreviated(ValidUtf8(why), 120) + ")";
}

}  // namespace

StartupProgress MeasureStartup(const std::vector<WorkerView>& workers, const std::set<std::string>& announced) {
  StartupProgress p;
  for (const auto& w : workers) {
    if (w.on_demand) continue;
    ++p.workers;
    if (w.state == WorkerState::kReady && announced.count(w.key)) {
      ++p.ready;
    } else if (w.failed_starts > 0 || w.crash_looping()) {
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
