#include "gateway/reply_writer.h"

#include <cmath>

#include "api/openai_response.h"
#include "gateway/gateway_internal.h"
#include "protocol/worker_protocol.h"

namespace spillway::gateway {

ReplyWriter::ReplyWriter(std::shared_ptr<http::Exchange> ex, std::string request_id, unsigned version)
    : ex_(std::move(ex)), id_(std::move(request_id)), version_(version) {}

size_t ReplyWriter::unsent_bytes() const { return ex_ ? ex_->unsent_bytes() : 0; }
bool ReplyWriter::disconnected() const { return ex_ && ex_->disconnected(); }

void ReplyWriter::Describe(http::Response& res, const ServedBy& s) {
  res.set("X-Spillway-Placement", s.placement);
  res.set("X-Spillway-Decision", s.decision);
  res.set("X-Spillway-Attempts", std::to_string(s.attempts));
  if (!s.limits.empty()) res.set("X-Spillway-Limits", s.limits);
  if (s.waited_ms > 0) res.set("X-Spillway-Queued-Ms", std::to_string(s.waited_ms));
  if (!s.degraded.empty()) res.set("X-Spillway-Degraded", s.degraded);
  if (!s.fallback_model.empty()) res.set("X-Spillway-Fallback-Model", s.fallback_model);
  if (!s.dropped_messages.empty()) res.set(std::string(protocol::kDroppedMessagesHeader), s.dropped_messages);
  // A request that was delayed hears the estimate it was delayed with (a
  // stream heard it at once, in its early head).
  if (s.estimated_delay_s >= 0) {
    res.set("X-Spillway-Estimated-Delay", std::to_string(static_cast<int>(std::ceil(s.estimated_delay_s))));
  }
}

void ReplyWriter::WaitingNote(const std::string& note, double est_delay_s) {
  if (!ex_ || note.empty()) return;
  if (!head_sent_) {
    head_sent_ = true;
    auto head = http::MakeResponse(200, "", "text/event-stream", version_);
    head.set(bhttp::field::cache_control, "no-cache");
    head.set("X-Request-Id", id_);
    head.set("X-Spillway-Degraded", note);
    head.set("X-Spillway-Estimated-Delay", std::to_string(static_cast<int>(std::ceil(est_delay_s))));
    ex_->StartStream(std::move(head));
  }
  Comment(note);
}

namespace {
constexpr std::string_view kServedComment = ": spillway-served ";
}  // namespace

std::optional<ServedBy> ReplyWriter::StoredServedBy(std::string_view stored) {
  if (stored.rfind(kServedComment, 0) != 0) return std::nullopt;
  stored.remove_prefix(kServedComment.size());
  const json j = json::parse(stored.substr(0, stored.find('\n')), nullptr, false);
  if (!j.is_object()) return std::nullopt;
  ServedBy s;
  const auto text = [&](const char* key) { return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : ""; };
  s.placement = text("placement");
  s.decision = text("decision");
  s.limits = text("limits");
  s.degraded = text("degraded");
  s.fallback_model = text("fallback_model");
  s.dropped_messages = text("dropped_messages");
  if (j.contains("attempts") && j["attempts"].is_number_integer()) s.attempts = j["attempts"].get<int>();
  return s;
}

void ReplyWriter::DescribeStoredCuts(http::Response& res, std::string_view stored) {
  // (Parsed only when it says either: an embedding's answer may be megabytes.)
  if (stored.find("\"truncated_inputs\"") == std::string_view::npos &&
      stored.find("\"dropped_messages\"") == std::string_view::npos) {
    return;
  }
  const json j = json::parse(stored, nullptr, false);
  if (!j.is_object() || !j.contains("spillway") || !j["spillway"].is_object()) return;
  const json& s = j["spillway"];
  const auto count = [&](const char* key, std::string_view header) {
    if (auto it = s.find(key); it != s.end() && it->is_number_integer() && it->get<int64_t>() > 0) {
      res.set(std::string(header), std::to_string(it->get<int64_t>()));
    }
  };
  count("truncated_inputs", protocol::kTruncatedInputsHeader);
  count("dropped_messages", protocol::kDroppedMessagesHeader);
}

void ReplyWriter::BeginStream(const ServedBy& served, const std::string& role) {
  if (events_started_) return;
  events_started_ = true;
  // (A chat's dropped messages too, when any: its replay's head says them
  // again, as a whole answer's replay does.)
  const bool dropped = !served.dropped_messages.empty() && served.dropped_messages != "0";
  if (!served.fallback_model.empty() || !served.limits.empty() || !served.degraded.empty() || dropped) {
    StoreServed(served);
  }
  if (!ex_) return;
  // (As a whole answer's body says them: request_lifecycle.cpp, Answered.)
  if (!served.fallback_model.empty()) ex_->Annotate("fallback_model", served.fallback_model);
  if (!served.limits.empty()) ex_->Annotate("limits", served.limits);
  if (head_sent_) {  // started while waiting: say where it runs now
    // (Its head went out without X-Spillway-Dropped-Messages: said here.)
    Comment("running on " + served.placement + " (" + role + ")" +
            (served.limits.empty() ? "" : ", limits " + served.limits) +
            (dropped ? ", its " + served.dropped_messages + " oldest messages left out to fit its context" : ""));
    return;
  }
  head_sent_ = true;
  auto head = http::MakeResponse(200, "", "text/event-stream", version_);
  head.set(bhttp::field::cache_control, "no-cache");
  head.set("X-Request-Id", id_);
  Describe(head, served);
  ex_->StartStream(std::move(head));
}

void ReplyWriter::BeginRelay(int status, const std::string& type, const ServedBy& served) {
  if (events_started_) return;
  events_started_ = true;
  if (!ex_) return;
  head_sent_ = relay_ = true;
  auto head = http::MakeResponse(static_cast<unsigned>(status), "", type, version_);
  head.set(bhttp::field::cache_control, "no-cache");
  head.set("X-Request-Id", id_);
  Describe(head, served);
  ex_->StartStream(std::move(head));
}

void ReplyWriter::StoreServed(const ServedBy& served) {
  std::string record = std::string(kServedComment) +
                       json{{"placement", served.placement},
                            {"decision", served.decision},
                            {"attempts", served.attempts},
                            {"limits", served.limits},
                            {"degraded", served.degraded},
                            {"fallback_model", served.fallback_model},
                            {"dropped_messages", served.dropped_messages}}
                           .dump(-1, ' ', false, json::error_handler_t::replace) +
                       "\n\n";
  // (One record, at the head: a continuation's replaces the first placement's.)
  if (stored_.rfind(kServedComment, 0) == 0) {
    const size_t end = stored_.find("\n\n");
    stored_.erase(0, end == std::string::npos ? stored_.size() : end + 2);
  }
  stored_ = record + stored_;
}

void ReplyWriter::ContinuedOn(const ServedBy& served) {
  // The stored stream (an Idempotency-Key's replay, GET /v1/requests/{id})
  // says the placement that finished it and what it applied, as the live
  // stream's comment and an Ollama stream's last line did: it said the
  // first placement's, or nothing.
  if (relayed_bytes_ <= max_stored_) {
    ServedBy now = served;  // (what the first placement left out of the chat stays left out: its count goes on)
    if (now.dropped_messages.empty()) {
      if (auto before = StoredServedBy(stored_)) now.dropped_messages = before->dropped_messages;
    }
    StoreServed(now);
  }
  // Its head went out long ago: what this placement applies (the CPU path's
  // lower max_tokens) is said here, and in an Ollama stream's last line.
  if (ex_ && !served.limits.empty()) ex_->Annotate("limits", served.limits);
  Comment("continued on " + served.placement + " after a failure" +
          (served.limits.empty() ? "" : ", limits " + served.limits));
}

void ReplyWriter::Comment(const std::string& text) {
  if (ex_) ex_->Write(": spillway: " + text + "\n\n");  // SSE comment, ignored by clients
}

void ReplyWriter::Event(const std::string& event) {
  relayed_bytes_ += event.size();
  if (relayed_bytes_ <= max_stored_) {
    stored_ += event;
  } else if (!stored_.empty()) {
    std::string().swap(stored_);  // what was kept goes; a note takes its place when asked for
  }
  if (ex_) ex_->Write(event);
}

const std::string& ReplyWriter::stored() const {
  if (relayed_bytes_ > max_stored_) {
    stored_ = "(not kept: an answer of more than " + std::to_string(max_stored_) + " bytes, relayed as it came; " +
              std::to_string(relayed_bytes_) + " bytes so far)";
  }
  return stored_;
}

std::string ReplyWriter::StoreFinalError(const json& error_body) {
  std::string ev = api::SseEvent(error_body) + api::kSseDone;
  stored_ += ev;
  return ev;
}

void ReplyWriter::SendFinal(const std::string& final_events) {
  if (!ex_) return;
  if (!final_events.empty()) ex_->Write(final_events);
  ex_->End();
}

void ReplyWriter::EndStream() {
  if (ex_) ex_->End();
}

void ReplyWriter::Abort() {
  if (ex_) ex_->Abort();
  ex_.reset();
}

void ReplyWriter::Answer(int status, const std::string& type, const std::string& body, const ServedBy* served,
                         const std::string& retry_after, const std::string& truncated_inputs) {
  if (!ex_) return;
  auto res = http::MakeResponse(static_cast<unsigned>(status), body, type, version_);
  res.set("X-Request-Id", id_);
  if (served) Describe(res, *served);
  if (!retry_after.empty()) res.set(bhttp::field::retry_after, retry_after);
  if (!truncated_inputs.empty()) res.set(std::string(protocol::kTruncatedInputsHeader), truncated_inputs);
  ex_->Respond(std::move(res));
}

void ReplyWriter::Error(const Status& st) {
  if (!ex_) return;
  if (!head_sent_) return ex_->Respond(ErrorResponse(st, version_, id_));
  // A stream has begun (an answer after it would land inside its body):
  // the error is its last event, or, for a relayed answer whose format is
  // the server's, the stream ends as cut.
  if (relay_) return Abort();
  ex_->Write(api::SseEvent(ErrorJson(st, id_)) + api::kSseDone);
  ex_->End();
}

}  // namespace spillway::gateway
