#include "gateway/ollama_exchange.h"

#include "gateway/reply_writer.h"

#include <nlohmann/json.hpp>

namespace spillway::gateway {

using nlohmann::json;
namespace bhttp = boost::beast::http;

OllamaExchange::OllamaExchange(std::shared_ptr<http::Exchange> inner, api::OllamaReplyContext ctx, const Clock& clock,
                               Offload offload)
    : ForwardingExchange(std::move(inner)),
      offload_(std::move(offload)),
      ctx_(ctx),
      clock_(clock),
      stream_(std::move(ctx)) {}

void OllamaExchange::Respond(http::Response res) {
  if (offload_ && res.body().size() > kOffloadBytes) {
    // (The exchange answers from any thread: http::Exchange.)
    auto task = std::make_shared<http::Response>(std::move(res));
    return offload_([self = shared_from_this(), task] { self->Translate(std::move(*task)); });
  }
  Translate(std::move(res));
}

void OllamaExchange::Translate(http::Response res) {
  std::string body;
  std::string type = "application/json";
  const std::string given(res[bhttp::field::content_type]);
  if (res.result_int() >= 400) {
    body = api::OllamaError(res.body()).dump(-1, ' ', false, json::error_handler_t::replace);
  } else if (given.rfind("text/event-stream", 0) == 0) {  // a stored stream, replayed whole
    std::lock_guard<std::mutex> lk(mu_);
    api::OllamaStreamTranslator whole(ctx_);
    if (auto served = ReplyWriter::StoredServedBy(res.body())) {  // as the stream's last line said it
      if (!served->fallback_model.empty()) whole.Annotate("fallback_model", served->fallback_model);
      if (!served->limits.empty()) whole.Annotate("limits", served->limits);
    }
    const int64_t now = clock_.NowMs();
    body = whole.Feed(res.body(), now);
    body += whole.Finish(now);  // (after Feed: the operands of + are unsequenced)
    type = "application/x-ndjson";
  } else {
    const json openai = json::parse(res.body(), nullptr, false);
    auto answer = api::OllamaAnswer(ctx_, openai, clock_.NowMs());
    if (answer.ok()) {
      body = answer->dump(-1, ' ', false, json::error_handler_t::replace);
    } else {  // not an answer the gateway knows: say so rather than pass a foreign shape on
      res.result(bhttp::status::bad_gateway);
      body = json{{"error", answer.status().message()}}.dump();
    }
  }
  res.set(bhttp::field::content_type, type);
  res.body() = std::move(body);
  res.prepare_payload();
  RespondTranslated(std::move(res));
}

void OllamaExchange::RespondTranslated(http::Response res) {
  for (const auto& [name, value] : headers_) res.set(name, value);
  inner_->Respond(std::move(res));
}

void OllamaExchange::StartStream(http::Response header) {
  header.set(bhttp::field::content_type, "application/x-ndjson");
  for (const auto& [name, value] : headers_) header.set(name, value);
  inner_->StartStream(std::move(header));
}

void OllamaExchange::Write(std::string data) {
  std::string lines;
  {
    std::lock_guard<std::mutex> lk(mu_);
    lines = stream_.Feed(data, clock_.NowMs());
  }
  if (!lines.empty()) inner_->Write(std::move(lines));
}

void OllamaExchange::Annotate(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lk(mu_);
  stream_.Annotate(key, value);
}

void OllamaExchange::End() {
  std::string tail;
  {
    std::lock_guard<std::mutex> lk(mu_);
    tail = stream_.Finish(clock_.NowMs());
  }
  if (!tail.empty()) inner_->Write(std::move(tail));
  inner_->End();
}

}  // namespace spillway::gateway
