#include "admission/eviction.h"

#include <algorithm>
#include <cstdio>
#include <tuple>

namespace spillway::admission {

bool Resident::InUse() const {
  // Loading, or just loaded with requests waiting for it and none running
  // yet, is as busy as running them (within the same bounds as an exclusive
  // device's): taken, two services of one class that do not fit together
  // undid each other's loads for good, neither serving a request.
  return running > 0 || (starting && state_ms < kExclusiveStartWaitMs) ||
         (!starting && waiting > 0 && state_ms < kExclusiveServeFirstMs);
}

bool Resident::TurnIsOver(int64_t waited_ms) const {
  // Served (loaded and ready) a whole turn, while the other's requests
  // waited one: a service still loading has had no turn yet.
  return turn_ms > 0 && !starting && state_ms >= turn_ms && waited_ms >= turn_ms;  // (0: no turns)
}

double Resident::Cost() const {
  if (evict_cost >= 0) return evict_cost;
  // An idle service still costs its reload once: at least one request a minute.
  return reload_s * std::max(1.0, requests_per_min);
}

namespace {

std::string Mib(uint64_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.0f MiB", static_cast<double>(b) / (1 << 20));
  return s;
}

// "30 s", "1.5 s".
std::string Seconds(int64_t ms) {
  char s[32];
  if (ms % 1000 == 0) std::snprintf(s, sizeof s, "%lld s", static_cast<long long>(ms / 1000));
  else std::snprintf(s, sizeof s, "%.1f s", static_cast<double>(ms) / 1000);
  return s;
}

}  // namespace

EvictionPlan PlanEviction(uint64_t need, uint64_t available, int requester_priority, const std::string& requester_key,
                          const std::vector<Resident>& residents, bool exclusive, Demand demand) {
  EvictionPlan plan;
  const bool awaited = demand.awaited;
  // The requester's service (keys are "<service>.<n>"): never takes a turn from itself.
  const std::string own = requester_key.substr(0, requester_key.rfind('.'));
  // Who may give room at all: not a pinned one, nor one that outranks the
  // requester, nor (for a load nobody waits for) one of its own rank that
  // is used as much as the requester or more.
  auto may_give = [&](const Resident& r) {
    if (r.pinned || r.key == requester_key || r.priority < requester_priority) return false;
    return awaited || r.priority > requester_priority ||
           (demand.recently_used && r.requests_per_min < demand.requests_per_min);
  };
  if (exclusive) {
    // Every other service loaded there, even one that holds nothing yet (still starting, once it has had its
    // time); not the requester's own other placements.
    for (const auto& r : residents) {
      if (r.pinned || r.key == requester_key || r.service == own) continue;
      if (r.evicting) continue;
      const bool loading = r.starting && r.state_ms < kExclusiveStartWaitMs;
      if (loading || (!r.starting && r.waiting > 0 && r.running == 0 && r.state_ms < kExclusiveServeFirstMs)) {
        plan.reason = "exclusive device (one service at a time): " + r.service +
                      (r.starting ? " is still loading" : " has just loaded") + " and serves its " +
                      std::to_string(r.waiting) + " waiting request(s) first";
        plan.wait = true;
        return plan;
      }
    }
    std::string names;
    for (const auto& r : residents) {
      if (r.pinned || r.key == requester_key || r.service == own) continue;
      if (!awaited && !r.evicting && !may_give(r)) {
        plan = EvictionPlan{};
        plan.reason = "exclusive device: " + r.service + " is loaded there, used as much, and no request waits for this load";
        return plan;
      }
      plan.evict.push_back(r.key);
      if (r.running > 0) plan.drain.push_back(r.key);
      plan.freed += r.bytes;
      names += (names.empty() ? "" : ", ") + r.service + " (" + Mib(r.bytes) + (r.running > 0 ? ", draining)" : ", idle)");
    }
    plan.fits = need <= available + plan.freed;
    plan.reason = names.empty() ? "exclusive device: nothing else loaded"
                                : "exclusive device (one service at a time): unloading " + names;
    if (!plan.fits) {
      plan.reason = "needs " + Mib(need) + ", " + Mib(available + plan.freed) + " even with every other service unloaded";
      plan.evict.clear();
      plan.drain.clear();
      plan.freed = 0;
    }
    return plan;
  }
  if (need <= available) {
    plan.fits = true;
    plan.reason = "fits: needs " + Mib(need) + ", " + Mib(available) + " available";
    return plan;
  }
  std::vector<const Resident*> allowed;
  std::vector<const Resident*> turns;  // busy peers of the requester's priority whose turn is not over yet
  for (const auto& r : residents) {
    if (!may_give(r) || r.bytes == 0) continue;
    if (r.InUse() && r.priority <= requester_priority) {
      // Busy: only for a higher priority, or its own priority's turn (awaited loads only).
      const bool peer = awaited && r.priority == requester_priority && r.service != own;
      if (!peer || !r.TurnIsOver(demand.waited_ms)) {
        if (peer && !r.starting) turns.push_back(&r);
        continue;
      }
    }
    allowed.push_back(&r);
  }
  std::sort(allowed.begin(), allowed.end(), [](const Resident* a, const Resident* b) {
    return std::make_tuple(a->InUse(), -a->priority, a->Cost(), -static_cast<double>(a->bytes)) <
           std::make_tuple(b->InUse(), -b->priority, b->Cost(), -static_cast<double>(b->bytes));
  });
  const uint64_t missing = need - available;
  uint64_t freed = 0;
  std::vector<const Resident*> chosen;
  for (const Resident* r : allowed) {
    if (freed >= missing) break;
    chosen.push_back(r);
    freed += r->bytes;
  }
  if (freed < missing) {
    plan.reason = "needs " + Mib(need) + ", " + Mib(available) + " available, and unloading every service it may (" +
                  std::to_string(allowed.size()) + ") would free only " + Mib(freed) +
                  (awaited ? ""
                           : " (no request waits for this load: none of its own priority used as much is unloaded for it)");
    // Each busy peer with its own turn (fair_turn_s), then how long this load's requests have waited.
    std::string busy;
    bool takes_turns = false;
    for (const Resident* r : turns) {
      busy += (busy.empty() ? "" : "; ") + r->service + ", which gives way ";
      busy += r->turn_ms <= 0 ? std::string("only to a higher priority (fair_turn_s = 0)")
                              : "once it has served " + Seconds(r->turn_ms) + " and this load's requests have waited as long";
      takes_turns |= r->turn_ms > 0;
    }
    if (!busy.empty()) plan.reason += "; busy with its priority: " + busy;
    if (takes_turns) {
      plan.reason += " (" + std::to_string(std::max<int64_t>(0, demand.waited_ms) / 1000) + " s so far" +
                     (demand.turn_of.empty() ? "" : "; the next turn is " + demand.turn_of + "'s, whose requests waited longer") +
                     ")";
    }
    return plan;
  }
  plan.fits = true;
  plan.freed = freed;
  std::string names;
  for (const Resident* r : chosen) {
    plan.evict.push_back(r->key);
    if (r->running > 0) plan.drain.push_back(r->key);
    char cost[48];
    std::snprintf(cost, sizeof cost, ", cost %.1f", r->Cost());
    names += (names.empty() ? "" : ", ") + r->service + " (" + Mib(r->bytes) + (r->running > 0 ? ", draining" : ", idle") +
             cost + ")";
  }
  plan.reason = "needs " + Mib(need) + ", " + Mib(available) + " available: unloading " + names;
  return plan;
}

bool InWindow(const std::vector<std::string>& windows, int minute_of_day) {
  if (windows.empty()) return true;
  for (const auto& w : windows) {
    int h1 = 0, m1 = 0, h2 = 0, m2 = 0;
    if (std::sscanf(w.c_str(), "%d:%d-%d:%d", &h1, &m1, &h2, &m2) != 4) continue;
    const int from = h1 * 60 + m1, to = h2 * 60 + m2;
    const bool in = from <= to ? minute_of_day >= from && minute_of_day < to : minute_of_day >= from || minute_of_day < to;
    if (in) return true;
  }
  return false;
}

}  // namespace spillway::admission
