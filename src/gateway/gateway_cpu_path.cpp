// The CPU path of the gateway: its limits, its line and its RAM budget
// (scheduler/cpu_queue.h), and the on-demand replicas' idle release.
#include <cstdio>
#include <algorithm>
#include <cmath>
#include <mutex>

#include "admission/cpu_path.h"
#include "devices/telemetry.h"
#include "gateway/gateway.h"
#include "gateway/gateway_internal.h"
#include "memory/estimator.h"

namespace spillway::gateway {

void Gateway::RefreshCpuResident(const config::ServiceConfig& svc, PlacementBoard::Locked& board) {
  // The replicas' share of the budget while their process runs: what they
  // were predicted to hold (weights, KV pool, compute), or their resident
  // set when it is larger (runtime, libraries, allocator), as the
  // supervisor last sampled it (no procfs read under the board's lock).
  auto& q = *board.cpu_lines.at(svc.name);
  auto& states = board.placements.at(svc.name);
  for (const auto& w : supervisor_.Snapshot()) {
    for (size_t k = 0; k < states.size(); ++k) {
      if (!svc.OnCpuPath(k) || states[k]->key != w.key) continue;
      // Also one that will be (in backoff: asked to start, or restarting
      // after a crash) or that still exits (stopped, its process not yet
      // gone): counted as nothing, a second replica was let load beside it
      // past the budget.
      const bool running = w.state == upstream::WorkerState::kStarting || w.state == upstream::WorkerState::kReady ||
                           w.state == upstream::WorkerState::kBackoff || w.pid > 0;
      uint64_t bytes = running ? states[k]->admission.predicted_bytes : 0;
      if (running) bytes = std::max(bytes, w.rss_bytes);
      q.SetResident(w.key, bytes);
    }
  }
}

Gateway::CpuGate Gateway::CpuPathGate(const journal::RequestRecord& rec, bool failover, const config::ServiceConfig& svc,
                                      admission::Decision* d, int prompt_tokens, std::string* limits,
                                      std::string* note, double* est_wait_s, Status* rejected) {
  return board_.WithLock([&](PlacementBoard::Locked& board) {
    return CpuPathGateLocked(rec, failover, svc, board, d, prompt_tokens, limits, note, est_wait_s, rejected);
  });
}

Gateway::CpuGate Gateway::CpuPathGateLocked(const journal::RequestRecord& rec, bool failover, const config::ServiceConfig& svc,
                                            PlacementBoard::Locked& board, admission::Decision* d, int prompt_tokens,
                                            std::string* limits, std::string* note, double* est_wait_s,
                                            Status* rejected) {
  // The rules are admission/cpu_path.h's; here their inputs are gathered and
  // what they say is committed to the line.
  auto& q = *board.cpu_lines.at(svc.name);
  auto& st = *board.placements.at(svc.name)[d->placement];
  const auto& cp = svc.cpu_path;
  const admission::CpuPathLimits lim{svc.name,
                                     static_cast<uint32_t>(std::max(0, cp.max_prompt_tokens)),
                                     static_cast<uint32_t>(cp.max_tokens > 0 ? cp.max_tokens : svc.max_tokens),
                                     cp.concurrency,
                                     static_cast<size_t>(std::max(0, cp.max_queue)),
                                     board.cpu_budgets.at(svc.name),
                                     static_cast<uint64_t>(cp.host_headroom_mib * 1024 * 1024)};
  const uint32_t prompt = static_cast<uint32_t>(prompt_tokens);
  const admission::CpuPathCap cap = admission::CapForCpuPath(prompt, d->max_tokens, lim);
  if (cap.refused) {
    *rejected = Status::ResourceExhausted(cap.reason).WithRetryAfter(cap.retry_after_s);
    return CpuGate::kReject;
  }
  d->max_tokens = cap.max_tokens;
  if (!cap.limits.empty()) *limits = cap.limits;
  RefreshCpuResident(svc, board);
  admission::CpuPathState s;
  s.request_bytes = memory::RequestHostBytes(st.admission.n_vocab, uint64_t{prompt} + d->max_tokens);
  s.join = q.Join(rec.id, s.request_bytes, /*past_bound=*/failover);
  s.replica_ready = supervisor_.ReadyPort(st.key).has_value();
  if (admission::NeedsStart(s.join, s.replica_ready)) {
    // Procfs and cgroup files, read under the board's lock on an I/O thread:
    // only for the one request that may start, not every waiter every round.
    if (q.MayStart(rec.id)) {
      if (auto h = devices::HostTelemetry().Read(); h.ok()) {
        const uint64_t avail = h->effective_available();
        s.host_available = avail > lim.host_headroom_bytes ? avail - lim.host_headroom_bytes : 0;
      }
    }
    s.start = q.TryStart(rec.id, s.host_available);
  }
  s.line = q.stats();
  s.position = q.Position(rec.id);
  s.replica = st.cfg.Name();
  s.replica_bytes = st.admission.predicted_bytes;
  s.replica_counted_bytes = q.Resident(st.key);
  s.readiness = st.readiness;
  s.readiness_expected_s = st.readiness_expected_s;
  s.cells_free = st.pool.free_for_request();
  s.prompt_tps = st.prompt_tps;
  s.gen_tps = st.gen_tps;
  const admission::CpuPathVerdict v = admission::JudgeCpuPath(prompt, d->max_tokens, s, lim);
  if (v.demand_replica) {
    // Wanted now (as RequestAdmission::Demand touches it): idle from here, or
    // the replica, once loaded, is released at once as idle since its last use.
    st.last_used_ms = clock_.NowMs();
    supervisor_.Demand(st.key);
  }
  switch (v.kind) {
    case admission::CpuPathVerdict::Kind::kGo:
      return CpuGate::kGo;
    case admission::CpuPathVerdict::Kind::kWait:
      *note = v.why;
      *est_wait_s = v.est_wait_s;
      return CpuGate::kWait;
    case admission::CpuPathVerdict::Kind::kReject:
      break;
  }
  q.Leave(rec.id);  // (a place it took: refused only now, its replica too large beside the loaded ones)
  *rejected = Status::ResourceExhausted(v.why).WithRetryAfter(v.retry_after_s);
  return CpuGate::kReject;
}

void Gateway::Wake(const std::string& service, PlacementBoard::Closed what) {
  if (what == PlacementBoard::Closed::kDevice) {
    for (auto& [name, signal] : signals_) signal->Notify();
  } else if (what == PlacementBoard::Closed::kPlacement) {
    // (Every request's release: one lookup, not a walk over every service.)
    if (auto it = signals_.find(service); it != signals_.end()) it->second->Notify();
  }
}

void Gateway::FirstEvent(const std::string& service, const std::string& id, const Target& t) {
  Wake(service, board_.Answering(service, t.index, id, t.generation));
}

void Gateway::AttemptSucceeded(const std::string& service, const Target& t) {
  Wake(service, board_.AttemptSucceeded(service, t.index, t.generation));
}

void Gateway::ReleaseTarget(const std::string& service, const std::string& id, Target* t, bool keep_cpu_turn) {
  const bool held = t->cells > 0 || t->holding;
  const auto ended = board_.Release(service, t->index, id, t->cells > 0, t->holding, keep_cpu_turn);
  t->cells = 0;
  t->holding = false;
  // Capacity may be free now, and a probe that ended lets the next request
  // probe (a device's: on any service). Nothing freed: the line's head is
  // not woken for nothing.
  Wake(service, held && ended == PlacementBoard::Closed::kNone ? PlacementBoard::Closed::kPlacement : ended);
}

}  // namespace spillway::gateway
