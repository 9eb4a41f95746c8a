// The client's exchange as an Ollama client sees it: the gateway's lifecycle
// answers an Ollama request exactly as it answers an OpenAI one (journal,
// admission, failover, cancel, the degraded-service headers), and this
// adapter translates what it says on the way out (api/ollama_response.h):
//
//   - a whole answer becomes Ollama's shape; an error becomes {"error": "..."}
//     with its status; headers (X-Request-Id, X-Spillway-*, Retry-After) stay;
//   - a stream's head becomes application/x-ndjson, its events NDJSON lines,
//     its SSE comments (waiting notes) are dropped; an error event becomes an
//     {"error"} line, the status unchanged; who served it (a fallback model,
//     the limits applied: Annotate) is in its last line's "spillway", since a
//     stream that waited sent its head before that was known;
//   - a stored stream replayed whole (an Idempotency-Key replay) becomes the
//     NDJSON body it would have streamed.
//
// Thread-safe as http::Exchange requires (one lock around the translator);
// the disconnect callback and state pass through to the wrapped exchange.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "api/http_server.h"
#include "api/ollama_response.h"
#include "common/clock.h"
#include "gateway/forwarding_exchange.h"

namespace spillway::gateway {

class OllamaExchange final : public ForwardingExchange, public std::enable_shared_from_this<OllamaExchange> {
 public:
  // Runs a task on a thread that may block (the gateway's blocking pool).
  using Offload = std::function<void(std::function<void()>)>;
  // `clock` must outlive the exchange (the gateway's). `offload`: where a
  // whole answer larger than kOffloadBytes is translated (an embedding of
  // many inputs: its parse and dump took the I/O thread, and every
  // connection on it, for as long); none: in place.
  OllamaExchange(std::shared_ptr<http::Exchange> inner, api::OllamaReplyContext ctx, const Clock& clock,
                 Offload offload = {});
  static constexpr size_t kOffloadBytes = 256 << 10;

  // A header every answer carries (set before the exchange is used).
  void AddHeader(std::string name, std::string value) { headers_.emplace_back(std::move(name), std::move(value)); }
  // An answer already in Ollama's shape (the gateway's own: a load, a 400).
  void RespondTranslated(http::Response res);

  void Respond(http::Response res) override;
  bool holds_tool_calls() const override { return true; }  // (sent with the last line)
  void StartStream(http::Response header) override;
  void Write(std::string data) override;
  void End() override;
  void Annotate(const std::string& key, const std::string& value) override;

 private:
  // Respond's work: the answer in Ollama's shape, sent.
  void Translate(http::Response res);
  Offload offload_;
  api::OllamaReplyContext ctx_;
  const Clock& clock_;
  std::vector<std::pair<std::string, std::string>> headers_;
  std::mutex mu_;
  api::OllamaStreamTranslator stream_;
};

}  // namespace spillway::gateway
