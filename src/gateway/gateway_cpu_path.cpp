// The CPU path of the gateway: its limits, its line and its RAM budget
// (scheduler/cpu_queue.h), and the on-demand replicas' idle release.
#include <cstdio>
#include <algorithm>
#include <cmath>
#include <mutex>

#include "admission/wait_estimate.h"
#include "devices/telemetry.h"
#include "gateway/gateway.h"
#include "gateway/gateway_internal.h"
#include "memory/estimator.h"

namespace spillway::gateway {

namespace {

std::string Mib(uint64_t bytes) { return std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB"; }

}  // namespace

void Gateway::RefreshCpuResident(const config::ServiceConfig& svc, PlacementBoard::Locked& board) {
  // The replicas' share of the budget while their process runs: what they
  // were predicted to hold (weights, KV pool, compute), or their resident
  // set when it is larger (runtime, libraries, allocator).
  auto& q = *board.cpu_lines.at(svc.name);
  auto& states = board.placements.at(svc.name);
  const devices::HostTelemetry host_telemetry;
  for (const auto& w : supervisor_.Snapshot()) {
    for (size_t k = 0; k < states.size(); ++k) {
      if (!svc.OnCpuPath(k) || states[k]->key != w.key) continue;
      const bool running = w.state == upstream::WorkerState::kStarting || w.state == upstream::WorkerState::kReady;
      uint64_t bytes = running ? states[k]->admission.predicted_bytes : 0;
      if (running && w.pid > 0) {
        if (auto rss = host_telemetry.ProcessRss(w.pid); rss.ok()) bytes = std::max(bytes, *rss);
      }
      q.SetResident(w.key, bytes);
    }
  }
}

Gateway::CpuGate Gateway::CpuPathGate(const journal::RequestRecord& rec, const config::ServiceConfig& svc,
                                      admission::Decision* d, int prompt_tokens, std::string* limits,
                                      std::string* note, double* est_wait_s, Status* rejected) {
  return board_.WithLock([&](PlacementBoard::Locked& board) {
    return CpuPathGateLocked(rec, svc, board, d, prompt_tokens, limits, note, est_wait_s, rejected);
  });
}

Gateway::CpuGate Gateway::CpuPathGateLocked(const journal::RequestRecord& rec, const config::ServiceConfig& svc,
                                            PlacementBoard::Locked& board, admission::Decision* d, int prompt_tokens,
                                            std::string* limits, std::string* note, double* est_wait_s,
                                            Status* rejected) {
  auto& q = *board.cpu_lines.at(svc.name);
  auto& states = board.placements.at(svc.name);
  const auto& cp = svc.cpu_path;
  auto& st = *states[d->placement];
  RefreshCpuResident(svc, board);
  const devices::HostTelemetry host_telemetry;
  if (cp.max_prompt_tokens > 0 && prompt_tokens > cp.max_prompt_tokens) {
    *rejected = Status::ResourceExhausted("the accelerator path of '" + svc.name + "' is unavailable and its CPU path takes prompts of up to " +
                                          std::to_string(cp.max_prompt_tokens) + " tokens (this one has " +
                                          std::to_string(prompt_tokens) + ")")
                    .WithRetryAfter(30);
    return CpuGate::kReject;
  }
  const uint32_t cap = static_cast<uint32_t>(cp.max_tokens > 0 ? cp.max_tokens : svc.max_tokens);
  if (d->max_tokens > cap) {
    d->max_tokens = cap;
    *limits = "max_tokens=" + std::to_string(cap) + " (CPU path)";
  }
  const uint64_t bytes = memory::RequestHostBytes(st.admission.n_vocab, static_cast<uint64_t>(prompt_tokens) + d->max_tokens);
  // Seconds one request takes here, from the measured throughput (10 s until measured).
  const double per_request_s =
      admission::ExpectedRunS(static_cast<uint32_t>(prompt_tokens), d->max_tokens, st.prompt_tps, st.gen_tps).value_or(10.0);
  const uint64_t budget = board.cpu_budgets.at(svc.name);
  switch (q.Join(rec.id, bytes)) {
    case scheduler::CpuQueue::JoinResult::kFull: {
      const auto s = q.stats();
      const double wait = std::ceil(static_cast<double>(s.waiting + s.running) / cp.concurrency) * per_request_s;
      *rejected = Status::ResourceExhausted("the CPU path of '" + svc.name + "' is full: " + std::to_string(s.running) +
                                            " running, " + std::to_string(s.waiting) + " waiting (max_queue " +
                                            std::to_string(cp.max_queue) + ")")
                      .WithRetryAfter(std::max(1, static_cast<int>(std::ceil(wait))));
      return CpuGate::kReject;
    }
    case scheduler::CpuQueue::JoinResult::kOverBudget:
      *rejected = Status::ResourceExhausted("the request needs " + Mib(bytes) + " of host RAM; the CPU path's budget of " +
                                            Mib(budget) + " holds " + Mib(q.stats().resident_bytes) + " of replicas")
                      .WithRetryAfter(30);
      return CpuGate::kReject;
    case scheduler::CpuQueue::JoinResult::kQueued:
      break;
  }
  // The replica must be up: an on-demand one is started now.
  if (!supervisor_.ReadyPort(st.key)) {
    supervisor_.Demand(st.key);
    *note = "loading the CPU replica " + st.cfg.Name() + " (" + st.readiness + ")";
    *est_wait_s = st.readiness_expected_s;
    return CpuGate::kWait;
  }
  uint64_t host = scheduler::CpuQueue::kUnknown;
  if (auto h = host_telemetry.Read(); h.ok()) {
    const uint64_t headroom = static_cast<uint64_t>(cp.host_headroom_mib * 1024 * 1024);
    const uint64_t avail = h->effective_available();
    host = avail > headroom ? avail - headroom : 0;
  }
  switch (q.TryStart(rec.id, host)) {
    case scheduler::CpuQueue::StartResult::kStart:
      // Its turn; the replica's KV cells are the last word (a long prompt may wait for them).
      if (static_cast<uint64_t>(prompt_tokens) + d->max_tokens > st.pool.free_for_request()) {
        *note = "first in line for the CPU path, waiting for " + std::to_string(prompt_tokens + d->max_tokens) +
                " KV cells (" + std::to_string(st.pool.free_for_request()) + " free for one request)";
        *est_wait_s = per_request_s;
        return CpuGate::kWait;
      }
      return CpuGate::kGo;
    case scheduler::CpuQueue::StartResult::kHostLow:
      *rejected = Status::ResourceExhausted("the host has " + Mib(host) + " available above its headroom of " +
                                            Mib(static_cast<uint64_t>(cp.host_headroom_mib * 1024 * 1024)) +
                                            "; the CPU path would need " + Mib(bytes))
                      .WithRetryAfter(5);
      return CpuGate::kReject;
    case scheduler::CpuQueue::StartResult::kWait:
      break;
  }
  const auto s = q.stats();
  *est_wait_s = q.EstimatedWaitS(rec.id, per_request_s);
  *note = "waiting for the CPU path: position " + std::to_string(q.Position(rec.id)) + " of " +
          std::to_string(s.waiting) + ", " + std::to_string(s.running) + " running, about " +
          std::to_string(static_cast<int>(std::ceil(*est_wait_s))) + " s";
  return CpuGate::kWait;
}

void Gateway::ReleaseTarget(const std::string& service, const std::string& id, Target* t) {
  const bool held = t->cells > 0 || t->holding;
  board_.Release(service, t->index, id, t->cells > 0, t->holding);
  t->cells = 0;
  t->holding = false;
  if (!held) return;  // (nothing freed: the line's head is not woken for nothing)
  if (auto it = signals_.find(service); it != signals_.end()) it->second->Notify();  // capacity may be free now
}

}  // namespace spillway::gateway
