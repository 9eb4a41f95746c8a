// The gateway <-> worker protocol: one header used by both binaries.
//
// Versioned: a worker reports kWorkerProtocolVersion in GET /v1/worker/info;
// the gateway refuses a worker of another version with a clear start-up
// error rather than misread it.
//
// Routes (all need the worker secret as a bearer token):
//   POST   /v1/chat/completions, /v1/completions, /v1/embeddings   generation (OpenAI bodies;
//          `spillway_resume` continues a cut stream), X-Request-Id carries the request id
//   POST   /v1/worker/tokenize?endpoint=chat|completion            prompt size -> TokenizeReply
//   DELETE /v1/worker/requests/{id}                                 cancel
//   DELETE /v1/worker/requests                                      cancel all (an adopting gateway)
//   GET    /health                                                  HealthReport
//   GET    /v1/worker/info                                          WorkerInfo (JSON)
//   POST   /v1/worker/faults                                        fault injection (tests)
//   POST   /apply-template                                          {"prompt", "tokens"} of a chat body
//
// Errors are `{"error": {"message", "type", "code", "phase"?, "status"?}}`
// (api::ErrorBody): "code" is the status code's name, or a reason that refines
// it (Status::reason) with the name in "status"; in a body or as a stream's
// last SSE event; WorkerError is their typed form.
// The gateway reads worker answers only through this header, never by
// searching a body for a substring.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace spillway::protocol {

// Bump on any change a worker of the previous version would misread.
inline constexpr int kWorkerProtocolVersion = 1;

inline constexpr std::string_view kHealthPath = "/health";
inline constexpr std::string_view kInfoPath = "/v1/worker/info";
inline constexpr std::string_view kTokenizePath = "/v1/worker/tokenize";
inline constexpr std::string_view kCancelPrefix = "/v1/worker/requests/";
inline constexpr std::string_view kCancelAllPath = "/v1/worker/requests";
inline constexpr std::string_view kFaultsPath = "/v1/worker/faults";
// llama-server's route, for parity checks: a chat body's rendered prompt and tokens.
inline constexpr std::string_view kApplyTemplatePath = "/apply-template";

// The path of a generation endpoint ("chat" | "completion" | "embedding").
std::string GenerationPath(std::string_view endpoint);

// What GET /health says.
enum class Health {
  kOk,          // serving
  kDeviceLost,  // its accelerator is gone: replace the worker now
  kStalled,     // a decode loop made no progress for longer than its progress timeout: replace it now
  kError,       // unhealthy for another reason (the supervisor replaces it after 3 in a row)
};
const char* HealthName(Health h);
// The supervisor's reason when it replaced a worker whose health said
// replace_now() (its device is lost or its decode loop stalled): the device
// is suspect for every placement on it.
inline constexpr std::string_view kExitDeviceLost = "device lost or stalled";

struct HealthReport {
  Health state = Health::kError;
  int64_t stalled_ms = 0;
  std::string error;
  // A worker that cannot recover in place (device lost, stalled).
  bool replace_now() const { return state == Health::kDeviceLost || state == Health::kStalled; }
  nlohmann::json ToJson() const;
  // From an answer of GET /health (any status); a body that is not a report is kError.
  static HealthReport FromBody(std::string_view body);
};

// A worker's error answer, typed.
struct WorkerError {
  int http_status = 0;
  StatusCode code = StatusCode::kInternal;
  FailurePhase phase = FailurePhase::kNone;
  std::string message;
  std::string reason;  // Status::reason ("context_length_exceeded"), empty for none

  // Every slot or KV cell is taken right now: wait and send again (no attempt is spent).
  bool busy() const { return code == StatusCode::kResourceExhausted && phase == FailurePhase::kNone; }
  // An allocation failure or a lost device: this placement cannot run it; another may.
  bool placement_failure() const { return phase != FailurePhase::kNone; }
  bool cancelled() const { return code == StatusCode::kCancelled; }
  Status ToStatus() const;
};

// From a worker's answer: nullopt for a 2xx, otherwise the typed error (a
// body that is not an error object becomes kInternal with the body as its
// message; a 500 without a phase is a compute failure, as the worker's own
// crash in compute reports it).
std::optional<WorkerError> ParseWorkerError(int http_status, std::string_view body);
// From one SSE event's payload (the JSON after "data: "): the error it carries, if any.
std::optional<WorkerError> ParseStreamError(const nlohmann::json& payload);

// The worker's measured timings of one request (`spillway.timings`).
struct Timings {
  double prompt_ms = 0, generation_ms = 0;
  double prompt_tokens = 0, generated_tokens = 0;
  // Of prompt_tokens, those the worker found in its cache (a slot's earlier
  // request): prompt_ms is the rest's time. 0 from a worker that says none.
  double cached_tokens = 0;
  // The prompt tokens prompt_ms was spent on.
  double computed_prompt_tokens() const { return prompt_tokens > cached_tokens ? prompt_tokens - cached_tokens : 0; }
  static std::optional<Timings> FromJson(const nlohmann::json& j);
  nlohmann::json ToJson() const;
  // The same in a header of a non-streamed answer (kTimingsHeader,
  // "prompt_ms=1.9;generation_ms=0.4;prompt_tokens=2;generated_tokens=1"):
  // the gateway reads them there without parsing the answer's body, which
  // cost more than the rest of its work on a short request.
  std::string ToHeader() const;
  static std::optional<Timings> FromHeader(std::string_view value);
};
inline constexpr std::string_view kTimingsHeader = "X-Spillway-Timings";
// An embeddings answer's count of inputs cut to what the model takes (its
// request's "truncate"); absent when none was. Passed on to the client.
inline constexpr std::string_view kTruncatedInputsHeader = "X-Spillway-Truncated-Inputs";
// How many of a chat's oldest messages the worker left out to fit its context
// (a request with "truncate": true; 0 when none was); absent without it.
inline constexpr std::string_view kDroppedMessagesHeader = "X-Spillway-Dropped-Messages";
// The timings in a finished answer: a JSON body's `spillway.timings`, or the
// last stream event that carries them.
std::optional<Timings> TimingsOf(std::string_view body);

struct TokenizeReply {
  int prompt_tokens = 0;
  int ctx = 0;
  int default_max_tokens = 0;
  int dropped_messages = 0;  // a chat with "truncate": its oldest messages left out to fit (what prompt_tokens counts)
  // Of prompt_tokens, those a run sent now would find in the cache of the
  // slot it would take (prefix reuse; an estimate: another may take it first).
  int cached_tokens = 0;
  static std::optional<TokenizeReply> FromJson(const nlohmann::json& j);
  nlohmann::json ToJson() const;
};

// The fields of GET /v1/worker/info that the gateway reads. FromJson never
// throws: a field of the wrong type (another build, a damaged answer) reads
// as absent, so a status page or an adoption never fails on one.
struct WorkerInfo {
  int protocol_version = 0;
  int64_t pid = 0;  // the answering process (an adopting gateway checks its record's)
  nlohmann::json fingerprint;
  std::string fingerprint_id;  // fingerprint.id
  nlohmann::json placement;
  bool context_created = true;
  std::optional<double> last_context_ms;  // how long its last context took to create
  // What llama.cpp allocated, per buffer (memory.buffers), and memory as the worker said it (shown as is).
  struct Buffer {
    std::string name;  // the buffer type's ("CPU", "CUDA0", ...)
    uint64_t total = 0;
    bool host = false;  // in host memory (IsHostBuffer)
  };
  std::vector<Buffer> buffers;
  nlohmann::json memory;
  struct Slots {
    int total = 0, busy = 0, queued = 0;
  };
  std::optional<Slots> slots;
  // Prompt prefixes kept in its slots' caches: {"on", "reused_prompt_tokens"}
  // as the worker says it (null from a worker that does not).
  nlohmann::json prefix_reuse;
  // Chat renderings kept for the run after a count: {"kept", "bytes", "hits",
  // "misses"} (null from a worker of a build without them; zeros with
  // --rendered-prompts 0).
  nlohmann::json rendered_prompts;
  // Prompts tokenized on from an earlier one's tokens (worker/prompt_tokens.h):
  // {"on", "kept", "bytes", "continued", "whole", "repeated", "reused_tokens"}
  // (null from a worker of a build without them).
  nlohmann::json prompt_tokens;
  static std::optional<WorkerInfo> FromJson(const nlohmann::json& j);
};
// Whether a buffer of the worker's memory breakdown (its info's
// memory.buffers, its dry run's buffers) is in host memory: its "host" flag
// (a host buffer type by llama.cpp's ggml_backend_buft_is_host, as CPU,
// CPU_Mapped and CUDA_Host's pinned memory, which is the host's RAM, not the
// GPU's; or one of the CPU device's own, as CPU_REPACK); from a worker that
// does not say, a name starting with "CPU".
inline bool IsHostBuffer(const nlohmann::json& b) {
  if (!b.is_object()) return false;
  if (auto h = b.find("host"); h != b.end() && h->is_boolean()) return h->get<bool>();
  auto n = b.find("name");
  return n != b.end() && n->is_string() && n->get_ref<const std::string&>().rfind("CPU", 0) == 0;
}

// Ok when a worker speaking `info` can serve this gateway; otherwise why not.
Status CheckCompatible(const WorkerInfo& info);

std::optional<StatusCode> ParseStatusCode(std::string_view name);
std::optional<FailurePhase> ParseFailurePhase(std::string_view name);

}  // namespace spillway::protocol
