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

namespace spillway::gateway {

void Gateway::HandleRequestQuery(const std::string& id, bool cancel, std::shared_ptr<http::Exchange> ex, unsigned v) {
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
        w["kv_cells"] = {{"total", st.pool.total()}, {"reserved", st.pool.reserved()}, {"requests", st.pool.active()}};
        w["throughput"] = {{"prompt_tokens_per_s", st.prompt_tps}, {"generated_tokens_per_s", st.gen_tps}};
        w["breaker"] = {{"state", failover::BreakerStateName(st.breaker.state())},
                        {"ejections", st.breaker.ejections()},
                        {"last_reason", st.breaker.last_reason()}};
      }
      for (const auto& v : workers) {
        if (v.key != key) continue;
        w["state"] = upstream::WorkerStateName(v.state);
        w["pid"] = v.pid;
        w["port"] = v.port;
        w["restarts"] = v.restarts;
        w["last_exit"] = v.last_exit;
        w["log"] = v.log_path;
        if (v.port) {
          auto info = http::Fetch("127.0.0.1", v.port, "GET", "/v1/worker/info", "", {}, std::chrono::milliseconds(500));
          if (info.ok() && info->status == 200) {
            json ij = json::parse(info->body, nullptr, false);
            if (!ij.is_discarded()) {
              w["memory"] = ij["memory"];
              // The estimate's error against what llama.cpp allocated on the placement's device.
              uint64_t observed = 0;
              const bool on_host = s.placements[i].device == "cpu";
              for (const auto& b : ij["memory"]["buffers"]) {
                const bool host_buffer = b["name"].get<std::string>().rfind("CPU", 0) == 0;
                if (host_buffer == on_host) observed += b["total"].get<uint64_t>();
              }
              w["observed_bytes"] = observed;
              if (auto it = placements_.find(s.name); it != placements_.end() && observed > 0) {
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
    services.push_back({{"name", s.name}, {"model", s.model}, {"placements", placements}});
  }
  return {{"services", services},
          {"queue", {{"waiting", dispatcher_->queued()}, {"max", config_.max_queue}}},
          {"journal", {{"synchronous", const_cast<journal::Journal&>(journal_).synchronous_mode()}}}};
}

std::string Gateway::RenderMetrics() const {
  std::vector<std::tuple<std::string, std::string, double>> g;
  g.emplace_back("spillway_queue_depth", "", static_cast<double>(dispatcher_->queued()));
  for (const auto& w : supervisor_.Snapshot()) {
    g.emplace_back("spillway_worker_restarts_total", "worker=\"" + w.key + "\"", w.restarts);
  }
  for (const auto& w : supervisor_.Snapshot()) {
    g.emplace_back("spillway_worker_ready", "worker=\"" + w.key + "\"", w.state == upstream::WorkerState::kReady ? 1 : 0);
  }
  {
    std::lock_guard<std::mutex> lk(const_cast<std::mutex&>(pools_mu_));
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
