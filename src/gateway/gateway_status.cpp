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

void Gateway::HandleRequestQuery(const std::string& id, bool cancel, const Caller& caller,
                                 std::shared_ptr<http::Exchange> ex, unsigned v) {
  // Another client's request does not exist for this caller (404, the same
  // answer as an unknown id: nothing to learn from it).
  if (!caller.sees_all) {
    auto owner = journal_.Get(id);
    if (owner.ok() && owner->client != caller.client) {
      return ex->Respond(ErrorResponse(Status::NotFound("no request '" + id + "'"), v));
    }
  }
  if (cancel) {
    std::shared_ptr<Live> live;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = live_.find(id);
      if (it != live_.end()) live = it->second;
    }
    auto rec = journal_.Get(id);
    if (!rec.ok()) return ex->Respond(ErrorResponse(rec.status(), v));
    if (journal::IsTerminal(rec->state)) {
      return ex->Respond(ErrorResponse(Status::Conflict("request '" + id + "' already ended: " +
                                                        journal::StateName(rec->state)), v, id));
    }
    if (live) Cancel(live);
    if (rec->state == State::kQueued) {
      Logged(journal_.Finish(id, State::kCancelled, 499, "application/json",
                             ErrorJson(Status::Cancelled("request cancelled"), id).dump(), "cancelled while queued"),
             "cancel");
    }
  }
  auto rec = journal_.Get(id);
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
  {
    // In flight here: its phase in this gateway's lifecycle, and for how long.
    std::lock_guard<std::mutex> lk(mu_);
    if (auto it = live_.find(id); it != live_.end()) {
      j["phase"] = LivePhaseName(it->second->phase.load());
      j["phase_age_ms"] = clock_.NowMs() - it->second->phase_since_ms.load();
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
    json parsed = json::parse(rec->result_body, nullptr, false);
    if (!parsed.is_discarded()) result["body"] = parsed;
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
      if (auto it = placements_.find(s.name); it != placements_.end() && i < it->second.size()) {
        const auto& st = *it->second[i];
        w["admitted"] = st.admission.admitted;
        w["admission"] = st.admission.reason;
        w["predicted_bytes"] = st.admission.predicted_bytes;
        std::lock_guard<std::mutex> lk(const_cast<std::mutex&>(pools_mu_));
        w["kv_cells"] = {{"total", st.pool.total()}, {"reserved", st.pool.reserved()}, {"requests", st.pool.active()},
                         {"per_request", st.pool.request_capacity()}, {"unified", st.cfg.kv_unified}};
        w["throughput"] = {{"prompt_tokens_per_s", st.prompt_tps}, {"generated_tokens_per_s", st.gen_tps}};
        w["breaker"] = {{"state", failover::BreakerStateName(st.breaker.state())},
                        {"ejections", st.breaker.ejections()},
                        {"last_reason", st.breaker.last_reason()}};
        w["readiness"] = {{"policy", st.readiness}, {"reason", st.readiness_reason},
                          {"expected_s", st.readiness_expected_s}, {"active_requests", st.active}};
      }
      for (const auto& v : workers) {
        if (v.key != key) continue;
        w["state"] = upstream::WorkerStateName(v.state);
        w["pid"] = v.pid;
        w["port"] = v.port;
        w["restarts"] = v.restarts;
        w["adopted"] = v.adopted;  // serving since before this gateway started (a crash), not reloaded
        w["last_exit"] = v.last_exit;
        if (!v.last_error.empty()) w["last_error"] = v.last_error;
        w["failed_starts"] = v.failed_starts;
        if (v.state == upstream::WorkerState::kBackoff) {
          w["next_start_in_s"] = std::max<int64_t>(0, v.next_start_ms - clock_.NowMs()) / 1000.0;
        }
        w["log"] = v.log_path;
        if (w.contains("readiness") && v.last_start_ms > 0) w["readiness"]["measured_start_s"] = v.last_start_ms / 1000.0;
        if (v.port) {
          auto info = http::Fetch("127.0.0.1", v.port, "GET", std::string(protocol::kInfoPath), "", supervisor_.AuthHeaders(),
                                  std::chrono::milliseconds(500));
          if (info.ok() && info->status == 200) {
            json ij = json::parse(info->body, nullptr, false);
            if (!ij.is_discarded()) {
              w["memory"] = ij["memory"];
              if (ij.contains("context") && w.contains("readiness")) {
                w["readiness"]["context_created"] = ij["context"]["created"];
                w["readiness"]["measured_context_s"] = ij["context"]["last_create_ms"].get<double>() / 1000.0;
              }
              const bool partial = ij.contains("context") && !ij["context"].value("created", true);
              // The estimate's error against what llama.cpp allocated on the placement's device.
              uint64_t observed = 0;
              const bool on_host = s.placements[i].device == "cpu";
              for (const auto& b : ij["memory"]["buffers"]) {
                const bool host_buffer = b["name"].get<std::string>().rfind("CPU", 0) == 0;
                if (host_buffer == on_host) observed += b["total"].get<uint64_t>();
              }
              w["observed_bytes"] = observed;
              if (auto it = placements_.find(s.name); it != placements_.end() && observed > 0 && !partial) {
                const double predicted = static_cast<double>(it->second[i]->admission.predicted_bytes);
                if (predicted > 0) w["estimate_error"] = (predicted - static_cast<double>(observed)) / static_cast<double>(observed);
              }
              w["slots"] = ij["slots"];
              w["fingerprint"] = ij["fingerprint"]["id"];
            }
          }
        }
      }
      placements.push_back(w);
    }
    json svc = {{"name", s.name}, {"model", s.model}, {"placements", placements}};
    if (auto it = cpu_queues_.find(s.name); it != cpu_queues_.end()) {
      std::lock_guard<std::mutex> lk(const_cast<std::mutex&>(pools_mu_));
      const_cast<Gateway*>(this)->RefreshCpuResident(s);
      const auto q = it->second->stats();
      svc["cpu_path"] = {{"waiting", q.waiting}, {"running", q.running}, {"oldest_wait_ms", q.oldest_wait_ms},
                         {"max_queue", s.cpu_path.max_queue}, {"concurrency", s.cpu_path.concurrency},
                         {"ram_budget_bytes", cpu_budgets_.at(s.name)}, {"ram_resident_bytes", q.resident_bytes},
                         {"ram_running_bytes", q.running_bytes}, {"ram_peak_bytes", q.peak_bytes},
                         {"started", q.started}, {"rejected_full", q.rejected_full},
                         {"rejected_budget", q.rejected_budget}, {"rejected_host", q.rejected_host}};
    }
    // One line on what a client gets now, when it is less than the primary.
    std::string degraded;
    for (const auto& p : placements) {
      if (p["role"] == "primary" && (p.value("state", "") != "ready" || !p.value("admitted", true) ||
                                     (p.contains("breaker") && p["breaker"]["state"] != "closed"))) {
        degraded = "the primary placement " + p["placement"].get<std::string>() + " is unavailable (" +
                   (p.contains("breaker") && p["breaker"]["state"] != "closed" ? "breaker " + p["breaker"]["state"].get<std::string>()
                    : !p.value("admitted", true)                                ? std::string("not admitted")
                                                                                : "worker " + p.value("state", std::string("stopped"))) +
                   "); requests go to the fallback placements";
      }
    }
    svc["degraded"] = degraded.empty() ? json(nullptr) : json(degraded);
    services.push_back(svc);
  }
  json devices = json::array();
  {
    std::lock_guard<std::mutex> lk(const_cast<std::mutex&>(pools_mu_));
    for (const auto& [name, b] : device_breakers_) {
      devices.push_back({{"name", name},
                         {"breaker", {{"state", failover::BreakerStateName(b.state())}, {"ejections", b.ejections()},
                                      {"last_reason", b.last_reason()}}}});
    }
  }
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
  {
    std::lock_guard<std::mutex> lk(const_cast<std::mutex&>(pools_mu_));
    for (const auto& [service, q] : cpu_queues_) {
      const auto st = q->stats();
      const std::string l = "service=\"" + service + "\"";
      g.emplace_back("spillway_cpu_queue_waiting", l, static_cast<double>(st.waiting));
      g.emplace_back("spillway_cpu_queue_running", l, static_cast<double>(st.running));
      g.emplace_back("spillway_cpu_queue_oldest_age_seconds", l, st.oldest_wait_ms / 1000.0);
      g.emplace_back("spillway_cpu_path_ram_bytes", l, static_cast<double>(st.resident_bytes + st.running_bytes));
      g.emplace_back("spillway_cpu_path_ram_budget_bytes", l, static_cast<double>(cpu_budgets_.at(service)));
      g.emplace_back("spillway_cpu_path_rejected_total", l + ",reason=\"queue_full\"", static_cast<double>(st.rejected_full));
      g.emplace_back("spillway_cpu_path_rejected_total", l + ",reason=\"ram_budget\"", static_cast<double>(st.rejected_budget));
      g.emplace_back("spillway_cpu_path_rejected_total", l + ",reason=\"host_low\"", static_cast<double>(st.rejected_host));
    }
    for (const auto& [name, b] : device_breakers_) {
      g.emplace_back("spillway_device_breaker_open", "device=\"" + name + "\"", b.state() == failover::BreakerState::kOpen ? 1 : 0);
    }
    for (const auto& [service, states] : placements_) {
      for (const auto& st : states) {
        g.emplace_back("spillway_breaker_open", "service=\"" + service + "\",placement=\"" + st->cfg.Name() + "\"",
                       st->breaker.state() == failover::BreakerState::kOpen ? 1 : 0);
      }
    }
  }
  return metrics_.Render(g);
}

}  // namespace spillway::gateway
