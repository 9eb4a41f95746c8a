// An exchange that passes everything to the client's own exchange: the base
// of those that change an answer on its way out (ollama_exchange.h,
// cors_exchange.h), which override what they change.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "api/http_server.h"

namespace spillway::gateway {

class ForwardingExchange : public http::Exchange {
 public:
  explicit ForwardingExchange(std::shared_ptr<http::Exchange> inner) : inner_(std::move(inner)) {}

  void Respond(http::Response res) override { inner_->Respond(std::move(res)); }
  void StartStream(http::Response header) override { inner_->StartStream(std::move(header)); }
  void Write(std::string data) override { inner_->Write(std::move(data)); }
  void End() override { inner_->End(); }
  void Abort() override { inner_->Abort(); }
  void OnDisconnect(std::function<void()> cb) override { inner_->OnDisconnect(std::move(cb)); }
  bool disconnected() const override { return inner_->disconnected(); }
  size_t unsent_bytes() const override { return inner_->unsent_bytes(); }
  boost::asio::any_io_executor executor() const override { return inner_->executor(); }
  std::string peer_address() const override { return inner_->peer_address(); }
  void Annotate(const std::string& key, const std::string& value) override { inner_->Annotate(key, value); }
  bool holds_tool_calls() const override { return inner_->holds_tool_calls(); }

 protected:
  std::shared_ptr<http::Exchange> inner_;
};

}  // namespace spillway::gateway
