#include "gateway/request_admission.h"

#include "common/mutation.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "admission/admission.h"
#include "api/json_text.h"
#include "protocol/worker_protocol.h"

namespace spillway::gateway {

namespace {

constexpr int64_t kTokenizeWaitMs = 5000;  // the most a request waits for a worker to count its prompt ...
constexpr int64_t kTokenizeMsPerMiB = 2000;  // ... and more for a long one (a worker counts ~1 MiB of text a second)
constexpr size_t kLongPromptBytes = 1 << 20;  // past this a count that outlasts its wait says the prompt is too long

using nlohmann::json;

bool Goes(admission::Kind k) { return k != admission::Kind::kDelay && k != admission::Kind::kReject; }

}  // namespace

RequestAdmission::RequestAdmission(Gateway& g, const journal::RequestRecord& rec, const config::ServiceConfig& svc,
                                   Gateway::Live& live, const std::vector<bool>& excluded, Gateway::Target* target,
                                   Status* rejected, std::string* reject_decision, const OnWait& on_wait, bool first,
                                   bool accepted)
    : g_(g), rec_(rec), svc_(svc), live_(live), excluded_(excluded), t_(target), rejected_(rejected),
      reject_decision_(reject_decision), on_wait_(on_wait), first_(first), accepted_(accepted),
      signal_(g.SignalFor(svc.name)),
      t0_(g.clock_.NowMs()) {
  for (size_t k = 0; k < svc.placements.size(); ++k) states_.push_back(&g_.board_.placement(svc.name, k));
  holds_.assign(states_.size(), Gateway::Hold::kNone);
  held_.assign(states_.size(), false);
}

RequestAdmission::~RequestAdmission() {
  live_.SetLineWaiter(nullptr);
  // Whatever the outcome, a request that is not admitted holds no place in
  // the CPU line; one that held a place there (cancelled, past its
  // deadline) wakes the line: its next head noticed only at its next poll.
  if (!admitted_ && g_.board_.LeaveCpuLine(svc_.name, rec_.id)) g_.Wake(svc_.name, PlacementBoard::Closed::kPlacement);
}

bool RequestAdmission::RefusedAtOnce() {
  // A batch service outside its window that would rather wait than run on
  // its CPU path is told when to come back (a window may be hours away).
  std::string why;
  int opens_in_s = 0;
  bool accelerator = false;
  for (const auto& p : svc_.placements) accelerator |= p.device != "cpu";
  // (Not one accepted before the window closed: it runs, or waits for the accelerator, as it would have.)
  if (accelerator && !accepted_ && svc_.residency.outside_window == "wait" &&
      g_.OutsideWindow(svc_.residency, &why, &opens_in_s)) {
    *rejected_ = Status::ResourceExhausted("service '" + svc_.name + "' is " + why + " (outside_window = \"wait\")")
                     .WithRetryAfter(std::max(1, opens_in_s));
    return true;
  }
  RefreshHeld();
  // Nothing was admitted to run (the memory is not there): say so at once.
  bool any = false;
  for (const auto& st : states_) any |= st->admission.admitted;
  if (!any) {
    why.clear();  // (the reasons written out only here: every request passes this point)
    for (const auto& st : states_) why += (why.empty() ? "" : "; ") + st->cfg.Name() + ": " + st->admission.reason;
    // Found at start, and so until a restart: no retry helps (a Retry-After
    // of 30 s had SDKs and Ollama clients retry a config error for good).
    *rejected_ = Status::Unavailable("no placement of '" + svc_.name + "' could be started (" + why +
                                     "); fix it and restart the gateway")
                     .WithReason(kServiceUnavailable);
    return true;
  }
  // Nothing can take it now and nothing is about to (only looked at then: not on the hot path).
  bool any_startable = false;
  for (size_t k = 0; k < states_.size(); ++k) any_startable |= states_[k]->admission.admitted && Startable(k);
  if (!any_startable) {
    if (Status st = g_.StartTrouble(svc_, g_.clock_.NowMs() - t0_, live_.only_model); !st.ok()) {
      *rejected_ = st;
      return true;
    }
  }
  return false;
}

// An on-demand replica that is stopped can take requests: it is started
// when chosen. A placement held back (unloading for another service,
// outside its window, no room) takes none while another can.
void RequestAdmission::RefreshHeld() {
  bool other = false;
  for (size_t k = 0; k < states_.size(); ++k) {
    holds_[k] = g_.HeldBack(svc_, k, nullptr);
    held_[k] = holds_[k] != Gateway::Hold::kNone || OtherModel(k);
    other |= !held_[k] && states_[k]->admission.admitted &&
             (g_.supervisor_.ReadyPort(states_[k]->key).has_value() || g_.supervisor_.OnDemand(states_[k]->key));
  }
  // Nothing else can serve: a placement short of room is still waited for.
  if (!other) {
    for (size_t k = 0; k < states_.size(); ++k) {
      held_[k] = held_[k] && (holds_[k] != Gateway::Hold::kNoRoom || OtherModel(k));
    }
  }
}

bool RequestAdmission::OtherModel(size_t k) const {
  return !svc_.Serves(k, live_.only_model);
}

std::function<bool(size_t)> RequestAdmission::serving_now() const {
  return [this](size_t k) { return k < states_.size() && g_.supervisor_.ReadyPort(states_[k]->key).has_value(); };
}

bool RequestAdmission::Startable(size_t k) const {
  return !held_[k] &&
         (g_.supervisor_.ReadyPort(states_[k]->key).has_value() || g_.supervisor_.OnDemand(states_[k]->key));
}

void RequestAdmission::DemandAll(bool cpu_path_too) {
  RefreshHeld();  // as things are now
  // Unloading or outside its window: not started again now. Short of
  // room: asked again, so that it comes back once there is room.
  auto may_start = [&](size_t k) {
    return states_[k]->admission.admitted && holds_[k] != Gateway::Hold::kUnloading &&
           holds_[k] != Gateway::Hold::kOutsideWindow && !OtherModel(k);
  };
  // An accelerator placement comes up (started here, or warm: it starts by
  // itself) unless it is in trouble: its worker failing to start or
  // crashing, or its breaker (or its device's) open, its worker lost. Then
  // the CPU path's replicas are started too: counted as coming up, a dead
  // accelerator kept a stopped on-demand fallback stopped, and every
  // request waited for the start timeout and got a 503 instead of failing
  // over.
  // Held back for want of room (its device full: it may never start) is
  // trouble too; its breaker half-opens after its ejection whether or not
  // it could start. A worker released when idle is not in trouble for what
  // its counters still say of an earlier crash.
  const auto workers = g_.supervisor_.Snapshot();
  auto troubled = [&](size_t k) {
    if (holds_[k] == Gateway::Hold::kNoRoom) return true;
    for (const auto& w : workers) {
      if (w.key != states_[k]->key) continue;
      if (w.state == upstream::WorkerState::kReady) break;
      if (w.state == upstream::WorkerState::kStopped && w.released_idle) break;
      if (w.failed_starts > 0 || w.crash_looping()) return true;
    }
    return !g_.board_.Allows(svc_.name, k);
  };
  bool other_comes_up = false;
  for (size_t k = 0; k < states_.size(); ++k) {
    if (svc_.OnCpuPath(k) || !may_start(k)) continue;
    if (!troubled(k)) other_comes_up = true;
    if (g_.supervisor_.OnDemand(states_[k]->key)) Demand(k);
  }
  for (size_t k = 0; k < states_.size(); ++k) {
    if (!svc_.OnCpuPath(k) || !may_start(k) || !g_.supervisor_.OnDemand(states_[k]->key)) continue;
    if (cpu_path_too || !other_comes_up) Demand(k);
  }
}

void RequestAdmission::Demand(size_t k) {
  // Wanted now: not idle, so the supervisor does not release it again
  // before this request reaches it.
  g_.board_.Touch(svc_.name, k);
  g_.supervisor_.Demand(states_[k]->key);
}

void RequestAdmission::Hold(uint64_t generation) {
  t_->holding = true;
  t_->generation = generation;
  admitted_ = true;
  // The line moved: one of its own was admitted (not a retry, nor one that
  // left it for the CPU path's line: those flowing kept a head that cannot
  // be served waiting for good).
  if (ticket_) signal_.Admitted(g_.clock_.NowMs());
}

void RequestAdmission::JoinLine(const boost::asio::any_io_executor& ex) {
  ticket_ = signal_.Join(ex);
  live_.SetLineWaiter(signal_.Handle(*ticket_));
}

void RequestAdmission::LeaveServiceLine() {
  live_.SetLineWaiter(nullptr);
  ticket_.reset();
}

bool RequestAdmission::Stopped() {
  if (live_.accept_refused) {  // (the lifecycle answers with the journal's refusal)
    *rejected_ = Status::Unavailable("the request journal refused the request");
    return true;
  }
  if (live_.cancelled) {
    *rejected_ = Status::Cancelled("request cancelled");
    return true;
  }
  if (live_.PastDeadline(g_.clock_.NowMs())) {
    *rejected_ = DeadlinePassed();
    return true;
  }
  return false;
}

boost::asio::awaitable<void> RequestAdmission::Wait(std::chrono::milliseconds bound) {
  if (ticket_) {
    co_await signal_.WaitInLine(*ticket_, bound);
  } else {
    co_await signal_.Wait(bound);
  }
}

int64_t RequestAdmission::WaitedSinceUp() {
  const int64_t now = g_.clock_.NowMs();
  if (up_since_ == 0) {
    for (const auto& st : states_) {
      if (st->admission.admitted && g_.supervisor_.ReadyPort(st->key)) up_since_ = now;
    }
  }
  // Counted from the line's last admission too: a line that moves keeps
  // its requests (bounded by max_queue and their deadlines), one that
  // stands still refuses them. Each was refused 60 s after it came, the
  // line moving or not: embeddings behind a long line of them, all served
  // in turn, got 503 at a minute.
  // A cut stream that goes on only with its model waits from when it began
  // to: the line moving (for the placements of another model) is not its
  // turn coming, and a lost primary kept it waiting for good.
  if (!live_.only_model.empty()) return now - t0_;
  if (up_since_ != 0) return now - std::max(up_since_, signal_.last_admitted_ms());
  // (None up yet: the start timeout bounds it, StartTrouble; this is a last bound.)
  return now - t0_ > kQueueWaitMs + g_.StartWaitMs(svc_) ? now - t0_ : 0;
}

int64_t RequestAdmission::AcceptedCapMs() const { return g_.attempt_bounds_.answer.count(); }

boost::asio::awaitable<bool> RequestAdmission::WaitBehind(int64_t cap_ms) {
  if (Stopped()) co_return false;
  if (accepted_) cap_ms = AcceptedCapMs();  // (and its deadline: the waits below)
  const int64_t now = g_.clock_.NowMs();
  const int64_t waited = WaitedSinceUp();
  if (waited > cap_ms) {
    *rejected_ = Status::ResourceExhausted("no placement of '" + svc_.name + "' took a request for " +
                                           std::to_string(cap_ms / 1000) + " s (it waited behind " +
                                           std::to_string(signal_.Ahead(*ticket_)) + " requests that came first)")
                     .WithRetryAfter(5);
    co_return false;
  }
  // Told where it stands when it begins to wait, and a stream again at
  // each wait comment (not at every wake).
  const int64_t comment_ms = svc_.cpu_path.wait_comment_ms();
  if (on_wait_ && (told_place_ms_ < 0 || (rec_.stream && now - told_place_ms_ >= comment_ms))) {
    told_place_ms_ = now;
    const size_t ahead = signal_.Ahead(*ticket_);
    on_wait_(std::to_string(ahead) + " earlier request" + (ahead == 1 ? "" : "s") + " of '" + svc_.name +
                 "' waiting ahead of it (first come, first served)",
             g_.board_.LineWaitS(svc_.name, static_cast<uint32_t>(ahead), line_need_, serving_now()).value_or(1.0));
  }
  // Until it is the head (told at once), its deadline, its cap, or a stream's next wait comment.
  co_await signal_.WaitInLine(*ticket_, TimeLeft(live_.deadline_ms, now, std::min<int64_t>(cap_ms - waited + 1,
                                                                                          rec_.stream ? comment_ms : cap_ms)));
  co_return true;
}

namespace {
boost::asio::awaitable<bool> Refused() { co_return false; }
}  // namespace

boost::asio::awaitable<bool> RequestAdmission::Run(const boost::asio::any_io_executor& ex) {
  if (RefusedAtOnce()) return Refused();
  // The service's line (capacity_signal.h): first come, first served; only
  // its head decides. A retry does not queue behind new requests: it was
  // admitted once (and after a failure it may wait for another placement
  // than they do).
  if (first_) JoinLine(ex);
  // Embeddings hold no KV between requests, and a lone placement without
  // shrinking has nothing to choose: its worker checks its own KV pool (busy
  // -> 503, the request waits; never fits -> 400 with the numbers), so the
  // token count is not asked for.
  const bool nothing_to_choose = (states_.size() == 1 && !svc_.admission.allow_shrink) || !svc_.admission.enabled;
  if (rec_.endpoint == "embedding" || nothing_to_choose) return Slot();
  return Decided();
}

// An embedding bound for a placement on the CPU path takes its place in
// that path's line first (its concurrency, its bound, its host-RAM budget),
// as a generation does in Decided: a lost accelerator otherwise sent every
// embedding at once onto the CPU, past `cpu_path.concurrency`.
RequestAdmission::CpuStep RequestAdmission::CpuLineStep(size_t i, std::string* note, double* est_wait_s) {
  admission::Decision d;
  d.placement = i;
  d.max_tokens = 0;  // (its inputs are not counted on this path: no prompt bound either)
  std::string limits;
  const Gateway::CpuGate gate = g_.CpuPathGate(rec_, /*failover=*/accepted_, svc_, &d, 0, &limits, note, est_wait_s, rejected_);
  if (gate == Gateway::CpuGate::kGo) return CpuStep::kGo;
  if (gate == Gateway::CpuGate::kWait) return CpuStep::kWait;
  g_.metrics_.Decision(svc_.name, "reject");
  *reject_decision_ = json{{"decision", "reject"}, {"reason", rejected_->message()}, {"status", 503},
                           {"placement", states_[i]->cfg.Name()}}
                          .dump();
  return CpuStep::kReject;
}

boost::asio::awaitable<bool> RequestAdmission::Slot() {
  // A request waits here (queued, nothing journaled) while every slot of
  // the worker is taken, instead of being sent to be refused as busy.
  bool all_busy = false, waited = false;
  std::string cpu_note;  // waiting in the CPU path's line: why
  double cpu_est_s = 1;
  while (true) {
    if (ticket_ && !signal_.IsHead(*ticket_)) {
      if (!co_await WaitBehind(kQueueWaitMs)) co_return false;
      waited = true;
      continue;
    }
    // (Woken at its deadline, or cancelled, it takes no slot: it was sent to
    // the worker with nothing left of its time.)
    if (Stopped()) co_return false;
    all_busy = false;
    cpu_note.clear();
    RefreshHeld();
    // Placements whose breaker (or device's) is open take nothing; those
    // that failed this request already are skipped while another may take
    // it (as the decision's views do, placement_board.h).
    std::vector<bool> usable(states_.size()), probing(states_.size());
    bool others = false;
    std::string probed;  // a placement held back only while one request probes its half-open breaker: busy
    for (size_t i = 0; i < states_.size(); ++i) {
      usable[i] = states_[i]->admission.admitted && !held_[i] && g_.board_.Allows(svc_.name, i);
      others |= usable[i] && !(i < excluded_.size() && excluded_[i]);
    }
    for (size_t i = 0; i < states_.size(); ++i) {
      // (One that failed this request already, while another may take it, is not waited for.)
      if (!usable[i] && states_[i]->admission.admitted && !held_[i] && !(others && i < excluded_.size() && excluded_[i])) {
        if (!g_.board_.ProbeOut(svc_.name, i).empty()) {
          probing[i] = true;
          // (Not which request: a caller sees only its own ids, as admission's own note says.)
          if (probed.empty()) {
            probed = states_[i]->cfg.Name() + " is back after a failure, and one request probes it first; "
                     "waiting for its answer";
          }
        }
      }
    }
    bool loading = false;  // the first placement that may serve loads on demand: waited for, not skipped
    // Another placement than the CPU path's is up (busy, maybe): an embedding
    // refused by the CPU path's line waits for it instead. (Asked only then.)
    auto others_up = [&] {
      for (size_t k = 0; k < states_.size(); ++k) {
        if ((usable[k] || probing[k]) && !svc_.OnCpuPath(k) && g_.supervisor_.ReadyPort(states_[k]->key).has_value()) {
          return true;  // (one a request probes is busy, not gone)
        }
      }
      return false;
    };
    for (size_t i = 0; i < states_.size(); ++i) {
      if (!usable[i] || (others && i < excluded_.size() && excluded_[i])) continue;
      const auto ready = g_.supervisor_.ReadyPort(states_[i]->key);
      if (!ready && g_.supervisor_.OnDemand(states_[i]->key) && g_.clock_.NowMs() - t0_ < g_.StartWaitMs(svc_)) {
        loading = true;
        break;
      }
      if (auto port = ready) {
        // (Its port asked again under the board's lock: an idle release
        // between the read above and the slot sent the request to a worker
        // being stopped.)
        const auto& key = states_[i]->key;
        const bool cpu_line = rec_.endpoint == "embedding" && svc_.OnCpuPath(i);
        if (cpu_line) {
          const CpuStep step = CpuLineStep(i, &cpu_note, &cpu_est_s);
          if (step == CpuStep::kReject) {
            // Final only when the CPU path was all it had: beside a busy
            // accelerator placement it waits for that one's slot instead.
            if (!others_up()) co_return false;
            reject_decision_->clear();
            cpu_note.clear();
            all_busy = true;
            continue;
          }
          if (step == CpuStep::kWait) {
            // Its turn is the CPU path's line's now: the service's line is
            // left (as Decided leaves it), else its head waited there and
            // every later request behind it, out of that line.
            LeaveServiceLine();
            continue;
          }
        }
        // (The service's default max_tokens stands for the request's: its
        // body is not parsed on this path.)
        const uint32_t max_tokens = rec_.endpoint == "embedding" ? 0 : static_cast<uint32_t>(svc_.default_max_tokens);
        uint64_t generation = 0;
        if (!g_.board_.TakeSlot(svc_.name, i, rec_.id, max_tokens,
                                [&] { return g_.supervisor_.ReadyPort(key) == port; }, &generation)) {
          if (cpu_line) g_.board_.LeaveCpuLine(svc_.name, rec_.id);  // (its turn there given up: no slot)
          all_busy |= g_.supervisor_.ReadyPort(key).has_value();  // (released: started again below)
          continue;
        }
        // Taken elsewhere: its place in the CPU path's line (kept while it
        // waited there, in turn with the accelerator) is given up.
        if (!cpu_line && rec_.endpoint == "embedding") g_.board_.LeaveCpuLine(svc_.name, rec_.id);
        // (As json{...}.dump() writes it, without a document on every request.)
        std::string decision = R"({"decision":"admit","placement":)" + api::JsonString(states_[i]->cfg.Name()) +
                               (rec_.endpoint == "embedding" ? R"(,"reason":"embeddings hold no KV cells"})"
                                                             : R"(,"reason":"the only placement; its worker checks its KV pool"})");
        *t_ = {i, states_[i]->key, states_[i]->cfg.Name(), *port, 0, rec_.body, "admit", std::move(decision), ""};
        Hold(generation);
        if (waited) t_->waited_ms = g_.clock_.NowMs() - t0_;
        co_return true;
      }
    }
    DemandAll();
    if (Stopped()) co_return false;
    all_busy |= !probed.empty();  // (woken by the probe's first event or end, as for a slot)
    if (!cpu_note.empty() && !loading) {
      all_busy = true;  // (woken when a place frees, as for a slot)
      if (on_wait_) on_wait_(cpu_note, cpu_est_s);
    } else if (!all_busy || loading) {
      // Nothing is up: wait for a start, at most its start timeout, and say so.
      if (Status st = g_.StartTrouble(svc_, g_.clock_.NowMs() - t0_, live_.only_model); !st.ok()) {
        *rejected_ = st;
        co_return false;
      }
      if (on_wait_) on_wait_(g_.StartingNote(svc_), 1);
    } else if (on_wait_ && !probed.empty()) {
      on_wait_(probed, 1);
    } else if (on_wait_) {
      // A stream waiting for a slot hears why, not silence until its answer,
      // and when one frees at the measured pace (1 s until one is measured).
      on_wait_("every slot of '" + svc_.name + "' is busy; waiting for one (" +
                   std::to_string((g_.clock_.NowMs() - t0_) / 1000) + " s so far, " +
                   std::to_string(signal_.waiting()) + " waiting)",
               g_.board_.LineWaitS(svc_.name, 0, 1, serving_now()).value_or(1.0));
    }
    // (A place in the CPU path's line, its replica up, is bounded by
    // max_queue and the deadline, as a generation's is: not by this cap.)
    const bool cpu_line_wait = !cpu_note.empty() && !loading;
    // (An accepted request is held by its deadline and the gateway's bound
    // on an answer, unless what it waits for is a start: that is bounded as
    // for any request.)
    if (!cpu_line_wait && WaitedSinceUp() > (accepted_ && !loading ? AcceptedCapMs() : kQueueWaitMs)) break;
    waited |= all_busy;
    // Woken when a slot frees; a start is looked at again within 100 ms.
    co_await Wait(TimeLeft(live_.deadline_ms, g_.clock_.NowMs(), all_busy ? 1000 : 100));
  }
  *rejected_ = !cpu_note.empty() ? Status::ResourceExhausted("no place came free in the CPU path of service '" +
                                                              svc_.name + "' within " +
                                                              std::to_string(kQueueWaitMs / 1000) + " s: " + cpu_note)
                                       .WithRetryAfter(5)
               : all_busy ? Status::ResourceExhausted("every slot of service '" + svc_.name + "' stayed busy for " +
                                                    std::to_string(kQueueWaitMs / 1000) + " s").WithRetryAfter(5)
                        : Status::Unavailable("no worker of service '" + svc_.name + "' became ready in time").WithRetryAfter(5);
  co_return false;
}

boost::asio::awaitable<bool> RequestAdmission::CountPrompt(const std::string& endpoint, int* prompt_tokens,
                                                           bool truncating, uint32_t cap_cells) {
  // Bounded by the request's deadline, and short: a tokenization takes
  // milliseconds, and a worker that hangs (it held each request 30 s, past
  // its X-Request-Timeout and deaf to its cancel) is not asked for long. A
  // body of megabytes takes seconds (2 s a MiB allowed).
  const int64_t wait_ms =
      (truncating ? 3 : 1) * (kTokenizeWaitMs + kTokenizeMsPerMiB * static_cast<int64_t>(rec_.body.size() >> 20));
  // A chat that may leave out its oldest messages ("truncate") is cut for the
  // context of the first admitted placement of the counting worker's model,
  // in the service's order (its primary, as a rule), whichever worker counts
  // it: the placement the service is built around, not whichever is up (a
  // small CPU fallback would cut the history the primary can read), nor the
  // largest (a large CPU fallback would take every long chat from the
  // accelerator). A placement with less room, were it chosen, cannot hold
  // what is counted: Decide sees that. A chat of which no tail fits that
  // context is cut for the next larger one (below).
  for (size_t k = 0; k < states_.size(); ++k) {
    if (Stopped()) co_return false;
    const auto& st = states_[k];
    // (A recount is the counted model's: another model's worker would cut
    // for itself; and not the worker of a placement this request failed on,
    // which is why it is counted again: it may hang.)
    if (cap_cells && (svc_.ModelOf(k) != live_.counted_model || (k < excluded_.size() && excluded_[k]))) continue;
    auto port = st->admission.admitted ? g_.supervisor_.ReadyPort(st->key) : std::nullopt;
    if (!port) continue;
    uint32_t fit_cells = 0;
    for (size_t first = 0; first < states_.size(); ++first) {
      if (!states_[first]->admission.admitted || svc_.ModelOf(first) != svc_.ModelOf(k)) continue;
      fit_cells = states_[first]->pool.request_capacity();  // (fixed by its config: read without the board's lock)
      break;
    }
    if (cap_cells) fit_cells = std::min(fit_cells, cap_cells);
    // (Asked again, cut for a larger context, when no tail fits this one.)
    for (bool count = true; count;) {
      count = false;
      auto r = co_await g_.pool_.Send(*port, "POST",
                                      std::string(protocol::kTokenizePath) + "?endpoint=" + endpoint +
                                          "&fit_cells=" + std::to_string(fit_cells),
                                      rec_.body, g_.supervisor_.AuthHeaders(),
                                      TimeLeft(live_.deadline_ms, g_.clock_.NowMs(), wait_ms));
      if (!r.ok() && r.status().code() == StatusCode::kDeadlineExceeded && rec_.body.size() > kLongPromptBytes &&
          !live_.PastDeadline(g_.clock_.NowMs())) {
        // Not a worker that hangs (it is up, and answers its health checks):
        // a prompt it could not count in that long. Asked again, every worker
        // would count it again, and again, until the request's 60 s are gone.
        // Said once, as what it most likely is, and what else it may be (the
        // worker prepares long bodies on two threads: others may be ahead).
        *rejected_ = Status::Unavailable("the prompt's tokens (" + std::to_string(rec_.body.size() >> 20) +
                                         " MiB of request) could not be counted within " +
                                         std::to_string(wait_ms / 1000) +
                                         " s: a prompt this long is likely far beyond any context (send a shorter "
                                         "one), or the worker is busy preparing other long prompts")
                         .WithRetryAfter(10);
        co_return false;
      }
      if (!r.ok()) break;  // (the next worker)
      if (auto reply = protocol::TokenizeReply::FromJson(json::parse(r->body, nullptr, false)); r->status == 200 && reply) {
        *prompt_tokens = reply->prompt_tokens;
        live_.dropped_messages = reply->dropped_messages;
        live_.cached_tokens = reply->cached_tokens;
        live_.counted_at = k;
        live_.counted_model = svc_.ModelOf(k);
        live_.counted_cells = truncating ? fit_cells : 0;
        co_return true;
      }
      if (auto err = protocol::ParseWorkerError(r->status, r->body); err && err->http_status == 400) {
        // No tail of a truncated chat fits (its last message alone is past
        // the context): cut for the next larger context of the model's
        // admitted placements (a CPU fallback with a longer one), and run
        // there, rather than refused where a placement could hold it (not
        // under fail_fast: only the primary ever runs it).
        if (truncating && !cap_cells && !svc_.admission.fail_fast && err->reason == kContextLengthExceeded) {
          if (const uint32_t larger = NextLargerCells(svc_.ModelOf(k), fit_cells); larger) {
            fit_cells = larger;
            count = true;
            continue;
          }
        }
        *rejected_ = Status::InvalidArgument(err->message);
        // Past the context it was cut for: OpenAI's code only when no placement
        // has a larger one (a larger fallback's is no reason to shorten for good).
        if (!truncating || LargestCells(/*primary_only=*/false) <= fit_cells) rejected_->WithReason(err->reason);
        co_return false;
      }
    }
  }
  co_return true;
}

uint32_t RequestAdmission::LargestCells(bool primary_only) const {
  uint32_t cells = 0;
  for (size_t k = 0; k < states_.size() && !(primary_only && k > 0); ++k) {
    // (Fixed by its config: read without the board's lock.)
    if (states_[k]->admission.admitted) cells = std::max(cells, states_[k]->pool.request_capacity());
  }
  return cells;
}

uint32_t RequestAdmission::NextLargerCells(const std::string& model, uint32_t cells) const {
  uint32_t next = 0;
  for (size_t k = 0; k < states_.size(); ++k) {
    if (!states_[k]->admission.admitted || svc_.ModelOf(k) != model) continue;
    const uint32_t c = states_[k]->pool.request_capacity();  // (fixed by its config: read without the board's lock)
    if (c > cells && (next == 0 || c < next)) next = c;
  }
  return next;
}

uint32_t RequestAdmission::RecountCells(const std::vector<admission::PlacementView>& views, uint64_t need) const {
  // (fail_fast: only the primary is ever chosen, so a smaller context never runs it.)
  if (live_.counted_cells == 0 || live_.began || live_.recount_refused || svc_.admission.fail_fast) return 0;
  uint32_t cells = 0;
  for (size_t k = 0; k < views.size() && k < states_.size(); ++k) {
    if (svc_.ModelOf(k) != live_.counted_model) continue;
    const auto& v = views[k];
    if (v.cells_total >= live_.counted_cells) {
      // One that holds what was counted is up (busy, if anything), or back
      // within seconds (one request probes its breaker): it waits for that.
      if (v.usable || v.probing) return 0;
      continue;
    }
    if (!v.usable) continue;  // (one that cannot take it now is no reason to cut)
    if (v.cells_total >= need) return 0;  // it holds the prompt as counted: nothing to leave out for it
    cells = std::max(cells, v.cells_total);
  }
  return cells;
}

boost::asio::awaitable<bool> RequestAdmission::Decided() {
  json body = json::parse(rec_.body, nullptr, false);
  uint32_t max_tokens = static_cast<uint32_t>(svc_.default_max_tokens);
  bool fit_context = false;  // (an Ollama request's num_predict: lowered to the room it has, never refused for it)
  if (body.is_object()) {
    bool asked = false;
    for (const char* k : {"max_completion_tokens", "max_tokens"}) {
      // (Parsed already: a whole number in range, which a client may write 1000.0.)
      if (body.contains(k) && body[k].is_number()) {
        max_tokens = static_cast<uint32_t>(body[k].get<double>());
        asked = true;
      }
    }
    if (auto f = body.find("spillway_fit_context"); f != body.end() && f->is_boolean()) fit_context = f->get<bool>();
    // None asked: default_max_tokens, or the room beside the prompt when
    // less (an answer then ends at the context, "length", as OpenAI's and
    // llama-server's do). It was refused for a max_tokens its client never
    // sent ("the prompt + max_tokens (256) can never fit").
    if (!asked && !fit_context) {
      fit_context = true;
      body["spillway_fit_context"] = true;  // (the worker lowers it as well)
    }
  }
  const std::string endpoint = rec_.endpoint == "chat" ? "chat" : "completion";
  // A chat that may leave out its oldest messages: counted so, and its count pinned.
  const auto truncate = body.is_object() ? body.find("truncate") : body.end();
  const bool truncating = truncate != body.end() && truncate->is_boolean() && truncate->get<bool>();
  int prompt_tokens = live_.prompt_tokens;  // (counted by an earlier round of this request's, or not yet)
  const int64_t decide_cap_ms = accepted_ ? AcceptedCapMs()
                                          : std::max<int64_t>(static_cast<int64_t>(svc_.admission.max_delay_s * 1000), kQueueWaitMs);
  while (true) {
    if (Stopped()) co_return false;
    // The prompt's size in tokens, from any ready worker of the service (they share the tokenizer).
    if (prompt_tokens < 0) {
      if (!co_await CountPrompt(endpoint, &prompt_tokens, truncating)) co_return false;
      if (prompt_tokens > 1 && MutationActive("admit-unmeasured-prompt")) prompt_tokens = 1;  // deliberate bug, tests only
      live_.prompt_tokens = prompt_tokens;
      if (prompt_tokens < 0) {
        // Nothing is up to count the prompt: start what can be started, the
        // CPU path's replicas only when nothing else can (the CPU path's gate
        // starts its replica when a request goes there, within its RAM
        // budget): a cold start loaded the CPU fallback's gigabytes beside
        // the accelerator's, from the same disk.
        DemandAll(/*cpu_path_too=*/false);
        if (Status st = g_.StartTrouble(svc_, g_.clock_.NowMs() - t0_, live_.only_model); !st.ok()) {
          *rejected_ = st;
          co_return false;
        }
      }
    }
    std::string note, limits, cpu_reject;
    double est_wait_s = 1;
    bool cpu_line_wait = false;  // waiting its turn in the CPU path's line, its replica up
    admission::Decision d;
    if (prompt_tokens >= 0) {
      RefreshHeld();
      // A snapshot of the board (pools, breakers, wait estimates) for the pure
      // decision. The waits are for what it will take: an Ollama request's
      // max_tokens is lowered to the room it finds (FitToContext), so it
      // waits for its prompt and the least it may be given (waiting for the
      // whole of max_tokens, it "never fit", and heard "about 1 s" each time).
      admission::RequestNeed need{static_cast<uint32_t>(prompt_tokens), max_tokens, svc_.admission.allow_shrink};
      need.fit_context = fit_context;
      need.cached_tokens = static_cast<uint32_t>(std::max(0, live_.cached_tokens));
      need.cached_at = live_.counted_at;
      const uint64_t wait_need =
          uint64_t{need.prompt_tokens} + (fit_context ? std::min(max_tokens, need.min_tokens) : max_tokens);
      line_need_ = std::max<uint64_t>(1, wait_need);  // (for its wait in line, WaitBehind)
      const std::vector<admission::PlacementView> views =
          g_.board_.Views(svc_, excluded_, wait_need, [this](size_t k) { return Startable(k); });
      const int64_t now = g_.clock_.NowMs();
      need.waited_s = (now - t0_) / 1000.0;
      // Its place in the service's line; out of it (it was sent to the CPU
      // path's line), a new request would join it at the end.
      need.ahead_in_line = static_cast<uint32_t>(ticket_ ? signal_.Ahead(*ticket_) : first_ ? signal_.in_line() : 0);
      if (live_.deadline_ms) need.deadline_left_s = std::max(0.001, (live_.deadline_ms - now) / 1000.0);
      // An accepted request waits for a busy pool past max_delay_s, which
      // turns new requests away (its bounds: the caps below, its deadline).
      // (Named, not by position: a field added to Policy took `pressure`.)
      const admission::Policy policy{.reroute_on_pressure = svc_.admission.reroute_on_pressure,
                                     .fail_fast = svc_.admission.fail_fast,
                                     .max_delay_s = svc_.admission.max_delay_s,
                                     .pressure = svc_.admission.pressure,
                                     .start_wait_s = std::min(kQueueWaitMs, g_.StartWaitMs(svc_)) / 1000.0,
                                     .unbounded_delay = accepted_};
      d = admission::Decide(need, views, policy);
      // Cut for a context that is not there now, and a smaller one is:
      // counted again for that one, so that it runs (a failover), its
      // oldest messages left out, not refused or kept waiting for the one
      // it was cut for. Once: a count it cannot hold either stands.
      if (truncating && !Goes(d.kind)) {
        if (const uint32_t cap = RecountCells(views, wait_need); cap) {
          int recounted = -1;
          if (co_await CountPrompt(endpoint, &recounted, truncating, cap)) {
            if (recounted >= 0) {
              prompt_tokens = live_.prompt_tokens = recounted;
              continue;  // decided again, for the prompt now counted
            }
          } else {
            // No tail of it fits there (its last message alone is too long),
            // or it could not be counted in time: the count it had stands
            // (CountPrompt changes it only when it counts).
            if (Stopped()) co_return false;
            *rejected_ = Status::Ok();
          }
          live_.recount_refused = true;
        }
      }
      if (d.behind_line) {  // its turn comes when those ahead have gone, at the measured pace
        est_wait_s = g_.board_.LineWaitS(svc_.name, need.ahead_in_line, wait_need, serving_now()).value_or(1.0);
      } else if (d.kind == admission::Kind::kDelay && d.placement < views.size()) {
        est_wait_s = views[d.placement].est_wait_s;
      }
      if (Goes(d.kind)) {
        if (svc_.OnCpuPath(d.placement)) {
          const Gateway::CpuGate gate =
              g_.CpuPathGate(rec_, /*failover=*/accepted_, svc_, &d, prompt_tokens, &limits, &note, &est_wait_s, rejected_);
          const uint64_t primary_need = static_cast<uint64_t>(prompt_tokens) + (fit_context ? 1 : max_tokens);
          const bool primary_later =
              d.placement != 0 && !views.empty() && (views[0].usable || views[0].probing) &&
              primary_need <= views[0].cells_total;
          // The CPU path's own line orders it from now on (its bound and
          // positions count from the moment it joins): out of the service's.
          if (gate != Gateway::CpuGate::kReject || !primary_later) LeaveServiceLine();
          if (gate == Gateway::CpuGate::kReject && primary_later) {
            // Refused by the CPU path (its prompt bound, a full line, host
            // memory) while the accelerator placement is up, only busy: it
            // waits for that one in the service's line, as it would have
            // without a CPU path.
            g_.board_.LeaveCpuLine(svc_.name, rec_.id);
            d.kind = admission::Kind::kDelay;
            d.reason = views[0].name + " is busy and the CPU path refused it (" + rejected_->message() + ")";
            est_wait_s = views[0].est_wait_s;
            *rejected_ = Status::Ok();
          } else if (gate == Gateway::CpuGate::kReject) {
            g_.metrics_.Decision(svc_.name, "reject");
            const json dj = {{"decision", "reject"}, {"reason", rejected_->message()}, {"prompt_tokens", prompt_tokens},
                             {"max_tokens", max_tokens}, {"status", 503}, {"placement", states_[d.placement]->cfg.Name()}};
            cpu_reject = dj.dump();  // journaled below
          } else if (gate == Gateway::CpuGate::kWait) {
            d.kind = admission::Kind::kDelay;
            d.reason = note;
            cpu_line_wait = g_.supervisor_.ReadyPort(states_[d.placement]->key).has_value();
            // Its replica loads (started for it): waited for within its start timeout.
            if (!cpu_line_wait) chose_stopped_ = true;
          }
        } else {
          g_.board_.LeaveCpuLine(svc_.name, rec_.id);  // back on the accelerator path
        }
      } else if (d.placement < states_.size() && !svc_.OnCpuPath(d.placement)) {
        // Waiting for the accelerator (delayed there): its place in the CPU
        // path's line is given up, and a lane it had started there with it.
        // Kept, it held the strict line's head (every request behind it,
        // those only the CPU can hold too) for as long as it waited for the
        // accelerator. Should the CPU path be chosen again, it joins anew.
        g_.board_.LeaveCpuLine(svc_.name, rec_.id);
      }
      if (d.behind_line) {
        g_.board_.LeaveCpuLine(svc_.name, rec_.id);  // bound for the accelerator, behind others
        // It waited in the CPU path's line and the accelerator has room now:
        // not ahead of those waiting for the accelerator (at the end of their line).
        if (!ticket_) JoinLine(co_await boost::asio::this_coro::executor);
      }
      if (cpu_reject.empty() && Goes(d.kind)) {
        const auto& st = *states_[d.placement];
        const uint32_t cells = static_cast<uint32_t>(prompt_tokens) + d.max_tokens;
        auto port = g_.supervisor_.ReadyPort(st.key);
        if (!port && g_.supervisor_.OnDemand(st.key)) {
          // Chosen while stopped (on demand: released when idle, or evicted
          // and its room back): started now and waited for, within its start
          // timeout. It was chosen and never started while another
          // placement was up to count the prompt: a 503 after 60 s.
          Demand(d.placement);
          chose_stopped_ = true;
        }
        // The decision is committed on the board; another request may have
        // taken the cells since the snapshot (then: decide again).
        uint64_t generation = 0;
        // (The prompt tokens its run computes, for the waits estimated
        // behind it: not what its worker's cache holds of them, there.)
        if (port && g_.board_.Reserve(svc_.name, d.placement, rec_.id, cells, need.ComputedPromptTokens(d.placement),
                                      d.max_tokens, [&] { return g_.supervisor_.ReadyPort(st.key) == port; },
                                      &generation)) {
          // (What the count found cached was this attempt's: a later attempt
          // of the request, after a failure, counts its prompt whole again.)
          live_.cached_tokens = 0;
          if (body.is_object()) {
            body["max_tokens"] = d.max_tokens;
            body.erase("max_completion_tokens");
            // The prompt counted is the one each placement of its model reads
            // (none left out included); another model's counts its own.
            if (truncating && svc_.ModelOf(d.placement) == live_.counted_model) {
              body["spillway_drop_messages"] = live_.dropped_messages;
            }
          }
          const int64_t waited_ms = g_.clock_.NowMs() - t0_;
          json dj = {{"decision", admission::KindName(d.kind)}, {"placement", st.cfg.Name()},
                     {"reason", d.reason}, {"prompt_tokens", prompt_tokens}, {"max_tokens", d.max_tokens},
                     {"waited_ms", waited_ms}};
          if (!limits.empty()) dj["limits"] = limits;
          *t_ = {d.placement, st.key, st.cfg.Name(), *port, cells,
                 body.is_object() ? body.dump() : rec_.body, admission::KindName(d.kind), dj.dump(), limits};
          Hold(generation);
          t_->waited_ms = waited_ms;
          g_.metrics_.Decision(svc_.name, admission::KindName(d.kind));
          co_return true;
        }
        d.kind = admission::Kind::kDelay;  // raced with another request: decide again
      }
    } else {
      // No worker ready to count tokens yet: waited for while one may
      // start, within the start timeout (then: why).
      if (Status st = g_.StartTrouble(svc_, g_.clock_.NowMs() - t0_, live_.only_model); !st.ok()) {
        *rejected_ = st;
        co_return false;
      }
      d.kind = admission::Kind::kDelay;
      d.reason = g_.StartingNote(svc_);
    }
    if (!cpu_reject.empty()) {  // the CPU path's line is full or over its budget: *rejected_ says why
      *reject_decision_ = cpu_reject;
      co_return false;
    }
    if (d.kind == admission::Kind::kReject) {
      g_.metrics_.Decision(svc_.name, "reject");
      const json dj = {{"decision", "reject"}, {"reason", d.reason}, {"prompt_tokens", prompt_tokens},
                       {"max_tokens", max_tokens}, {"status", d.http_status}};
      *reject_decision_ = dj.dump();
      *rejected_ = d.http_status == 413   ? Status::PayloadTooLarge(d.reason)
                   : d.http_status == 400 ? Status::InvalidArgument(d.reason)
                                          : Status::ResourceExhausted(d.reason).WithRetryAfter(std::max(1, d.retry_after_s));
      // Past the context of every placement it could run on (not only of
      // those left after this request's failures): OpenAI's code for it.
      // (line_need_: its prompt and the least answer it takes, as decided; fail_fast: its primary alone.)
      if ((d.http_status == 400 || d.http_status == 413) && line_need_ > LargestCells(svc_.admission.fail_fast)) {
        rejected_->WithReason(kContextLengthExceeded);
      }
      co_return false;
    }
    if (on_wait_) on_wait_(d.reason, est_wait_s);
    const double waited_s = WaitedSinceUp() / 1000.0;
    const double start_s = chose_stopped_ ? g_.StartWaitMs(svc_) / 1000.0 : 0;  // (a load takes what it takes)
    // (A place in the CPU path's line is bounded by that line, max_queue
    // long, and by the request's deadline: a request told "position 3,
    // about 100 s" is not dropped at 60 s.)
    // (An accepted request: its deadline and the gateway's bound on an
    // answer, and for a start it waits for, that start's bound as for any.)
    const double cap_s = accepted_ ? (chose_stopped_ ? kQueueWaitMs / 1000.0 + start_s : AcceptedCapMs() / 1000.0)
                                   : std::max({svc_.admission.max_delay_s, kQueueWaitMs / 1000.0, start_s});
    if (!cpu_line_wait && waited_s > cap_s) {
      *rejected_ = Status::ResourceExhausted("no placement of '" + svc_.name + "' could take the request within " +
                                             std::to_string(static_cast<int>(waited_s)) + " s: " + d.reason)
                       .WithRetryAfter(5);
      co_return false;
    }
    // Decided again when capacity is released, a worker comes or goes, or
    // within 100 ms for what no event announces (a breaker's ejection ending).
    if (ticket_ && !signal_.IsHead(*ticket_)) {  // woken when it is the head (not every 100 ms)
      if (!co_await WaitBehind(decide_cap_ms)) co_return false;
      continue;
    }
    co_await Wait(TimeLeft(live_.deadline_ms, g_.clock_.NowMs(), 100));
  }
}

}  // namespace spillway::gateway
