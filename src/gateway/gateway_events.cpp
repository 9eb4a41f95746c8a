// GET /v1/events (Server-Sent Events), the status views that depend on who
// asks (/v1/status, GET /v1/requests), and the incidents behind them.
//
// The stream needs the same key as the API (Authorization header). A browser's
// EventSource cannot send headers, so the dashboard reads the stream with
// fetch() and a ReadableStream instead: no ticket, no cookie, no key in a URL.
#include <cstdio>
#include <mutex>
#include <set>

#include "common/json_log.h"
#include "gateway/event_feed.h"
#include "gateway/gateway.h"
#include "gateway/gateway_internal.h"

namespace spillway::gateway {

namespace {

constexpr size_t kStatusIncidents = 30;

// The most requests a view lists (its caller's oldest).
constexpr size_t kMaxListedRequests = 200;

// A breaker's probe (the id of the request probing it) that is not among
// `own` is left out, wherever a breaker is in `j`: "probing" says one runs.
void HideOthersProbes(json& j, const std::set<std::string>& own) {
  if (j.is_object()) {
    if (auto p = j.find("probe"); p != j.end() && p->is_string() && !own.count(p->get<std::string>())) j.erase(p);
    for (auto& [_, v] : j.items()) HideOthersProbes(v, own);
  } else if (j.is_array()) {
    for (auto& v : j) HideOthersProbes(v, own);
  }
}

// What a caller may see of a status snapshot: another client's requests are
// left out, their ids taken off incidents and breakers, and a request
// incident's reason (which may hold its upstream's echo of the prompt) said
// without its details, unless the caller sees all.
json ViewFor(const json& snapshot, const std::string& client, bool sees_all) {
  json out = snapshot;
  auto mine = [&](const json& j) { return sees_all || j.value("_client", "") == client; };
  std::set<std::string> own;
  if (out.contains("requests")) {
    json kept = json::array();
    for (auto r : out["requests"]) {  // (oldest first)
      if (!mine(r)) continue;
      own.insert(r.value("id", ""));
      if (kept.size() >= kMaxListedRequests) break;
      r.erase("_client");
      kept.push_back(std::move(r));
    }
    out["requests"] = kept;
  }
  if (out.contains("incidents")) {
    for (auto& i : out["incidents"]) {
      if (!mine(i)) {
        i.erase("request_id");
        if (i.contains("_others_reason")) i["reason"] = i["_others_reason"];
      }
      i.erase("_client");
      i.erase("_others_reason");
    }
  }
  if (!sees_all) HideOthersProbes(out, own);
  return out;
}

json IncidentView(const Incident& i, const std::string& client, bool sees_all) {
  json j = IncidentJson(i);
  // (An owner not known, its journal row unread, is not the caller's: as ViewFor.)
  if (!sees_all && i.client != client) {
    j.erase("request_id");
    if (!i.others_reason.empty()) j["reason"] = i.others_reason;
  }
  return j;
}

json RecentIncidents(const IncidentLog& log) {
  json list = json::array();
  for (const auto& i : log.Recent(kStatusIncidents)) list.push_back(IncidentJson(i, true));
  return list;
}

}  // namespace

void Gateway::StartEvents() {
  journal_.SetObserver([this](const journal::Transition& t) { OnTransition(t); });
  EventFeed::Options opts;
  events_ = std::make_unique<EventFeed>([this] { return StatusView(); }, incidents_, clock_, opts);
  events_->Start();
}

void Gateway::StopEvents() {
  if (events_) events_->Stop();
}

// With --log-format json, one line per committed transition of a request:
// its id, service, placement, attempt, admission decision and state.
void Gateway::LogTransition(const journal::Transition& t, const journal::RequestRecord* rec) {
  using Kind = journal::Transition::Kind;
  json j = {{"event", t.kind == Kind::kAttempt ? "request.attempt" : t.kind == Kind::kRequeued ? "request.requeued"
                                                                                                : "request.finished"},
            {"request_id", t.id}};
  if (rec) {
    j["service"] = rec->service;
    j["placement"] = t.kind == Kind::kAttempt ? t.placement : rec->placement;
    j["attempt"] = t.kind == Kind::kAttempt ? t.attempt : rec->attempts;
    // The state this transition put it in, not the row's now: the row of a
    // short request is already at its end when its attempt is logged.
    j["state"] = journal::StateName(t.kind == Kind::kAttempt     ? journal::State::kRunning
                                    : t.kind == Kind::kRequeued ? journal::State::kQueued
                                                                : rec->state);
  }
  if (t.kind == Kind::kAttempt) {
    const json d = json::parse(t.decision_json, nullptr, false);
    j["decision"] = d.is_object() ? d.value("decision", "") : "";
    if (d.is_object() && d.contains("reason")) j["reason"] = d["reason"];
  }
  if (t.kind == Kind::kFinished) j["state"] = journal::StateName(t.state);
  if (!t.error.empty()) j["reason"] = t.error.substr(0, 500);
  std::fprintf(stderr, "%s\n", j.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
}

// On the thread that committed the transition (never an I/O thread).
void Gateway::OnTransition(const journal::Transition& t) {
  auto found = request_incidents_.Observe(t, clock_.NowMs());
  if (JsonLogs() || !found.empty()) {
    auto rec = journal_.Get(t.id);
    if (JsonLogs()) LogTransition(t, rec.ok() ? &*rec : nullptr);
    for (auto& i : found) {
      if (rec.ok()) {
        i.service = rec->service;
        i.client = rec->client;
      }
      incidents_.Add(std::move(i));
    }
  }
  if (events_) events_->Kick();  // the page hears of it within the feed's minimum gap
}

void Gateway::HandleEvents(const Caller& caller, std::shared_ptr<http::Exchange> ex, unsigned v) {
  if (!events_) return ex->Respond(ErrorResponse(Status::Unavailable("the event stream is not running yet"), v));
  auto head = http::MakeResponse(200, "", "text/event-stream", v);
  head.set(bhttp::field::cache_control, "no-cache");
  head.set("X-Accel-Buffering", "no");  // a reverse proxy in front must not hold events back
  ex->StartStream(std::move(head));
  ex->Write("retry: 2000\n\n");
  EventFeed::Subscriber s;
  s.ex = std::move(ex);
  s.snapshot_view = [caller](const json& snap) { return ViewFor(snap, caller.client, caller.sees_all); };
  s.incident_view = [caller](const Incident& i) { return IncidentView(i, caller.client, caller.sees_all); };
  events_->Subscribe(std::move(s));
}

void Gateway::HandleStatusView(const Caller& caller, std::shared_ptr<http::Exchange> ex, unsigned v) {
  // It asks each worker for its memory and reads the journal: off the I/O threads.
  PostStatus([this, caller, ex = std::move(ex), v] {
    json status = StatusView();
    status["incidents"] = RecentIncidents(incidents_);
    ex->Respond(JsonResponse(200, ViewFor(status, caller.client, caller.sees_all), v));
  });
}

void Gateway::HandleRequestList(const Caller& caller, std::shared_ptr<http::Exchange> ex, unsigned v) {
  PostStatus([this, caller, ex = std::move(ex), v] {
    const json view = ViewFor({{"requests", LiveRequestsJson()}}, caller.client, caller.sees_all);
    ex->Respond(JsonResponse(200, {{"object", "list"}, {"data", view["requests"]}}, v));
  });
}

}  // namespace spillway::gateway
