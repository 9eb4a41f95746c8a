// The worker's HTTP surface: OpenAI routes served by one Engine, plus the
// control routes the gateway uses (health, info, cancel).
//
//   GET    /health                    200 {"status":"ok"} | 503 when the context is unusable
//   GET    /v1/worker/info            placement, fingerprint, memory breakdown, slots, KV cells
//   GET    /v1/models
//   POST   /v1/chat/completions       (stream and non-stream)
//   POST   /v1/completions            (stream and non-stream)
//   POST   /v1/embeddings
//   DELETE /v1/worker/requests/{id}   cancel a queued or running request
//   DELETE /v1/worker/requests        cancel them all (a gateway adopting this worker after a crash)
//   POST   /v1/worker/tokenize        ?endpoint=chat|completion: the prompt's token count
//   POST   /apply-template            a chat body's rendered prompt and its tokens (llama-server's route)
//   POST   /v1/worker/faults          {"faults": ["fail-next=kv", ...]} arm faults (sim devices)
//
// Requests carry their id in X-Request-Id (the gateway sets it; otherwise the
// worker makes one). A client that disconnects cancels its request.
//
// A large body's preparation (its JSON, the chat template, tokenization:
// seconds for megabytes) runs on two preparation threads of the service's
// own, not on the I/O threads, which keep answering health checks and
// cancels meanwhile: two long prompts held both I/O threads for 7 s, and the
// supervisor, whose health checks time out after 1 s, took the worker for
// hung and replaced it, with every request it ran.
//
// Callers: the supervising gateway only. Every request needs the worker secret
// (ServiceOptions::secret) and a loopback Host; a browser's Origin is refused.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <random>
#include <mutex>
#include <string>

#include "common/thread_pool.h"

#include "api/http_server.h"
#include "api/json_limits.h"
#include "worker/engine.h"
#include "worker/faults.h"
#include "worker/model.h"
#include "worker/chat_template.h"
#include "worker/prompt_tokens.h"
#include "worker/rendered_prompts.h"

namespace spillway::worker {

struct ServiceOptions {
  int default_max_tokens = 256;  // when a request does not set max_tokens
  double progress_timeout_s = 10;  // /health answers 503 "stalled" past this without a decode step
  api::JsonLimits json_limits;     // every body is checked against these before it is parsed
  // Every request must carry "Authorization: Bearer <secret>". Empty (--no-auth):
  // anyone local may call, but internal fields and fault routes are refused.
  std::string secret;
  // Chat renderings and completions' tokens kept for a moment
  // (rendered_prompts.h): the gateway's count of a prompt and the run that
  // follows render and tokenize it once. 0: none kept.
  size_t rendered_prompts = 8;
  // Prompts' texts and tokens kept (prompt_tokens.h): a chat's next turn is
  // tokenized from where it differs from an earlier one. 0: none kept.
  size_t kept_prompt_tokens = 4;
};

class WorkerService {
 public:
  // `faults` may be null (no fault injection).
  WorkerService(const Model& model, Engine& engine, Placement placement, ServiceOptions opts, FaultInjector* faults);

  // The http::Handler. Thread-safe.
  void Handle(http::Request req, std::shared_ptr<http::Exchange> ex);
  // Runs what the preparation threads still hold, then lets them go; called
  // before the engine stops (nothing is submitted to it afterwards).
  void Stop();

  // Bodies above this are prepared on the preparation threads (below: at
  // once, on the I/O thread, with no hop to another thread).
  static constexpr size_t kInlineBodyBytes = 64 << 10;

  nlohmann::json Info() const;
  // When the last request that passed CheckCaller() arrived (health checks
  // included), or construction: the orphan rule's clock (worker/main.cpp).
  std::chrono::steady_clock::time_point last_caller() const {
    return std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(last_caller_.load()));
  }

 private:
  // Loopback Host, no browser Origin, the worker secret.
  Status CheckCaller(const http::Request& req) const;
  void Route(const http::Request& req, std::shared_ptr<http::Exchange> ex);
  void HandleGeneration(const http::Request& req, std::shared_ptr<http::Exchange> ex, bool chat);
  // A chat/completion body made ready to generate: prompt (chat: rendered
  // by the model's template), its tokens, and what the answer must follow.
  struct Prompt {
    api::GenerationRequest gen;
    std::string text;               // chat: the rendered prompt
    std::vector<int32_t> tokens;
    std::optional<ChatSyntax> chat; // chat: how to read the answer
    GrammarSpec grammar;            // tool calls or response_format
    std::vector<int32_t> preserved_tokens;
    std::vector<std::string> extra_stops;  // the chat format's own stop strings
    int dropped_messages = -1;      // chat with "truncate": its oldest messages left out to fit (-1: not asked)
  };
  // `fit_cells` (> 0): the context a chat with "truncate" is cut for, in
  // place of this worker's (the gateway's count, for the service's primary
  // placement of the model).
  StatusOr<Prompt> PromptFor(const std::string& body, bool chat, int32_t fit_cells = 0) const;
  void HandleEmbeddings(const http::Request& req, std::shared_ptr<http::Exchange> ex);
  std::string RequestId(const http::Request& req);
  uint32_t FreshSeed();

  const Model& model_;
  Engine& engine_;
  Placement placement_;
  ServiceOptions opts_;
  FaultInjector* faults_;
  std::chrono::system_clock::time_point started_;
  std::mutex rng_mu_;
  std::mt19937_64 rng_;
  std::atomic<uint64_t> requests_{0};
  SystemClock clock_;
  mutable RenderedPrompts rendered_;
  mutable PromptTokens prompt_tokens_;
  ThreadPool prep_{2, "worker's request-preparation", "sw-prep"};
  std::atomic<std::chrono::steady_clock::rep> last_caller_{std::chrono::steady_clock::now().time_since_epoch().count()};
};

}  // namespace spillway::worker
