// The decode loop: one thread owns the llama.cpp context and every slot, and
// batches all running requests into each llama_decode (continuous batching).
//
// KV cells: by default each slot has a stream of its own of ctx/slots cells
// (batch-invariant decoding: see EngineOptions::kv_unified); with kv_unified
// one pool of `ctx` cells is shared by the slots. A job reserves prompt +
// max_tokens cells when it is submitted (a whole stream when per-slot), so a
// running job can never run out of cache mid-generation; a job that does not
// fit now is refused with kResourceExhausted (503, retry later), one that can
// never fit with kInvalidArgument (400, with the numbers).
//
// Prompt prefixes (EngineOptions::prefix_reuse, on by default with per-slot
// streams): a slot keeps what its last request left in its cache, and a new
// job goes to the free slot whose cache it continues (more than half of it
// is the prompt's beginning), else to the least recently used one; only
// the rest of the prompt is computed (a chat's next turn resends the whole
// conversation). A prompt found whole keeps all but its
// last token, whose logits the first sample needs. Exact on the CPU:
// decoding is batch-invariant there, so a cell computed with another
// request's chunking holds what a fresh prefill would write (a GPU's kernels
// may round with the batch's size, as they do with neighbours). A job's
// `cached_tokens` says how many of its prompt tokens were taken so.
//
// Ownership: Submit() takes the job on success and then calls its on_done
// exactly once, from the engine thread; on failure the caller keeps it and no
// callback runs. Cancel() may be called from any thread.
//
// Failure containment: an exception out of llama_decode (a failed compute
// buffer re-reservation) poisons the context. The engine fails the jobs that
// were running with phase=compute, discards the context and builds a new one.
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "api/openai_response.h"
#include "common/status.h"
#include "worker/model.h"
#include "worker/sampling.h"

struct llama_context;
namespace spillway::worker {
class FaultInjector;
class SimControl;
}
struct ggml_threadpool;

namespace spillway::worker {

struct JobResult {
  Status status;
  std::string text;
  std::string finish_reason;  // "stop" | "length" (when status is OK)
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;  // of prompt_tokens: found in the slot's cache, not computed again (prefix_reuse)
  std::vector<int32_t> tokens;                   // generated token ids
  std::vector<api::TokenLogprob> logprobs;       // one per generated token, when the job asked for them
  std::vector<std::vector<float>> embeddings;    // embedding jobs
  double queue_ms = 0, prompt_ms = 0, generation_ms = 0;
};

struct Job {
  std::string id;
  bool embedding = false;
  std::vector<int32_t> prompt;                   // generation jobs
  std::vector<std::vector<int32_t>> inputs;      // embedding jobs
  SamplerSettings sampling;
  int32_t max_tokens = 16;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  // Continuation of a stream cut elsewhere: these tokens were already
  // generated (and `resume_text_bytes` of their text delivered). They are
  // sampled again with the same sampler state and must come out identical;
  // only text beyond what was delivered is emitted.
  std::vector<int32_t> resume_tokens;
  size_t resume_text_bytes = 0;
  // Tokens generated as their text although they are control tokens (a chat
  // format's markers, llama-server's preserved tokens). Sorted.
  std::vector<int32_t> preserved_tokens;
  // >= 0: report each generated token's log probability and this many
  // alternatives (OpenAI's logprobs / top_logprobs).
  int top_logprobs = -1;
  std::atomic<bool> cancelled{false};
  // All run on the engine thread and must not block.
  // `tokens`: the ids sampled since the previous call (for a continuation);
  // `logprobs`: theirs, when asked for.
  std::function<void(std::string_view ready_text, const std::vector<int32_t>& tokens,
                     const std::vector<api::TokenLogprob>& logprobs)> on_text;
  // A continuation whose replayed tokens came out as delivered: their ready
  // text, which the earlier attempt delivered; an error ends the job with it.
  // Without it, the first `resume_text_bytes` of the text count as delivered.
  std::function<Status(std::string_view replayed_text)> on_replayed;
  std::function<void(JobResult)> on_done;
};

struct EngineOptions {
  int slots = 4;
  int ctx = 4096;
  int batch = 512;
  int threads = 0;
  bool embedding = false;
  std::string kv_type = "f16";       // KV cache type: f16 | q8_0 | f32
  // false (default): every slot has its own KV stream of ctx/slots cells and
  // attention runs without flash attention, so a request's logits are
  // bit-identical whatever else runs beside it (batch-invariant; what
  // failover replay and continuation rely on). true: one pool of ctx cells
  // shared by the slots, flash attention as llama.cpp chooses; a request's
  // tokens may then depend on its neighbours.
  bool kv_unified = false;
  // A new job starts from what its slot's cache already holds of its prompt
  // (see the top of this file). Only with per-slot streams and a model whose
  // cache can lose its tail (not recurrent or hybrid): with one shared pool,
  // kept cells would hold room the gateway counts as free.
  bool prefix_reuse = true;
  FaultInjector* faults = nullptr;   // optional; must outlive the engine
  const SimControl* sim = nullptr;   // set when the placement is on a sim device
  // The "mmap" readiness policy: the context (KV pool, compute buffers) is
  // created by the first job, not by Start(), and freed after
  // `context_idle_s` without work (0: kept).
  bool lazy_context = false;
  double context_idle_s = 0;
};

struct MemoryBuffer {
  std::string name;
  size_t model = 0, context = 0, compute = 0;
  bool host = false;  // in host memory (CPU, CPU_Mapped, CPU_REPACK, CUDA_Host...: see Breakdown)
};

struct EngineStats {
  int slots_total = 0, slots_busy = 0, queued = 0;
  int cells_total = 0, cells_reserved = 0;
  int cells_per_request = 0;  // ctx/slots with per-slot streams, ctx when unified
  bool kv_unified = false;
  uint64_t completed = 0, failed = 0, cancelled = 0, contexts_rebuilt = 0;
  uint64_t reused_prompt_tokens = 0;  // prompt tokens taken from slots' caches (prefix_reuse), all jobs together
  bool healthy = true;
  bool device_lost = false;
  int64_t stalled_ms = 0;  // work waiting and no decode step finished for this long
  // The longest decode step finished so far (a prompt chunk of a large model
  // on a CPU): a step no longer than a few of these is slow, not hung.
  int64_t longest_step_ms = 0;
  std::string last_error;
  bool context_created = false;
  uint64_t contexts_created = 0;
  double last_context_ms = 0;  // how long the last context creation took
};

// llama.cpp's exact buffer plan for a context of `opts` on a model loaded
// with Placement::dry_run: nothing is allocated.
StatusOr<std::vector<MemoryBuffer>> DryRunBreakdown(const Model& model, const EngineOptions& opts);

// The most cells (prompt + answer) one request may use out of `stream_cells`
// (a slot's share, or the whole pool): all of them, but no position past
// `n_ctx_train` for a model whose positions are not rotary: such a model
// looks its positions up in a table of that many rows (GPT-2, StarCoder, MPT),
// and llama.cpp's CPU backend aborts past it (ggml_get_rows' assert), every
// request of the worker lost with it.
int32_t RequestCellLimit(int32_t stream_cells, int32_t n_ctx_train, bool rotary_positions);

// An embedding input cut to `limit` tokens (at least 1): its first ones,
// and its last when `keep_end` (a model whose tokenizer ends every input
// with its end or separator token pools, or reads, that token).
void TruncateInput(std::vector<int32_t>* tokens, size_t limit, bool keep_end);

class Engine {
 public:
  Engine(const Model& model, EngineOptions opts);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Creates the context (allocating KV and compute buffers) and starts the
  // loop. A KV or compute allocation failure returns phase=kv / phase=compute.
  Status Start();
  void Stop();

  Status Submit(std::shared_ptr<Job> job);
  // True if a job with this id was queued or running (it will end cancelled).
  // An id not known yet is remembered for a while: a job that arrives after
  // its cancellation (the two crossed on the wire) is refused as cancelled.
  // One that has just ended is not (its answer is on its way).
  bool Cancel(const std::string& id);
  // Cancels every queued and running job and remembers no id (and forgets
  // those cancelled early): a gateway that
  // adopts this worker after its predecessor's crash clears what nobody can
  // receive any more, then re-runs journaled requests under their own ids.
  // Returns how many jobs were cancelled.
  int CancelAll();

  EngineStats stats() const;
  std::vector<MemoryBuffer> memory_breakdown() const;
  const EngineOptions& options() const { return opts_; }
  // The most one request may hold: a slot's share, or the whole pool
  // (RequestCellLimit: within the model's trained context when its positions
  // are not rotary).
  int32_t CellsPerRequest() const;
  // The most tokens one embedding input may have: the pool, within the
  // positions the model was trained on (`by_training`: that is the bound).
  int32_t EmbeddingInputLimit(bool* by_training = nullptr) const;
  // Whether a job starts from what its slot's cache holds (prefix_reuse, and
  // the cache and model allow it).
  bool ReusesPrefixes() const;
  // How many of `prompt`'s tokens a job submitted now would find in the
  // cache of the slot it would take (an estimate: another job may take that
  // slot first). Any thread.
  int32_t CachedPrefixFor(const std::vector<int32_t>& prompt) const;

 private:
  struct Slot;
  Status CreateContext();
  // Lazy context: creates it for pending work (failing that work when it
  // cannot), or frees it after the idle time. Engine thread.
  bool EnsureContext();
  void FreeIdleContext();
  void Loop();
  void AssignPending();
  void RunGenerationStep();
  void RunEmbeddingJob(const std::shared_ptr<Job>& job);
  void FinishSlot(Slot& slot, Status status, const std::string& finish_reason);
  void EmitText(Slot& slot, std::string_view text);
  api::TokenLogprob TokenLogprobAt(int batch_index, int32_t tok, int n) const;
  void FailAllActive(const Status& status);
  void HandleDecodeFailure(int rc, const std::string& exception_what);
  bool DeviceLost() const;
  void ReleaseReservation(const Job& job);
  int32_t CellsNeeded(const Job& job) const;
  int32_t StreamCells() const;  // a slot's stream, or the whole pool (unified, embeddings)
  void ForgetCachedPrefixes();  // the context's cache was cleared, or the context is gone

  const Model& model_;
  EngineOptions opts_;
  llama_context* ctx_ = nullptr;
  ggml_threadpool* threadpool_ = nullptr;  // outlives every context it is attached to
  std::vector<Slot> slots_;
  std::vector<MemoryBuffer> breakdown_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> pending_;
  std::map<std::string, std::weak_ptr<Job>> by_id_;
  std::map<std::string, std::chrono::steady_clock::time_point> cancelled_early_;
  // The ids of the last jobs that ended (their answers may still be on their
  // way): a cancel of one of them is not remembered as early.
  std::deque<std::string> recently_done_;
  static constexpr size_t kRecentlyDone = 256;
  int busy_ = 0;              // pending + running, guarded by mu_
  int32_t cells_reserved_ = 0;
  bool stop_ = false;
  bool healthy_ = true;
  // Why it is not: the phase its context's rebuild failed in (kv or compute),
  // which every later request is refused with.
  FailurePhase unhealthy_phase_ = FailurePhase::kCompute;
  bool device_lost_ = false;
  // Progress: the time of the last finished decode step (or of going idle).
  std::atomic<int64_t> progress_ms_{0};
  std::atomic<int64_t> longest_step_ms_{0};  // EngineStats::longest_step_ms
  // A decode step started at `started_ms` has finished (`ok`: it succeeded): progress.
  void StepDone(int64_t started_ms, bool ok);
  std::string last_error_;
  uint64_t completed_ = 0, failed_ = 0, cancelled_ = 0, rebuilt_ = 0;
  uint64_t contexts_created_ = 0;
  std::atomic<uint64_t> reused_tokens_{0};  // EngineStats::reused_prompt_tokens
  uint64_t use_count_ = 0;  // slots' last use, in order (under mu_)
  double last_context_ms_ = 0;
  std::chrono::steady_clock::time_point idle_since_ = std::chrono::steady_clock::now();
  std::thread thread_;
};

}  // namespace spillway::worker
