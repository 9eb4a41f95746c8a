// One admission of one request (its lifecycle builds one each time it asks): where it
// runs, when, or why not. Its steps:
//
//   Refusals first   a batch service outside its window that would rather
//                    wait; no placement admitted to run at all; every
//                    placement failing to start
//   The line         a new request takes its place at the end of the
//                    service's line (capacity_signal.h); only the head decides
//   Take a slot      embeddings, and a lone placement that cannot shrink:
//                    the worker checks its own KV pool, so the request only
//                    waits for a free slot (Slot); an embedding bound for
//                    the CPU path waits for its turn in that path's line too
//   Decide           otherwise: the prompt's tokens counted by a worker, a
//                    snapshot of the board for the pure admission::Decide,
//                    the CPU path's rules (admission/cpu_path.h) when it
//                    chose a placement there, then the decision committed
//                    with a reservation (which may lose a race: decided
//                    again) (Decided)
//
// It waits (woken by releases, starts and exits, or its deadline) while the
// answer is delay, telling the caller why before every round; behind others
// in the line it sleeps until it is the head. A request that is not
// admitted leaves the CPU line and the service's line (the destructor).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gateway/capacity_signal.h"
#include "gateway/gateway.h"
#include "gateway/gateway_internal.h"

namespace spillway::gateway {

class RequestAdmission {
 public:
  using OnWait = std::function<void(const std::string&, double)>;
  // One admission of `rec` for one attempt, run by Run(): it chooses a
  // placement (the admission decision) and reserves its cells, delaying
  // inside. False when the request is rejected: `rejected` says why, and
  // `reject_decision` is the decision to journal (JSON; empty when none).
  // Writes nothing to the journal itself.
  // `excluded`: placements that already failed this request (ignored when no
  // other placement could take it).
  // `on_wait(note, est_s)` is called before every round spent waiting.
  // `first`: the request has not run an attempt yet, so it takes its place
  // at the end of the service's line (capacity_signal.h); a retry (after a
  // failure, or a worker that answered busy) does not queue behind newer ones.
  // `accepted`: the gateway took the request on already (an attempt of it
  // failed, or it was recovered from the journal after a restart): bounds
  // that refuse new load do not refuse it (a full CPU line, max_delay_s, the
  // 60 s a line may stand still, a batch window that closed meanwhile); its
  // deadline, its cancel, the gateway's bound on an answer (AcceptedCapMs),
  // a start that does not come within its bound, and a size nothing can
  // hold do.
  // The caller keeps it (and what it refers to) until Run's awaitable is done.
  RequestAdmission(Gateway& g, const journal::RequestRecord& rec, const config::ServiceConfig& svc, Gateway::Live& live,
                   const std::vector<bool>& excluded, Gateway::Target* target, Status* rejected,
                   std::string* reject_decision, const OnWait& on_wait, bool first, bool accepted);
  ~RequestAdmission();
  RequestAdmission(const RequestAdmission&) = delete;
  RequestAdmission& operator=(const RequestAdmission&) = delete;

  // `ex`: the calling coroutine's executor (where its waits are woken). Not
  // a coroutine itself: the one it returns is the admission's way (Slot or
  // Decided), a frame less on every request's way.
  boost::asio::awaitable<bool> Run(const boost::asio::any_io_executor& ex);

 private:
  // Refused before any wait (*rejected_ says why), or Ok.
  bool RefusedAtOnce();
  // Which placements are held back now (unloading, outside its window, no room).
  void RefreshHeld();
  bool Startable(size_t k) const;
  // Placement k is of another model than the one a cut stream goes on with (Live::only_model).
  bool OtherModel(size_t k) const;
  // Whether placement k's worker is ready (serving now), as LineWaitS asks it.
  std::function<bool(size_t)> serving_now() const;
  // Starts the on-demand placements that may serve (as things are now); the
  // CPU path's replicas only with `cpu_path_too`, or when no accelerator
  // placement may come up.
  void DemandAll(bool cpu_path_too = true);
  // Starts on-demand placement `k` for this request (touched: not released as idle before it arrives).
  void Demand(size_t k);
  // Admitted: the board counts the attempt as holding the placement, taken
  // on its worker process `generation` (PlacementBoard::Placement::generation).
  void Hold(uint64_t generation);
  void JoinLine(const boost::asio::any_io_executor& ex);  // (woken on `ex`: the coroutine's)
  void LeaveServiceLine();
  // Cancelled, or past its deadline (*rejected_ says which).
  bool Stopped();
  boost::asio::awaitable<void> Wait(std::chrono::milliseconds bound);
  // Behind others in the line: until it is the head (told where it stands),
  // its deadline, `cap_ms` or a stream's next wait comment. False (with
  // *rejected_) when it stops waiting.
  boost::asio::awaitable<bool> WaitBehind(int64_t cap_ms);
  // How long it has waited since a worker of its service was first seen up,
  // or since the service's line last moved (a request admitted), whichever
  // is later (0 while none has been up): the waits for a slot or a decision
  // count from there, and a start's own time only against the start timeout
  // (Gateway::StartTrouble). Requests recovered after a restart, or sent
  // while a model loads, ended failed at 60 s while it loaded within its
  // start_timeout_s.
  int64_t WaitedSinceUp();
  // How long an accepted request may wait for room (`accepted`): the
  // gateway's bound on an answer without a deadline (an hour), as it would
  // wait for its worker's answer; its deadline, when it has one, comes first.
  int64_t AcceptedCapMs() const;
  // Embeddings and a lone placement: a free slot is all it waits for.
  boost::asio::awaitable<bool> Slot();
  // An embedding's turn in the CPU path's line for placement `i` (kReject:
  // *rejected_ and *reject_decision_ say why; kWait: `note` and the estimate).
  enum class CpuStep { kGo, kWait, kReject };
  CpuStep CpuLineStep(size_t i, std::string* note, double* est_wait_s);
  // Counted, decided, committed.
  boost::asio::awaitable<bool> Decided();
  // The prompt's size in tokens from a ready worker (-1: none could say).
  // False when the prompt is refused as invalid.
  // `truncating`: a chat with "truncate", whose count may render it a few
  // times over (chat_fit.h), and is given three times as long. Such a chat
  // is cut for the context of the first admitted placement of the counting
  // worker's model, or for `cap_cells` when that is less (a recount).
  boost::asio::awaitable<bool> CountPrompt(const std::string& endpoint, int* prompt_tokens, bool truncating,
                                           uint32_t cap_cells = 0);
  // A chat cut for a context that no placement usable now offers (the one it
  // was cut for failed this request, or is down: its worker restarting, its
  // breaker open) while a placement of its model with less room, too little
  // for `need` (the prompt as counted and its least answer), is usable now:
  // that one's context, to count the chat again for (more of its oldest
  // messages left out, as its answer says). 0 otherwise, and always once any
  // of it reached its client: a continuation reads the prompt its stream
  // began with.
  uint32_t RecountCells(const std::vector<admission::PlacementView>& views, uint64_t need) const;
  // The smallest request capacity above `cells` among the admitted
  // placements of `model`; 0 when none is larger.
  uint32_t NextLargerCells(const std::string& model, uint32_t cells) const;
  // The most cells one request may hold on any admitted placement (on the
  // primary alone, with `primary_only`): past it, a prompt and its least
  // answer can never run here (OpenAI's context_length_exceeded).
  uint32_t LargestCells(bool primary_only) const;

  Gateway& g_;
  const journal::RequestRecord& rec_;
  const config::ServiceConfig& svc_;
  Gateway::Live& live_;
  const std::vector<bool>& excluded_;
  Gateway::Target* t_;
  Status* rejected_;
  std::string* reject_decision_;
  const OnWait& on_wait_;
  const bool first_;
  const bool accepted_;
  CapacitySignal& signal_;
  // The placements' fixed parts (key, config, start-up admission); what
  // changes (pools, breakers, throughput) is read through the board's views.
  std::vector<const PlacementBoard::Placement*> states_;
  const int64_t t0_;
  int64_t up_since_ = 0;  // (WaitedSinceUp)
  bool chose_stopped_ = false;  // a decision chose a stopped on-demand placement, started for it (Decided)
  std::vector<Gateway::Hold> holds_;
  std::vector<bool> held_;
  // Its place in the service's line, while it has one: known to its Live,
  // so that a cancel wakes it alone.
  std::unique_ptr<CapacitySignal::Ticket> ticket_;
  int64_t told_place_ms_ = -1;
  uint64_t line_need_ = 1;  // its cells, as last decided: what its wait in line is estimated for (WaitBehind)
  bool admitted_ = false;
};

}  // namespace spillway::gateway
