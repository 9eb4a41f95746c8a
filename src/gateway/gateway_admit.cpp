// Per-request admission and breaker bookkeeping of the gateway.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>

#include "admission/admission.h"
#include "admission/wait_estimate.h"
#include "api/http_client.h"
#include "api/json_text.h"
#include "gateway/gateway.h"
#include "gateway/gateway_internal.h"
#include "protocol/worker_protocol.h"

namespace spillway::gateway {

void Gateway::WorkerExited(const std::string& key, const std::string& why) {
  for (auto& [name, signal] : signals_) signal->Notify();  // waiters decide again without it
  board_.WorkerExited(key, why, why == protocol::kExitDeviceLost);
}

void Gateway::RecordThroughput(const std::string& service, size_t index, const std::string& body,
                               std::string_view timings_header) {
  // The worker's timings: its header (a non-streamed answer), or a stream's last chunk.
  const auto t = timings_header.empty() ? protocol::TimingsOf(body) : protocol::Timings::FromHeader(timings_header);
  if (t) {
    board_.RecordThroughput(service, index, t->prompt_ms, t->prompt_tokens, t->generation_ms, t->generated_tokens);
  }
}

namespace {

// How long a waiter may sleep before deciding again: `ms`, or less when its deadline comes sooner.
std::chrono::milliseconds WaitBound(int64_t deadline_ms, int64_t now_ms, int64_t ms) {
  if (deadline_ms) ms = std::max<int64_t>(1, std::min(ms, deadline_ms - now_ms));
  return std::chrono::milliseconds(ms);
}

}  // namespace

int64_t Gateway::StartWaitMs(const config::ServiceConfig& svc) {
  int64_t ms = 0;
  for (size_t k = 0; k < svc.placements.size(); ++k) {
    if (board_.placement(svc.name, k).admission.admitted) {
      ms = std::max(ms, static_cast<int64_t>(svc.placements[k].start_timeout_s * 1000));
    }
  }
  return ms;
}

std::string Gateway::StartingNote(const config::ServiceConfig& svc) {
  std::string note;
  for (const auto& w : supervisor_.Snapshot()) {
    for (size_t k = 0; k < svc.placements.size(); ++k) {
      const auto* st = &board_.placement(svc.name, k);
      if (w.key != st->key || !st->admission.admitted || w.state == upstream::WorkerState::kReady) continue;
      const int64_t now = clock_.NowMs();
      std::string part = st->cfg.Name() + " is " + upstream::WorkerStateName(w.state);
      if (w.state == upstream::WorkerState::kStarting) {
        part += " (";
        if (w.load_total_bytes > 0) {
          part += "model " + std::to_string(w.load_bytes * 100 / w.load_total_bytes) + " % loaded, ";
        }
        part += std::to_string((now - w.starting_since_ms) / 1000) + " s of its " +
                std::to_string(w.start_timeout_ms / 1000) + " s start timeout)";
      } else if (w.state == upstream::WorkerState::kBackoff && !w.last_exit.empty()) {
        part += " after " + w.last_exit + ", next start in " +
                std::to_string(std::max<int64_t>(0, (w.next_start_ms - now + 999) / 1000)) + " s";
      }
      note += (note.empty() ? "" : "; ") + part;
    }
  }
  return note.empty() ? "waiting for a worker of '" + svc.name + "' to start" : "waiting for a worker: " + note;
}

Status Gateway::StartTrouble(const config::ServiceConfig& svc, int64_t waited_ms) {
  // Every placement that may run keeps failing to start (a device that is
  // gone, a driver that refuses), or the wait has outlasted the start
  // timeout: say why, never a silent wait.
  bool hope = false;
  std::string why;
  int64_t next_ms = INT64_MAX;
  const int64_t now = clock_.NowMs();
  const auto workers = supervisor_.Snapshot();
  for (size_t k = 0; k < svc.placements.size(); ++k) {
    const auto* st = &board_.placement(svc.name, k);
    if (!st->admission.admitted) continue;
    bool found = false;
    for (const auto& w : workers) {
      if (w.key != st->key) continue;
      found = true;
      if (w.state == upstream::WorkerState::kReady) return Status::Ok();
      if (w.failed_starts > 0) {
        why += (why.empty() ? "" : "; ") + st->cfg.Name() + " failed to start " + std::to_string(w.failed_starts) +
               " time" + (w.failed_starts == 1 ? "" : "s") + " (" + w.last_exit +
               (w.last_error.empty() ? "" : ": " + w.last_error) + ")";
      } else if (w.state == upstream::WorkerState::kStarting) {
        why += (why.empty() ? "" : "; ") + st->cfg.Name() + " still starting after " +
               std::to_string((now - w.starting_since_ms) / 1000) + " s";
      }
      if (w.state == upstream::WorkerState::kBackoff) next_ms = std::min(next_ms, w.next_start_ms);
      if (w.state != upstream::WorkerState::kBackoff || w.failed_starts < 2) hope = true;
    }
    hope |= !found;
  }
  const int64_t limit_ms = StartWaitMs(svc);
  if (hope && waited_ms <= limit_ms) return Status::Ok();
  if (why.empty()) return Status::Ok();  // stopped on-demand replicas: the caller starts them
  const int64_t wait_s = next_ms == INT64_MAX ? 5 : std::max<int64_t>(1, (next_ms - now + 999) / 1000);
  const std::string head = hope ? "no worker of '" + svc.name + "' became ready within " +
                                      std::to_string(limit_ms / 1000) + " s (start_timeout_s): "
                                : "no placement of '" + svc.name + "' can start right now: ";
  return Status::Unavailable(head + why + "; next try in " + std::to_string(wait_s) + " s")
      .WithRetryAfter(static_cast<int>(wait_s));
}

boost::asio::awaitable<bool> Gateway::Admit(const journal::RequestRecord& rec, const config::ServiceConfig& svc,
                                           Live& live, const std::vector<bool>& excluded, Target* t, Status* rejected,
                                           std::string* reject_decision,
                                           const std::function<void(const std::string&, double)>& on_wait,
                                           bool first) {
  CapacitySignal& signal = SignalFor(svc.name);
  // The placements' fixed parts (key, config, start-up admission); what
  // changes (pools, breakers, throughput) is read through board_.Views.
  std::vector<const PlacementBoard::Placement*> states;
  for (size_t k = 0; k < svc.placements.size(); ++k) states.push_back(&board_.placement(svc.name, k));
  const int64_t t0 = clock_.NowMs();
  // Whatever the outcome, a request that is not admitted holds no place in the CPU line.
  struct LeaveLine {
    Gateway* g;
    const std::string& service;
    const std::string& id;
    bool admitted = false;
    ~LeaveLine() {
      if (!admitted) g->board_.LeaveCpuLine(service, id);
    }
  } leave_line{this, svc.name, rec.id};
  // A batch service outside its window that would rather wait than run on
  // its CPU path is told when to come back (a window may be hours away).
  {
    std::string why;
    int opens_in_s = 0;
    bool accelerator = false;
    for (const auto& p : svc.placements) accelerator |= p.device != "cpu";
    if (accelerator && svc.residency.outside_window == "wait" && OutsideWindow(svc.residency, &why, &opens_in_s)) {
      *rejected = Status::ResourceExhausted("service '" + svc.name + "' is " + why + " (outside_window = \"wait\")")
                      .WithRetryAfter(std::max(1, opens_in_s));
      co_return false;
    }
  }
  // An on-demand replica that is stopped can take requests: it is started
  // when chosen. A placement held back (unloading for another service,
  // outside its window, no room) takes none while another can.
  std::vector<Hold> holds(states.size(), Hold::kNone);
  std::vector<bool> held(states.size(), false);
  auto refresh_held = [&] {
    bool other = false;
    for (size_t k = 0; k < states.size(); ++k) {
      holds[k] = HeldBack(svc, k, nullptr);
      held[k] = holds[k] != Hold::kNone;
      other |= !held[k] && states[k]->admission.admitted &&
               (supervisor_.ReadyPort(states[k]->key).has_value() || supervisor_.OnDemand(states[k]->key));
    }
    // Nothing else can serve: a placement short of room is still waited for.
    if (!other) {
      for (size_t k = 0; k < states.size(); ++k) held[k] = held[k] && holds[k] != Hold::kNoRoom;
    }
  };
  refresh_held();
  auto startable = [&](size_t k) {
    return !held[k] && (supervisor_.ReadyPort(states[k]->key).has_value() || supervisor_.OnDemand(states[k]->key));
  };
  auto demand_all = [&] {
    refresh_held();  // as things are now
    for (size_t k = 0; k < states.size(); ++k) {
      if (!states[k]->admission.admitted || !supervisor_.OnDemand(states[k]->key)) continue;
      // Unloading or outside its window: not started again now. Short of
      // room: asked again, so that it comes back once there is room.
      if (holds[k] == Hold::kUnloading || holds[k] == Hold::kOutsideWindow) continue;
      // Wanted now: not idle, so the supervisor does not release it again
      // before this request reaches it.
      board_.Touch(svc.name, k);
      supervisor_.Demand(states[k]->key);
    }
  };
  {
    // Nothing was admitted to run (the memory is not there): say so at once.
    bool any = false;
    std::string why;
    for (const auto& st : states) {
      any |= st->admission.admitted;
      why += (why.empty() ? "" : "; ") + st->cfg.Name() + ": " + st->admission.reason;
    }
    if (!any) {
      *rejected = Status::ResourceExhausted("no placement of '" + svc.name + "' could be started (" + why + ")")
                      .WithRetryAfter(30);
      co_return false;
    }
  }
  bool any_startable = false;
  for (size_t k = 0; k < states.size(); ++k) any_startable |= states[k]->admission.admitted && startable(k);
  // (Only looked at when nothing can take the request now: not on the hot path.)
  if (!any_startable) {
    if (Status st = StartTrouble(svc, clock_.NowMs() - t0); !st.ok()) {
      *rejected = st;
      co_return false;
    }
  }
  auto hold = [&] {  // the board counts the attempt as holding the placement
    t->holding = true;
    leave_line.admitted = true;
  };
  // The service's line (capacity_signal.h): first come, first served; only
  // its head decides. A retry does not queue behind new requests: it was
  // admitted once (and after a failure it may wait for another placement
  // than they do).
  // Its place is known to its Live while it has one: a cancel wakes it alone.
  std::unique_ptr<CapacitySignal::Ticket> ticket;
  auto join_line = [&]() -> boost::asio::awaitable<void> {
    ticket = co_await signal.Join();
    live.SetLineWaiter(signal.Handle(*ticket));
  };
  auto leave_service_line = [&] {
    live.SetLineWaiter(nullptr);
    ticket.reset();
  };
  struct ClearLineWaiter {
    Live& live;
    ~ClearLineWaiter() { live.SetLineWaiter(nullptr); }
  } clear_line_waiter{live};
  if (first) co_await join_line();
  // Why it stops waiting, if it does: cancelled, or past its deadline (*rejected says which).
  auto stopped = [&] {
    if (live.cancelled) {
      *rejected = Status::Cancelled("request cancelled");
      return true;
    }
    if (live.deadline_ms && clock_.NowMs() >= live.deadline_ms) {
      *rejected = Status::DeadlineExceeded("the request did not finish within its X-Request-Timeout");
      return true;
    }
    return false;
  };
  auto wait = [&](std::chrono::milliseconds bound) {
    return ticket ? signal.WaitInLine(*ticket, bound) : signal.Wait(bound);
  };
  int64_t told_place_ms = -1;
  // Behind others in the line: no decision until it is the head. Returns
  // false (with *rejected) when it stops waiting.
  auto wait_behind = [&](int64_t cap_ms) -> boost::asio::awaitable<bool> {
    if (stopped()) co_return false;
    const int64_t now = clock_.NowMs();
    if (now - t0 > cap_ms) {
      *rejected = Status::ResourceExhausted("no placement of '" + svc.name + "' could take the request within " +
                                            std::to_string(cap_ms / 1000) + " s (it waited behind " +
                                            std::to_string(signal.Ahead(*ticket)) + " requests that came first)")
                      .WithRetryAfter(5);
      co_return false;
    }
    // Told where it stands when it begins to wait, and a stream again at
    // each wait comment (not at every wake).
    const int64_t comment_ms = svc.cpu_path.wait_comment_ms();
    if (on_wait && (told_place_ms < 0 || (rec.stream && now - told_place_ms >= comment_ms))) {
      told_place_ms = now;
      const size_t ahead = signal.Ahead(*ticket);
      on_wait(std::to_string(ahead) + " earlier request" + (ahead == 1 ? "" : "s") + " of '" + svc.name +
                  "' waiting ahead of it (first come, first served)",
              board_.LineWaitS(svc.name, static_cast<uint32_t>(ahead)).value_or(1.0));
    }
    // Until it is the head (told at once), its deadline, its cap, or a stream's next wait comment.
    co_await signal.WaitInLine(*ticket, WaitBound(live.deadline_ms, now, std::min<int64_t>(cap_ms - (now - t0) + 1,
                                                                                         rec.stream ? comment_ms : cap_ms)));
    co_return true;
  };
  // Embeddings hold no KV between requests, and a lone placement without
  // shrinking has nothing to choose: its worker checks its own KV pool (busy
  // -> 503, the request waits; never fits -> 400 with the numbers), so the
  // token count is not asked for.
  const bool nothing_to_choose = (states.size() == 1 && !svc.admission.allow_shrink) || !svc.admission.enabled;
  if (rec.endpoint == "embedding" || nothing_to_choose) {
    // A request waits here (queued, nothing journaled) while every slot of
    // the worker is taken, instead of being sent to be refused as busy.
    bool all_busy = false, waited = false;
    while (true) {
      if (ticket && !signal.IsHead(*ticket)) {
        if (!co_await wait_behind(kQueueWaitMs)) co_return false;
        waited = true;
        continue;
      }
      all_busy = false;
      refresh_held();
      bool loading = false;  // the first placement that may serve loads on demand: waited for, not skipped
      for (size_t i = 0; i < states.size(); ++i) {
        if (!states[i]->admission.admitted || held[i]) continue;
        const auto ready = supervisor_.ReadyPort(states[i]->key);
        if (!ready && supervisor_.OnDemand(states[i]->key) && clock_.NowMs() - t0 < StartWaitMs(svc)) {
          loading = true;
          break;
        }
        if (auto port = ready) {
          if (!board_.TakeSlot(svc.name, i)) {
            all_busy = true;
            continue;
          }
          // (As json{...}.dump() writes it, without a document on every request.)
          std::string decision = R"({"decision":"admit","placement":)" + api::JsonString(states[i]->cfg.Name()) +
                                 (rec.endpoint == "embedding" ? R"(,"reason":"embeddings hold no KV cells"})"
                                                              : R"(,"reason":"the only placement; its worker checks its KV pool"})");
          *t = {i, states[i]->key, states[i]->cfg.Name(), *port, 0, rec.body, "admit", std::move(decision), ""};
          hold();
          if (waited) t->waited_ms = clock_.NowMs() - t0;
          co_return true;
        }
      }
      demand_all();
      if (stopped()) co_return false;
      if (!all_busy || loading) {
        // Nothing is up: wait for a start, at most its start timeout, and say so.
        if (Status st = StartTrouble(svc, clock_.NowMs() - t0); !st.ok()) {
          *rejected = st;
          co_return false;
        }
        if (on_wait) on_wait(StartingNote(svc), 1);
      } else if (on_wait) {
        // A stream waiting for a slot hears why, not silence until its answer.
        on_wait("every slot of '" + svc.name + "' is busy; waiting for one (" +
                    std::to_string((clock_.NowMs() - t0) / 1000) + " s so far, " +
                    std::to_string(SignalFor(svc.name).waiting()) + " waiting)",
                1);
      }
      if (clock_.NowMs() - t0 > kQueueWaitMs) break;
      waited |= all_busy;
      // Woken when a slot frees; a start is looked at again within 100 ms.
      co_await wait(WaitBound(live.deadline_ms, clock_.NowMs(), all_busy ? 1000 : 100));
    }
    *rejected = all_busy ? Status::ResourceExhausted("every slot of service '" + svc.name + "' stayed busy for " +
                                                     std::to_string(kQueueWaitMs / 1000) + " s").WithRetryAfter(5)
                         : Status::Unavailable("no worker of service '" + svc.name + "' became ready in time").WithRetryAfter(5);
    co_return false;
  }
  json body = json::parse(rec.body, nullptr, false);
  uint32_t max_tokens = static_cast<uint32_t>(svc.default_max_tokens);
  if (body.is_object()) {
    for (const char* k : {"max_completion_tokens", "max_tokens"}) {
      if (body.contains(k) && body[k].is_number_integer()) max_tokens = body[k].get<uint32_t>();
    }
  }
  const std::string endpoint = rec.endpoint == "chat" ? "chat" : "completion";
  int prompt_tokens = -1;
  const int64_t decide_cap_ms = std::max<int64_t>(static_cast<int64_t>(svc.admission.max_delay_s * 1000), kQueueWaitMs);
  while (true) {
    if (stopped()) co_return false;
    // The prompt's size in tokens, from any ready worker of the service (they share the tokenizer).
    if (prompt_tokens < 0) {
      for (const auto& st : states) {
        auto port = st->admission.admitted ? supervisor_.ReadyPort(st->key) : std::nullopt;
        if (!port) continue;
        auto r = co_await pool_.Send(*port, "POST", std::string(protocol::kTokenizePath) + "?endpoint=" + endpoint,
                                     rec.body, supervisor_.AuthHeaders(), std::chrono::seconds(30));
        if (!r.ok()) continue;
        if (auto reply = protocol::TokenizeReply::FromJson(json::parse(r->body, nullptr, false)); r->status == 200 && reply) {
          prompt_tokens = reply->prompt_tokens;
          break;
        }
        if (auto err = protocol::ParseWorkerError(r->status, r->body); err && err->http_status == 400) {
          *rejected = Status::InvalidArgument(err->message);
          co_return false;
        }
      }
      if (prompt_tokens < 0) {
        demand_all();  // nothing is up to count the prompt: start what can be started
        if (Status st = StartTrouble(svc, clock_.NowMs() - t0); !st.ok()) {
          *rejected = st;
          co_return false;
        }
      }
    }
    std::string note, limits, cpu_reject;
    double est_wait_s = 1;
    admission::Decision d;
    if (prompt_tokens >= 0) {
      refresh_held();
      // A snapshot of the board (pools, breakers, wait estimates) for the pure decision.
      const std::vector<admission::PlacementView> views =
          board_.Views(svc, excluded, static_cast<uint64_t>(prompt_tokens) + max_tokens, startable);
      const int64_t now = clock_.NowMs();
      admission::RequestNeed need{static_cast<uint32_t>(prompt_tokens), max_tokens, svc.admission.allow_shrink, 16};
      need.waited_s = (now - t0) / 1000.0;
      // Its place in the service's line; out of it (it was sent to the CPU
      // path's line), a new request would join it at the end.
      need.ahead_in_line = static_cast<uint32_t>(ticket ? signal.Ahead(*ticket) : first ? signal.in_line() : 0);
      if (live.deadline_ms) need.deadline_left_s = std::max(0.001, (live.deadline_ms - now) / 1000.0);
      admission::Policy policy{svc.admission.reroute_on_pressure, svc.admission.fail_fast, svc.admission.max_delay_s,
                               svc.admission.pressure};
      policy.start_wait_s = std::min(kQueueWaitMs, StartWaitMs(svc)) / 1000.0;
      d = admission::Decide(need, views, policy);
      if (d.kind == admission::Kind::kDelay && d.placement < views.size()) est_wait_s = views[d.placement].est_wait_s;
      CpuGate gate = CpuGate::kGo;
      if (d.kind != admission::Kind::kDelay && d.kind != admission::Kind::kReject) {
        if (svc.OnCpuPath(d.placement)) {
          // The CPU path's own line orders it from now on (its bound and
          // positions count from the moment it joins): out of the service's.
          leave_service_line();
          gate = CpuPathGate(rec, svc, &d, prompt_tokens, &limits, &note, &est_wait_s, rejected);
          if (gate == CpuGate::kReject) {
            metrics_.Decision(svc.name, "reject");
            const json dj = {{"decision", "reject"}, {"reason", rejected->message()}, {"prompt_tokens", prompt_tokens},
                             {"max_tokens", max_tokens}, {"status", 503}, {"placement", states[d.placement]->cfg.Name()}};
            cpu_reject = dj.dump();  // journaled below
          }
          else if (gate == CpuGate::kWait) {
            d.kind = admission::Kind::kDelay;
            d.reason = note;
          }
        } else {
          board_.LeaveCpuLine(svc.name, rec.id);  // back on the accelerator path
        }
      }
      if (d.behind_line) {
        board_.LeaveCpuLine(svc.name, rec.id);  // bound for the accelerator, behind others
        // It waited in the CPU path's line and the accelerator has room now:
        // not ahead of those waiting for the accelerator (at the end of their line).
        if (!ticket) co_await join_line();
      }
      if (cpu_reject.empty() && d.kind != admission::Kind::kDelay && d.kind != admission::Kind::kReject) {
        const auto& st = *states[d.placement];
        const uint32_t cells = static_cast<uint32_t>(prompt_tokens) + d.max_tokens;
        auto port = supervisor_.ReadyPort(st.key);
        // The decision is committed on the board; another request may have
        // taken the cells since the snapshot (then: decide again).
        if (port && board_.Reserve(svc.name, d.placement, rec.id, cells, static_cast<uint32_t>(prompt_tokens), d.max_tokens)) {
          if (body.is_object()) {
            body["max_tokens"] = d.max_tokens;
            body.erase("max_completion_tokens");
          }
          const int64_t waited_ms = clock_.NowMs() - t0;
          json dj = {{"decision", admission::KindName(d.kind)}, {"placement", st.cfg.Name()},
                     {"reason", d.reason}, {"prompt_tokens", prompt_tokens}, {"max_tokens", d.max_tokens},
                     {"waited_ms", waited_ms}};
          if (!limits.empty()) dj["limits"] = limits;
          *t = {d.placement, st.key, st.cfg.Name(), *port, cells,
                body.is_object() ? body.dump() : rec.body, admission::KindName(d.kind), dj.dump(), limits};
          hold();
          t->waited_ms = waited_ms;
          metrics_.Decision(svc.name, admission::KindName(d.kind));
          co_return true;
        }
        d.kind = admission::Kind::kDelay;  // raced with another request: decide again
      }
    } else {
      d.kind = admission::Kind::kDelay;  // no worker ready to count tokens yet
      d.reason = StartingNote(svc);
    }
    if (!cpu_reject.empty()) {  // the CPU path's line is full or over its budget: *rejected says why
      *reject_decision = cpu_reject;
      co_return false;
    }
    if (d.kind == admission::Kind::kReject) {
      metrics_.Decision(svc.name, "reject");
      const json dj = {{"decision", "reject"}, {"reason", d.reason}, {"prompt_tokens", prompt_tokens},
                       {"max_tokens", max_tokens}, {"status", d.http_status}};
      *reject_decision = dj.dump();
      *rejected = d.http_status == 413   ? Status::PayloadTooLarge(d.reason)
                  : d.http_status == 400 ? Status::InvalidArgument(d.reason)
                                         : Status::ResourceExhausted(d.reason).WithRetryAfter(std::max(1, d.retry_after_s));
      co_return false;
    }
    if (on_wait) on_wait(d.reason, est_wait_s);
    const double waited_s = (clock_.NowMs() - t0) / 1000.0;
    if (waited_s > std::max(svc.admission.max_delay_s, kQueueWaitMs / 1000.0)) {
      *rejected = Status::ResourceExhausted("no placement of '" + svc.name + "' could take the request within " +
                                            std::to_string(static_cast<int>(waited_s)) + " s: " + d.reason)
                      .WithRetryAfter(5);
      co_return false;
    }
    // Decided again when capacity is released, a worker comes or goes, or
    // within 100 ms for what no event announces (a breaker's ejection ending).
    if (ticket && !signal.IsHead(*ticket)) {  // woken when it is the head (not every 100 ms)
      if (!co_await wait_behind(decide_cap_ms)) co_return false;
      continue;
    }
    co_await wait(WaitBound(live.deadline_ms, clock_.NowMs(), 100));
  }
}

}  // namespace spillway::gateway
