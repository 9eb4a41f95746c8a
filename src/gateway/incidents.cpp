#include "gateway/incidents.h"

#include <algorithm>

namespace spillway::gateway {

using nlohmann::json;

namespace {

// A worker's JSON error body inside a reason, told by its message instead:
// 'phase device: {"error":{"message":"the device was lost",…}}' -> 'phase device: the device was lost'.
std::string Readable(const std::string& s) {
  const size_t open = s.find('{'), close = s.rfind('}');
  if (open == std::string::npos || close == std::string::npos || close < open) return s;
  const json j = json::parse(s.substr(open, close - open + 1), nullptr, false);
  if (j.is_discarded() || !j.contains("error") || !j["error"].is_object() || !j["error"].contains("message")) return s;
  const json& m = j["error"]["message"];
  return s.substr(0, open) + (m.is_string() ? m.get<std::string>() : m.dump()) + s.substr(close + 1);
}

std::string Short(const std::string& s, size_t n = 300) {
  const std::string r = Readable(s);
  return r.size() <= n ? r : r.substr(0, n) + "…";
}

std::string Str(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

// Placements of a snapshot by worker key, and the service each belongs to.
std::map<std::string, std::pair<std::string, json>> PlacementsByKey(const json& status) {
  std::map<std::string, std::pair<std::string, json>> out;
  if (!status.contains("services")) return out;
  for (const auto& s : status["services"]) {
    for (const auto& p : s.value("placements", json::array())) out[Str(p, "key")] = {Str(s, "name"), p};
  }
  return out;
}

std::string BreakerState(const json& p) {
  return p.contains("breaker") && p["breaker"].is_object() ? Str(p["breaker"], "state") : "";
}

int Ejections(const json& p) {
  return p.contains("breaker") && p["breaker"].is_object() ? p["breaker"].value("ejections", 0) : 0;
}

// How an object's breaker changed: "opened" (a trip, or a longer ejection), "closed" or "".
std::string BreakerChange(const json& was, const json& now) {
  const std::string b0 = BreakerState(was), b1 = BreakerState(now);
  if (b1 == "open" && (b0 != "open" || Ejections(now) > Ejections(was))) return "opened";
  if (!b0.empty() && b0 != "closed" && b1 == "closed") return "closed";
  return "";
}

// Why a worker is not serving, from its last exit and its own last word.
std::string ExitWords(const json& p) {
  std::string why = Str(p, "last_exit");
  if (const std::string e = Str(p, "last_error"); !e.empty()) why += (why.empty() ? "" : ": ") + e;
  return why.empty() ? "no reason given" : why;
}

}  // namespace

json IncidentJson(const Incident& i, bool with_owner) {
  json j = {{"seq", i.seq}, {"time_ms", i.time_ms}, {"kind", i.kind}, {"reason", i.reason}};
  if (with_owner && !i.client.empty()) j["_client"] = i.client;
  if (with_owner && !i.others_reason.empty()) j["_others_reason"] = i.others_reason;
  if (!i.service.empty()) j["service"] = i.service;
  if (!i.placement.empty()) j["placement"] = i.placement;
  if (!i.device.empty()) j["device"] = i.device;
  if (!i.request_id.empty()) j["request_id"] = i.request_id;
  return j;
}

uint64_t IncidentLog::Add(Incident i) {
  std::lock_guard<std::mutex> lk(mu_);
  i.seq = ++seq_;
  items_.push_back(std::move(i));
  while (items_.size() > capacity_) items_.pop_front();
  return seq_;
}

std::vector<Incident> IncidentLog::Since(uint64_t seq) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<Incident> out;
  for (const auto& i : items_) {
    if (i.seq > seq) out.push_back(i);
  }
  return out;
}

std::vector<Incident> IncidentLog::Recent(size_t n) const {
  std::lock_guard<std::mutex> lk(mu_);
  const size_t from = items_.size() > n ? items_.size() - n : 0;
  return {items_.begin() + static_cast<std::ptrdiff_t>(from), items_.end()};
}

uint64_t IncidentLog::last_seq() const {
  std::lock_guard<std::mutex> lk(mu_);
  return seq_;
}

std::vector<Incident> DiffStatus(const json& before, const json& after, int64_t now_ms) {
  std::vector<Incident> out;
  if (before.is_null() || !before.is_object()) return out;
  auto add = [&](std::string kind, std::string service, std::string placement, std::string device, std::string reason) {
    Incident i;
    i.time_ms = now_ms;
    i.kind = std::move(kind);
    i.service = std::move(service);
    i.placement = std::move(placement);
    i.device = std::move(device);
    i.reason = Short(reason);
    out.push_back(std::move(i));
  };
  const auto old_placements = PlacementsByKey(before);
  for (const auto& [key, sp] : PlacementsByKey(after)) {
    const auto it = old_placements.find(key);
    if (it == old_placements.end()) continue;
    const json& was = it->second.second;
    const json& now = sp.second;
    const std::string& service = sp.first;
    const std::string name = Str(now, "placement"), device = Str(now, "device");
    // Breakers: a trip (or a longer ejection) and a close.
    const std::string breaker = BreakerChange(was, now);
    if (breaker == "opened") {
      add("breaker", service, name, device,
          "breaker of " + service + " on " + name + " opened: " + Short(Str(now["breaker"], "last_reason"), 200));
    } else if (breaker == "closed") {
      add("recovered", service, name, device, "breaker of " + service + " on " + name + " closed: it serves again");
    }
    // Workers: leaving ready (an exit, a replacement, an unload) and coming back.
    const std::string w0 = Str(was, "state"), w1 = Str(now, "state");
    const int r0 = was.value("restarts", 0), r1 = now.value("restarts", 0);
    if (w0 == "ready" && w1 != "ready") {
      if (w1 == "stopped") {
        add("unloaded", service, name, device, "worker " + key + " (" + name + ") was unloaded: idle, its memory given back");
      } else {
        add("worker", service, name, device, "worker " + key + " (" + name + ") stopped serving: " + ExitWords(now));
      }
    } else if (r1 > r0 && w0 == w1) {
      // It exited and came back between two snapshots.
      add("worker", service, name, device, "worker " + key + " (" + name + ") exited: " + ExitWords(now));
    }
    if (w1 == "ready" && (w0 != "ready" || r1 > r0)) {
      add(r1 > r0 ? "restart" : "loaded", service, name, device,
          "worker " + key + " (" + name + ") is ready" + (r1 > r0 ? " again (restart " + std::to_string(r1) + ")" : ""));
    }
  }
  // Device breakers.
  std::map<std::string, json> old_devices;
  for (const auto& d : before.value("devices", json::array())) old_devices[Str(d, "name")] = d;
  for (const auto& d : after.value("devices", json::array())) {
    const std::string name = Str(d, "name");
    const auto it = old_devices.find(name);
    if (it == old_devices.end()) continue;
    const std::string breaker = BreakerChange(it->second, d);
    if (breaker == "opened") {
      add("device", "", "", name, "device " + name + " taken out of service: " + Short(Str(d["breaker"], "last_reason"), 200));
    } else if (breaker == "closed") {
      add("recovered", "", "", name, "device " + name + " is back in service");
    }
  }
  // Services turning degraded or unavailable, and back (a first load is no recovery).
  std::map<std::string, json> old_services;
  for (const auto& s : before.value("services", json::array())) old_services[Str(s, "name")] = s;
  for (const auto& s : after.value("services", json::array())) {
    const std::string name = Str(s, "name");
    const auto it = old_services.find(name);
    if (it == old_services.end()) continue;
    const std::string s0 = Str(it->second, "state"), s1 = Str(s, "state");
    if (s0 == s1) continue;
    const std::string summary = s.contains("serving") ? Str(s["serving"], "summary") : "";
    const std::string why = Str(s, "degraded");
    // An unloaded primary ("evicted": idle, or its room given to another
    // service) is no outage: the next request loads it, and its "unloaded"
    // incident says so. Every idle unload was recorded "unavailable", with
    // no recovery after the next load.
    if (s1 == "degraded" || s1 == "unavailable") {
      add(s1 == "degraded" ? "degraded" : "unavailable", name, "", "", s1 + (summary.empty() ? "" : ": " + summary) +
          (why.empty() ? "" : " (" + why + ")"));
    } else if (s1 == "ready" && (s0 == "degraded" || s0 == "unavailable")) {
      add("recovered", name, "", "", "served by its primary placement again");
    }
  }
  return out;
}

std::vector<Incident> RequestIncidents::Observe(const journal::Transition& t, int64_t now_ms) {
  using Kind = journal::Transition::Kind;
  std::vector<Incident> out;
  Incident i;
  i.time_ms = now_ms;
  i.request_id = t.id;
  std::lock_guard<std::mutex> lk(mu_);
  switch (t.kind) {
    case Kind::kAttempt: {
      Track& tr = tracks_[t.id];
      if (!tr.placement.empty() && tr.placement != t.placement) {
        i.kind = "failover";
        i.placement = t.placement;
        i.others_reason = "moved from " + tr.placement + " to " + t.placement + " (attempt " + std::to_string(t.attempt) + ")";
        i.reason = i.others_reason + (tr.requeue_reason.empty() ? "" : ": " + Short(tr.requeue_reason, 240));
        out.push_back(i);
      }
      tr.placement = t.placement;
      tr.requeue_reason.clear();
      break;
    }
    case Kind::kRequeued:
      tracks_[t.id].requeue_reason = t.error;
      break;
    case Kind::kFinished: {
      auto it = tracks_.find(t.id);
      if (it != tracks_.end()) {
        i.placement = it->second.placement;
        tracks_.erase(it);
      }
      if (t.state == journal::State::kCancelled) {
        i.kind = "cancelled";
        i.others_reason = "cancelled";
        i.reason = t.error.empty() || t.error == "request cancelled" ? "cancelled" : "cancelled: " + Short(t.error, 200);
        out.push_back(i);
      } else if ((t.state == journal::State::kFailed || t.state == journal::State::kFailedResumable) &&
                 t.status != 400 && t.status != 413 && t.status != 422) {
        // (A client's own mistake, a request a worker found invalid, too
        // large or unprocessable, is no incident: a buggy client pushed real
        // failovers and crashes off the list. A 403 or 404 may be the
        // gateway's own trouble, a secret or a service gone: kept.)
        i.kind = "failed";
        i.others_reason = journal::StateName(t.state);
        i.reason = i.others_reason + ": " + Short(t.error, 240);
        out.push_back(i);
      }
      break;
    }
  }
  return out;
}

}  // namespace spillway::gateway
