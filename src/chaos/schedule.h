// The scenarios of `spillway chaos` and the seeded schedule of each run: a
// seed fixes every request (arrival, kind, streaming, prompt, seed, cancel)
// and every fault (time, kind), so a failing seed replays the same run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace spillway::chaos {

struct Scenario {
  std::string name, description;
  double requests_per_s = 3;
  int clients = 8;                  // requests in flight at most
  double stream_fraction = 0.5;     // each scenario runs with streaming off and on
  double long_prompt_fraction = 0;  // prompts beyond the accelerator's KV pool
  double agent_fraction = 0;        // chat requests that must call the harness's tool
  double embed_fraction = 0.15;     // traffic on the unrelated service
  double cancel_fraction = 0;       // cancelled by the client (DELETE) after 0.2-1 s
  int max_tokens_lo = 8, max_tokens_hi = 48;
  // Faults drawn (uniformly, by the seed) from these kinds; see harness.cpp.
  std::vector<std::string> fault_kinds;
  bool llama_server_can_run = false;  // the llama-server baseline can receive these faults
  // Several services competing for the accelerator (competing_services): the
  // traffic's span (the first 85 % of the run) is cut into 2 x batch_phases
  // equal slices, interactive traffic alone and under batch pressure in turn
  // (alone first), so that drift in the host's load over the run falls on
  // both sides of the comparison. In each pressure slice a backlog of batch
  // embeddings ("embed", priority batch) is worked through by batch_clients
  // clients, each sending its next request batch_think_ms after its last
  // answer (closed loop: how many get done is the batch goodput); a share of
  // the interactive requests goes to "search", an interactive on-demand
  // embedding service that must take the batch service's room. 0: not such
  // a scenario.
  int batch_phases = 0;
  int batch_clients = 0;
  int batch_think_ms = 0;
  double search_fraction = 0;
  bool Competing() const { return batch_phases > 0; }
};

// The seeds' list: short prompts, long prompts, concurrency, another GPU
// workload, memory reduced step by step, routing before admission,
// allocation failure before generation, driver reset (device lost, kill -9),
// hung worker, cancellation in the CPU queue, unrelated traffic, agent tool
// calls, gateway kill -9 and restart; and services competing for one
// accelerator (chat pinned, batch embeddings, an on-demand interactive
// service that evicts the batch one).
const std::vector<Scenario>& AllScenarios();
const Scenario* FindScenario(const std::string& name);

struct PlannedRequest {
  int64_t at_ms = 0;
  std::string id;
  std::string kind;         // completion | chat | agent | embedding | search (embedding, interactive)
  bool stream = false;
  bool long_prompt = false;
  int max_tokens = 16;
  uint32_t seed = 0;        // sampling seed (every generation is seeded: outputs are comparable)
  int prompt_words = 4;
  int64_t cancel_after_ms = -1;  // -1: not cancelled
};

struct PlannedFault {
  int64_t at_ms = 0;
  std::string kind;
};

struct Schedule {
  std::vector<PlannedRequest> requests;  // by at_ms
  std::vector<PlannedFault> faults;      // by at_ms
};

// `faults`: how many to inject in this scenario (spread over 10%..75% of
// the duration, at least 300 ms apart when they fit).
Schedule MakeSchedule(const Scenario& s, uint64_t seed, int64_t duration_ms, int faults);

// A competing scenario's pressure slices, [from, to) in ms since the start;
// empty for other scenarios.
struct Window {
  int64_t from_ms = 0, to_ms = 0;
};
std::vector<Window> PressureWindows(const Scenario& s, int64_t duration_ms);

// The n-th request of a competing scenario's batch backlog (deterministic in
// the seed and n; sent when a batch client is free, not at a planned time).
PlannedRequest BatchRequest(const Scenario& s, uint64_t seed, int n);

// A prompt of `words` words, deterministic in (seed, index).
std::string PromptText(uint64_t seed, int words);

}  // namespace spillway::chaos
