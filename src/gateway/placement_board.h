// The placement board: the one object that owns what the gateway knows of
// each placement and device at run time, behind one lock:
//
//   per placement   its KV cell pool (per-request reservations), breaker,
//                   measured throughput, the requests running on it (for the
//                   wait estimate), attempts holding it, readiness policy;
//   per device      its breaker (a lost device is lost for every placement on it);
//   per service     its CPU line (scheduler/cpu_queue.h) and host-RAM budget.
//
// Admission reads a consistent snapshot (`Views`, the input of the pure
// admission::Decide) and commits a decision with `Reserve`, which can lose a
// race with another request (false: decide again). Outcomes of attempts come
// back through AttemptFailed / AttemptSucceeded / WorkerExited /
// RecordThroughput. The CPU line's rules, which need the line and the
// replica's pool at once, run under the board's lock through `WithLock`.
//
// Thread-safe.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "admission/admission.h"
#include "common/clock.h"
#include "config/config.h"
#include "failover/breaker.h"
#include "gateway/placement_admission.h"
#include "memory/ledger.h"
#include "scheduler/cpu_queue.h"

namespace spillway::gateway {

// The supervisor key of a service's n-th placement.
std::string WorkerKey(const config::ServiceConfig& s, size_t n);

class PlacementBoard {
 public:
  struct Placement {
    Placement(std::string k, config::PlacementConfig c, PlacementAdmission a, failover::Breaker b)
        : key(std::move(k)),
          cfg(std::move(c)),
          pool(static_cast<uint32_t>(cfg.ctx), cfg.kv_unified ? 0u : static_cast<uint32_t>(cfg.slots)),
          admission(std::move(a)),
          breaker(b) {}
    std::string key;
    config::PlacementConfig cfg;
    bool cpu_path = false;  // on its service's CPU path (ServiceConfig::OnCpuPath): a line of its own
    memory::CellPool pool;
    PlacementAdmission admission;
    failover::Breaker breaker;
    // Measured throughput (tokens/s, EWMA; 0 = not measured yet).
    double prompt_tps = 0, gen_tps = 0;
    // The prompt's pace, weighted by tokens: sums of the computed prompt
    // tokens and their milliseconds, the older decayed by the tokens that
    // came since (to 0.7 every 512; prompt_tps is their ratio). A sample of a
    // few tokens (a chat's next turn, a prompt found whole in the worker's
    // cache), whose time is mostly a decode step's fixed cost, moves it by
    // what it weighs, not as much as a prefill of thousands.
    double prompt_tokens_seen = 0, prompt_ms_seen = 0;
    // Attempts holding this placement now, and when the last one ended
    // (an idle on-demand replica is released after idle_unload_s).
    int active = 0;
    int64_t last_used_ms = 0;
    // What runs on its pool now (by request id), for the wait estimate
    // (prompt_tokens: those its run computes, what its worker's cache holds
    // of them left out).
    struct Running {
      uint32_t cells = 0, prompt_tokens = 0, max_tokens = 0;
      int64_t since_ms = 0;
    };
    std::map<std::string, Running> running;
    // Which process of its worker the placement is served by: counted up by
    // each WorkerExited (the next process is a new one; counted at the exit,
    // not at the next ready, which requests may see through the supervisor
    // before the board hears of it). An attempt keeps the one it was sent
    // to, so that a failure reported late by a process already replaced does
    // not count against its replacement.
    uint64_t generation = 0;
    std::string readiness = "warm";  // of this placement's worker: warm | mmap | on-demand
    std::string readiness_reason;
    double readiness_expected_s = 0;
  };
  // The lock's contents, for the few rules that need several parts at once.
  struct Locked {
    std::map<std::string, std::vector<std::unique_ptr<Placement>>>& placements;  // by service
    std::map<std::string, std::unique_ptr<scheduler::CpuQueue>>& cpu_lines;       // by service
    const std::map<std::string, uint64_t>& cpu_budgets;                            // by service
  };

  // `admissions`: the start-up decisions (a placement missing there is admitted).
  PlacementBoard(const config::GatewayConfig& config, const std::map<std::string, PlacementAdmission>& admissions,
                 const Clock& clock);

  // What admission::Decide sees of a service's placements now. `excluded`:
  // placements that failed this request (kept out unless nothing else could
  // take it); `startable(k)`: its worker is ready or can be started on demand;
  // `need`: the request's cells, for each pool's wait estimate.
  std::vector<admission::PlacementView> Views(const config::ServiceConfig& svc, const std::vector<bool>& excluded,
                                              uint64_t need, const std::function<bool(size_t)>& startable);
  // Seconds until a request with `ahead` others before it in the service's
  // line may start (a slot and `need` cells free for each: the asking
  // request's own, as the line's requests are taken alike; a slot with
  // too few cells told a line whose head waits for cells "0 s"), on the
  // placement that frees them soonest among those serving now (`serving(k)`:
  // its worker is ready; not the CPU path, whose line is its own, nor one
  // whose breaker takes nothing); nullopt while none of them has measured
  // its throughput (a free slot of a placement still loading said "about
  // 0 s" to a line waiting for its load). `need` 1: a slot alone.
  std::optional<double> LineWaitS(const std::string& service, uint32_t ahead, uint64_t need,
                                  const std::function<bool(size_t)>& serving);
  // Commits a decision: reserves `cells` of placement `index` for request
  // `id`, and counts the attempt as holding it. False when another request
  // took them since the snapshot (decide again), or its breaker (or its
  // device's) takes nothing now: opened since, or half-open with another
  // request probing it. Taken on a half-open breaker, `id` is its probe
  // (failover::Breaker): the next requests go elsewhere or wait until the
  // probe's result, its first streamed event (Answering) or its Release.
  // `up` (asked under the board's lock, which an idle release holds too):
  // whether the placement's worker is still the one the request will be
  // sent to; false when it was released since (nothing is taken).
  // `generation`: set to the worker process's (Placement::generation) when taken.
  // `prompt_tokens`: those its run will compute (for the wait estimates).
  bool Reserve(const std::string& service, size_t index, const std::string& id, uint32_t cells,
               uint32_t prompt_tokens, uint32_t max_tokens, const std::function<bool()>& up = {},
               uint64_t* generation = nullptr);
  // Takes a slot of placement `index` without cells (embeddings, a lone
  // placement whose worker checks its own pool); false when every slot is
  // taken, `up` says its worker is gone, or its breakers take nothing (as
  // for Reserve, probes included).
  // `max_tokens`: what it may generate (for the wait estimates: when its slot frees).
  bool TakeSlot(const std::string& service, size_t index, const std::string& id, uint32_t max_tokens,
                const std::function<bool()>& up = {}, uint64_t* generation = nullptr);
  // Which breaker an event let traffic through again, so that whoever waits
  // for it may go: kPlacement (the service's waiters), kDevice (every
  // service's: the device's breaker covers each placement on it).
  enum class Closed { kNone, kPlacement, kDevice };
  // Gives back what an attempt held: its cells, its slot, its place in the
  // CPU line, the probe of a half-open breaker it held without a result
  // (what that probe held back is said: the next request may probe it).
  // `keep_cpu_turn`: a request its CPU worker found busy (nothing ran) is
  // sent again at once and keeps its turn in the line.
  Closed Release(const std::string& service, size_t index, const std::string& id, bool cells, bool slot,
                 bool keep_cpu_turn = false);
  // The request leaves the service's CPU line (it runs elsewhere, or ends): whether it held a place.
  bool LeaveCpuLine(const std::string& service, const std::string& id);
  // The placement was just chosen: not idle (its replica is not released under it).
  void Touch(const std::string& service, size_t index);
  // Attempts holding placement `index` now.
  int Active(const std::string& service, size_t index) const;

  // An attempt's outcome, from the worker process `generation` it was sent
  // to (nullopt: the current one). One from a process replaced since says
  // nothing of its replacement: the placement's breaker does not hear it
  // (the old process's end already tripped it; a late failure reopened the
  // replacement's half-open breaker for a second, longer ejection). Its
  // device's breaker does.
  void AttemptFailed(const std::string& service, size_t index, const std::string& phase, const std::string& why,
                     std::optional<uint64_t> generation = std::nullopt);
  // What it closed (a half-open breaker it probed, or that another request
  // probes: one success closes it).
  Closed AttemptSucceeded(const std::string& service, size_t index, std::optional<uint64_t> generation = std::nullopt);
  // Request `id`'s stream reached its first event on placement `index`: the
  // placement allocates and computes again. When `id` probes a half-open
  // breaker (its own or its device's), that breaker closes now, not when a
  // long stream ends. What closed.
  Closed Answering(const std::string& service, size_t index, const std::string& id, uint64_t generation);
  // A worker exited or was replaced: its breaker opens (and its device's
  // when the device was lost), and its placements' generation is counted up.
  void WorkerExited(const std::string& key, const std::string& why, bool device_lost);
  // A new worker process for `key` became ready: its placements' open
  // breakers become half-open (Breaker::Uneject). A device's breaker stays.
  void WorkerReady(const std::string& key);
  // The worker's timings of one request (`spillway.timings`).
  void RecordThroughput(const std::string& service, size_t index, double prompt_ms, double prompt_tokens,
                        double generation_ms, double generated_tokens);
  // An idle on-demand replica may be released: nothing holds it and it has
  // been unused for `idle_ms`; then its resident bytes leave the CPU line's
  // budget. (`release` runs under the lock, so no request can pick its port meanwhile.)
  bool ReleaseIfIdle(const std::string& key, const std::function<int64_t(const std::string& service)>& idle_ms,
                     const std::function<void()>& release);

  // Whether placement `index`'s breaker and its device's allow traffic now.
  bool Allows(const std::string& service, size_t index);
  // The request probing placement `index`'s half-open breaker (or its
  // device's) while it takes no other; empty when none does.
  std::string ProbeOut(const std::string& service, size_t index);
  // Read-only access to a placement's start-up decision and readiness (never change after construction).
  const Placement& placement(const std::string& service, size_t index) const;
  // Runs `f` under the board's lock.
  template <typename F>
  auto WithLock(F f) {
    std::lock_guard<std::mutex> lk(mu_);
    Locked l{placements_, cpu_lines_, cpu_budgets_};
    return f(l);
  }

  // For /v1/status and /metrics.
  // `typical_need`: KV cells of a default request, for its estimated wait
  // ("est_wait_s", null until the placement's throughput is measured).
  nlohmann::json PlacementJson(const std::string& service, size_t index, uint64_t typical_need) const;
  nlohmann::json DevicesJson() const;
  void Gauges(std::vector<std::tuple<std::string, std::string, double>>* g) const;

 private:
  // Its own breaker and its device's allow traffic (mu_ held).
  bool BreakersAllow(Placement& st);
  // Request `id` goes to `st`: it probes whichever of its breakers is half-open (mu_ held).
  void BeginProbes(Placement& st, const std::string& id);
  Closed EndProbes(Placement& st, const std::string& id);  // which probe it ended (mu_ held)
  // The request whose probe alone holds `st` back (its breaker's or its device's); empty otherwise (mu_ held).
  std::string ProbeBlocking(Placement& st);
  std::optional<double> EstimatedWaitS(const Placement& st, uint64_t need) const;  // mu_ held

  const Clock& clock_;
  mutable std::mutex mu_;
  std::map<std::string, std::vector<std::unique_ptr<Placement>>> placements_;
  std::map<std::string, std::unique_ptr<scheduler::CpuQueue>> cpu_lines_;
  std::map<std::string, uint64_t> cpu_budgets_;
  std::map<std::string, failover::Breaker> device_breakers_;
};

}  // namespace spillway::gateway
