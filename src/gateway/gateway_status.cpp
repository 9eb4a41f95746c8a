// Request queries, /v1/status and /metrics of the gateway.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>

#include "admission/admission.h"
#include "api/http_client.h"
#include "gateway/gateway.h"
#include "gateway/gateway_internal.h"
#include "protocol/worker_protocol.h"

namespace spillway::gateway {

std::shared_ptr<Gateway::Live> Gateway::LiveFor(const std::string& id, const Caller& caller) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = live_.find(id);
  if (it == live_.end() || (!caller.sees_all && it->second->client != caller.client)) return nullptr;
  return it->second;
}

void Gateway::HandleRequestQuery(const std::string& id, bool cancel, const Caller& caller,
                                 std::shared_ptr<http::Exchange> ex, unsigned v) {
  // Another client's request does not exist for this caller (404, the same
  // answer as an unknown id: nothing to learn from it). Checked on every
  // read: a row may appear between two of them.
  auto read = [&]() -> StatusOr<journal::RequestRecord> {
    auto rec = journal_.Get(id);
    if (rec.ok() && !caller.sees_all && rec->client != caller.client) {
      return Status::NotFound("no request '" + id + "'");
    }
    return rec;
  };
  if (cancel) {
    auto rec = read();
    if (!rec.ok() && rec.status().code() == StatusCode::kNotFound) {
      // Not journaled yet, but here: a request with its own X-Request-Id
      // whose Accept is still on its way, or one of the gateway's own ids
      // before its first commit. Cancelled now, it ends cancelled once its
      // row exists (its lifecycle checks before every attempt), unless an
      // answer was on its way already: the reply says the cancel was asked
      // for, not that it took (GET /v1/requests/{id} tells the end).
      if (auto live = LiveFor(id, caller)) {
        Cancel(live);
        return ex->Respond(JsonResponse(200, {{"id", id},
                                              {"object", "spillway.request"},
                                              {"state", "queued"},
                                              {"service", live->service},
                                              {"phase", LivePhaseName(live->phase.load())},
                                              {"cancel_requested", true}},
                                        v));
      }
    }
    if (!rec.ok()) return ex->Respond(ErrorResponse(rec.status(), v));
    if (journal::IsTerminal(rec->state)) {
      return ex->Respond(ErrorResponse(Status::Conflict("request '" + id + "' already ended: " +
                                                        journal::StateName(rec->state)), v, id));
    }
    // Looked up after the read: a request is live here before its first row
    // is written, so one whose row was read is found (looked up before, a
    // request that arrived while the read waited for the journal was missed,
    // and a 200 cancelled nothing). A live request is ended by its lifecycle
    // alone (journal first, then its client): the row read may be stale (a
    // keyed request's attempt on its way to the disk while its worker
    // answers), and ending it here too let an answer the client got be
    // journaled as cancelled. Only a queued row nothing here runs (its
    // lifecycle ended when the journal could not write: it would run again
    // after a restart) is ended here.
    if (auto live = LiveFor(id, caller)) {
      // One that waits for capacity is woken and ends at once: its end is
      // what this answer tells (a blocking-pool thread waits for it, as for
      // a commit, and never long). One running ends when its worker stops.
      const bool waiting = live->phase.load() == LivePhase::kQueued;
      Cancel(live);
      if (waiting) live->WaitEnded(std::chrono::seconds(2));
    } else if (rec->state == State::kQueued) {
      Logged(journal_.Finish(id, State::kCancelled, 499, "application/json",
                             ErrorText(Status::Cancelled("request cancelled"), id), "cancelled while queued"),
             "cancel");
    }
  }
  auto rec = read();
  if (!rec.ok() && rec.status().code() == StatusCode::kNotFound && LiveFor(id, caller)) {
    // Here but not on disk yet: its first record on its way, or waiting to
    // share its end's sync (a non-streamed request's, journal.h). Still a
    // 404 (a 200 says the journal holds it: it survives a crash), but its
    // sync is asked for now, so that the next query finds it; not waited
    // for, so that a slow disk never holds up a query.
    journal_.SyncNow();
  }
  if (!rec.ok()) return ex->Respond(ErrorResponse(rec.status(), v));
  json j = {{"id", rec->id},
            {"object", "spillway.request"},
            {"state", journal::StateName(rec->state)},
            {"service", rec->service},
            {"endpoint", rec->endpoint},
            {"stream", rec->stream},
            {"placement", rec->placement},
            {"attempts", rec->attempts},
            {"created_ms", rec->created_ms},
            {"updated_ms", rec->updated_ms}};
  if (!rec->error.empty()) j["error"] = rec->error;
  if (cancel) j["cancel_requested"] = true;
  {
    // In flight here: its phase in this gateway's lifecycle, and for how long.
    std::lock_guard<std::mutex> lk(mu_);
    if (auto it = live_.find(id); it != live_.end()) {
      const Live& me = *it->second;
      const LivePhase phase = me.phase.load();
      const int64_t now = clock_.NowMs();
      j["phase"] = LivePhaseName(phase);
      j["phase_age_ms"] = now - me.phase_since_ms.load();
      if (phase == LivePhase::kQueued) {
        // Its place among the requests of its service waiting here (by when
        // they began to wait), why it waits and when it is expected to start.
        size_t ahead = 0, waiting = 0;
        for (const auto& [other_id, other] : live_) {
          if (other->service != me.service || other->phase.load() != LivePhase::kQueued) continue;
          ++waiting;
          if (WaitsAhead(other->phase_since_ms.load(), other_id, me.phase_since_ms.load(), id)) ++ahead;
        }
        const auto [note, est_s] = me.WaitState();
        json q = {{"position", ahead + 1}, {"waiting", waiting}};
        if (!note.empty()) {
          q["reason"] = note;
          q["estimated_wait_s"] = est_s;
          q["estimated_start_ms"] = now + static_cast<int64_t>(est_s * 1000);
        }
        j["queue"] = q;
      }
    }
  }
  if (auto attempts = journal_.Attempts(id); attempts.ok()) {
    json list = json::array();
    for (const auto& a : *attempts) {
      json e = {{"n", a.n}, {"placement", a.placement}, {"outcome", a.outcome}, {"started_ms", a.started_ms}};
      if (a.ended_ms) e["ended_ms"] = a.ended_ms;
      if (!a.error.empty()) e["error"] = a.error.substr(0, 500);
      list.push_back(e);
    }
    j["attempt_log"] = list;
  }
  if (!rec->decision.empty()) {
    json d = json::parse(rec->decision, nullptr, false);
    if (!d.is_discarded()) j["admission"] = d;
  }
  if (journal::IsTerminal(rec->state)) {
    json result = {{"status", rec->result_status}, {"content_type", rec->result_type}};
    // (An external server's answer is anything it sent: one nested deeper
    // than a request body may be is shown as text, never parsed and copied
    // deep. Its size was bounded when it was kept.)
    json parsed = api::CheckJsonLimits(rec->result_body, api::DepthOnly(JsonLimitsOf(config_).max_depth)) ==
                          api::JsonShape::kOk
                      ? json::parse(rec->result_body, nullptr, false)
                      : json(json::value_t::discarded);
    if (!parsed.is_discarded()) result["body"] = std::move(parsed);
    else result["text"] = rec->result_body;
    j["result"] = result;
  }
  auto res = JsonResponse(200, j, v);
  res.set("X-Request-Id", rec->id);
  ex->Respond(std::move(res));
}

json Gateway::StatusJson() const {
  json services = json::array();
  const auto workers = supervisor_.Snapshot();
  for (const auto& s : config_.services) {
    json placements = json::array();
    for (size_t i = 0; i < s.placements.size(); ++i) {
      const std::string key = WorkerKey(s, i);
      json w = {{"key", key}, {"placement", s.placements[i].Name()}, {"device", s.placements[i].device},
                {"role", s.placements[i].role}};
      w.update(board_.PlacementJson(s.name, i, static_cast<uint64_t>(s.default_max_tokens)));
      // Taking no requests now while another placement can (request_admission.cpp, RefreshHeld).
      std::string held_why;
      w["held_back"] = HeldBack(s, i, &held_why) != Hold::kNone ? json(held_why) : json(nullptr);
      w["on_demand"] = supervisor_.OnDemand(key);  // (stopped: started by the next request that wants it)
      for (const auto& v : workers) {
        if (v.key != key) continue;
        w["state"] = upstream::WorkerStateName(v.state);
        w["pid"] = v.pid;
        w["port"] = v.port;
        w["rss_bytes"] = v.rss_bytes;  // its host RAM, as the supervisor last sampled it
        w["restarts"] = v.restarts;
        w["loads"] = v.starts;  // processes spawned for it
        w["ever_ready"] = v.ever_ready;  // false: never loaded since the gateway started (adopted: loaded)
        w["adopted"] = v.adopted;  // serving since before this gateway started (a crash), not reloaded
        w["last_exit"] = v.last_exit;
        if (!v.last_error.empty()) w["last_error"] = v.last_error;
        w["failed_starts"] = v.failed_starts;
        w["crashes"] = v.crashes;  // ends by its own hand in a row, each soon after it became ready
        if (v.state == upstream::WorkerState::kStarting && v.load_total_bytes > 0) {
          // A model coming in from disk: how far (the worker's own count).
          w["load"] = {{"loaded_bytes", v.load_bytes},
                       {"total_bytes", v.load_total_bytes},
                       {"fraction", static_cast<double>(v.load_bytes) / static_cast<double>(v.load_total_bytes)}};
        }
        if (v.state == upstream::WorkerState::kBackoff) {
          w["next_start_in_s"] = std::max<int64_t>(0, v.next_start_ms - clock_.NowMs()) / 1000.0;
        }
        w["log"] = v.log_path;
        if (w.contains("readiness") && v.last_start_ms > 0) w["readiness"]["measured_start_s"] = v.last_start_ms / 1000.0;
        // What the worker said of itself, as the supervisor last fetched it
        // (every second while ready): this page asks no worker anything.
        if (v.port && v.info) {
          w["info_age_ms"] = clock_.NowMs() - v.info_ms;
          {
            const auto info = protocol::WorkerInfo::FromJson(json::parse(*v.info, nullptr, false));
            if (info) {
              w["memory"] = info->memory;
              if (info->last_context_ms && w.contains("readiness")) {
                w["readiness"]["context_created"] = info->context_created;
                w["readiness"]["measured_context_s"] = *info->last_context_ms / 1000.0;
              }
              // The estimate's error against what llama.cpp allocated on the placement's device.
              uint64_t observed = 0;
              const bool on_host = s.placements[i].device == "cpu";
              for (const auto& b : info->buffers) {
                if (b.host == on_host) observed += b.total;
              }
              w["observed_bytes"] = observed;
              if (observed > 0 && info->context_created) {
                const double predicted = static_cast<double>(board_.placement(s.name, i).admission.predicted_bytes);
                if (predicted > 0) w["estimate_error"] = (predicted - static_cast<double>(observed)) / static_cast<double>(observed);
              }
              if (info->slots) {
                w["slots"] = {{"total", info->slots->total}, {"busy", info->slots->busy}, {"queued", info->slots->queued}};
              }
              w["fingerprint"] = info->fingerprint_id.empty() ? json(nullptr) : json(info->fingerprint_id);
              if (!info->prefix_reuse.is_null()) w["prefix_reuse"] = info->prefix_reuse;
              if (!info->rendered_prompts.is_null()) w["rendered_prompts"] = info->rendered_prompts;
              if (!info->prompt_tokens.is_null()) w["prompt_tokens"] = info->prompt_tokens;
            }
          }
        }
      }
      placements.push_back(w);
    }
    json svc = {{"name", s.name}, {"model", s.model}, {"placements", placements}};
    svc["cpu_path"] = const_cast<PlacementBoard&>(board_).WithLock([&](PlacementBoard::Locked& board) {
      const_cast<Gateway*>(this)->RefreshCpuResident(s, board);
      const auto q = board.cpu_lines.at(s.name)->stats();
      return json{{"waiting", q.waiting}, {"running", q.running}, {"oldest_wait_ms", q.oldest_wait_ms},
                  {"max_queue", s.cpu_path.max_queue}, {"concurrency", s.cpu_path.concurrency},
                  {"ram_budget_bytes", board.cpu_budgets.at(s.name)}, {"ram_resident_bytes", q.resident_bytes},
                  {"ram_running_bytes", q.running_bytes}, {"ram_peak_bytes", q.peak_bytes},
                  {"started", q.started}, {"rejected_full", q.rejected_full},
                  {"rejected_budget", q.rejected_budget}, {"rejected_host", q.rejected_host}};
    });
    // One line on what a client gets now, when it is less than the primary.
    // (A half-open breaker lets the next request probe it; a stopped
    // on-demand primary is started by the next request: neither is down. And
    // the fallback is named only when one can take the requests.)
    std::string degraded;
    bool other_up = false, other_loading = false;  // another placement serves now (or would start for them), or loads
    for (const auto& p : placements) {
      if (p["role"] == "primary") continue;
      other_up |= ServesNow(p);
      other_loading |= LoadsForItsRequests(p);
    }
    for (const auto& p : placements) {
      if (p["role"] != "primary") continue;
      const std::string state = p.value("state", std::string("stopped"));
      if (ServesNow(p)) continue;
      if (LoadsForItsRequests(p)) {
        degraded = "the primary placement " + p["placement"].get<std::string>() +
                   (state == "backoff" ? " is failing to start (worker backoff: " + p.value("last_exit", std::string("")) + ")"
                                       : " is loading (worker " + state + ")") +
                   "; its requests wait for it";
        continue;
      }
      const bool held = !p["held_back"].is_null();
      const bool device_open = BreakerIsOpen(p, "device_breaker");
      degraded = "the primary placement " + p["placement"].get<std::string>() + " is " +
                 (held ? "held back (" + p["held_back"].get<std::string>() + ")"
                       : "unavailable (" +
                             (device_open      ? "its device's breaker is open: " +
                                                     p["device_breaker"].value("last_reason", std::string("failures"))
                              : BreakerOpen(p) ? std::string("breaker open")
                              : !p.value("admitted", true) ? std::string("not admitted")
                                                           : "worker " + state) +
                             ")") +
                 (other_up        ? "; requests go to the fallback placements"
                  : other_loading ? "; its requests wait for a fallback placement that is loading"
                  : held          ? "; its requests wait for it"
                                  : "; no other placement can take its requests");
    }
    svc["degraded"] = degraded.empty() ? json(nullptr) : json(degraded);
    services.push_back(svc);
  }
  const json devices = board_.DevicesJson();
  // Group commit: writes per commit tells how much the fsyncs are shared.
  const journal::JournalStats js = journal_.stats();
  json journal = {{"synchronous", journal_.synchronous_mode()}, {"writable", true},
                  {"writes", js.writes}, {"commits", js.commits}, {"failed_commits", js.failed_commits},
                  {"largest_batch", js.largest_batch}};
  if (const Status h = journal_.Health(); !h.ok()) {
    journal["writable"] = false;
    journal["reason"] = h.message();
  }
  return {{"services", services},
          {"externals", ExternalsJson()},
          {"residency", const_cast<Gateway*>(this)->ResidencyJson()},
          {"devices", devices},
          {"queue", {{"waiting", waiting_.load()}, {"max", config_.max_queue}}},
          {"journal", journal}};
}

std::string Gateway::RenderMetrics() const {
  std::vector<std::tuple<std::string, std::string, double>> g;
  g.emplace_back("spillway_queue_depth", "", static_cast<double>(waiting_.load()));
  for (const auto& w : supervisor_.Snapshot()) {
    g.emplace_back("spillway_worker_restarts_total", "worker=\"" + w.key + "\"", w.restarts);
  }
  for (const auto& w : supervisor_.Snapshot()) {
    g.emplace_back("spillway_worker_ready", "worker=\"" + w.key + "\"", w.state == upstream::WorkerState::kReady ? 1 : 0);
  }
  board_.Gauges(&g);
  // Per device and service: what each holds there, and what others hold (the accounting of /v1/status).
  const json devices = const_cast<Gateway*>(this)->DevicesJson(StatusJson());
  for (const auto& d : devices) {
    const std::string dev = "device=\"" + d.value("name", "") + "\"";
    if (d.contains("used_bytes")) g.emplace_back("spillway_device_used_bytes", dev, d["used_bytes"].get<double>());
    if (d.contains("other_bytes")) g.emplace_back("spillway_device_other_bytes", dev, d["other_bytes"].get<double>());
    for (const auto& u : d["services"]) {
      const std::string l = dev + ",service=\"" + u.value("service", "") + "\",key=\"" + u.value("key", "") + "\"";
      if (u.contains("held_bytes")) g.emplace_back("spillway_service_device_bytes", l, u["held_bytes"].get<double>());
      g.emplace_back("spillway_service_weights_bytes", l, u.value("weights_bytes", 0.0));
      g.emplace_back("spillway_service_kv_bytes", l, u.value("kv_bytes", 0.0));
      g.emplace_back("spillway_service_kv_cells_in_use", l, u.value("kv_cells_in_use", 0.0));
      g.emplace_back("spillway_service_requests_running", l, u.value("requests", 0.0));
      if (u.contains("transient_bytes")) g.emplace_back("spillway_service_transient_bytes", l, u["transient_bytes"].get<double>());
      if (u.contains("loads")) g.emplace_back("spillway_service_loads_total", l, u["loads"].get<double>());
    }
  }
  return metrics_.Render(g);
}

}  // namespace spillway::gateway
