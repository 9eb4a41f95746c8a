// The status a person reads (the dashboard, `spillway status`): /v1/status
// plus each device's memory by service, the requests in flight and waiting,
// and what serves each service now, in words.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <set>
#include <cstdio>

#include "common/proc_file.h"
#include "devices/telemetry.h"
#include "gateway/gateway.h"
#include "gateway/gateway_internal.h"
#include "memory/ledger.h"
#include "protocol/worker_protocol.h"

namespace spillway::gateway {

namespace {

std::string Words(uint64_t tokens, const char* what) { return std::to_string(tokens) + " " + what; }

// Weights, KV cache and compute buffers a worker reports on one side
// (its device, or the host).
json BufferSums(const json& placement, bool host) {
  uint64_t weights = 0, kv = 0, compute = 0;
  if (placement.contains("memory") && placement["memory"].contains("buffers")) {
    for (const auto& b : placement["memory"]["buffers"]) {
      if (protocol::IsHostBuffer(b) != host) continue;
      weights += b.value("model", uint64_t{0});
      kv += b.value("context", uint64_t{0});
      compute += b.value("compute", uint64_t{0});
    }
  }
  return {{"weights_bytes", weights}, {"kv_bytes", kv}, {"compute_bytes", compute}};
}

}  // namespace

StatusOr<devices::DeviceTelemetry*> internal::Telemetry(const std::string& device) {
  thread_local std::map<std::string, std::unique_ptr<devices::DeviceTelemetry>> readers;
  auto& r = readers[device];
  if (!r) {
    auto opened = devices::OpenDeviceTelemetry(device);
    if (!opened.ok()) return opened.status();
    r = std::move(*opened);
  }
  return r.get();
}

json Gateway::LiveRequestsJson() {
  // From the live requests' own state: no journal read (each was a query,
  // and a flush of the rows waiting for company, per request listed).
  std::vector<std::shared_ptr<Live>> rows;
  {
    std::lock_guard<std::mutex> lk(mu_);
    // All of them (the queues bound how many): the services' counts and the
    // positions in line come from these; a caller's view lists the oldest
    // of its own (ViewFor). Cut here, in id order, they were a random sample.
    rows.reserve(live_.size());
    for (const auto& [id, live] : live_) rows.push_back(live);
  }
  const int64_t now = clock_.NowMs();
  json list = json::array();
  struct Waiting {
    int64_t since;
    const Live* live;
    size_t index;  // in `list`
  };
  std::vector<Waiting> queued;
  for (const auto& live : rows) {
    const std::string phase = LivePhaseName(live->phase.load());
    if (phase == "terminal") continue;
    const int64_t since = live->phase_since_ms.load();
    if (phase == "queued") queued.push_back({since, live.get(), list.size()});
    json j = {{"id", live->id}, {"service", live->service}, {"phase", phase}, {"phase_age_ms", now - since}};
    if (const auto [why, est_s] = live->WaitState(); phase == "queued" && !why.empty()) {
      j["reason"] = why;
      j["estimated_wait_s"] = est_s;
    }
    const auto [placement, attempts] = live->AttemptState();
    j["endpoint"] = live->endpoint;
    j["stream"] = live->stream;
    j["placement"] = placement;
    j["attempts"] = attempts;
    j["age_ms"] = now - live->created_ms;
    j["created_ms"] = live->created_ms;
    j["_client"] = live->client;  // for the caller's view only (see ViewFor)
    list.push_back(j);
  }
  // A waiting request's position in its service's line, in the order they
  // began to wait (WaitsAhead, as GET /v1/requests/{id} counts it: a retried
  // request waits again from its retry); then the list oldest first.
  std::sort(queued.begin(), queued.end(), [](const Waiting& a, const Waiting& b) {
    return WaitsAhead(a.since, a.live->id, b.since, b.live->id);
  });
  std::map<std::string, int> position;
  for (const auto& w : queued) list[w.index]["position"] = ++position[w.live->service];
  std::stable_sort(list.begin(), list.end(),
            [](const json& a, const json& b) { return a.value("created_ms", int64_t{0}) < b.value("created_ms", int64_t{0}); });
  return list;
}

json Gateway::DevicesJson(const json& status) {
  // Each device the services use, with what each holds on it.
  std::map<std::string, json> devices;
  std::vector<std::string> order;
  auto device_entry = [&](const std::string& device) -> json& {
    if (!devices.count(device)) {
      order.push_back(device);
      devices[device] = {{"name", device}, {"kind", device == "cpu" ? "host" : device.substr(0, device.find(':'))},
                         {"services", json::array()}};
    }
    return devices[device];
  };
  for (const auto& s : status["services"]) {
    const config::ServiceConfig* svc = config_.FindService(s["name"].get<std::string>());
    size_t i = 0;
    for (const auto& p : s["placements"]) {
      const std::string device = p.value("device", "cpu");
      json use = BufferSums(p, device == "cpu");
      use["kind"] = "llama";
      use["service"] = s["name"];
      use["placement"] = p["placement"];
      use["key"] = p["key"];
      use["pid"] = p.value("pid", 0);
      use["state"] = p.value("state", "stopped");
      // The KV pool it reserved and how much of it requests hold now.
      const json cells = p.value("kv_cells", json::object());
      use["kv_cells_total"] = cells.value("total", 0);
      use["kv_cells_in_use"] = cells.value("reserved", 0);
      use["requests"] = cells.value("requests", 0);
      if (svc && i < svc->placements.size()) {
        use["ctx"] = svc->placements[i].ctx;
        use["slots"] = svc->placements[i].slots;
        use["batch"] = svc->placements[i].batch;
      }
      const uint64_t kv = use["kv_bytes"].get<uint64_t>(), total = std::max<uint64_t>(1, use["kv_cells_total"].get<uint64_t>());
      use["kv_in_use_bytes"] = kv * std::min<uint64_t>(total, use["kv_cells_in_use"].get<uint64_t>()) / total;
      device_entry(device)["services"].push_back(use);
      ++i;
    }
  }
  for (const auto& e : status.value("externals", json::array())) {
    const std::string device = e.value("device", "cpu");
    json use = {{"kind", "external"}, {"service", e["name"]}, {"key", e.value("key", "")}, {"pid", e.value("pid", 0)},
                {"state", e.value("state", "")}, {"weights_bytes", 0}, {"kv_bytes", 0}, {"compute_bytes", 0},
                {"requests", e["requests"].value("running", 0)},
                {"url", e.contains("url")},  // already running elsewhere (no pid here), not Spillway's to start
                {"resident_bytes", e["memory"]["resident_bytes"]},
                {"transient_peak_bytes", e["memory"]["transient_peak_bytes"]}};
    if (e.contains("starts")) use["loads"] = e["starts"];
    device_entry(device)["services"].push_back(use);
  }
  // Switches onto each device (loads), from the residency view.
  for (auto& [name, d] : devices) {
    for (auto& u : d["services"]) {
      for (const auto& r : status.value("residency", json::object()).value("services", json::array())) {
        if (r.value("key", "") == u.value("key", "") && r.contains("loads")) u["loads"] = r["loads"];
      }
    }
  }
  for (const auto& d : status["devices"]) {
    if (auto it = devices.find(d.value("name", "")); it != devices.end()) it->second["breaker"] = d["breaker"];
  }
  json out = json::array();
  for (const auto& name : order) {
    json& d = devices[name];
    uint64_t managed = 0;
    if (name == "cpu") {
      const auto host = devices::HostTelemetry().Read();
      if (!host.ok()) {
        d["error"] = host.status().message();
      } else {
        const uint64_t total = host->cgroup_limit ? std::min(*host->cgroup_limit, host->total) : host->total;
        const uint64_t free = std::min(total, host->effective_available());
        d["total_bytes"] = total;
        d["free_bytes"] = free;
        d["used_bytes"] = total - free;
        for (const auto& u : d["services"]) {
          managed += u["weights_bytes"].get<uint64_t>() + u["kv_bytes"].get<uint64_t>() + u["compute_bytes"].get<uint64_t>();
        }
      }
    } else if (auto telemetry = Telemetry(name); !telemetry.ok()) {
      d["error"] = telemetry.status().message();
    } else if (auto reading = (*telemetry)->Read(); !reading.ok()) {
      d["error"] = reading.status().message();
    } else {
      d["total_bytes"] = reading->total;
      d["free_bytes"] = reading->free;
      d["used_bytes"] = reading->total - std::min(reading->free, reading->total);
      std::set<int32_t> known;
      for (auto& u : d["services"]) {
        const int32_t pid = u["pid"].get<int32_t>();
        const uint64_t held = reading->BytesOfGroup(pid);  // (each leads its group: an external server's children count)
        if (pid > 0) known.insert(pid);
        u["held_bytes"] = held;
        // What a worker holds beyond its buffers is transient (graph scratch, allocator slack).
        const uint64_t buffers =
            u["weights_bytes"].get<uint64_t>() + u["kv_bytes"].get<uint64_t>() + u["compute_bytes"].get<uint64_t>();
        if (u["kind"] == "llama") u["transient_bytes"] = held > buffers ? held - buffers : 0;
        // An external server whose own share cannot be read (one already
        // running at a url has no pid here) counts as its resident size, as
        // the dashboard draws it, not again among "not Spillway".
        // (Only one at a url: a server Spillway starts holds nothing while stopped or starting.)
        const uint64_t resident = u.value("url", false) ? u.value("resident_bytes", uint64_t{0}) : 0;
        managed += u["kind"] == "llama" ? std::max(held, buffers) : held > 0 ? held : resident;
      }
      // Memory held by processes Spillway does not run, by pid and name.
      std::map<int32_t, json> others;
      uint64_t other = 0;
      for (const auto& proc : reading->processes) {
        if (known.count(proc.pid)) continue;
        if (const auto f = ReadProcStat(proc.pid); f && known.count(f->pgrp)) continue;  // (counted with its group)
        json& o = others[proc.pid];
        if (o.is_null()) {
          std::string comm;
          if (std::FILE* f = std::fopen(("/proc/" + std::to_string(proc.pid) + "/comm").c_str(), "r")) {
            char buf[64] = {0};
            if (std::fgets(buf, sizeof buf, f)) comm = buf;
            std::fclose(f);
            while (!comm.empty() && comm.back() == '\n') comm.pop_back();
          }
          o = {{"pid", proc.pid}, {"name", comm}, {"bytes", 0}, {"labels", json::array()}};
        }
        o["bytes"] = o["bytes"].get<uint64_t>() + proc.bytes;
        if (!proc.label.empty()) o["labels"].push_back(proc.label);
        other += proc.bytes;
      }
      d["other_processes"] = json::array();
      for (auto& [pid, o] : others) d["other_processes"].push_back(o);
      d["accounted_bytes"] = managed + other;
    }
    if (d.contains("total_bytes")) {
      const auto dc = config_.Device(name);
      const uint64_t total = d["total_bytes"].get<uint64_t>();
      d["headroom_bytes"] = HeadroomOf(dc).For(total);
      // Memory nobody declared to Spillway: other programs, other users.
      const uint64_t used = d["used_bytes"].get<uint64_t>();
      d["other_bytes"] = used > managed ? used - managed : 0;
    }
    out.push_back(d);
  }
  return out;
}

void Gateway::AddServiceViews(json& status, const json& requests) {
  for (auto& s : status["services"]) {
    const config::ServiceConfig* svc = config_.FindService(s["name"].get<std::string>());
    if (!svc) continue;
    int queued = 0, running = 0;
    for (const auto& r : requests) {
      if (r["service"] != s["name"]) continue;
      (r["phase"] == "queued" ? queued : running) += 1;
    }
    s["requests"] = {{"queued", queued}, {"running", running}};
    // What a client gets now: the first placement that may take requests
    // and is ready, or stopped on demand (the next request starts it). One
    // on demand that starts (or backs off) before it is waited for: its
    // requests wait for it, as admission has them (request_admission.cpp).
    const json& placements = s["placements"];
    int serving = -1;
    bool loading = false;
    for (size_t i = 0; i < placements.size(); ++i) {
      const json& p = placements[i];
      if (ServesNow(p)) {
        serving = static_cast<int>(i);
        break;
      }
      // (A first start due, its process not spawned yet, is loading too: said
      // "unavailable", the first view of every start ended in a "recovered"
      // incident with no outage before it.)
      const bool first_start_due = p.value("state", "") == "stopped" && !p.value("on_demand", false) &&
                                   !p.value("ever_ready", true) && p.value("last_exit", "").empty();
      loading |= p.value("state", "") == "starting" || first_start_due;
      if (LoadsForItsRequests(p)) {
        loading = true;
        break;
      }
    }
    json view = json::object();
    std::string state;
    if (serving < 0) {
      state = loading ? "loading" : "unavailable";
      // How far a load is: the share of the model loaded, and seconds of its start timeout.
      // Nothing serves: requests wait for a placement to come back (a
      // breaker's ejection ending, a worker restarting, room on its device)
      // up to the admission's bound or their deadline; it said "get 503".
      std::string back;
      for (const auto& p : placements) {
        for (const char* b : {"breaker", "device_breaker"}) {
          if (!BreakerIsOpen(p, b) || !p[b].contains("retry_in_ms")) continue;
          back += "; " + p.value("placement", std::string()) + (b[0] == 'd' ? "'s device breaker" : "'s breaker") +
                  " lets a request through again in " +
                  std::to_string((p[b]["retry_in_ms"].get<int64_t>() + 999) / 1000) + " s";
          break;
        }
      }
      const int cap_s = static_cast<int>(std::max(svc->admission.max_delay_s, kQueueWaitMs / 1000.0));
      view["summary"] = loading ? "no placement is ready yet, requests wait; " + StartingNote(*svc)
                                : "no placement can serve now" + back + "; requests wait up to " +
                                      std::to_string(cap_s) + " s (or their deadline) for one to come back, then get " +
                                      "503 with the reason";
    } else {
      const auto& p = svc->placements[static_cast<size_t>(serving)];
      const std::string model = svc->ModelLabel(static_cast<size_t>(serving));
      state = serving == 0 ? "ready" : "degraded";
      view = {{"placement", p.Name()}, {"role", p.role}, {"device", p.device}, {"model", model},
              {"different_model", p.different_model}};
      std::vector<std::string> limits;
      if (svc->OnCpuPath(static_cast<size_t>(serving))) {
        const auto& cp = svc->cpu_path;
        if (cp.max_tokens > 0 && cp.max_tokens < svc->max_tokens) limits.push_back("answers of up to " + Words(cp.max_tokens, "tokens"));
        if (cp.max_prompt_tokens > 0) limits.push_back("prompts of up to " + Words(cp.max_prompt_tokens, "tokens"));
        limits.push_back(cp.concurrency == 1 ? "one request at a time" : std::to_string(cp.concurrency) + " requests at a time");
        limits.push_back("at most " + std::to_string(cp.max_queue) + " waiting");
      }
      if (p.slots > 0) {
        limits.push_back(std::to_string(RequestContext(*svc, static_cast<size_t>(serving))) +
                         " tokens of context per request");
      }
      std::string words;
      for (const auto& l : limits) words += (words.empty() ? "" : ", ") + l;
      view["limits"] = words;
      std::string summary = serving == 0 ? "served by its primary placement " + p.Name()
                                         : "served by the " + p.role + " placement " + p.Name();
      if (p.different_model) summary += " with a different, smaller model: " + model;
      else if (serving != 0) summary += " (the same model, " + model + ")";
      if (serving != 0 && !words.empty()) summary += "; limits: " + words;
      view["summary"] = summary;
      // The wait of a new default-length request: those ahead (running and
      // waiting) in rounds of the placement's lanes, each a default-length
      // answer at its measured speed; on a pool whose cells admission
      // tracks, at least the board's estimate (the one admission acts on:
      // when running requests free enough cells). Null until measured.
      const json& sp = placements[static_cast<size_t>(serving)];
      const double gen_tps = sp.value("throughput", json::object()).value("generated_tokens_per_s", 0.0);
      const int lanes = svc->OnCpuPath(static_cast<size_t>(serving)) ? svc->cpu_path.concurrency : std::max(1, p.slots);
      if (gen_tps > 0) {
        double wait = std::floor(static_cast<double>(queued + running) / std::max(1, lanes)) * svc->default_max_tokens / gen_tps;
        if (!svc->OnCpuPath(static_cast<size_t>(serving)) && sp.value("est_wait_s", json()).is_number()) {
          wait = std::max(wait, sp["est_wait_s"].get<double>());
        }
        view["est_wait_s"] = wait;
      } else {
        view["est_wait_s"] = nullptr;
      }
    }
    // Unloaded, started again by a request (or held back with nothing else
    // to serve); one whose fallback serves meanwhile is degraded. Not one
    // that takes nothing now (a breaker open, not admitted): its requests
    // get 503, and it read as unloaded, loaded again by the next request.
    // Never loaded since the gateway started (a service whose first request
    // loads it): "standby", not "evicted" (nothing was unloaded).
    for (const auto& p : placements) {
      if (serving <= 0 && p.value("role", "") == "primary" && p.value("on_demand", false) &&
          p.value("state", "") == "stopped" && !BreakerOpen(p) && p.value("admitted", true)) {
        state = p.value("ever_ready", false) ? "evicted" : "standby";
        const std::string placement = p.value("placement", std::string());
        if (serving == 0 && state == "standby") {
          view["summary"] = "not loaded yet: its first request loads " + placement + " (on demand) and waits for the load";
        } else if (serving == 0) {
          view["summary"] = "unloaded (idle, or its room given to another service): its next request loads " + placement +
                            " again (on demand) and waits for the load";
        }
      }
    }
    s["state"] = state;
    s["serving"] = view;
  }
}

json Gateway::StatusView() {
  json status = StatusJson();
  json requests = LiveRequestsJson();
  AddServiceViews(status, requests);
  status["devices"] = DevicesJson(status);
  status["requests"] = requests;
  status["time_ms"] = clock_.NowMs();
  return status;
}

}  // namespace spillway::gateway
