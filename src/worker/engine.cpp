#include "worker/engine.h"

#include "common/thread_name.h"
#include "common/utf8.h"

#include <llama.h>
#include <llama-ext.h>

#include <ggml-backend.h>
#include <ggml-cpu.h>

#include <algorithm>
#include <cmath>
#include <exception>

#include "common/mutation.h"
#include "worker/faults.h"
#include "worker/output_text.h"
#include "worker/sim_control.h"

namespace spillway::worker {

using Clock = std::chrono::steady_clock;
// How long a cancel of a request not (yet) here is remembered for its arrival.
constexpr std::chrono::seconds kCancelledEarlyKept{30};

namespace {
int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
}
constexpr int kDecodeThrew = -1000;

double MsSince(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}
}  // namespace

struct Engine::Slot {
  int id = 0;
  std::shared_ptr<Job> job;
  llama_sampler* smpl = nullptr;
  std::unique_ptr<OutputText> out;
  size_t n_prompt_done = 0;
  int n_past = 0;
  int32_t next_token = -1;  // sampled, not yet decoded
  int batch_index = -1;     // logits row in the current batch
  std::vector<int32_t> generated;
  size_t emitted_tokens = 0;  // generated[0..emitted_tokens) were handed to on_text
  std::vector<api::TokenLogprob> logprobs;  // of generated[], when the job asked for them
  Clock::time_point t_submit, t_start, t_prompt_done;
  // What the slot's cache holds, positions 0.. (prefix_reuse), from its last
  // job, when it was used last (use_count_), and whether it is free: under
  // mu_ (CachedPrefixFor reads them from other threads). `reused`: how many
  // of the running job's prompt tokens came from the cache (engine thread).
  std::vector<int32_t> cached;
  uint64_t last_used = 0;
  bool idle = true;
  size_t reused = 0;
};

namespace {

size_t CommonPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

}  // namespace

// The free slot a job with `prompt` goes to: the one whose cache it
// continues (more than half of what the slot holds is the prompt's
// beginning: the same conversation), the longest such; else the one used
// least recently, so that a beginning shared by chance (a system prompt, a
// template's first tokens) does not take another conversation's cache
// (llama-server's rule, its slot_prompt_similarity of 0.5). `keep`: how
// much of the prompt its cache holds, all of it but the last token at most
// (whose logits the first sample reads). Under mu_.
template <typename Slots>
auto* ChooseSlot(Slots& slots, const std::vector<int32_t>& prompt, bool reuse, size_t* keep) {
  decltype(&slots[0]) to = nullptr;
  decltype(&slots[0]) oldest = nullptr;
  size_t best = 0, oldest_common = 0;
  for (auto& s : slots) {
    if (!s.idle) continue;
    const size_t c = reuse ? CommonPrefix(s.cached, prompt) : 0;
    if (!oldest || s.last_used < oldest->last_used) {
      oldest = &s;
      oldest_common = c;
    }
    if (c > 0 && 2 * c > s.cached.size() && c > best) {
      to = &s;
      best = c;
    }
  }
  if (!to) {
    to = oldest;
    best = oldest_common;
  }
  *keep = std::min(best, prompt.empty() ? size_t{0} : prompt.size() - 1);
  return to;
}

int32_t Engine::CachedPrefixFor(const std::vector<int32_t>& prompt) const {
  std::lock_guard<std::mutex> lk(mu_);
  size_t keep = 0;
  if (!ReusesPrefixes() || !ChooseSlot(slots_, prompt, true, &keep)) return 0;
  return static_cast<int32_t>(keep);
}

Engine::Engine(const Model& model, EngineOptions opts) : model_(model), opts_(opts) {
  slots_.resize(static_cast<size_t>(opts_.slots));
  for (int i = 0; i < opts_.slots; ++i) slots_[static_cast<size_t>(i)].id = i;
}

Engine::~Engine() {
  Stop();
  for (auto& s : slots_) {
    if (s.smpl) llama_sampler_free(s.smpl);
  }
  if (ctx_) llama_free(ctx_);
  if (threadpool_) {
    if (auto* cpu = ggml_backend_reg_by_name("CPU")) {
      auto* free_fn = reinterpret_cast<decltype(ggml_threadpool_free)*>(
          ggml_backend_reg_get_proc_address(cpu, "ggml_threadpool_free"));
      if (free_fn) free_fn(threadpool_);
    }
  }
}

namespace {

llama_context_params ContextParams(const Model& model, const EngineOptions& opts_) {
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(opts_.ctx);
  cp.n_seq_max = static_cast<uint32_t>(opts_.slots);
  // (An embedding model runs one job at a time over the whole context.)
  cp.kv_unified = opts_.kv_unified || opts_.embedding;
  // Flash attention's CPU kernels pick a tiled, a KV-split or a plain path
  // from the batch's shape, each rounding differently: off for batch-invariant
  // decoding.
  if (!cp.kv_unified) cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  // A sliding-window model keeps every cell of its window's cache, not just
  // the window (llama.cpp's default, stated): a kept prompt prefix
  // (prefix_reuse) holds cells a pruned window would have dropped.
  cp.swa_full = true;
  cp.no_perf = true;
  const ggml_type kv = opts_.kv_type == "q8_0" ? GGML_TYPE_Q8_0 : opts_.kv_type == "f32" ? GGML_TYPE_F32 : GGML_TYPE_F16;
  cp.type_k = cp.type_v = kv;
  const int threads = opts_.threads > 0 ? opts_.threads : static_cast<int>(std::thread::hardware_concurrency());
  cp.n_threads = threads;
  cp.n_threads_batch = threads;
  if (opts_.embedding) {
    cp.embeddings = true;
    cp.pooling_type = static_cast<enum llama_pooling_type>(model.pooling_type());
    cp.n_batch = cp.n_ubatch = static_cast<uint32_t>(opts_.ctx);
  } else {
    cp.n_batch = static_cast<uint32_t>(opts_.batch);
    cp.n_ubatch = static_cast<uint32_t>(std::min(opts_.batch, 512));
  }
  return cp;
}

std::vector<MemoryBuffer> Breakdown(const llama_context* ctx) {
  std::vector<MemoryBuffer> out;
  for (const auto& [buft, mb] : llama_get_memory_breakdown(ctx)) {
    // Host memory: a host buffer type (CPU, CPU_Mapped, CUDA_Host's pinned
    // RAM), or one of the CPU device's own (CPU_REPACK, AMX, KleidiAI leave
    // is_host unset, but they are the host's RAM too).
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
    const bool host = ggml_backend_buft_is_host(buft) || (dev && ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU);
    out.push_back({ggml_backend_buft_name(buft), mb.model, mb.context, mb.compute, host});
  }
  return out;
}

}  // namespace

StatusOr<std::vector<MemoryBuffer>> DryRunBreakdown(const Model& model, const EngineOptions& opts) {
  llama_context* ctx = nullptr;
  try {
    ctx = llama_init_from_model(model.raw(), ContextParams(model, opts));
  } catch (const std::exception&) {
    ctx = nullptr;
  }
  if (!ctx) return Status::Internal("llama.cpp could not plan the context");
  auto out = Breakdown(ctx);
  llama_free(ctx);
  return out;
}

Status Engine::CreateContext() {
  llama_context_params cp = ContextParams(model_, opts_);
  const int threads = static_cast<int>(cp.n_threads);
  // A persistent thread pool polling briefly between graphs, as llama.cpp's
  // own server and llama-bench use; without one ggml starts threads per graph.
  if (!threadpool_) {
    if (auto* cpu = ggml_backend_reg_by_name("CPU")) {
      auto* make = reinterpret_cast<decltype(ggml_threadpool_new)*>(
          ggml_backend_reg_get_proc_address(cpu, "ggml_threadpool_new"));
      if (make) {
        ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
        tpp.poll = 50;
        threadpool_ = make(&tpp);
      }
    }
  }
  ForgetCachedPrefixes();  // (a new context's cache holds nothing)
  if (opts_.sim) opts_.sim->SetPhase(SPILLWAY_SIM_PHASE_KV);
  ClearLlamaErrors();
  try {
    ctx_ = llama_init_from_model(model_.raw(), cp);
  } catch (const std::exception& e) {
    ctx_ = nullptr;
  }
  if (opts_.sim) opts_.sim->SetPhase(SPILLWAY_SIM_PHASE_COMPUTE);
  if (!ctx_) {
    // llama.cpp returns NULL both for the KV cache and for the compute
    // buffers; only its log says which. Or for the parameters themselves,
    // before anything is allocated: that was read as the KV cache not
    // fitting (an allocation failure, at every start).
    const std::string log = RecentLlamaErrors();
    for (const char* refusal : {"does not divide", "requires flash_attn", "does not support different K", "cannot both be zero"}) {
      if (log.find(refusal) != std::string::npos) {
        return Status::InvalidArgument("llama.cpp refused the context's parameters: " + Abbreviated(log, 300));
      }
    }
    const bool compute = log.find("compute") != std::string::npos;
    return Status::ResourceExhausted("llama.cpp could not create a context of " + std::to_string(opts_.ctx) +
                                     " cells for " + std::to_string(opts_.slots) + " slots: " +
                                     (compute ? "the compute buffers do" : "the KV cache does") + " not fit")
        .WithPhase(compute ? FailurePhase::kCompute : FailurePhase::kKv);
  }
  if (threadpool_) llama_attach_threadpool(ctx_, threadpool_, nullptr);
  auto breakdown = Breakdown(ctx_);
  std::lock_guard<std::mutex> lk(mu_);
  breakdown_ = std::move(breakdown);
  ++contexts_created_;
  return Status::Ok();
}

Status Engine::Start() {
  if (!opts_.lazy_context) {
    const auto t0 = Clock::now();
    SPILLWAY_RETURN_IF_ERROR(CreateContext());
    last_context_ms_ = MsSince(t0, Clock::now());
  }
  thread_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

bool Engine::EnsureContext() {
  if (ctx_) return true;
  const auto t0 = Clock::now();
  Status st = CreateContext();
  {
    std::lock_guard<std::mutex> lk(mu_);
    last_context_ms_ = MsSince(t0, Clock::now());
  }
  if (st.ok()) return true;
  // The pending work cannot run here: it fails with the phase (kv/compute),
  // which the gateway treats as an allocation failure and moves elsewhere.
  std::deque<std::shared_ptr<Job>> failed;
  {
    std::lock_guard<std::mutex> lk(mu_);
    failed.swap(pending_);
    last_error_ = st.message();
  }
  for (auto& job : failed) {
    ReleaseReservation(*job);
    JobResult r;
    r.status = st;
    job->on_done(std::move(r));
  }
  return false;
}

void Engine::FreeIdleContext() {
  if (!opts_.lazy_context || opts_.context_idle_s <= 0 || !ctx_) return;
  llama_context* idle = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (busy_ > 0) return;
    if (MsSince(idle_since_, Clock::now()) < opts_.context_idle_s * 1000) return;
    idle = std::exchange(ctx_, nullptr);  // (only this thread uses the context)
    breakdown_.clear();
  }
  ForgetCachedPrefixes();
  // Freed without the lock: freeing the KV pool and compute buffers takes a
  // while, and health checks, cancels and submits take the lock.
  llama_free(idle);
}

void Engine::Stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

int32_t RequestCellLimit(int32_t stream_cells, int32_t n_ctx_train, bool rotary_positions) {
  return !rotary_positions && n_ctx_train > 0 && n_ctx_train < stream_cells ? n_ctx_train : stream_cells;
}

int32_t Engine::StreamCells() const {
  return opts_.kv_unified || opts_.embedding ? opts_.ctx : opts_.ctx / std::max(1, opts_.slots);
}

int32_t Engine::CellsNeeded(const Job& job) const {
  if (job.embedding) return 0;  // embedding jobs run one at a time on a cleared cache
  if (!opts_.kv_unified) return StreamCells();  // the slot's whole stream
  return static_cast<int32_t>(job.prompt.size()) + job.max_tokens;
}

int32_t Engine::CellsPerRequest() const {
  // (An embedding's inputs have their own check against n_ctx_train, below.)
  if (opts_.embedding) return StreamCells();
  return RequestCellLimit(StreamCells(), model_.n_ctx_train(), model_.rotary_positions());
}

int32_t Engine::EmbeddingInputLimit(bool* by_training) const {
  // No input past the positions the model was trained on: a BERT-style
  // model looks its positions up in a table of that size (llama.cpp aborts
  // beyond it), and a rotary one's vectors mean little there.
  const int32_t cells_total = CellsPerRequest();
  const int32_t trained = model_.n_ctx_train();
  const bool trained_less = trained > 0 && trained < cells_total;
  if (by_training) *by_training = trained_less;
  return trained_less ? trained : cells_total;
}

void TruncateInput(std::vector<int32_t>* tokens, size_t limit, bool keep_end) {
  limit = std::max<size_t>(1, limit);
  if (tokens->size() <= limit) return;
  const int32_t last = tokens->back();
  tokens->resize(limit);
  if (keep_end && limit > 1) tokens->back() = last;
}

Status Engine::Submit(std::shared_ptr<Job> job) {
  const int32_t cells_total = CellsPerRequest();
  if (job->embedding != opts_.embedding) {
    return Status::InvalidArgument(opts_.embedding ? "this worker serves an embedding model; use /v1/embeddings"
                                                   : "this worker serves a generative model, not embeddings");
  }
  if (job->embedding) {
    bool by_training = false;
    const int32_t limit = EmbeddingInputLimit(&by_training);
    for (const auto& in : job->inputs) {
      // (A decode of no token fails: it was a compute failure, counted
      // against the placement, for an input whose tokenizer drops it all.)
      if (in.empty()) return Status::InvalidArgument("an input is empty after tokenization");
      if (static_cast<int32_t>(in.size()) > limit) {
        return Status::InvalidArgument("input of " + std::to_string(in.size()) + " tokens exceeds " +
                                       (by_training ? "the model's trained context of " : "the context of ") +
                                       std::to_string(limit) + " tokens (\"truncate\": true cuts an input to fit)")
            .WithReason(kContextLengthExceeded);
      }
    }
  } else {
    if (job->prompt.empty()) return Status::InvalidArgument("the prompt is empty after tokenization");
    if (job->max_tokens < 1) return Status::InvalidArgument("max_tokens must be at least 1");
    if (static_cast<int32_t>(job->resume_tokens.size()) >= job->max_tokens) {
      return Status::InvalidArgument("the continuation already holds max_tokens tokens");
    }
    const int32_t need = static_cast<int32_t>(job->prompt.size()) + job->max_tokens;
    if (need > cells_total) {
      return Status::InvalidArgument("prompt (" + std::to_string(job->prompt.size()) + " tokens) + max_tokens (" +
                                     std::to_string(job->max_tokens) + ") = " + std::to_string(need) +
                                     " exceeds the context of " + std::to_string(cells_total) + " tokens" +
                                     (cells_total < StreamCells() ? " the model was trained on (its positions are not rotary)"
                                      : opts_.kv_unified          ? ""
                                                                  : " per slot"))
          .WithReason(kContextLengthExceeded);
    }
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (stop_) return Status::Unavailable("worker is shutting down");
  if (device_lost_) return Status::Unavailable("the device was lost: " + last_error_).WithPhase(FailurePhase::kDevice);
  if (!healthy_) return Status::Unavailable("worker context is unusable: " + last_error_).WithPhase(unhealthy_phase_);
  if (auto it = by_id_.find(job->id); it != by_id_.end() && !it->second.expired()) {
    return Status::Conflict("request id '" + job->id + "' is already running");
  }
  if (auto it = cancelled_early_.find(job->id); it != cancelled_early_.end()) {
    const bool recent = Clock::now() - it->second <= kCancelledEarlyKept;
    cancelled_early_.erase(it);
    // (An older one was refused for as long as no other early cancel came to sweep it.)
    if (recent) return Status::Cancelled("request cancelled before it arrived");
  }
  if (busy_ >= opts_.slots) {
    return Status::ResourceExhausted("all " + std::to_string(opts_.slots) + " slots are busy").WithRetryAfter(1);
  }
  const int32_t need = CellsNeeded(*job);
  if (cells_reserved_ + need > opts_.ctx) {
    return Status::ResourceExhausted("KV cache: request needs " + std::to_string(need) + " cells, " +
                                     std::to_string(opts_.ctx - cells_reserved_) + " of " +
                                     std::to_string(opts_.ctx) + " are free")
        .WithRetryAfter(1);  // capacity (busy, no phase: the request waits), not an allocation failure
  }
  cells_reserved_ += need;
  if (busy_ == 0) progress_ms_ = SteadyMs();  // idle until now: progress counts from here
  ++busy_;
  if (auto d = std::find(recently_done_.begin(), recently_done_.end(), job->id); d != recently_done_.end()) {
    recently_done_.erase(d);  // running again under its id: a cancel is about this run now
  }
  by_id_[job->id] = job;
  pending_.push_back(std::move(job));
  cv_.notify_all();
  return Status::Ok();
}

bool Engine::Cancel(const std::string& id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = by_id_.find(id);
  auto job = it == by_id_.end() ? nullptr : it->second.lock();
  if (!job) {
    // Ended a moment ago (its answer on its way: a disconnect racing the
    // answer's delivery): nothing to remember. Remembered, a re-run under
    // the id (a restarted gateway's replay) was refused as cancelled.
    if (std::find(recently_done_.begin(), recently_done_.end(), id) != recently_done_.end()) return false;
    const auto now = Clock::now();
    for (auto e = cancelled_early_.begin(); e != cancelled_early_.end();) {
      e = now - e->second > kCancelledEarlyKept ? cancelled_early_.erase(e) : std::next(e);
    }
    if (cancelled_early_.size() < 4096) cancelled_early_[id] = now;
    return false;
  }
  job->cancelled = true;
  cv_.notify_all();
  return true;
}

int Engine::CancelAll() {
  std::lock_guard<std::mutex> lk(mu_);
  // (A new gateway's: what the previous one cancelled early is not about the requests it re-runs.)
  cancelled_early_.clear();
  int n = 0;
  for (auto& [id, weak] : by_id_) {
    if (auto job = weak.lock(); job && !job->cancelled) {
      job->cancelled = true;
      ++n;
    }
  }
  cv_.notify_all();
  return n;
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  EngineStats s;
  s.slots_total = opts_.slots;
  s.queued = static_cast<int>(pending_.size());
  s.slots_busy = busy_ - s.queued;
  s.cells_total = opts_.ctx;
  s.cells_reserved = cells_reserved_;
  s.cells_per_request = CellsPerRequest();
  s.kv_unified = opts_.kv_unified;
  s.completed = completed_;
  s.failed = failed_;
  s.cancelled = cancelled_;
  s.contexts_rebuilt = rebuilt_;
  s.reused_prompt_tokens = reused_tokens_.load();
  // A hung decode (a stuck driver) still answers HTTP: only progress tells.
  if (busy_ > 0) s.stalled_ms = std::max<int64_t>(0, SteadyMs() - progress_ms_.load());
  s.longest_step_ms = longest_step_ms_.load();
  s.healthy = healthy_;
  s.device_lost = device_lost_;
  s.last_error = last_error_;
  s.context_created = !breakdown_.empty();
  s.contexts_created = contexts_created_;
  s.last_context_ms = last_context_ms_;
  return s;
}

std::vector<MemoryBuffer> Engine::memory_breakdown() const {
  std::lock_guard<std::mutex> lk(mu_);
  return breakdown_;
}

void Engine::ReleaseReservation(const Job& job) {
  std::lock_guard<std::mutex> lk(mu_);
  cells_reserved_ -= CellsNeeded(job);
  --busy_;
  by_id_.erase(job.id);
  recently_done_.push_back(job.id);
  if (recently_done_.size() > kRecentlyDone) recently_done_.pop_front();
}

void Engine::Loop() {
  NameThisThread("sw-decode");
  while (true) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      auto has_work = [&] {
        if (stop_ || !pending_.empty()) return true;
        for (const auto& s : slots_) {
          if (s.job) return true;
        }
        return false;
      };
      if (!has_work()) idle_since_ = Clock::now();
      if (opts_.lazy_context && opts_.context_idle_s > 0 && ctx_) {
        cv_.wait_for(lk, std::chrono::milliseconds(static_cast<int64_t>(opts_.context_idle_s * 1000) + 10), has_work);
      } else {
        cv_.wait(lk, has_work);
      }
      if (stop_) break;
      if (!has_work()) {
        lk.unlock();
        FreeIdleContext();
        continue;
      }
    }
    if (!EnsureContext()) continue;
    if (opts_.embedding) {
      std::shared_ptr<Job> job;
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (!pending_.empty()) {
          job = std::move(pending_.front());
          pending_.pop_front();
        }
      }
      if (job) RunEmbeddingJob(job);
      continue;
    }
    AssignPending();
    for (auto& s : slots_) {
      if (s.job && s.job->cancelled) FinishSlot(s, Status::Cancelled("request cancelled"), "");
    }
    RunGenerationStep();
  }
  // Shutting down: everything still owned ends with an error.
  FailAllActive(Status::Unavailable("worker is shutting down"));
  std::deque<std::shared_ptr<Job>> rest;
  {
    std::lock_guard<std::mutex> lk(mu_);
    rest.swap(pending_);
  }
  for (auto& job : rest) {
    ReleaseReservation(*job);
    JobResult r;
    r.status = Status::Unavailable("worker is shutting down");
    job->on_done(std::move(r));
  }
}

void Engine::AssignPending() {
  std::vector<Slot*> assigned;
  {
    std::lock_guard<std::mutex> lk(mu_);
    const bool reuse = ReusesPrefixes();
    while (!pending_.empty()) {
      size_t keep = 0;
      Slot* to = ChooseSlot(slots_, pending_.front()->prompt, reuse, &keep);
      if (!to) break;
      to->reused = keep;  // (what its cache holds of the prompt: kept below)
      to->idle = false;
      to->cached.clear();  // (what it held stays in the cache as far as `reused`: dropped below past that)
      to->job = std::move(pending_.front());
      pending_.pop_front();
      assigned.push_back(to);
    }
  }
  // The rest without the lock (only this thread uses a slot's sampler and
  // text): a grammar's parse and compile held off health checks, cancels
  // and submits meanwhile.
  std::vector<Slot*> no_sampler;
  for (Slot* slot : assigned) {
    Slot& s = *slot;
    s.smpl = BuildSamplerChain(s.job->sampling, model_.vocab(),
                               s.job->ignore_eos ? &model_.end_of_generation_tokens() : nullptr);
    s.out = std::make_unique<OutputText>(s.job->stop);
    // What the cache holds of the prompt stays (found as the slot was
    // chosen); the rest of the cache goes.
    size_t keep = s.reused;
    llama_memory_t mem = llama_get_memory(ctx_);
    if (keep > 0 && !llama_memory_seq_rm(mem, s.id, static_cast<llama_pos>(keep), -1)) keep = 0;
    if (keep == 0) llama_memory_seq_rm(mem, s.id, -1, -1);
    s.reused = keep;
    s.n_prompt_done = keep;
    s.n_past = static_cast<int>(keep);
    s.next_token = -1;
    s.batch_index = -1;
    s.generated.clear();
    s.logprobs.clear();
    s.emitted_tokens = 0;
    s.t_start = Clock::now();
    if (!s.smpl) no_sampler.push_back(&s);
  }
  // Submitters check grammars first (CheckGrammar); this is the backstop.
  for (Slot* s : no_sampler) FinishSlot(*s, Status::Internal("the sampler chain could not be built (grammar)"), "");
}

void Engine::RunGenerationStep() {
  llama_batch batch = llama_batch_init(opts_.batch + opts_.slots, 0, 1);
  int budget = opts_.batch;
  for (auto& s : slots_) {
    s.batch_index = -1;
    if (!s.job || s.next_token < 0) continue;
    const int i = batch.n_tokens++;
    batch.token[i] = s.next_token;
    batch.pos[i] = s.n_past;
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = s.id;
    batch.logits[i] = 1;
    s.batch_index = i;
    --budget;
  }
  std::vector<std::pair<Slot*, int>> prompt_chunks;
  for (auto& s : slots_) {
    if (!s.job || s.next_token >= 0 || budget <= 0) continue;
    const auto& prompt = s.job->prompt;
    const int take = std::min<int>(budget, static_cast<int>(prompt.size() - s.n_prompt_done));
    for (int k = 0; k < take; ++k) {
      const int i = batch.n_tokens++;
      batch.token[i] = prompt[s.n_prompt_done + static_cast<size_t>(k)];
      batch.pos[i] = s.n_past + k;
      batch.n_seq_id[i] = 1;
      batch.seq_id[i][0] = s.id;
      batch.logits[i] = 0;
    }
    budget -= take;
    if (s.n_prompt_done + static_cast<size_t>(take) == prompt.size()) {
      batch.logits[batch.n_tokens - 1] = 1;
      s.batch_index = batch.n_tokens - 1;
    }
    prompt_chunks.emplace_back(&s, take);
  }
  if (batch.n_tokens == 0) {
    llama_batch_free(batch);
    return;
  }

  if (opts_.faults && opts_.faults->TakeForceReserve()) {
    // What a server does when it switches attention mode, embeddings or a
    // LoRA: the next llama_decode must re-reserve its compute buffers.
    llama_set_causal_attn(ctx_, false);
    llama_set_causal_attn(ctx_, true);
  }
  int rc = 0;
  std::string what;
  const int64_t step_started_ms = SteadyMs();
  try {
    // (kv-full: what llama_decode returns when the cache has no room for the batch.)
    rc = opts_.faults && opts_.faults->TakeKvFull() ? 1 : llama_decode(ctx_, batch);
  } catch (const std::exception& e) {
    rc = kDecodeThrew;
    what = e.what();
  } catch (...) {
    rc = kDecodeThrew;
    what = "unknown exception";
  }
  llama_batch_free(batch);
  StepDone(step_started_ms, rc == 0);
  if (rc != 0) return HandleDecodeFailure(rc, what);

  for (auto& [slot, take] : prompt_chunks) {
    slot->n_prompt_done += static_cast<size_t>(take);
    slot->n_past += take;
  }
  const auto now = Clock::now();
  for (auto& s : slots_) {
    if (!s.job || s.batch_index < 0) continue;
    if (s.next_token >= 0) {
      ++s.n_past;  // the token sampled last step is now in the cache
    } else {
      s.t_prompt_done = now;
    }
    int32_t tok = -1;
    try {
      if (s.generated.empty() && s.job->resume_tokens.size() > 1 && MutationActive("resume-skip-advance")) {
        tok = s.job->resume_tokens[0];  // deliberate bug: accepted without sampling
        llama_sampler_accept(s.smpl, tok);
      } else {
        tok = llama_sampler_sample(s.smpl, ctx_, s.batch_index);
      }
    } catch (const std::exception& e) {
      // A grammar that allows no token throws from its accept: the
      // request's own constraints (its response_format's end banned by
      // ignore_eos or logit_bias), not the placement's failure (a 500 read
      // as a compute failure tripped the breakers of every placement).
      FinishSlot(s, Status::Unprocessable(std::string("sampling failed: no token is allowed here (a response_format "
                                                      "or tool grammar whose end ignore_eos or logit_bias bans?): ") +
                                          e.what()),
                 "");
      continue;
    }
    if (opts_.faults) opts_.faults->OnToken();
    const size_t k = s.generated.size();
    const auto& resume = s.job->resume_tokens;
    // Before the end-of-generation check: a replay that diverges into an
    // end token is not reproducible either (ended as "stop", the replayed
    // text would be sent to the client a second time).
    if (k < resume.size() && tok != resume[k]) {
      FinishSlot(s, Status::Unavailable("the continuation is not reproducible: token " + std::to_string(k) + " came out " +
                                        std::to_string(tok) + ", " + std::to_string(resume[k]) + " was delivered"),
                 "");
      continue;
    }
    if (model_.IsEndOfGeneration(tok)) {
      FinishSlot(s, Status::Ok(), "stop");
      continue;
    }
    s.generated.push_back(tok);
    if (s.job->top_logprobs >= 0) s.logprobs.push_back(TokenLogprobAt(s.batch_index, tok, s.job->top_logprobs));
    const bool special = std::binary_search(s.job->preserved_tokens.begin(), s.job->preserved_tokens.end(), tok);
    const bool stopped = s.out->Append(model_.TokenPiece(tok, special));
    if (k + 1 < resume.size()) {
      s.next_token = tok;  // replaying what was already delivered: nothing to emit yet
      continue;
    }
    if (k + 1 == resume.size()) {
      if (s.job->on_replayed) {
        if (Status st = s.job->on_replayed(s.out->TakeReady()); !st.ok()) {
          FinishSlot(s, std::move(st), "");
          continue;
        }
      } else {
        s.out->MarkSent(s.job->resume_text_bytes);
      }
      s.emitted_tokens = s.generated.size();
    }
    if (std::string ready = s.out->TakeReady(); !ready.empty() && s.job->on_text) {
      EmitText(s, ready);
    }
    if (stopped) {
      FinishSlot(s, Status::Ok(), "stop");
    } else if (static_cast<int32_t>(s.generated.size()) >= s.job->max_tokens) {
      FinishSlot(s, Status::Ok(), "length");
    } else {
      s.next_token = tok;
    }
  }
}

// Hands `text` to the job with the ids (and logprobs) not handed yet.
void Engine::EmitText(Slot& s, std::string_view text) {
  const size_t from = std::min(s.emitted_tokens, s.generated.size());
  std::vector<int32_t> ids(s.generated.begin() + static_cast<std::ptrdiff_t>(from), s.generated.end());
  std::vector<api::TokenLogprob> lp;
  if (s.logprobs.size() == s.generated.size()) {
    lp.assign(s.logprobs.begin() + static_cast<std::ptrdiff_t>(from), s.logprobs.end());
  }
  s.emitted_tokens = s.generated.size();
  s.job->on_text(text, ids, lp);
}

// llama-server's probabilities: the softmax of the model's logits for this
// row, before any sampler; the top `n` alternatives by logit.
api::TokenLogprob Engine::TokenLogprobAt(int batch_index, int32_t tok, int n) const {
  const float* logits = llama_get_logits_ith(ctx_, batch_index);
  const int n_vocab = llama_vocab_n_tokens(model_.vocab());
  api::TokenLogprob out;
  out.token = model_.TokenPiece(tok, true);
  if (!logits) return out;
  float max = -INFINITY;
  for (int i = 0; i < n_vocab; ++i) max = std::max(max, logits[i]);
  double sum = 0;
  for (int i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(logits[i] - max));
  const double log_z = static_cast<double>(max) + std::log(sum);
  out.logprob = static_cast<float>(logits[tok] - log_z);
  if (n > 0) {
    std::vector<int32_t> ids(static_cast<size_t>(n_vocab));
    for (int i = 0; i < n_vocab; ++i) ids[static_cast<size_t>(i)] = i;
    const int k = std::min(n, n_vocab);
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int i = 0; i < k; ++i) {
      out.top.emplace_back(model_.TokenPiece(ids[static_cast<size_t>(i)], true),
                           static_cast<float>(logits[ids[static_cast<size_t>(i)]] - log_z));
    }
  }
  return out;
}

bool Engine::DeviceLost() const { return opts_.sim && opts_.sim->lost(); }

void Engine::HandleDecodeFailure(int rc, const std::string& what) {
  if (DeviceLost()) {
    // Nothing on the device can be trusted again: fail fast from now on
    // (the supervisor restarts the worker, as after a driver reset).
    // Marked before the requests fail: a client told "device lost" that asks
    // /health at once must hear it too.
    const std::string msg = "the device was lost during decode";
    {
      std::lock_guard<std::mutex> lk(mu_);
      device_lost_ = true;
      healthy_ = false;
      last_error_ = msg;
    }
    FailAllActive(Status::Unavailable(msg).WithPhase(FailurePhase::kDevice));
    return;
  }
  if (rc == 1) {
    FailAllActive(Status::ResourceExhausted("no free space in the KV cache").WithPhase(FailurePhase::kKv));
    return;
  }
  if (rc == kDecodeThrew || rc == -2) {
    // An exception (failed re-reservation) or a failed graph allocation leaves
    // the graph allocator in an undefined state: discard the context.
    const std::string msg = rc == kDecodeThrew
                                ? "compute buffer allocation failed inside llama_decode (exception: " + what + ")"
                                : "compute buffer allocation failed inside llama_decode";
    FailAllActive(Status::Unavailable(msg).WithPhase(FailurePhase::kCompute));
    llama_free(ctx_);
    ctx_ = nullptr;
    Status st = CreateContext();
    std::lock_guard<std::mutex> lk(mu_);
    ++rebuilt_;
    last_error_ = msg;
    if (!st.ok()) {
      healthy_ = false;
      unhealthy_phase_ = st.phase() == FailurePhase::kKv ? FailurePhase::kKv : FailurePhase::kCompute;
      last_error_ = msg + "; rebuilding the context failed: " + st.message();
      // Its buffers are freed: /v1/worker/info said they were held (the
      // gateway counted the memory), and the context created.
      breakdown_.clear();
    }
    return;
  }
  FailAllActive(Status::Unavailable("llama_decode failed with code " + std::to_string(rc) + " (compute error)")
                    .WithPhase(FailurePhase::kCompute));
  std::lock_guard<std::mutex> lk(mu_);
  last_error_ = "llama_decode failed with code " + std::to_string(rc);
}

void Engine::FinishSlot(Slot& s, Status status, const std::string& finish_reason) {
  auto job = std::move(s.job);
  s.job.reset();
  // The cache keeps what the job left (its prompt, then the tokens fed back
  // after it, n_past in all) for the slot's next job; without reuse it is
  // emptied.
  std::vector<int32_t> kept;
  const size_t held = static_cast<size_t>(std::max(0, s.n_past));
  if (ctx_ && ReusesPrefixes() && held <= job->prompt.size() + s.generated.size()) {
    const size_t from_prompt = std::min(held, job->prompt.size());
    kept.assign(job->prompt.begin(), job->prompt.begin() + static_cast<std::ptrdiff_t>(from_prompt));
    kept.insert(kept.end(), s.generated.begin(), s.generated.begin() + static_cast<std::ptrdiff_t>(held - from_prompt));
  } else if (ctx_) {
    llama_memory_seq_rm(llama_get_memory(ctx_), s.id, -1, -1);
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    s.cached = std::move(kept);
    s.last_used = ++use_count_;
    s.idle = true;
  }
  if (s.smpl) {
    llama_sampler_free(s.smpl);
    s.smpl = nullptr;
  }
  const auto now = Clock::now();
  JobResult r;
  if (status.ok()) reused_tokens_ += s.reused;  // (a job that failed or was cancelled may not have run)
  if (status.ok()) {
    // The rest of the text, and the ids of tokens that made none (so every id goes out once).
    std::string rest = s.out->TakeRest();
    if (job->on_text && (!rest.empty() || s.emitted_tokens < s.generated.size())) {
      s.job = job;
      EmitText(s, rest);
      s.job.reset();
    }
  }
  r.text = s.out->text();
  r.finish_reason = finish_reason;
  r.prompt_tokens = static_cast<int>(job->prompt.size());
  r.cached_tokens = static_cast<int>(s.reused);
  r.completion_tokens = static_cast<int>(s.generated.size());
  r.tokens = std::move(s.generated);
  r.logprobs = std::move(s.logprobs);
  s.logprobs.clear();
  r.prompt_ms = s.t_prompt_done > s.t_start ? MsSince(s.t_start, s.t_prompt_done) : MsSince(s.t_start, now);
  r.generation_ms = s.t_prompt_done > s.t_start ? MsSince(s.t_prompt_done, now) : 0;
  s.next_token = -1;
  s.out.reset();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (status.ok()) ++completed_;
    else if (status.code() == StatusCode::kCancelled) ++cancelled_;
    else ++failed_;
  }
  r.status = std::move(status);
  ReleaseReservation(*job);
  job->on_done(std::move(r));
}

void Engine::StepDone(int64_t started_ms, bool ok) {
  const int64_t now = SteadyMs();
  progress_ms_ = now;
  if (ok && now - started_ms > longest_step_ms_.load()) longest_step_ms_ = now - started_ms;
}

void Engine::FailAllActive(const Status& status) {
  for (auto& s : slots_) {
    if (s.job) FinishSlot(s, status, "");
  }
  if (ctx_) llama_memory_clear(llama_get_memory(ctx_), true);
  ForgetCachedPrefixes();
}

bool Engine::ReusesPrefixes() const {
  return opts_.prefix_reuse && !opts_.kv_unified && !opts_.embedding && !llama_model_is_recurrent(model_.raw()) &&
         !llama_model_is_hybrid(model_.raw());
}

void Engine::ForgetCachedPrefixes() {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& s : slots_) s.cached.clear();
}

void Engine::RunEmbeddingJob(const std::shared_ptr<Job>& job) {
  JobResult r;
  const auto t0 = Clock::now();
  const int n_embd = model_.n_embd_out();
  int rc = 0;
  std::string what;
  for (const auto& input : job->inputs) {
    if (job->cancelled) {
      r.status = Status::Cancelled("request cancelled");
      break;
    }
    llama_memory_clear(llama_get_memory(ctx_), true);
    llama_batch batch = llama_batch_init(static_cast<int32_t>(input.size()), 0, 1);
    for (size_t i = 0; i < input.size(); ++i) {
      batch.token[i] = input[i];
      batch.pos[i] = static_cast<int32_t>(i);
      batch.n_seq_id[i] = 1;
      batch.seq_id[i][0] = 0;
      batch.logits[i] = 1;
    }
    batch.n_tokens = static_cast<int32_t>(input.size());
    const int64_t step_started_ms = SteadyMs();
    try {
      rc = llama_decode(ctx_, batch);
    } catch (const std::exception& e) {
      rc = kDecodeThrew;
      what = e.what();
    } catch (...) {
      rc = kDecodeThrew;
      what = "an exception that is not a std::exception";
    }
    llama_batch_free(batch);
    // Each input is a step: a long run of them (a large batch of inputs, back-to-back requests) is not a hang.
    StepDone(step_started_ms, rc == 0);
    const float* e = rc == 0 ? llama_get_embeddings_seq(ctx_, 0) : nullptr;
    if (!e) {
      r.status = Status::Unavailable("embedding decode failed (code " + std::to_string(rc) + ")")
                     .WithPhase(DeviceLost() ? FailurePhase::kDevice : FailurePhase::kCompute);
      if (rc == 0) rc = -3;
      break;
    }
    std::vector<float> v(e, e + n_embd);
    double norm = 0;
    for (float x : v) norm += double(x) * x;
    norm = std::sqrt(norm);
    if (norm > 0) {
      for (auto& x : v) x = static_cast<float>(x / norm);
    }
    r.embeddings.push_back(std::move(v));
    r.prompt_tokens += static_cast<int>(input.size());
  }
  if (rc == 0) llama_memory_clear(llama_get_memory(ctx_), true);
  r.prompt_ms = MsSince(t0, Clock::now());
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (r.status.ok()) ++completed_;
    else if (r.status.code() == StatusCode::kCancelled) ++cancelled_;
    else ++failed_;
  }
  ReleaseReservation(*job);
  // The worker's state first (a lost device marked), then the answer: a
  // client told "device lost" that asks /health at once hears it too.
  if (rc != 0) HandleDecodeFailure(rc, what);
  job->on_done(std::move(r));
}

}  // namespace spillway::worker
