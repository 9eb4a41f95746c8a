#include "chaos/verdict.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <set>
#include <tuple>
#include <string>

namespace spillway::chaos {

bool IsTerminalState(const std::string& s) {
  return s == "completed" || s == "failed" || s == "failed_resumable" || s == "cancelled";
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

double PercentileRatioLowerBound(const std::vector<double>& num, const std::vector<double>& den, double p,
                                 double confidence, std::mt19937_64& rng, int rounds) {
  if (num.empty() || den.empty() || rounds < 1) return 0;
  std::vector<double> ratios, a(num.size()), b(den.size());
  ratios.reserve(static_cast<size_t>(rounds));
  std::uniform_int_distribution<size_t> pick_num(0, num.size() - 1), pick_den(0, den.size() - 1);
  for (int i = 0; i < rounds; ++i) {
    for (auto& x : a) x = num[pick_num(rng)];
    for (auto& x : b) x = den[pick_den(rng)];
    ratios.push_back(Percentile(a, p) / std::max(1.0, Percentile(b, p)));
  }
  return Percentile(std::move(ratios), (1 - confidence) * 100);
}

namespace {


std::string Ms(double ms) {
  char b[32];
  std::snprintf(b, sizeof b, "%.0f ms", ms);
  return b;
}

void JudgeCompeting(const ScenarioResult& r, const VerdictOptions& o, Verdict& v) {
  auto completed = [](const RequestRecord& q) {
    return q.journal_state == "completed" && q.http_status == 200 && q.connection_survived && q.first_error.empty();
  };
  // Each slice lasts until its last batch request is answered.
  std::vector<Window> slices = o.pressure_ms;
  for (const auto& q : r.requests) {
    if (q.service != o.batch_service || q.latency_ms < 0) continue;
    for (size_t i = 0; i < slices.size(); ++i) {
      const Window& planned = o.pressure_ms[i];  // sent within the planned slice (not one already extended)
      if (q.sent_ms >= planned.from_ms && q.sent_ms < planned.to_ms) {
        slices[i].to_ms = std::max(slices[i].to_ms, q.sent_ms + q.latency_ms);
      }
    }
  }
  // [from, to] overlaps one of `spans` (slices of batch traffic, or host stalls: what overlapped a stall
  // measures the host, not the gateway).
  auto overlaps = [](const auto& spans, int64_t from, int64_t to) {
    return std::any_of(spans.begin(), spans.end(), [&](const auto& s) { return from < s.to_ms && to >= s.from_ms; });
  };
  std::vector<double> alone, pressure;
  for (const auto& q : r.requests) {
    if (!completed(q) || q.service != o.interactive_service || q.latency_ms < 0) continue;
    const bool pressed = overlaps(slices, q.sent_ms, q.sent_ms + q.latency_ms);
    if (overlaps(r.stalls, q.sent_ms, q.sent_ms + q.latency_ms)) {
      ++(pressed ? v.interactive_in_stalls_pressure : v.interactive_in_stalls);
      continue;
    }
    (pressed ? pressure : alone).push_back(static_cast<double>(q.latency_ms));
  }
  v.interactive_alone = static_cast<int>(alone.size());
  v.interactive_pressure = static_cast<int>(pressure.size());
  // Left out for stalls, more than one in ten on either side: the comparison proves nothing either way.
  for (const auto& [kept, out, side] : {std::tuple{v.interactive_alone, v.interactive_in_stalls, "alone"},
                                        std::tuple{v.interactive_pressure, v.interactive_in_stalls_pressure,
                                                   "under batch pressure"}}) {
    if (out * 10 > kept + out) {
      v.failures.push_back("inconclusive: " + std::to_string(out) + " of " + std::to_string(kept + out) + " " +
                           o.interactive_service + " requests " + side +
                           " overlapped a host stall (more than one in ten); run it again on a quieter machine");
    }
  }
  if (alone.size() < 5 || pressure.size() < 5) {
    v.failures.push_back("too few completed " + o.interactive_service + " requests to compare (" +
                         std::to_string(alone.size()) + " alone, " + std::to_string(pressure.size()) +
                         " under batch pressure; 5 each at least)");
  } else {
    v.interactive_p95_alone_ms = Percentile(alone, 95);
    v.interactive_p95_pressure_ms = Percentile(pressure, 95);
    // Under 20 a side, the p95 is the slowest request and a resampled
    // extreme says little: the point ratio is the bound then.
    std::mt19937_64 rng(r.seed);
    v.interactive_ratio_lower =
        alone.size() < 20 || pressure.size() < 20
            ? v.interactive_p95_pressure_ms / std::max(1.0, v.interactive_p95_alone_ms)
            : PercentileRatioLowerBound(pressure, alone, 95, o.interactive_confidence, rng);
    if (v.interactive_ratio_lower > o.max_interactive_ratio) {
      char ratio[96];
      std::snprintf(ratio, sizeof ratio, "%.2fx its p95 alone (%s; at %.0f%% confidence at least %.2fx)",
                    v.interactive_p95_pressure_ms / std::max(1.0, v.interactive_p95_alone_ms),
                    Ms(v.interactive_p95_alone_ms).c_str(), o.interactive_confidence * 100, v.interactive_ratio_lower);
      v.failures.push_back(o.interactive_service + " p95 under batch pressure " + Ms(v.interactive_p95_pressure_ms) + " is " +
                           ratio + "; the limit is " + std::to_string(o.max_interactive_ratio).substr(0, 4) + "x");
    }
  }
  int evicted_under_pressure = 0;
  for (size_t i = 0; i < r.events.size(); ++i) {
    const auto& e = r.events[i];
    if (e.kind != "evict") continue;
    ++v.evictions;
    evicted_under_pressure += overlaps(slices, e.at_ms, e.at_ms);
    if (!o.pinned_service.empty() && e.service == o.pinned_service) {
      v.failures.push_back("the pinned service " + e.service + " was evicted (for " + e.for_service + ")");
    }
    if (e.reason.empty() || e.for_service.empty()) v.failures.push_back("an eviction of " + e.service + " says not why or for whom");
    bool unloaded = false;
    for (size_t j = i + 1; j < r.events.size() && !unloaded; ++j) {
      unloaded = r.events[j].kind == "unload" && r.events[j].key == e.key;
    }
    if (unloaded) ++v.evictions_completed;
    else v.failures.push_back("evicted without an unload after it: " + e.key + " (for " + e.for_service + ")");
  }
  if (evicted_under_pressure == 0) {
    v.failures.push_back("no service was evicted under batch pressure: the scenario did not make its services compete");
  }
}

// Whether a kill of the gateway fell within the request's life, from its
// sending to its end (one that never ended: to the scenario's end), or it
// was sent while the gateway was down (killed, not yet serving again): its
// client's connection went with the process, and its outcome is the
// journal's, read by id.
bool GatewayKilledDuring(const RequestRecord& q, const ScenarioResult& r) {
  const int64_t end = q.latency_ms >= 0 ? q.sent_ms + q.latency_ms : INT64_MAX;
  for (const auto& f : r.faults) {
    if (f.kind.rfind("kill-gateway", 0) != 0) continue;
    // (Up again when its restart returned; not when its accelerator
    // placement recovered, which may be much later, or read as at once.)
    const int64_t back = f.back_ms >= 0 ? f.back_ms : INT64_MAX;
    if (f.at_ms <= end && q.sent_ms <= back) return true;
  }
  return false;
}

}  // namespace

Verdict Judge(const ScenarioResult& r, const VerdictOptions& o) {
  Verdict v;
  int chat_succeeded = 0;
  int comparable = 0;  // deterministic requests that completed: each may be compared with its reference
  std::vector<double> latencies;
  std::set<std::string> failed_services;  // besides chat
  for (const auto& q : r.requests) {
    ++v.sent;
    const bool unrelated = q.service != "chat";
    if (unrelated) ++v.unrelated_sent;
    if (q.acknowledged) ++v.acknowledged;
    // The outcome: the journal's when there is one, else what the client saw.
    const bool ok_client = q.http_status == 200 && q.connection_survived && q.first_error.empty();
    const bool completed = o.journal ? q.journal_state == "completed" && ok_client : ok_client;
    const bool terminal = o.journal ? IsTerminalState(q.journal_state) : q.http_status != 0 && q.connection_survived;
    if (completed) {
      ++v.succeeded;
      if (!unrelated) ++chat_succeeded;
      if (q.latency_ms >= 0) latencies.push_back(static_cast<double>(q.latency_ms));
    } else if (q.cancelled_by_client) {
      ++v.cancelled;
    } else if (q.journal_state == "cancelled") {
      // Not by its client: the client gave up (its 120 s), or a worker's
      // 499 ended it. It passed as a client's cancel: a request stuck in a
      // line until its client left was no failure.
      ++v.cancelled;
      if (!unrelated) {
        v.failures.push_back("cancelled, though its client did not cancel it: " + q.id +
                             (q.first_error.empty() ? "" : " (its client: " + q.first_error + ")"));
      }
    } else if (terminal) {
      ++v.failed_controlled;
      // Failed once it had run: the request was taken, an attempt ran, and
      // the gateway gave up on it (a failover that refused instead of moving
      // it ends so, and so does a 400 "exceeds the context" from a placement
      // admission should not have chosen: the harness sends only requests
      // some placement can serve). A refusal before any attempt (admission
      // said no, with its reason) is not a loss; a stream that ends
      // resumable with its checkpoint (a tool call delivered, the gateway
      // itself killed) is by design. (The other services' failures count
      // under their own rule, below.)
      // Resumable is by design only for a stream past a tool call its
      // client ran, or one the gateway's own restart cut; any other (a
      // continuation that never works, a non-streamed request) passed.
      if (!unrelated && o.journal && q.journal_state == "failed_resumable" &&
          (!q.stream || (q.tool_executions == 0 && q.journal_error.find("gateway restarted") == std::string::npos))) {
        v.failures.push_back("ended resumable, with no tool call delivered and no gateway restart: " + q.id +
                             (q.journal_error.empty() ? "" : " (" + q.journal_error.substr(0, 200) + ")"));
      }
      if (!unrelated && o.journal && q.journal_state == "failed" && q.attempts > 0) {
        ++v.failed_after_start;
        std::string where;
        for (const auto& p : q.attempt_placements) where += (where.empty() ? "" : ", ") + p;
        v.failures.push_back("failed after it started: " + q.id + " (" + std::to_string(q.attempts) + " attempt" +
                             (q.attempts == 1 ? "" : "s") + (where.empty() ? "" : " on " + where) + "; " +
                             (q.http_status ? "HTTP " + std::to_string(q.http_status) : std::string("no answer")) +
                             (q.first_error.empty() ? "" : ": " + q.first_error) + ")");
      }
    }
    // Completed in the journal, and its client got an error or a cut
    // stream, or nothing: the answer was not delivered. Only a request the
    // gateway's own kill cut (its connection gone with the process) is read
    // by id, its journaled completion standing; any other cut passed,
    // however its client fared.
    const bool cut_by_kill = GatewayKilledDuring(q, r);
    if (!unrelated && o.journal && q.journal_state == "completed" && !ok_client && !q.unreadable &&
        !q.cancelled_by_client && (q.connection_survived || !cut_by_kill)) {
      v.failures.push_back("completed in the journal, but its client got " +
                           (q.first_error.empty() ? "HTTP " + std::to_string(q.http_status) : q.first_error) + ": " + q.id);
    }
    // An unrelated job interrupted: it reached the gateway and did not complete
    // (one that never reached it, while the gateway itself was down, is an
    // unknown outcome, counted below).
    if (unrelated && !completed && (q.acknowledged || terminal)) {
      ++v.unrelated_failed;
      failed_services.insert(q.service);
    }
    // Accepted: acknowledged to its client, or journaled (a non-streamed
    // request is acknowledged only by its answer: one journaled and then cut
    // by a gateway's crash was accepted, and is lost if it never ends).
    const bool journaled = o.journal && !q.journal_state.empty();
    if ((q.acknowledged || journaled) && !terminal) {
      ++v.lost;
      v.failures.push_back("lost: " + q.id + " was " + (q.acknowledged ? "acknowledged" : "journaled") +
                           " and has no terminal result" + (q.journal_state.empty() ? "" : " (journal: " + q.journal_state + ")"));
    } else if (!q.acknowledged && !terminal) {
      ++v.unknown;
      // Its journal could not be asked, the gateway up at the end: lost or
      // never accepted, the proof cannot tell, so it does not pass.
      if (o.journal && q.journal_unanswered) {
        v.failures.push_back("outcome unknown: the gateway did not answer GET /v1/requests/" + q.id);
      } else if (o.journal && !unrelated && !q.cancelled_by_client && !cut_by_kill && q.http_status == 0) {
        // Neither answered at all nor journaled while the gateway was up (no
        // kill of it during the request): dropped before it was recorded. (A
        // refusal before the journal, without the id echoed, was answered.)
        v.failures.push_back("no answer and no journal record, the gateway up throughout: " + q.id +
                             (q.first_error.empty() ? "" : " (its client: " + q.first_error.substr(0, 200) + ")"));
      }
    }
    if (q.attempts > 1) {
      ++v.retried;
      // Exactly once: one terminal state under the same id, every attempt journaled.
      if (!IsTerminalState(q.journal_state) || static_cast<int>(q.attempt_placements.size()) != q.attempts) {
        ++v.retried_not_exactly_once;
        v.failures.push_back("retry not finished exactly once: " + q.id + " (" + std::to_string(q.attempts) +
                             " attempts, state " + q.journal_state + ")");
      }
    }
    if (q.unreadable) {
      v.failures.push_back("unreadable answer: " + q.id + " (" + q.first_error + ")");
    }
    if (q.tool_executions > 1) {
      ++v.duplicates;
      v.failures.push_back("duplicate side effect: the tool ran " + std::to_string(q.tool_executions) + " times for " + q.id);
    }
    if (q.deterministic && completed && !q.cancelled_by_client) ++comparable;
    if (!q.reference_error.empty()) {
      v.failures.push_back("not compared: " + q.id + "'s reference answer could not be had (" + q.reference_error + ")");
    }
    if (q.equivalent.has_value()) {
      ++v.deterministic_compared;
      if (*q.equivalent) ++v.deterministic_equal;
      else v.failures.push_back("not equivalent: " + q.id + " differs from the reference output");
    }
    // Served off its accelerator placement: told so. Services competing for one device: every service's requests.
    if (completed && (!unrelated || !o.pressure_ms.empty()) && !q.placement.empty() && q.placement != o.primary_placement) {
      ++v.degraded_served;
      if (q.degraded_signal) ++v.degraded_signalled;
      else v.failures.push_back("degraded without a signal: " + q.id + " was served by " + q.placement);
    }
  }
  if (!o.pressure_ms.empty()) JudgeCompeting(r, o, v);
  // Equivalence checked on nothing (every reference refused) proved nothing.
  if (o.journal && comparable > 0 && v.deterministic_compared == 0) {
    v.failures.push_back("none of its " + std::to_string(comparable) +
                         " deterministic answers could be compared: no reference answer was given");
  }
  // Nothing served proves nothing (a gateway that refused every request
  // before an attempt lost none).
  if (v.sent > v.unrelated_sent && chat_succeeded == 0) {
    v.failures.push_back("none of its " + std::to_string(v.sent - v.unrelated_sent) + " chat requests succeeded");
  }
  if (v.unrelated_failed > 0) {
    std::string names;
    for (const auto& n : failed_services) names += (names.empty() ? "" : ", ") + n;
    v.failures.push_back(std::to_string(v.unrelated_failed) + " of " + std::to_string(v.unrelated_sent) +
                         " requests on the other services (" + names + ") failed");
  }
  v.success_rate = v.sent ? static_cast<double>(v.succeeded) / v.sent : 0;
  v.p50_ms = Percentile(latencies, 50);
  v.p95_ms = Percentile(latencies, 95);
  v.goodput_per_min = r.duration_ms > 0 ? v.succeeded * 60000.0 / static_cast<double>(r.duration_ms) : 0;
  for (const auto& s : r.samples) {
    v.queue_age_max_ms = std::max(v.queue_age_max_ms, s.cpu_queue_oldest_ms);
    v.host_ram_peak_bytes = std::max(v.host_ram_peak_bytes, s.cpu_path_ram_bytes);
    v.host_ram_measured_peak_bytes = std::max(v.host_ram_measured_peak_bytes, s.cpu_path_rss_bytes);
    v.host_ram_budget_bytes = std::max(v.host_ram_budget_bytes, s.cpu_path_budget_bytes);
  }
  if (v.host_ram_budget_bytes > 0 && v.host_ram_peak_bytes > v.host_ram_budget_bytes) {
    v.failures.push_back("host RAM over budget: the CPU path held " + std::to_string(v.host_ram_peak_bytes >> 20) +
                         " MiB of a " + std::to_string(v.host_ram_budget_bytes >> 20) + " MiB budget");
  }
  // The accounting is the gateway's own: what its workers hold, read from
  // /proc, is held to the same budget.
  if (v.host_ram_budget_bytes > 0 && v.host_ram_measured_peak_bytes > v.host_ram_budget_bytes) {
    v.failures.push_back("host RAM over budget: the CPU path's workers held " +
                         std::to_string(v.host_ram_measured_peak_bytes >> 20) + " MiB (their RSS) of a " +
                         std::to_string(v.host_ram_budget_bytes >> 20) + " MiB budget");
  }
  // A scenario with faults that injected none of them (their targets were
  // never ready) tested nothing: it does not pass. Nor does one whose
  // injected faults were all armed and none went off (no request reached
  // them before the next fault or the end).
  const auto injected = std::count_if(r.faults.begin(), r.faults.end(), [](const FaultEvent& f) { return f.injected; });
  for (const FaultEvent& f : r.faults) {
    if (!f.injected || !f.fired.has_value()) continue;
    ++v.faults_armed;
    if (*f.fired) ++v.faults_fired;
  }
  if (!r.faults.empty() && injected == 0) {
    v.failures.push_back("none of its " + std::to_string(r.faults.size()) +
                         " faults was injected (their targets were never ready): it proved nothing");
  } else if (injected > 0 && v.faults_armed == injected && v.faults_fired == 0) {
    v.failures.push_back("none of its " + std::to_string(v.faults_armed) +
                         " armed faults went off (no request reached one before the next fault or the end): it "
                         "proved nothing");
  }
  std::vector<double> rec;
  for (const auto& f : r.faults) {
    // (An armed fault that never went off disrupted nothing to recover
    // from: its "0 ms" pulled the median down.)
    if (f.recovered_ms >= 0 && f.injected && f.fired.value_or(true)) {
      rec.push_back(static_cast<double>(f.recovered_ms - f.at_ms));
    }
  }
  v.recovery_median_ms = rec.empty() ? -1 : Percentile(rec, 50);
  v.recovery_max_ms = rec.empty() ? -1 : *std::max_element(rec.begin(), rec.end());
  v.gpu_restored = !r.samples.empty() && r.samples.back().primary_state == "ready" &&
                   r.samples.back().primary_breaker == "closed";
  if (o.expect_restored && !v.gpu_restored) {
    v.failures.push_back("the accelerator placement was not serving again at the end (" +
                         (r.samples.empty() ? std::string("no samples")
                                            : r.samples.back().primary_state + ", breaker " + r.samples.back().primary_breaker) +
                         ")");
  }
  v.passed = v.failures.empty();
  return v;
}

void MarkFired(std::vector<FaultEvent>& faults, const std::vector<Sample>& samples) {
  for (size_t i = 0; i < faults.size(); ++i) {
    FaultEvent& f = faults[i];
    if (!f.injected || f.fired_before < 0) continue;
    const int64_t next = i + 1 < faults.size() ? faults[i + 1].at_ms : INT64_MAX;
    bool fired = false;
    for (const Sample& s : samples) {
      if (s.t_ms < f.at_ms) continue;
      if (s.t_ms >= next) break;
      if (s.primary_state.empty() || s.primary_state == "gateway down") continue;  // nothing to tell
      if (s.primary_pid != f.worker_pid || s.primary_faults_fired > f.fired_before) {
        fired = true;
        break;
      }
    }
    f.fired = fired;
  }
}

}  // namespace spillway::chaos
