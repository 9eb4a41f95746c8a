#include "admission/admission.h"

#include <algorithm>
#include <cmath>
#include <optional>

namespace spillway::admission {

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kAdmit: return "admit";
    case Kind::kDelay: return "delay";
    case Kind::kShrink: return "shrink";
    case Kind::kOffload: return "offload";
    case Kind::kReroute: return "reroute";
    case Kind::kReject: return "reject";
  }
  return "reject";
}

namespace {

std::string N(uint64_t v) { return std::to_string(v); }

// A pool free in `wait_s` is waited for (a delay), within the policy's bound.
bool Within(const Policy& pol, double wait_s) { return pol.unbounded_delay || wait_s <= pol.max_delay_s; }

bool FitsNow(const PlacementView& p, uint64_t need) { return p.usable && p.slots_free > 0 && need <= p.cells_free; }

bool UnderPressure(const PlacementView& p, uint64_t need, double pressure) {
  // Each slot's cells are its own, reserved whole: a request that fills most
  // of a free slot presses on nothing. Such a pool is busy when its slots
  // are taken (FitsNow), not "under pressure".
  if (p.per_slot) return false;
  if (p.cells_total == 0) return true;
  const double used_after = static_cast<double>(p.cells_total - p.cells_free + need) / p.cells_total;
  return used_after > pressure;
}

Decision Make(Kind k, size_t i, uint32_t max_tokens, std::string reason) {
  Decision d;
  d.kind = k;
  d.placement = i;
  d.max_tokens = max_tokens;
  d.reason = std::move(reason);
  return d;
}

Decision Reject(int status, int retry_after, std::string reason) {
  Decision d;
  d.kind = Kind::kReject;
  d.http_status = status;
  d.retry_after_s = retry_after;
  d.reason = std::move(reason);
  return d;
}

// Another placement to go to, best first: a hybrid of the same model, then a fallback.
Kind MoveKind(const PlacementView& p) { return p.hybrid ? Kind::kOffload : Kind::kReroute; }

std::vector<size_t> Alternatives(const std::vector<PlacementView>& ps) {
  std::vector<size_t> idx;
  for (size_t i = 1; i < ps.size(); ++i) {
    if (ps[i].usable) idx.push_back(i);
  }
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return ps[a].hybrid && !ps[b].hybrid; });
  return idx;
}

}  // namespace

namespace {

// The tokens a request asking `max_tokens` is given on `p` (its cap, when it has one).
uint32_t MaxTokensAt(uint32_t max_tokens, const PlacementView& p) {
  return p.max_tokens_cap > 0 ? std::min(max_tokens, p.max_tokens_cap) : max_tokens;
}

// The cells a request holds on `p`.
uint64_t NeedAt(const RequestNeed& r, const PlacementView& p) {
  return static_cast<uint64_t>(r.prompt_tokens) + MaxTokensAt(r.max_tokens, p);
}

}  // namespace

// Where the request goes by the placements' pools alone.
Decision Place(const RequestNeed& r, const std::vector<PlacementView>& ps, const Policy& pol) {
  if (ps.empty()) return Reject(503, 5, "no placement is configured");
  const uint64_t need = static_cast<uint64_t>(r.prompt_tokens) + r.max_tokens;
  const PlacementView& primary = ps[0];
  const auto alts = pol.fail_fast ? std::vector<size_t>{} : Alternatives(ps);

  // 1. The primary has room and no pressure: admit.
  if (FitsNow(primary, need) && !UnderPressure(primary, need, pol.pressure)) {
    return Make(Kind::kAdmit, 0, r.max_tokens, "fits " + primary.name + ": " + N(need) + " of " + N(primary.cells_free) + " free cells");
  }

  // 2. It can never fit the primary's pool: another placement with a larger
  // pool, or shrink; 400/413 only when no pool could ever hold it, 503 when
  // one could later (busy past max_delay_s, restarting, its breaker open).
  if (need > primary.cells_total) {
    double soonest_s = -1;  // the least wait of a larger pool that is busy now
    for (size_t i : alts) {
      if (NeedAt(r, ps[i]) > ps[i].cells_total) continue;
      const std::string why = N(need) + " cells exceed " + primary.name + "'s pool of " + N(primary.cells_total) +
                              "; " + ps[i].name + " holds " + N(ps[i].cells_total);
      if (FitsNow(ps[i], NeedAt(r, ps[i]))) return Make(MoveKind(ps[i]), i, r.max_tokens, why);
      if (Within(pol, ps[i].est_wait_s)) {
        Decision d = Make(Kind::kDelay, i, r.max_tokens, why + ", busy now");
        d.retry_after_s = static_cast<int>(std::ceil(ps[i].est_wait_s));
        return d;
      }
      if (soonest_s < 0 || ps[i].est_wait_s < soonest_s) soonest_s = ps[i].est_wait_s;
    }
    uint64_t best_total = primary.cells_total;
    for (size_t i : alts) best_total = std::max<uint64_t>(best_total, ps[i].cells_total);
    uint32_t shrunk = 0;  // max_tokens that would fit the primary's pool
    if (r.allow_shrink && r.prompt_tokens + r.min_tokens <= best_total) {
      shrunk = static_cast<uint32_t>(std::min<uint64_t>(r.max_tokens, primary.cells_total - std::min<uint64_t>(primary.cells_total, r.prompt_tokens)));
      if (shrunk >= r.min_tokens && FitsNow(primary, r.prompt_tokens + shrunk)) {
        return Make(Kind::kShrink, 0, shrunk, "max_tokens lowered from " + N(r.max_tokens) + " to " + N(shrunk) +
                                                  " to fit " + primary.name + "'s pool of " + N(primary.cells_total));
      }
    }
    const std::string sum = "the prompt (" + N(r.prompt_tokens) + " tokens) + " +
                            (r.fit_context ? "the shortest answer (" + N(r.max_tokens) + " tokens)"
                                           : "max_tokens (" + N(r.max_tokens) + ")") +
                            " = " + N(need) + " cells";
    if (soonest_s >= 0) {  // a larger pool is busy for longer than max_delay_s
      const int wait = std::max(1, static_cast<int>(std::ceil(soonest_s)));
      return Reject(503, wait, sum + " fit only a pool that is full for about " + N(wait) + " s");
    }
    // Shrunk, it fits the primary's pool once it frees (or once it is back:
    // restarting, or probed by one request; Decide waits for that).
    if (shrunk >= r.min_tokens && (primary.usable || primary.comes_back)) {
      // Full only briefly: it waits, as any request waits for a busy pool
      // (it was a 503 however soon a slot freed, and went ahead of its line).
      if (primary.usable && Within(pol, primary.est_wait_s)) {
        Decision d = Make(Kind::kDelay, 0, shrunk, sum + " fit " + primary.name + "'s pool only shrunk; it is full, room in about " +
                                                       N(static_cast<uint64_t>(std::ceil(primary.est_wait_s))) + " s");
        d.retry_after_s = static_cast<int>(std::ceil(primary.est_wait_s));
        return d;
      }
      const int wait = std::max(1, static_cast<int>(std::ceil(primary.est_wait_s)));
      return Reject(503, wait, sum + " fit " + primary.name + "'s pool only shrunk, and it is full for about " +
                                   N(wait) + " s");
    }
    // A larger pool that is not usable now but comes back (its worker restarting, its breaker to probe).
    for (size_t i = 1; i < ps.size() && !pol.fail_fast; ++i) {
      if (ps[i].usable || !ps[i].comes_back || NeedAt(r, ps[i]) > ps[i].cells_total) continue;
      if (r.waited_s < pol.start_wait_s) {
        Decision d = Make(Kind::kDelay, i, r.max_tokens, sum + " fit only " + ps[i].name + "'s pool of " +
                                                             N(ps[i].cells_total) + ", which is not up yet");
        d.retry_after_s = 1;
        return d;
      }
      return Reject(503, 5, sum + " fit only " + ps[i].name + "'s pool, which did not come back within " +
                                N(static_cast<uint64_t>(pol.start_wait_s)) + " s");
    }
    const bool prompt_alone = r.prompt_tokens >= best_total;
    return Reject(prompt_alone ? 413 : 400, 0, sum + " can never fit: the largest pool holds " + N(best_total));
  }

  // 3. It fits the primary's pool, but not now (or only under pressure).
  if (pol.reroute_on_pressure || !primary.usable) {
    for (size_t i : alts) {
      if (FitsNow(ps[i], NeedAt(r, ps[i])) && !UnderPressure(ps[i], NeedAt(r, ps[i]), 1.0)) {
        return Make(MoveKind(ps[i]), i, r.max_tokens,
                    primary.name + (primary.usable ? " is under pressure" : " is unusable") + "; " + ps[i].name +
                        " has " + N(ps[i].cells_free) + " free cells");
      }
    }
  }
  if (primary.usable && FitsNow(primary, need)) {
    // Pressure but nowhere better: admit all the same (the pool does hold it).
    return Make(Kind::kAdmit, 0, r.max_tokens, "fits " + primary.name + " under pressure; no placement has more room");
  }
  if (primary.usable && r.allow_shrink && primary.slots_free > 0 && primary.cells_free >= r.prompt_tokens + r.min_tokens) {
    const uint32_t shrunk = primary.cells_free - r.prompt_tokens;
    return Make(Kind::kShrink, 0, shrunk, "max_tokens lowered from " + N(r.max_tokens) + " to " + N(shrunk) + " to start now on " + primary.name);
  }
  if (primary.usable && Within(pol, primary.est_wait_s)) {
    Decision d = Make(Kind::kDelay, 0, r.max_tokens, primary.name + " is full; " + N(need) + " cells free in about " +
                                                         N(static_cast<uint64_t>(std::ceil(primary.est_wait_s))) + " s");
    d.retry_after_s = static_cast<int>(std::ceil(primary.est_wait_s));
    return d;
  }
  // The primary out for good (not admitted, or it failed this request): a
  // placement that holds the request once it frees is waited for, as the
  // primary would be (every request past a hybrid's slots, or a retry after
  // a failure beside a GPU fallback busy for 3 s, got a 503 at once).
  if (!primary.usable) {
    for (size_t i : alts) {
      if (NeedAt(r, ps[i]) > ps[i].cells_total || !Within(pol, ps[i].est_wait_s)) continue;
      Decision d = Make(Kind::kDelay, i, r.max_tokens, primary.name + " is unusable; " + ps[i].name + " is full, room in about " +
                                                           N(static_cast<uint64_t>(std::ceil(ps[i].est_wait_s))) + " s");
      d.retry_after_s = std::max(1, static_cast<int>(std::ceil(ps[i].est_wait_s)));
      return d;
    }
  }
  const double wait = primary.usable ? primary.est_wait_s : pol.max_delay_s;
  return Reject(503, std::max(1, static_cast<int>(std::ceil(wait))),
                primary.usable ? primary.name + " is full for longer than " + N(static_cast<uint64_t>(pol.max_delay_s)) + " s"
                               : primary.name + " is unusable and no placement can take " + N(need) + " cells");
}

RequestNeed FitToContext(const RequestNeed& r, const std::vector<PlacementView>& ps) {
  if (!r.fit_context) return r;
  const uint32_t wanted = std::min(r.max_tokens, r.min_tokens);
  // The placements that can take it now, or, with none, all of them (one
  // that comes back).
  bool any_usable = false;
  for (const auto& p : ps) any_usable |= p.usable && p.cells_total > r.prompt_tokens;
  uint64_t most = 0;
  std::optional<uint64_t> room;
  for (const auto& p : ps) {
    if (p.cells_total <= r.prompt_tokens) continue;  // (unknown, or too small for the prompt)
    if (any_usable && !p.usable) continue;
    const uint64_t left = p.cells_total - r.prompt_tokens;
    if (left >= wanted) {
      room = left;
      break;
    }
    most = std::max(most, left);
  }
  if (!room && most > 0) room = most;
  RequestNeed out = r;
  if (room && *room < r.max_tokens) out.max_tokens = static_cast<uint32_t>(*room);
  // No pool holds even the prompt: judged with the shortest answer it may
  // be given (its refusal named a max_tokens of the service's cap, which
  // its client never sent).
  if (!room) out.max_tokens = wanted;
  return out;
}

Decision Decide(const RequestNeed& asked, const std::vector<PlacementView>& ps, const Policy& pol) {
  const RequestNeed r = FitToContext(asked, ps);
  Decision d = Place(r, ps, pol);
  // A primary that is not up yet (starting, restarting) is waited for, not
  // judged; one that a request probes is only busy, waited for by a
  // fail_fast service too (which waits for a busy primary).
  if (d.kind == Kind::kReject && d.http_status == 503 && !ps.empty() && ps[0].comes_back &&
      (!pol.fail_fast || ps[0].probing) && r.waited_s < pol.start_wait_s) {
    d = Make(Kind::kDelay, 0, r.max_tokens,
             ps[0].probing ? ps[0].name + " is back after a failure, and one request probes it first; waiting for its answer"
                           : ps[0].name + " is not up yet; waited " + N(static_cast<uint64_t>(r.waited_s)) + " s of " +
                                 N(static_cast<uint64_t>(pol.start_wait_s)) + " s for it");
    d.retry_after_s = 1;
    return d;
  }
  // Deadline awareness: from the placement's measured throughput, will it finish in time?
  if (d.kind != Kind::kDelay && d.kind != Kind::kReject && r.deadline_left_s > 0) {
    const PlacementView& p = ps[d.placement];
    if (p.prompt_tps > 0 && p.gen_tps > 0) {
      const uint32_t tokens = MaxTokensAt(d.max_tokens, p);
      // (What its worker holds of the prompt in the slot's cache is not computed again.)
      const uint32_t computed = r.ComputedPromptTokens(d.placement);
      // (Bounded before any conversion: a pace measured near zero made it past any integer.)
      const double need_s = std::min(computed / p.prompt_tps + tokens / p.gen_tps, 1e9);
      if (need_s > r.deadline_left_s) {
        // Sent again as it is, it needs as long: Retry-After is a short look
        // again (the pace may change), not its run time (minutes for a slow CPU).
        return Reject(503, static_cast<int>(std::clamp(std::ceil(need_s - r.deadline_left_s), 1.0, 30.0)),
                      p.name + " would need about " + N(static_cast<uint64_t>(std::ceil(need_s * 1000))) + " ms for " +
                          N(computed) + " prompt + " + N(tokens) +
                          " tokens, beyond the request's deadline (" +
                          N(static_cast<uint64_t>(r.deadline_left_s * 1000)) + " ms left)");
      }
    }
  }
  // First come, first served: room, but earlier requests still wait for it.
  if (d.kind != Kind::kDelay && d.kind != Kind::kReject && r.ahead_in_line > 0 && !ps[d.placement].own_line) {
    d = Make(Kind::kDelay, d.placement, r.max_tokens,
             N(r.ahead_in_line) + (r.ahead_in_line == 1 ? " earlier request waits" : " earlier requests wait") +
                 " ahead of it (first come, first served)");
    d.retry_after_s = 1;
    d.behind_line = true;
    return d;
  }
  return d;
}

}  // namespace spillway::admission
