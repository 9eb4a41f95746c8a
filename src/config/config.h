// The gateway's configuration (TOML). Errors name the file, line and key, and
// the gateway refuses to start on any of them rather than guess.
//
//   listen = "127.0.0.1:8480"           # default
//   state_dir = "/var/lib/spillway"      # journal, worker logs
//   api_keys = ["sk-local-1"]            # plus $SPILLWAY_API_KEYS (comma-separated)
//   allow_unauthenticated_remote = false # binding beyond loopback needs keys unless true
//   allowed_hosts = ["localhost", "127.0.0.1", "[::1]"]   # Host header allow-list (port ignored)
//   allowed_origins = []                 # Origin allow-list for browsers (empty: none)
//   operator_keys = []                   # may see and cancel every key's requests (plus $SPILLWAY_OPERATOR_KEYS)
//   max_body_bytes = 8388608
//   max_body_memory_bytes = 33554432     # request bodies held at once, all clients
//   json_max_depth = 64
//   max_queue = 256                      # accepted requests waiting for a worker
//   max_requests_per_key = 64            # in flight per API key (per client address without keys)
//   max_connections = 1024
//   io_threads = 2
//   shutdown_grace_s = 10                # on SIGTERM: how long running requests may finish (0: stop at once)
//   model_dirs = ["/models"]             # listed by `spillway models --config` (with Ollama's store)
//   ollama_models = "/usr/share/ollama/.ollama/models"  # Ollama's store for "ollama:" models (default:
//                                        # $OLLAMA_MODELS, else ~/.ollama/models of the gateway's user)
//   [journal]
//   synchronous = "full"                 # or "normal"
//   retention_hours = 168
//   idempotency_hours = 24
//   [[device]]
//   name = "sim:0"
//   headroom_mib = 0                     # kept free: the larger of this and headroom_pct of the device
//   headroom_pct = 5
//   exclusive = false                    # one service at a time on it (llama-swap's swap groups)
//   [[service]]
//   name = "chat"
//   kind = "llama"                       # the default: a GGUF model Spillway's workers load ("external": below)
//   model = "/models/chat.gguf"          # or "ollama:NAME[:TAG]": a model in Ollama's store (ollama_models,
//                                        # else $OLLAMA_MODELS, else ~/.ollama/models), read-only (models/ollama_store.h)
//   max_tokens = 4096                    # cap per request
//   default_max_tokens = 256
//   max_queue = 0                        # its own bound on waiting requests (0: the gateway's max_queue only)
//   residency = "pinned"                 # of its accelerator placements: pinned | keep_alive | on_demand
//   keep_alive_s = 300                   # keep_alive / on_demand: unloaded after this long idle (0: when room is needed)
//   priority = "interactive"             # interactive | batch | background (who gives way on the accelerator)
//   evict_cost = 12.5                    # optional; else measured reload seconds x requests per minute
//   fair_turn_s = 30                     # busy, it gives way to a waiting service of its priority after this long (0: never)
//   # For a batch or background service only (refused beside priority = "interactive"):
//   # windows = ["02:00-05:00"]          # on the accelerator only then (local time)
//   # interactive_idle_s = 0             # ... and/or once interactive services were idle this long
//   # outside_window = "cpu"             # cpu (its CPU placements serve) | wait
//   [service.admission]
//   enabled = true                       # false: a plain proxy (no memory checks)
//   reroute_on_pressure = true
//   fail_fast = false
//   allow_shrink = false
//   max_delay_s = 30
//   pressure = 0.9                       # a KV pool fuller than this: another placement is preferred
//   [service.failover]
//   breaker_failures = 3
//   ejection_s = 30
//   max_ejection_s = 300
//   probe_hold_s = 5                     # a half-open breaker's probe holds it this long without a result
//   readiness = "warm"                   # warm | mmap | on-demand | auto (of the CPU fallback)
//   recovery_budget_s = 5                # auto: the lightest policy ready within this
//   idle_unload_s = 600                  # mmap / on-demand: give the RAM back after this idle time
//   [service.cpu_path]                   # requests on the CPU fallback
//   max_queue = 16
//   concurrency = 1
//   max_prompt_tokens = 0                # 0: the placement's ctx
//   max_tokens = 0                       # 0: the service's max_tokens
//   ram_budget_mib = 0                   # 0: half of the host's memory
//   host_headroom_mib = 512
//   wait_comment_s = 2
//   [[service.placement]]
//   role = "primary"                     # primary | hybrid | fallback
//   device = "cpu"                       # cpu | cuda:N | sim:N
//   model = ""                           # another file than the service's (a replica, or a smaller model:
//   different_model = false              # ... then declared, and announced to clients)
//   gpu_layers = 0
//   ctx = 4096
//   slots = 4
//   batch = 512
//   kv_unified = false
//   prefix_reuse = true                  # a request starts from what its slot's cache holds of its prompt
//   threads = 0                          # CPU threads of its worker (0: one per core)
//   mmap = true                          # false: weights read into memory, not mapped
//   progress_timeout_s = 10              # a decode loop without progress this long is hung
//   start_timeout_s = 120                # not ready by then, nor loading more since: killed (a failed start)
//
//   [[service]]                          # an external upstream (external.h): any HTTP server
//   name = "whisper"
//   kind = "external"
//   command = "whisper-server --port ${PORT} -m ${MODEL}"   # started by Spillway, or:
//   url = "http://127.0.0.1:9000"        # one that already runs (loopback only)
//   model = "/models/ggml-base.bin"      # ${MODEL}
//   routes = { "/v1/audio/transcriptions" = "/inference" }  # gateway path = upstream path
//   device = "cuda:0"                    # where its memory lives (accounted there)
//   resident_mib = 600                   # declared until measured
//   transient_mib = 200                  # per request, checked before it is sent
//   residency = "pinned"                 # pinned | keep_alive | on_demand (command only)
//   keep_alive_s = 300
//   idempotent = false                   # true: a request it failed may be sent again
//   concurrency = 4                      # requests at once; more wait in its queue
//   max_queue = 64
//   health_path = "/health"
//   stop_signal = "SIGTERM"
//   start_timeout_s = 120
//   request_timeout_s = 600              # the longest it may go without sending a byte
//   # priority, evict_cost, fair_turn_s, windows, interactive_idle_s, outside_window: as for a llama service
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "api/json_limits.h"
#include "common/names.h"
#include "common/status.h"

namespace spillway::config {

struct PlacementConfig {
  std::string role;  // "primary" (the first by default), "hybrid" (planned partial offload) or "fallback"
  std::string model;             // empty: the service's model file
  std::string model_name;        // as configured ("ollama:NAME:TAG" resolves to `model`, its blob); "" when unset
  bool different_model = false;  // declared: a different (e.g. smaller) model, announced to clients
  std::string device = "cpu";
  int gpu_layers = 0;
  int ctx = 4096;
  int slots = 4;
  int threads = 0;
  int batch = 512;
  bool mmap = true;
  // false: each slot has its own ctx/slots KV cells and decoding is
  // batch-invariant (failover replays reproduce tokens exactly); true: one
  // pool of ctx cells shared by the slots (longer single prompts fit, but a
  // request's tokens may depend on what runs beside it).
  bool kv_unified = false;
  // A request starts from what its slot's cache holds of its prompt (a
  // chat's earlier turns): exact, since decoding is batch-invariant. Off:
  // every prompt computed whole, and no request answers sooner because
  // another's prompt began as its own (who can time requests cannot tell).
  // Never with kv_unified (the worker's --no-prefix-reuse).
  bool prefix_reuse = true;
  double progress_timeout_s = 10;  // a decode loop without progress this long is hung
  // A worker not ready this long after it was started is killed and its start
  // counted as failed; a request waiting for it waits no longer than this.
  double start_timeout_s = 120;
  std::string Name() const;  // "cpu", "sim:0/99", ...
  // The context one request may hold: its slot's share of the pool, or the
  // whole pool when the slots share it (kv_unified).
  int ContextPerRequest() const { return kv_unified ? ctx : ctx / std::max(1, slots); }
  const std::string& ModelOr(const std::string& service_model) const { return model.empty() ? service_model : model; }
};

struct AdmissionConfig {
  // false: no memory checks at all, neither before a worker starts nor per
  // request (a plain proxy; `spillway chaos` uses it as the baseline).
  bool enabled = true;
  bool reroute_on_pressure = true;
  bool fail_fast = false;     // "GPU or error": never leave the primary placement
  bool allow_shrink = false;  // lower max_tokens to what fits (said in the answer)
  double max_delay_s = 30;
  double pressure = 0.9;      // pool utilisation above which another placement is preferred
};

struct FailoverConfig {
  int breaker_failures = 3;     // consecutive failures that open a placement's breaker
  double ejection_s = 30;       // x times ejected ...
  double max_ejection_s = 300;  // ... capped (Envoy's defaults)
  // A half-open breaker lets one request probe it; the next requests go
  // elsewhere (or wait) until its answer or first streamed event, or this
  // long without one (then the next request probes too). At most 60 s, the
  // longest a request waits in its line for a slot. A device's breaker takes
  // this (as its ejection) from the first service with a placement on it.
  double probe_hold_s = 5;
  // How the CPU fallback replica is kept ready: "warm" (loaded at start),
  // "mmap" (weights mapped at start, context created on the first request,
  // freed after idle_unload_s), "on-demand" (process started on the first
  // request, stopped after idle_unload_s) or "auto": the lightest one whose
  // expected readiness time fits recovery_budget_s.
  std::string readiness = "warm";
  double recovery_budget_s = 5;
  double idle_unload_s = 600;
};

// The CPU path: requests on fallback placements on the host ("cpu") wait in
// a line of their own, with their own limits and a host-RAM budget.
struct CpuPathConfig {
  int max_queue = 16;           // waiting requests; more get 503 + Retry-After
  int concurrency = 1;          // running at once on the CPU path
  int max_prompt_tokens = 0;    // 0: the placement's context
  int max_tokens = 0;           // cap on the CPU path (0: the service's); lowered requests are told
  double ram_budget_mib = 0;    // the CPU path's host RAM (replicas + requests); 0: half of the host's memory
  double host_headroom_mib = 512;  // the host's observed available memory must stay above this
  double wait_comment_s = 2;    // SSE comment period while a stream waits in the line
  // wait_comment_s in milliseconds, at least 1: what the waits and the comments both count in.
  int64_t wait_comment_ms() const { return std::max<int64_t>(1, static_cast<int64_t>(wait_comment_s * 1000)); }
};

// How a service holds its accelerator memory, and how much it matters
// against the others there (admission/eviction.h decides who gives room).
// The same keys for llama services (their accelerator placements) and
// external services Spillway starts.
struct ResidencyConfig {
  // pinned: loaded at start and never unloaded; keep_alive: loaded at start,
  // unloaded after keep_alive_s idle; on_demand: loaded by its first request,
  // unloaded after keep_alive_s idle (0: only when its room is needed).
  std::string mode = "pinned";
  double keep_alive_s = 300;
  std::string priority = "interactive";  // interactive | batch | background
  // Busy on a device that cannot hold it beside another service of its
  // priority whose requests wait: it gives way once it has served this long
  // and their requests have waited as long (0: never; admission/eviction.h).
  double fair_turn_s = 30;
  double evict_cost = -1;                // declared cost of unloading it (< 0: measured reload time x request rate)
  // batch/background: on the accelerator only inside these local-time windows
  // ("02:00-05:00"; empty: always) and/or once interactive services have been
  // idle this long (0: no such rule); outside, requests take the CPU path
  // (outside_window = "cpu") or wait ("wait").
  std::vector<std::string> windows;
  double interactive_idle_s = 0;
  std::string outside_window = "cpu";
  int PriorityRank() const { return priority == "interactive" ? 0 : priority == "batch" ? 1 : 2; }
  int64_t FairTurnMs() const { return static_cast<int64_t>(fair_turn_s * 1000); }
  // The niceness of its processes: batch 10, background 19 (they yield the host's cores to interactive work).
  int Niceness() const { return PriorityRank() == 0 ? 0 : PriorityRank() == 1 ? 10 : 19; }
};

struct DeviceConfig {
  std::string name;           // cpu | cuda:N | sim:N
  double headroom_mib = 0;
  double headroom_pct = 5;
  // One service at a time on this device (llama-swap's swap groups): loading one unloads every other
  // that is not pinned, whatever its priority, busy ones once their running requests end; loads take
  // turns in the order they asked, and one still loading or just loaded serves its waiting requests first
  // (admission/eviction.h).
  bool exclusive = false;
};

struct ServiceConfig {
  std::string name;
  std::string model;       // the GGUF file
  std::string model_name;  // as configured: the path, or "ollama:NAME:TAG" (resolved read-only to `model`, its blob)
  int max_tokens = 4096;
  int default_max_tokens = 256;
  int max_queue = 0;  // its requests waiting at once (0: only the gateway's max_queue bounds them)
  AdmissionConfig admission;
  FailoverConfig failover;
  CpuPathConfig cpu_path;
  std::vector<PlacementConfig> placements;  // [0] is the primary
  ResidencyConfig residency;                 // of its accelerator placements
  // Whether placement `i` belongs to the CPU path (a fallback on the host).
  // How placement `i`'s model is named to clients: an ollama: name as
  // configured, else the file's stem.
  std::string ModelLabel(size_t i) const;
  // The model file placement `i` serves: its own when declared a different
  // model, else the service's (a copy of another file refuses to start).
  const std::string& ModelOf(size_t i) const {
    return placements[i].different_model ? placements[i].ModelOr(model) : model;
  }
  // Whether placement `i` may serve a request bound to `only_model` (a cut
  // stream goes on only with the model that began it; empty: any model).
  bool Serves(size_t i, const std::string& only_model) const { return only_model.empty() || ModelOf(i) == only_model; }
  bool OnCpuPath(size_t i) const { return i > 0 && placements[i].role == "fallback" && placements[i].device == "cpu"; }
};

// A service Spillway proxies to without knowing its model: an HTTP server it
// starts itself (`command`) or one already running at a loopback `url`.
// Bodies go through untouched (multipart included); requests are journaled,
// counted, cancellable and queued per service like any other.
struct ExternalConfig {
  std::string name;
  std::string url;                   // "http://127.0.0.1:PORT": already running, not started by Spillway
  std::vector<std::string> command;  // argv, ${PORT} and ${MODEL} expanded when started
  std::string model;                 // ${MODEL}, and what /v1/models says of it
  std::vector<std::pair<std::string, std::string>> routes;  // gateway path -> upstream path
  std::string device = "cpu";        // where its memory lives
  double resident_mib = 0;           // declared resident device memory (replaced once measured)
  double transient_mib = 0;          // declared per-request peak on the device
  ResidencyConfig residency;         // mode: a command only
  bool idempotent = false;           // a request that reached it may be sent again after a failure
  int concurrency = 4;
  int max_queue = 64;
  std::string health_path = "/health";
  std::string stop_signal = "SIGTERM";
  double start_timeout_s = 120;
  double request_timeout_s = 600;
  // The upstream path for a gateway path; "" when this service does not serve it.
  std::string UpstreamPath(const std::string& gateway_path) const;
  bool Started() const { return !command.empty(); }  // Spillway runs it (else `url`)
  uint16_t UrlPort() const;                          // of `url` (0 when started by Spillway)
};

// The routes an external service may serve.
const std::vector<std::string>& ExternalRoutes();
// SIGTERM, SIGINT, ... -> its number; 0 for any other name.
int SignalNumber(const std::string& name);

struct JournalConfig {
  bool synchronous_full = true;
  double retention_hours = 168;
  double idempotency_hours = 24;
};

struct GatewayConfig {
  std::string source = "(built-in demo)";
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 8480;
  std::string state_dir;
  // spillway-worker as serve (or doctor) found it, not read from the file:
  // its dry run plans the models whose metadata cannot size them
  // (memory/exact_plan.h). Empty: such models have no estimate.
  std::string worker_binary;
  std::vector<std::string> api_keys;
  bool allow_unauthenticated_remote = false;
  std::vector<std::string> allowed_hosts = {"localhost", "127.0.0.1", "[::1]"};
  std::vector<std::string> allowed_origins;
  size_t max_body_bytes = 8 << 20;
  // The largest body a worker takes: what the gateway forwards of a body it
  // accepted. An Ollama body is translated (tool-call arguments become JSON
  // text, each quote and backslash escaped again: up to twice as long); the
  // gateway refuses (413) what would still be larger.
  size_t WorkerMaxBodyBytes() const { return 2 * max_body_bytes + (64 << 10); }
  // The deepest body a worker takes, for the same reason (an Ollama
  // `format` schema is nested three levels deeper once translated).
  int WorkerJsonMaxDepth() const { return json_max_depth + api::kWorkerExtraJsonDepth; }
  int max_queue = 256;
  int json_max_depth = 64;      // nesting of request bodies (gateway and workers); deeper is 400
  int max_connections = 1024;   // open client connections (lowered to fit the file-descriptor limit)
  int io_threads = 2;           // event loops, a thread each; a client connection stays on one
  // On SIGTERM, how long requests under way may finish (no new connection or
  // request is taken meanwhile) before the gateway stops; a second signal
  // stops it at once. 0: at once.
  double shutdown_grace_s = 10;
  size_t max_body_memory_bytes = 32 << 20;  // request bodies held at once, all clients together (each costs ~7x in parsing)
  int max_requests_per_key = 64;  // requests in flight per API key (or per client address without keys); more get 429
  std::vector<std::string> operator_keys;  // may see and cancel every client's requests
  std::vector<std::string> model_dirs;     // folders `spillway models --config` lists GGUF files in
  std::string ollama_models;               // Ollama's store for "ollama:" models (empty: $OLLAMA_MODELS, else ~/.ollama/models)
  JournalConfig journal;
  std::vector<ServiceConfig> services;    // llama.cpp models served by spillway-worker placements
  std::vector<ExternalConfig> externals;  // [[service]] kind = "external"
  std::vector<DeviceConfig> devices;  // headroom per device; defaults apply to others

  const ServiceConfig* FindService(const std::string& name) const;
  const ExternalConfig* FindExternal(const std::string& name) const;
  DeviceConfig Device(const std::string& name) const;
  // What is valid but likely a mistake, one line each (serve prints them at
  // start, serve --check too): a [[device]] no placement or external
  // service is on, whose settings apply to nothing.
  std::vector<std::string> Warnings() const;

};

inline constexpr uint16_t kDefaultPort = 8480;

StatusOr<GatewayConfig> LoadConfigFile(const std::string& path);
StatusOr<GatewayConfig> ParseConfig(const std::string& text, const std::string& source_name);
// The text ParseConfig hands to toml++: the characters toml++ cannot read
// safely (undefined behaviour in its whitespace tables) written as \uXXXX
// escapes in "basic strings" and blanked in comments; an error where nothing
// can stand for them, or for bytes that are not UTF-8.
StatusOr<std::string> TomlSafeText(const std::string& text, const std::string& source_name);

// The built-in demo: services "chat" and "embed" on the build's demo models.
GatewayConfig DemoConfig(const std::string& models_dir);

// Checks cross-field rules (unique names, files exist, keys for remote binds).
// `model_files` false: a service's model file is not looked for (serve
// --keep-going: a missing one is a placement that cannot work, reported by
// the start-up check and not started, as a file that is not a GGUF is).
Status Validate(const GatewayConfig& c, bool model_files = true);

using ::spillway::SplitHostPort;  // common/names.h

}  // namespace spillway::config
