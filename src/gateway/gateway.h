// The gateway's HTTP surface and request lifecycle.
//
//   POST /v1/chat/completions, /v1/completions, /v1/embeddings   (model = service name)
//   POST /v1/audio/transcriptions, /v1/audio/translations, /v1/audio/speech,
//        /v1/images/generations, /v1/rerank     external services (gateway_external.cpp),
//        as are the three above when their model names one
//   GET  /v1/models
//   GET  /v1/requests/{id}      state, placement, attempts, stored result
//   DELETE /v1/requests/{id}    cancel, queued or running
//   GET  /healthz  /readyz  /metrics  /v1/status
//   GET  /v1/requests           the caller's requests in flight and waiting
//   GET  /v1/events             Server-Sent Events: status snapshots and incidents (event_feed.h)
//   GET  /, /ui/...             the dashboard (compiled-in files, ui/assets.h)
//   /api/chat, /api/generate, /api/embed, /api/embeddings, /api/tags, /api/show,
//   /api/ps, /api/version       Ollama's API (gateway_ollama.cpp): translated into the
//                               OpenAI requests above, which take the same lifecycle
//
// Lifecycle of a request: parsed and checked on the connection's strand, then
// run as a coroutine on a strand of its own (no thread per request: an open
// stream costs a coroutine frame and two sockets). It is journaled (before
// any acceptance reaches the client; journal writes run on a small blocking
// pool, never on an I/O thread), waits for capacity on a CapacitySignal
// (woken when an attempt releases its cells or a worker comes or goes, never
// a sleep loop), runs attempts on the placements admission chooses from a
// snapshot of the PlacementBoard (each by an AttemptRunner over async
// keep-alive connections, see upstream/connection_pool.h), journals the
// terminal state with the answer, and only then answers (through its
// ReplyWriter). Streams are relayed as they arrive and stored once finished.
// Workers are reached through upstream::Workers (the Supervisor, or fakes in
// tests).
#pragma once

#include <utility>  // before Asio's awaitable.hpp, which uses std::exchange without it (Boost 1.74)

#include <nlohmann/json.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <atomic>
#include <functional>
#include <optional>
#include <deque>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <string_view>

#include "api/http_server.h"
#include "common/clock.h"
#include "common/thread_pool.h"
#include "config/config.h"
#include "admission/admission.h"
#include "admission/eviction.h"
#include "gateway/attempt_bounds.h"
#include "gateway/cancel_cause.h"
#include "gateway/capacity_signal.h"
#include "gateway/event_feed.h"
#include "gateway/external_lines.h"
#include "gateway/external_route.h"
#include "gateway/incidents.h"
#include "gateway/metrics.h"
#include "failover/breaker.h"
#include "gateway/placement_admission.h"
#include "gateway/placement_board.h"
#include "memory/ledger.h"
#include "models/model_info.h"
#include "journal/journal.h"
#include "upstream/connection_pool.h"
#include "scheduler/cpu_queue.h"
#include "upstream/workers.h"

namespace spillway::api {
struct OllamaCall;  // api/ollama_request.h
}  // namespace spillway::api

namespace spillway::devices {
struct DeviceReading;  // devices/telemetry.h
}  // namespace spillway::devices

namespace spillway::gateway {

class PendingStatus;  // offload.h
class ReplyWriter;    // reply_writer.h

// The supervisor key of an external service's server ("<name>.ext"), and
// the external service a supervisor key belongs to (null: none).
std::string ExternalKey(const config::ExternalConfig& e);
const config::ExternalConfig* ExternalOfKey(const config::GatewayConfig& config, const std::string& key);
// The service and placement index of a worker key; false when no placement
// has it (placement_admission.cpp).
bool FindPlacement(const config::GatewayConfig& cfg, const std::string& key, const config::ServiceConfig** s,
                   size_t* i);
// Whose a supervisor key is: a model service's placement (`svc`, `index`)
// or an external server (`external`), its device and residency; nullopt
// when neither (gateway_external.cpp).
struct KeyOwner {
  std::string service;
  std::string device;
  const config::ResidencyConfig* residency = nullptr;
  const config::ServiceConfig* svc = nullptr;
  size_t index = 0;
  const config::ExternalConfig* external = nullptr;
};
std::optional<KeyOwner> OwnerOfKey(const config::GatewayConfig& cfg, const std::string& key);

// The dashboard's paths (/, /ui, /ui/...) and their compiled-in files (gateway_ui.cpp).
bool IsUiPath(const std::string& path);
http::Response UiResponse(const std::string& path, unsigned version);

class Gateway {
 public:
  // `admissions`: the placement-level decisions (AdmitPlacements); a refused
  // placement has no worker and takes no requests.
  Gateway(const config::GatewayConfig& config, journal::Journal& journal, upstream::Workers& supervisor,
          const Clock& clock, std::map<std::string, PlacementAdmission> admissions = {});
  ~Gateway();

  // Requests run as coroutines on `io` (a strand each); `recovered`, what the
  // journal recovered after a crash, is re-run (no client attached). Before
  // the server listens.
  void Start(boost::asio::any_io_executor io, std::vector<journal::RequestRecord> recovered);
  void Handle(http::Request req, std::shared_ptr<http::Exchange> ex);
  // The answer that refuses `req` for its Host, Origin or key (none: it may
  // go on). Handle asks it, and the server with each head that declares a
  // body (ServerOptions::check_head), before the body's memory is reserved.
  std::optional<http::Response> AccessRefusal(const http::RequestHead& req) const;
  // A worker became ready: requests waiting for it decide again at once, and
  // its placement's open breaker lets the next one probe it (a new process).
  void WorkerReady(const std::string& key);
  // The supervisor's start gate (start_gate.cpp): may `key` (a placement's
  // worker or an external server) start now? Asked of every start, restarts
  // included, against fresh telemetry, so that memory taken by others
  // meanwhile keeps a worker from restarting into an allocation failure:
  // the placement's calibrated prediction (AdmitPlacement, beside the
  // starts let through moments ago: PendingStarts) and the device's own
  // view (RoomFor: who gives room). Ok: let through (RoomGranted).
  // Unavailable: asked again next round; otherwise refused for now.
  // Idle services unloaded to make room are waited for (their processes'
  // end, up to 2 s each) without the device's check held, so that the
  // requests' room checks there go on meanwhile, and the start is then
  // judged again on what they gave back. Supervisor thread.
  Status StartGate(const std::string& key, PlacementCalibration* calibration);
  // Who a start of `key` is for, as the gate weighs it (admission::Demand):
  // whether requests wait for it, how much it is used, how long its oldest
  // request has waited. `released_idle`: its worker was unloaded when idle.
  admission::Demand LoadDemand(const std::string& key, bool released_idle = false);
  // `demand` (of `key`, `service` at `priority`), with no wait for a turn
  // when another service waiting for the device (`wanting`: keys whose start
  // is due) has waited longer and the turn would let it load (Demand::turn_of).
  admission::Demand TurnAmongWaiters(const std::string& key, const std::string& service, int priority,
                                     admission::Demand demand, const std::set<std::string>& wanting,
                                     const std::vector<admission::Resident>& residents, uint64_t available);
  // One judgment of StartGate's, with the device's check held; the idle
  // victims it released (RoomFor) in `unloading`.
  Status JudgeStart(const std::string& key, PlacementCalibration* calibration, std::vector<std::string>* unloading);
  // The starts the gate let through whose spawn has not happened yet: in
  // `workers` (a supervisor snapshot) still waiting to be spawned, no
  // process, no spawn tried since. They hold nothing on their device yet
  // and will take all they need. (A worker loading now is not among them:
  // its device shows what it has loaded, and RoomFor counts the rest.)
  std::set<std::string> PendingStarts(const std::vector<upstream::WorkerView>& workers) const;
  // Residency (gateway_residency.cpp). The supervisor's start gate asks
  // before `key` loads onto an accelerator: Ok when `need_bytes` fit there
  // now; otherwise why not, after choosing who gives room (admission/
  // eviction.h): the victims unload as soon as they are idle (their new
  // requests go elsewhere meanwhile), each decision journaled as an event,
  // and the gate asks again. `starting`: keys the gate let start that have no
  // process yet (an exclusive device counts them as loading). On an exclusive
  // device the loads wait their turn, first come first served (Unavailable:
  // asked again next round). `demand`: whether a request waits for this
  // load (not: an on-demand load asked again after its requests went
  // elsewhere, which unloads a service of its own priority only when that
  // one is used less; eviction.h). Idle victims are released here and
  // added to `unloading` when given (their processes may not have ended
  // yet: the caller waits for them, StartGate), the answer then "making
  // room". Supervisor thread.
  Status RoomFor(const std::string& key, uint64_t need_bytes, const std::set<std::string>& starting = {},
                 admission::Demand demand = {}, std::vector<std::string>* unloading = nullptr);
  // The gate let `key` start, expecting it to hold `bytes` (its calibrated
  // prediction; 0: not known): no longer held back for want of room, and
  // counted as loading on its device from now, before its process exists
  // (LoadingBytesOn), at those bytes (ExpectedBytes).
  // `attempts`: its worker's spawn attempts so far, in the gate's snapshot
  // (one more is the spawn it was let through for).
  void RoomGranted(const std::string& key, uint64_t bytes, int attempts);
  // The longest a start the gate let through counts as about to load
  // without its spawn being seen (a safety net: a round spawns what its
  // gate let through once its last gate call returns, and one gate call
  // may wait seconds for a victim's release, or minutes for a dry run).
  static constexpr int64_t kGrantedSpawnMs = 300'000;
  // What an external server holds on its device: measured once seen, else declared.
  uint64_t ExternalResidentBytes(const config::ExternalConfig& e) const;
  // What the worker or external server under `key` is expected to hold on
  // its device once loaded (what the gate last let it start with,
  // calibrated; else its admission's prediction at start; an external
  // server's measured or declared resident bytes).
  uint64_t ExpectedBytes(const std::string& key) const;
  // The gateway's own bounds on an attempt (defaults: an hour; 600 s of a
  // stream's silence). Before Start; tests step them down.
  void SetAttemptBounds(AttemptBounds bounds) { attempt_bounds_ = bounds; }
  // After the I/O threads have stopped, before the I/O context is destroyed:
  // finishes blocking work and drops what holds I/O objects.
  void Shutdown();
  // A graceful stop begins (SIGTERM): new requests are refused with 503 and
  // Retry-After, those under way go on. LiveRequests: how many are under way
  // (accepted, not ended), for the stop to wait on.
  void BeginStop() { stopping_ = true; }
  // Why a new request (or an Ollama model load) is refused while stopping.
  static Status StoppingRefusal() {
    return Status::Unavailable("the gateway is stopping (it lets the requests under way finish first); send it again "
                               "once it is back")
        .WithRetryAfter(5);
  }
  size_t LiveRequests() const;
  // The stop's grace has passed: every request still under way is cancelled
  // and ends as RequestLifecycle::EndForStop says (an external service's, as
  // its route's `stopped` says): its client hears why, and what the next
  // start does with it. Returns how many.
  size_t CutForStop();

 private:
  friend class RequestLifecycle;  // one request's life (request_lifecycle.h)
  friend class RequestAdmission;  // one admission of one request (request_admission.h)
  struct Live;
  struct Incoming;
  struct Target;
  // Whether a request may wait in a service's CPU line (see scheduler/cpu_queue.h).
  enum class CpuGate { kGo, kWait, kReject };
  // For a decision that chose a CPU-path placement: applies the CPU path's
  // limits (lowering d->max_tokens, said in *limits), and takes the
  // request's place in line (under the board's lock).
  // `failover`: the request ran an attempt elsewhere already (it joins a full line: CpuQueue::Join's past_bound).
  CpuGate CpuPathGate(const journal::RequestRecord& rec, bool failover, const config::ServiceConfig& svc, admission::Decision* d,
                      int prompt_tokens, std::string* limits, std::string* note, double* est_wait_s, Status* rejected);
  CpuGate CpuPathGateLocked(const journal::RequestRecord& rec, bool failover, const config::ServiceConfig& svc,
                            PlacementBoard::Locked& board, admission::Decision* d, int prompt_tokens,
                            std::string* limits, std::string* note, double* est_wait_s, Status* rejected);
  // The CPU replicas' resident bytes in the service's line (under the board's lock).
  void RefreshCpuResident(const config::ServiceConfig& svc, PlacementBoard::Locked& board);
  // Whether an idle on-demand worker is stopped now (the supervisor asks):
  // a CPU replica after idle_unload_s, an accelerator placement or external
  // server after keep_alive_s, at once when evicted or outside its window.
  bool IdleReplica(const std::string& key);
  // How long an accelerator placement of `svc` stays loaded once idle (on
  // demand): the last Ollama request's keep_alive, else keep_alive_s
  // (INT64_MAX: for good).
  int64_t KeepAliveMs(const config::ServiceConfig& svc) const;
  // Whether the worker or external server `key` is being evicted (it takes no new requests).
  bool Evicting(const std::string& key);
  // Whether accelerator placement `k` of `svc` takes no new requests now,
  // and why (in words too, when `why` is given).
  enum class Hold { kNone, kUnloading, kNoRoom, kOutsideWindow };
  Hold HeldBack(const config::ServiceConfig& svc, size_t k, std::string* why) const;
  // A batch/background service outside its windows (or interactive work not idle long enough): why.
  bool OutsideWindow(const config::ResidencyConfig& r, std::string* why, int* opens_in_s = nullptr) const;
  // A residency decision: printed, kept for /v1/status, journaled as an event.
  void NoteResidency(const std::string& kind, const std::string& service, nlohmann::json detail);
  // Keeps an event for /v1/status (the last kRecentEvents).
  void KeepEvent(nlohmann::json detail, int64_t at_ms);
  static constexpr size_t kRecentEvents = 50;
  // A request for `service` begins (request rates for eviction costs; interactive idleness for windows).
  bool CountRequest(const std::string& service);  // true: an interactive service's
  double RequestsPerMinute(const std::string& service) const;
  int64_t LastRequestMs(const std::string& service) const;  // 0: none in the rate window
  nlohmann::json ResidencyJson();
  // From the answer's timings header when it has one (see protocol::Timings), else from its body.
  void RecordThroughput(const std::string& service, size_t index, const std::string& body,
                        std::string_view timings_header = {});
  // Why no worker of the service can take a request now, when that is final
  // enough to answer: every runnable placement failed to start twice, or the
  // request has waited (`waited_ms`) past the longest start timeout. Ok while
  // a start may still succeed.
  // `only_model`: a cut stream goes on only with that model (Live::only_model):
  // another model's placements, ready or not, give it no hope.
  Status StartTrouble(const config::ServiceConfig& svc, int64_t waited_ms, const std::string& only_model = "");
  // What a request waiting for a start is told ("sim:0/99 is starting (3 s of its 120 s start timeout)").
  std::string StartingNote(const config::ServiceConfig& svc);
  // Whether a request of `service` waits for a place to run (queued, or
  // queued again after a failed attempt, or in an external server's line).
  bool AnyoneWaits(const std::string& service);
  // How long the oldest of `service`'s queued requests has waited (0: none
  // waits); a busy peer's turn on a device ends by it (admission::Demand).
  int64_t OldestWaitMs(const std::string& service);
  // The longest start timeout of the service's runnable placements (of `only_model`'s, when given).
  int64_t StartWaitMs(const config::ServiceConfig& svc, const std::string& only_model = "");
  // Gives back what an attempt held (cells, its place in the CPU line, a
  // probe it held without a result). `keep_cpu_turn`: its CPU worker found
  // busy, it is sent again and keeps its turn in the CPU line.
  void ReleaseTarget(const std::string& service, const std::string& id, Target* target, bool keep_cpu_turn = false);
  // Request `id`'s stream reached an attempt's first event on `target`: a
  // half-open breaker it probes closes (PlacementBoard::Answering).
  void FirstEvent(const std::string& service, const std::string& id, const Target& target);
  // An attempt on `target` succeeded: a half-open breaker closes.
  void AttemptSucceeded(const std::string& service, const Target& target);
  // Wakes the requests waiting for what a breaker let through again: the
  // service's, or every service's for a device's breaker.
  void Wake(const std::string& service, PlacementBoard::Closed what);
  // The supervisor saw a worker exit or replaced it: its breaker opens (and its
  // device's, when the device was lost), even with no request in flight.
  void WorkerExited(const std::string& key, const std::string& why);
  // A request's JSON body within the configured limits (api/json_limits.h).
  // `extra_depth`: levels beyond json_max_depth that a translation added
  // (the client's own body was checked against the limit).
  StatusOr<nlohmann::json> ParseBody(const http::Request& req, int extra_depth = 0) const;
  // `on_accepted` runs once the request is taken as new (after every check
  // that may refuse it, and not for an Idempotency-Key's replay).
  void HandleGeneration(http::Request& req, std::shared_ptr<http::Exchange> ex, const std::string& endpoint,
                        std::function<void()> on_accepted = {}, int extra_depth = 0);
  // What every accepted request takes from its head: its id (ours or the
  // client's X-Request-Id), client and place among its client's requests
  // (`peer`: the client's address), Idempotency-Key, X-Request-Timeout. A
  // refusal says why.
  Status Intake(const http::Request& req, const std::string& peer, Incoming& in);
  // External services (gateway_external.cpp): a request to one of
  // config::ExternalRoutes() for them (a POST: Handle sends other methods
  // to their 405), proxied with its body untouched.
  // `fields`: the body's model and stream when already read (ExternalFieldsFor).
  void HandleExternal(http::Request& req, std::shared_ptr<http::Exchange> ex, const std::string& path,
                      std::optional<RequestedFields> fields = std::nullopt);
  boost::asio::awaitable<void> RunExternal(journal::RequestRecord rec, std::shared_ptr<http::Exchange> ex,
                                           std::shared_ptr<Live> live, bool unjournaled);
  // Waits until the request may run at `svc`: a server that is up (started
  // on demand), its turn in the service's line (*running once taken), room
  // on the device for its transient peak. The port, or why it ends here:
  // Cancelled, DeadlineExceeded, or how long it waited for what.
  boost::asio::awaitable<StatusOr<uint16_t>> AwaitExternalTurn(const journal::RequestRecord& rec,
                                                               const config::ExternalConfig& svc, Live& live,
                                                               bool* running, bool* took_room);
  // The body's fields when a chat, completion or embedding request's model
  // names an external service (read once: HandleExternal takes them).
  std::optional<RequestedFields> ExternalFieldsFor(const http::Request& req) const;
  // The port of an external service that can take a request now.
  std::optional<uint16_t> ExternalPort(const config::ExternalConfig& e) const;
  // Whether its device has room for one more request's transient peak (the reason when not).
  Status TransientRoom(const config::ExternalConfig& svc);
  // One request's transient peak on an external server: measured once seen, else declared.
  uint64_t PeakOf(const config::ExternalConfig& e) const;
  // The peaks of the external requests sent on `device` with room for them
  // that `reading` does not show them holding yet (they may not have
  // allocated yet). `workers`: the supervisor's snapshot.
  uint64_t SentPeaksOn(const std::string& device, const devices::DeviceReading& reading,
                       const std::vector<upstream::WorkerView>& workers) const;
  // What the processes still loading on `device` will take beyond what
  // `reading` shows them holding.
  uint64_t LoadingBytesOn(const std::string& device, const devices::DeviceReading& reading,
                          const std::vector<upstream::WorkerView>& workers) const;
  // Wakes the waiters of every external service on `svc`'s device (only its
  // own on the CPU): room there, and its room checks, are the device's.
  void WakeDevicePeers(const config::ExternalConfig& svc);
  // /v1/status's entries for the external services.
  nlohmann::json ExternalsJson() const;
  // Ollama's routes (gateway_ollama.cpp): a generation is translated
  // (api/ollama_request.h) and handed to HandleGeneration with an exchange
  // that translates its answer back (gateway/ollama_exchange.h).
  void HandleOllama(http::Request& req, std::shared_ptr<http::Exchange> ex, const std::string& path);
  void HandleOllamaGeneration(http::Request& req, std::shared_ptr<http::Exchange> ex, const std::string& path);
  // The service an Ollama model name means ("chat", "chat:latest"); null when none.
  const config::ServiceConfig* OllamaService(const std::string& model) const;
  // What one request may hold on placement i of `svc` (Ollama's num_ctx, the
  // dashboard's limit): its slot's share of the pool; for an embedding model
  // the whole pool (embeddings run one at a time on a cleared cache), within
  // the positions it was trained on, as its worker reads it
  // (Engine::EmbeddingInputLimit). It said half of what the worker took.
  int RequestContext(const config::ServiceConfig& svc, size_t i) const;
  // Ollama's 400 for thinking or tools asked of a model whose template has none.
  Status OllamaCapable(const config::ServiceConfig& svc, const api::OllamaCall& call) const;
  // /api/tags, /api/show, /api/ps: blocking (model files, worker info), never on an I/O thread.
  nlohmann::json OllamaTags() const;
  StatusOr<nlohmann::json> OllamaShow(const config::ServiceConfig& svc) const;
  nlohmann::json OllamaRunning() const;
  boost::asio::awaitable<void> Process(std::shared_ptr<Incoming> in);
  // `unjournaled`: the request is not in the journal yet (see Process); Run
  // writes its Accept. `rec` is taken (moved into the request's lifecycle),
  // not copied: it must outlive the call, as a caller that awaits it keeps it.
  boost::asio::awaitable<void> Run(journal::RequestRecord&& rec, std::shared_ptr<http::Exchange> ex,
                                   std::shared_ptr<Live> live, bool unjournaled = false);
  // Starts a coroutine on `where` (a client connection's strand, so that a
  // request's answer needs no hop to another thread), else on a strand of
  // its own; an exception is logged.
  void Spawn(boost::asio::awaitable<void> task, boost::asio::any_io_executor where = {});
  // `task` run at once, up to its first wait, when this thread is the loop
  // `where` runs on (else, and with another Boost than Debian's, Spawn).
  void StartHere(boost::asio::awaitable<void> task, boost::asio::any_io_executor where);
  // Blocking work (journal reads, status snapshots) off the I/O threads.
  template <typename F>
  boost::asio::awaitable<std::invoke_result_t<F&>> Blocking(F f);
  // A journal write: `start(done)` calls one of the journal's ...Async forms;
  // the result is awaited on the caller's strand.
  template <typename F>
  boost::asio::awaitable<Status> Journaled(F start);
  // The end of request `id` could not be written (`why`: the journal cannot
  // write). Journal first, then the client: an answer not sent yet is
  // withheld (the client hears 503, since a crash could lose it); a stream's
  // events went out as they came (covered by its first commit). The end is
  // recorded as that 503 once the journal writes again, on a task of its
  // own on `where` (the request's end does not wait for the disk).
  void WithholdUnrecorded(const Status& why, const std::string& id, ReplyWriter& reply,
                          boost::asio::any_io_executor where);
  // What the client of request `id` hears when the journal could not record
  // `what` (why: the journal cannot write) and `withheld` follows: the
  // request is still held as not ended, a restart before its end is recorded
  // runs it again, and how to tell when sending it again is safe.
  static Status Unrecorded(const Status& why, const std::string& id, std::string_view what,
                           std::string_view withheld);
  // WithholdUnrecorded's task: tries every unwritable_retry_ms.
  boost::asio::awaitable<void> RecordEndWhenWritable(std::string id, journal::State state, Status told);
  // Runs `f` on the blocking pool, detached (a handler that touches the journal).
  void PostBlocking(std::function<void()> f);
  // /v1/status and /readyz ask each worker and probe the journal's disk: a
  // pool of their own, so that a hung worker or a flood of status calls never
  // delays a journal commit.
  void PostStatus(std::function<void()> f);
  CapacitySignal& SignalFor(const std::string& service);
  // Who is asking: `client` owns the requests it makes (the hash of its key,
  // or "anonymous"); `sees_all` (no keys configured, or an operator key) may
  // see and cancel every client's requests.
  struct Caller {
    std::string client;
    bool sees_all = false;
  };
  // GET / DELETE /v1/requests/{id}: another client's request is a 404.
  void HandleRequestQuery(const std::string& id, bool cancel, const Caller& caller, std::shared_ptr<http::Exchange> ex,
                          unsigned v);
  // A live request's state for `rec` (received at `now_ms`), not yet registered.
  std::shared_ptr<Live> MakeLive(const journal::RequestRecord& rec, int64_t now_ms) const;
  // `cause`: why, if it is the first to cancel it (Live::cancel_cause).
  void Cancel(const std::shared_ptr<Live>& live, CancelCause cause = CancelCause::kAsked);
  // The request running here under `id`, when `caller` may see it (null otherwise).
  std::shared_ptr<Live> LiveFor(const std::string& id, const Caller& caller);
  std::string NewRequestId();
  std::string ClientOf(const http::Request& req) const;
  Caller CallerOf(const http::Request& req) const;
  bool KeysRequired() const;
  // The request's Origin when it is one of allowed_origins (its answer then
  // carries CORS headers, cors_exchange.h); "" otherwise.
  std::string CorsOrigin(const http::RequestHead& req) const;
  Status CheckAccess(const http::RequestHead& req, bool needs_key) const;
  // Whose max_requests_per_key places a request takes: its API key's where
  // keys are required; else its address's (without keys the Authorization
  // header proves nothing, and a client that varied it had a cap of its own
  // for each value).
  std::string SlotOwner(const std::string& client, const std::string& peer) const;
  // One of the owner's max_requests_per_key places, held until the returned
  // handle is destroyed; null when the owner has them all.
  std::shared_ptr<void> TakeClientSlot(const std::string& owner);
  // A place among waiting_ and a service's waiting requests (counted
  // already), given back when the returned handle goes.
  std::shared_ptr<void> QueuePlace(std::atomic<int>& service_waiting);
  nlohmann::json StatusJson() const;
  // GET /readyz: 200 when every service has a worker that can serve and the journal can write.
  http::Response ReadyResponse(unsigned v);
  std::string RenderMetrics() const;

  // What a person reads (gateway_view.cpp, gateway_events.cpp): the status
  // with each device's memory by service, the live requests and what serves
  // each service; blocking (worker and journal reads), never on an I/O thread.
  nlohmann::json StatusView();
  nlohmann::json LiveRequestsJson();  // each carries "_client" (its owner) for ViewFor
  nlohmann::json DevicesJson(const nlohmann::json& status);
  void AddServiceViews(nlohmann::json& status, const nlohmann::json& requests);
  // The event feed starts with Start() and stops in Shutdown().
  void StartEvents();
  void StopEvents();
  void OnTransition(const journal::Transition& t);  // the journal's observer
  void LogTransition(const journal::Transition& t, const journal::RequestRecord* rec);  // --log-format json
  void HandleEvents(const Caller& caller, std::shared_ptr<http::Exchange> ex, unsigned v);
  void HandleStatusView(const Caller& caller, std::shared_ptr<http::Exchange> ex, unsigned v);
  void HandleRequestList(const Caller& caller, std::shared_ptr<http::Exchange> ex, unsigned v);

  const config::GatewayConfig& config_;
  journal::Journal& journal_;
  upstream::Workers& supervisor_;
  const Clock& clock_;
  Metrics metrics_;
  std::optional<boost::asio::any_io_executor> io_;
  ThreadPool blocking_{16, "gateway's blocking-work", "sw-blocking"};
  ThreadPool status_pool_{2, "gateway's status", "sw-status"};
  upstream::ConnectionPool pool_;
  AttemptBounds attempt_bounds_;
  // Woken when capacity may have changed, per service (an attempt released
  // its cells or slot, a worker came or went, a request was cancelled).
  std::map<std::string, std::unique_ptr<CapacitySignal>> signals_;
  // Accepted requests not yet running their first attempt (max_queue bounds them).
  std::atomic<int> waiting_{0};
  std::atomic<bool> stopping_{false};  // BeginStop
  std::map<std::string, std::unique_ptr<std::atomic<int>>> waiting_by_service_;  // of waiting_, by llama service
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Live>> live_;
  std::map<std::string, int> in_flight_by_client_;  // guarded by mu_
  std::mt19937_64 rng_;  // seeds only (they are returned to clients); ids come from RandomHex
  // Every placement's and device's run-time state, behind one lock.
  PlacementBoard board_;
  std::unique_ptr<ExternalLines> external_lines_;  // each external service's own queue and concurrency
  // Residency state (gateway_residency.cpp), under residency_mu_.
  mutable std::mutex residency_mu_;
  std::set<std::string> evicting_;      // keys chosen to give room: unloaded once idle
  std::set<std::string> room_refused_;  // keys whose start found no room (and no one to evict)
  struct Granted {
    uint64_t bytes = 0;
    int64_t at_ms = 0;
    int attempts = 0;  // its worker's spawn attempts then: one more is the spawn it was let through for
    bool pending = true;  // not refused by a later gate call (its bytes stay: ExpectedBytes)
  };
  std::map<std::string, Granted> granted_;  // what the gate last let each key start with (RoomGranted)
  // Keys waiting for their turn on an exclusive device: the device, since when.
  std::map<std::string, std::pair<std::string, int64_t>> exclusive_waits_;
  std::map<std::string, std::deque<int64_t>> request_times_;  // by service, the last 10 minutes
  std::atomic<int64_t> last_interactive_ms_{0};
  std::atomic<int> interactive_running_{0};  // interactive requests between Run's start and end (OutsideWindow)
  // The last Ollama request's keep_alive, by service: how long its
  // accelerator placements stay loaded once idle (INT64_MAX: kept; 0:
  // unloaded once idle), counted from when the last request ended, as Ollama does.
  std::map<std::string, int64_t> keep_alive_idle_ms_;
  // The last residency events, newest first, as the journal holds them (read
  // once at Start, then kept here): /v1/status never waits for the journal.
  std::deque<nlohmann::json> recent_events_;
  IncidentLog incidents_;
  mutable models::SummaryCache model_summaries_;  // the services' model files, for /api/tags and /api/ps
  RequestIncidents request_incidents_;
  std::unique_ptr<EventFeed> events_;  // last: stopped (and destroyed) before what it samples
};

}  // namespace spillway::gateway
