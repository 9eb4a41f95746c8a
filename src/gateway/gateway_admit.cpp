// What admission asks of the gateway (start-up state of a service's
// workers, their exits, measured throughput); one admission itself is a
// RequestAdmission (request_admission.h).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>

#include "gateway/gateway.h"
#include "gateway/gateway_internal.h"
#include "protocol/worker_protocol.h"

namespace spillway::gateway {

void Gateway::WorkerExited(const std::string& key, const std::string& why) {
  // A victim that ended before it was idle (a crash while it drained) has
  // given its room: it is no longer unloading, or it would be held back (and
  // never started again) for good.
  bool was_evicting = false;
  {
    std::lock_guard<std::mutex> lk(residency_mu_);
    was_evicting = evicting_.erase(key) > 0;
  }
  if (was_evicting) NoteResidency("unload", key.substr(0, key.rfind('.')), {{"key", key}, {"reason", "evicted: it ended (" + why + ")"}});
  for (auto& [name, signal] : signals_) signal->Notify();  // waiters decide again without it
  board_.WorkerExited(key, why, why == protocol::kExitDeviceLost);
}

void Gateway::RecordThroughput(const std::string& service, size_t index, const std::string& body,
                               std::string_view timings_header) {
  // The worker's timings: its header (a non-streamed answer), or a stream's last chunk.
  const auto t = timings_header.empty() ? protocol::TimingsOf(body) : protocol::Timings::FromHeader(timings_header);
  if (t) {
    // (The prompt's time is its computed tokens': those found in the worker's cache took none.)
    board_.RecordThroughput(service, index, t->prompt_ms, t->computed_prompt_tokens(), t->generation_ms,
                            t->generated_tokens);
  }
}

int64_t Gateway::StartWaitMs(const config::ServiceConfig& svc, const std::string& only_model) {
  int64_t ms = 0;
  for (size_t k = 0; k < svc.placements.size(); ++k) {
    if (board_.placement(svc.name, k).admission.admitted && svc.Serves(k, only_model)) {
      ms = std::max(ms, static_cast<int64_t>(svc.placements[k].start_timeout_s * 1000));
    }
  }
  return ms;
}

std::string Gateway::StartingNote(const config::ServiceConfig& svc) {
  std::string note;
  for (const auto& w : supervisor_.Snapshot()) {
    for (size_t k = 0; k < svc.placements.size(); ++k) {
      const auto* st = &board_.placement(svc.name, k);
      if (w.key != st->key || !st->admission.admitted || w.state == upstream::WorkerState::kReady) continue;
      const int64_t now = clock_.NowMs();
      std::string part = st->cfg.Name();
      if (w.state != upstream::WorkerState::kBackoff) part += std::string(" is ") + upstream::WorkerStateName(w.state);
      if (w.state == upstream::WorkerState::kStarting) {
        part += " (";
        if (w.load_total_bytes > 0) {
          part += "model " + std::to_string(w.load_bytes * 100 / w.load_total_bytes) + " % loaded, ";
        }
        part += std::to_string((now - w.starting_since_ms) / 1000) + " s of its " +
                std::to_string(w.start_timeout_ms / 1000) + " s start timeout)";
      } else if (w.state == upstream::WorkerState::kBackoff) {
        // Refused by the start gate (no room: "not admitted: ..."), or backing off after a failure.
        const std::string in = std::to_string(std::max<int64_t>(0, (w.next_start_ms - now + 999) / 1000)) + " s";
        part += w.last_exit.empty()               ? " waits to start (in " + in + ")"
                : !w.NotAdmittedWhy().empty() ? " waits to start (" + w.last_exit + "; asked again in " + in + ")"
                                              : " is backing off after " + w.last_exit + ", next start in " + in;
      }
      note += (note.empty() ? "" : "; ") + part;
    }
  }
  return note.empty() ? "waiting for a worker of '" + svc.name + "' to start" : "waiting for a worker: " + note;
}

bool Gateway::AnyoneWaits(const std::string& service) {
  if (auto it = waiting_by_service_.find(service); it != waiting_by_service_.end() && it->second->load() > 0) return true;
  if (config_.FindExternal(service) && external_lines_->Waiting(service) > 0) return true;
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& [id, live] : live_) {
    if (live->service == service && live->phase.load() == LivePhase::kQueued) return true;
  }
  return false;
}

int64_t Gateway::OldestWaitMs(const std::string& service) {
  const int64_t now = clock_.NowMs();
  int64_t oldest = now;
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& [id, live] : live_) {
    if (live->service == service && live->phase.load() == LivePhase::kQueued) {
      oldest = std::min(oldest, live->phase_since_ms.load());
    }
  }
  return now - oldest;
}

Status Gateway::StartTrouble(const config::ServiceConfig& svc, int64_t waited_ms, const std::string& only_model) {
  // Every placement that may run keeps failing to start (a device that is
  // gone, a driver that refuses), or the wait has outlasted the start
  // timeout: say why, never a silent wait.
  bool hope = false, loading = false;
  std::string why;
  int64_t next_ms = INT64_MAX;
  const int64_t now = clock_.NowMs();
  const auto workers = supervisor_.Snapshot();
  for (size_t k = 0; k < svc.placements.size(); ++k) {
    const auto* st = &board_.placement(svc.name, k);
    if (!st->admission.admitted || !svc.Serves(k, only_model)) continue;
    bool found = false;
    for (const auto& w : workers) {
      if (w.key != st->key) continue;
      found = true;
      if (w.state == upstream::WorkerState::kReady) return Status::Ok();
      if (w.failed_starts > 0) {
        why += (why.empty() ? "" : "; ") + st->cfg.Name() + " failed to start " + std::to_string(w.failed_starts) +
               " time" + (w.failed_starts == 1 ? "" : "s") + " (" + w.HowItEnded() + ")";
      } else if (w.crash_looping()) {
        why += (why.empty() ? "" : "; ") + st->cfg.Name() + " crashed " + std::to_string(w.crashes) +
               " times in a row soon after starting (" + w.HowItEnded() + ")";
      } else if (w.state == upstream::WorkerState::kStarting) {
        why += (why.empty() ? "" : "; ") + st->cfg.Name() + " still starting after " +
               std::to_string((now - w.starting_since_ms) / 1000) + " s";
        // Its model still loads: waited for past the start timeout, as the supervisor does.
        loading |= w.load_progress_ms > 0 && now - w.load_progress_ms < w.start_timeout_ms;
      }
      if (w.state == upstream::WorkerState::kBackoff) next_ms = std::min(next_ms, w.next_start_ms);
      if (w.state != upstream::WorkerState::kBackoff || (w.failed_starts < 2 && !w.crash_looping())) hope = true;
    }
    hope |= !found;
  }
  const int64_t limit_ms = StartWaitMs(svc, only_model);
  if (hope && (waited_ms <= limit_ms || loading)) return Status::Ok();
  if (why.empty()) return Status::Ok();  // stopped on-demand replicas: the caller starts them
  const int64_t wait_s = next_ms == INT64_MAX ? 5 : std::max<int64_t>(1, (next_ms - now + 999) / 1000);
  const std::string head = hope ? "no worker of '" + svc.name + "' became ready within " +
                                      std::to_string(limit_ms / 1000) + " s (start_timeout_s): "
                                : "no placement of '" + svc.name + "' can start right now: ";
  return Status::Unavailable(head + why + "; next try in " + std::to_string(wait_s) + " s")
      .WithRetryAfter(static_cast<int>(wait_s));
}

}  // namespace spillway::gateway
