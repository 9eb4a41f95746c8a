#include "chaos/record.h"

// nlohmann/json 3.11.2 has no std::optional support: an empty one is null.
template <>
struct nlohmann::adl_serializer<std::optional<bool>> {
  static void to_json(json& j, const std::optional<bool>& v) { j = v ? json(*v) : json(nullptr); }
  static void from_json(const json& j, std::optional<bool>& v) {
    v = j.is_null() ? std::nullopt : std::optional<bool>(j.get<bool>());
  }
};

namespace spillway::chaos {

// The JSON keys are the field names.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(RequestRecord, id, scenario, service, kind, stream, deterministic, sent_ms,
                                   latency_ms, ttft_ms, acknowledged, http_status, first_error, connection_survived,
                                   degraded_signal, cancelled_by_client, placement, output, tool_executions, completion_tokens,
                                   journal_state, journal_error, journal_unanswered, attempts, attempt_placements, cpu_start_ms,
                                   decision, equivalent, unreadable)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(FaultEvent, at_ms, kind, recovered_ms, injected, worker_pid, fired_before, fired)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Sample, t_ms, device_used_bytes, device_capacity_bytes, rss_bytes,
                                   cpu_path_ram_bytes, cpu_path_budget_bytes, cpu_path_rss_bytes, primary_pid,
                                   primary_faults_fired, cpu_queue_waiting, cpu_queue_running,
                                   cpu_queue_oldest_ms, service_device_bytes, primary_breaker, primary_state)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ResidencyEvent, at_ms, kind, service, key, reason, for_service)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Stall, from_ms, to_ms)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Verdict, sent, acknowledged, succeeded, failed_controlled, cancelled, lost, unknown,
                                   failed_after_start,
                                   retried, retried_not_exactly_once, duplicates, deterministic_compared,
                                   deterministic_equal, degraded_served, degraded_signalled, unrelated_sent,
                                   unrelated_failed, success_rate, p50_ms, p95_ms, goodput_per_min, queue_age_max_ms,
                                   host_ram_peak_bytes, host_ram_budget_bytes, host_ram_measured_peak_bytes, faults_armed,
                                   faults_fired, recovery_median_ms, recovery_max_ms,
                                   gpu_restored, interactive_p95_alone_ms, interactive_p95_pressure_ms,
                                   interactive_ratio_lower, interactive_alone, interactive_pressure, interactive_in_stalls, interactive_in_stalls_pressure, evictions, evictions_completed, passed,
                                   failures)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ScenarioResult, name, description, target, seed, duration_ms, requests, faults,
                                   samples, events, stalls, verdict, skipped_reason)

nlohmann::json ToJson(const RequestRecord& r) { return r; }
nlohmann::json ToJson(const FaultEvent& f) { return f; }
nlohmann::json ToJson(const Sample& s) { return s; }
nlohmann::json ToJson(const ResidencyEvent& e) { return e; }
nlohmann::json ToJson(const Stall& s) { return s; }
nlohmann::json ToJson(const Verdict& v) { return v; }
nlohmann::json ToJson(const ScenarioResult& r) { return r; }

}  // namespace spillway::chaos
