// What `spillway chaos` records: one RequestRecord per request it sent, time
// series sampled while a scenario ran, the faults it injected, and the
// per-scenario verdict computed from them (chaos/verdict.h).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace spillway::chaos {

struct RequestRecord {
  std::string id;               // X-Request-Id the harness chose
  std::string scenario;
  std::string service;          // "chat" or the unrelated "embed"
  std::string kind;             // "completion" | "chat" | "agent" | "embedding"
  bool stream = false;
  bool deterministic = false;   // seeded: output must equal the reference
  int64_t sent_ms = 0;          // since the scenario's start
  int64_t latency_ms = -1;      // to the last byte (-1: never ended)
  int64_t ttft_ms = -1;         // streams: to the first token
  bool acknowledged = false;    // the gateway answered with the request id (head or body)
  int http_status = 0;          // 0: no response at all
  std::string first_error;      // transport error or error message, "" when none
  bool unreadable = false;      // an answer the harness could not read (a 200 of another shape): a failure
  bool connection_survived = false;  // the response arrived whole ([DONE] for streams)
  bool degraded_signal = false; // X-Spillway-Degraded / fallback headers or an SSE comment
  bool cancelled_by_client = false;
  std::string placement;        // X-Spillway-Placement (or the journal's)
  std::string output;           // final text (or tool calls, as JSON text)
  int tool_executions = 0;      // times the harness ran a tool for this request
  int completion_tokens = -1;   // from the answer's usage (-1: none)
  // From GET /v1/requests/{id} after the scenario settled.
  std::string journal_state;    // "" when the gateway does not know it
  std::string journal_error;    // its journaled error, "" when none
  bool journal_unanswered = false;  // the gateway did not answer GET /v1/requests/{id} at all
  int attempts = 0;
  std::vector<std::string> attempt_placements;
  int64_t cpu_start_ms = -1;    // when an attempt on the CPU started (since the scenario's start)
  std::string decision;         // admission decision kind
  std::optional<bool> equivalent;  // deterministic and completed: same text as the reference
  std::string reference_error;  // chosen for comparison, and its reference could not be had (why)
};

struct FaultEvent {
  int64_t at_ms = 0;            // since the scenario's start
  std::string kind;             // "compute-error", "kill -9 gpu worker", "sim hold 200 MiB", ...
  int64_t recovered_ms = -1;    // primary ready, breaker closed and serving again (-1: not seen)
  int64_t back_ms = -1;         // a kill of the server itself: when its restart returned (-1: not one)
  // False when it could not be injected (its worker was not ready to arm it,
  // no process to kill): not counted as injected, and a scenario none of
  // whose faults was injected fails (it proved nothing).
  bool injected = true;
  // An armed fault (one the GPU worker's fault route arms, to go off when a
  // request reaches it): that worker's pid and its count of faults fired just
  // before the arming (-1: not armed, a kill or a hold that acts at once).
  int worker_pid = 0;
  int64_t fired_before = -1;
  // Whether an armed fault went off before the next fault (MarkFired): its
  // worker counted it, or was replaced meanwhile. nullopt: not armed.
  std::optional<bool> fired = std::nullopt;
};

// A residency decision the gateway journaled (/v1/status residency.events).
struct ResidencyEvent {
  int64_t at_ms = 0;            // since the scenario's start
  std::string kind;             // evict | unload | room_refused
  std::string service, key, reason;
  std::string for_service;      // evict: who the room was for
};

// One sample of the system, every ~200 ms.
struct Sample {
  int64_t t_ms = 0;
  uint64_t device_used_bytes = 0;     // the simulated device (all holders)
  uint64_t device_capacity_bytes = 0;
  std::map<std::string, uint64_t> rss_bytes;  // per worker key ("chat.0", "chat.1", "embed.0")
  uint64_t cpu_path_ram_bytes = 0;    // the gateway's accounting (resident + running)
  uint64_t cpu_path_budget_bytes = 0;
  uint64_t cpu_path_rss_bytes = 0;    // measured: VmRSS of the service's CPU placements' workers
  // The accelerator placement's worker and its count of faults fired
  // (GET /v1/worker/info; -1: not read, 0 pid: none running).
  int primary_pid = 0;
  int64_t primary_faults_fired = -1;
  int cpu_queue_waiting = 0, cpu_queue_running = 0;
  int64_t cpu_queue_oldest_ms = 0;
  // What each service's processes hold on the device (competing_services; /v1/status devices[].services).
  std::map<std::string, uint64_t> service_device_bytes;
  std::string primary_breaker;        // closed | open | half_open
  std::string primary_state;          // ready | starting | backoff | stopped
};

// The host did not run the harness for a while: its own 10 ms timer woke at
// least kStallMs late. Its usual cause is the virtual machine not being run
// (steal) or memory being swapped, which freeze every process alike; but an
// overloaded host can cause it too, so a run where more than one request in
// ten of either side overlaps a stall is judged inconclusive.
struct Stall {
  int64_t from_ms = 0, to_ms = 0;
};
inline constexpr int64_t kStallMs = 150;

struct Verdict {
  int sent = 0, acknowledged = 0, succeeded = 0, failed_controlled = 0, cancelled = 0;
  int lost = 0;                 // accepted (acknowledged or journaled), no terminal result
  int unknown = 0;              // neither acknowledged nor journaled, no terminal result
  int failed_after_start = 0;   // of failed_controlled: journaled failed after an attempt ran (not a refusal before any)
  int retried = 0;              // attempts > 1
  int retried_not_exactly_once = 0;
  int duplicates = 0;           // requests whose tool ran more than once
  int deterministic_compared = 0, deterministic_equal = 0;
  int degraded_served = 0, degraded_signalled = 0;  // served by a non-primary placement / and told so
  int unrelated_sent = 0, unrelated_failed = 0;
  double success_rate = 0;      // succeeded / sent
  double p50_ms = 0, p95_ms = 0;
  double goodput_per_min = 0;   // succeeded per minute of scenario time
  int64_t queue_age_max_ms = 0;
  uint64_t host_ram_peak_bytes = 0, host_ram_budget_bytes = 0;  // the gateway's accounting
  uint64_t host_ram_measured_peak_bytes = 0;  // the CPU path's workers' RSS summed, at its highest
  int faults_armed = 0, faults_fired = 0;     // armed through the worker / seen to go off
  double recovery_median_ms = -1, recovery_max_ms = -1;
  bool gpu_restored = false;
  // competing_services: the interactive (chat) service's p95 before the batch
  // traffic started and while it ran, and how many requests each stands for;
  // evictions journaled, and of them those whose service then unloaded.
  double interactive_p95_alone_ms = -1, interactive_p95_pressure_ms = -1;
  double interactive_ratio_lower = -1;  // the p95 ratio's lower bound (PercentileRatioLowerBound)
  int interactive_alone = 0, interactive_pressure = 0;
  int interactive_in_stalls = 0, interactive_in_stalls_pressure = 0;  // left out (alone / under pressure): in a stall
  int evictions = 0, evictions_completed = 0;
  bool passed = false;
  std::vector<std::string> failures;  // why it did not pass, one line each
};

struct ScenarioResult {
  std::string name, description, target;  // target: "spillway" | "plain-proxy" | "llama-server" | profile name
  uint64_t seed = 0;
  int64_t duration_ms = 0;
  std::vector<RequestRecord> requests;
  std::vector<FaultEvent> faults;
  std::vector<Sample> samples;
  std::vector<ResidencyEvent> events;  // competing_services
  std::vector<Stall> stalls;
  Verdict verdict;
  std::string skipped_reason;   // set when this target cannot express the scenario (reported, never silent)
};

nlohmann::json ToJson(const RequestRecord& r);
nlohmann::json ToJson(const FaultEvent& f);
nlohmann::json ToJson(const Sample& s);
nlohmann::json ToJson(const ResidencyEvent& e);
nlohmann::json ToJson(const Stall& s);
nlohmann::json ToJson(const Verdict& v);
nlohmann::json ToJson(const ScenarioResult& r);

}  // namespace spillway::chaos
