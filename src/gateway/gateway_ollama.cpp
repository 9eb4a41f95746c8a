// Ollama's API on the gateway's port. Generations (/api/chat, /api/generate,
// /api/embed, /api/embeddings) are translated into OpenAI requests and run
// by HandleGeneration, the same lifecycle an OpenAI request takes; an
// OllamaExchange translates the answer back. The listing routes read the
// services' model files and the workers' cached info.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>

#include "api/ollama_request.h"
#include "api/ollama_response.h"
#include "api/openai_request.h"
#include "common/hash.h"
#include "gateway/gateway.h"
#include "gateway/gateway_internal.h"
#include "gateway/ollama_exchange.h"
#include "models/model_info.h"
#include "models/ollama_store.h"
#include "protocol/worker_protocol.h"

namespace spillway::gateway {

namespace {

// The Ollama API version whose shapes the translation follows (clients gate
// features on it); Spillway's own build is said beside it.
constexpr const char* kOllamaApiVersion = "0.9.0";
// What an Ollama client lists: a name with its tag (Ollama's default "latest").
std::string OllamaName(const std::string& service) {
  return service.find(':') == std::string::npos ? service + ":latest" : service;
}

http::Response OllamaResponse(unsigned status, const json& body, unsigned v) { return JsonResponse(status, body, v); }

api::OllamaRoute RouteOf(const std::string& path) {
  if (path == "/api/generate") return api::OllamaRoute::kGenerate;
  if (path == "/api/embed") return api::OllamaRoute::kEmbed;
  if (path == "/api/embeddings") return api::OllamaRoute::kEmbeddings;
  return api::OllamaRoute::kChat;
}

// Ollama's "details" of a model file.
json Details(const models::ModelSummary& m) {
  return {{"parent_model", ""},
          {"format", "gguf"},
          {"family", m.architecture},
          {"families", json::array({m.architecture})},
          {"parameter_size", models::HumanCount(m.parameters)},
          {"quantization_level", m.quantization}};
}

// Ollama's digest is its manifest's sha256; a plain file's is the hash of
// its path, size and time (hashing gigabytes per listing would be slow).
std::string Digest(const config::ServiceConfig& svc, const models::ModelSummary& m) {
  const std::string blob = std::filesystem::path(svc.model).filename().string();
  if (models::IsOllamaName(svc.model_name) && blob.rfind("sha256-", 0) == 0) return blob.substr(7);
  return Sha256Hex(svc.model + "\n" + std::to_string(m.size) + "\n" + std::to_string(m.modified_unix_s));
}

}  // namespace

int Gateway::RequestContext(const config::ServiceConfig& svc, size_t i) const {
  const auto& p = svc.placements[i];
  if (auto m = model_summaries_.Get(p.ModelOr(svc.model)); m.ok() && m->embedding) {
    const int trained = static_cast<int>(std::min<uint64_t>(m->context_length, 1u << 30));
    return trained > 0 ? std::min(p.ctx, trained) : p.ctx;
  }
  return p.ContextPerRequest();
}

const config::ServiceConfig* Gateway::OllamaService(const std::string& model) const {
  if (const auto* svc = config_.FindService(model)) return svc;
  return config_.FindService(api::WithoutLatestTag(model));
}

void Gateway::HandleOllama(http::Request& req, std::shared_ptr<http::Exchange> ex, const std::string& path) {
  const unsigned v = req.version();
  const auto method = req.method();
  auto blocking = [&](std::function<http::Response()> answer) {
    PostStatus([ex, answer = std::move(answer)] { ex->Respond(answer()); });
  };
  // A HEAD is answered as its GET, head alone (Ollama's clients ask HEAD /api/version and /api/tags).
  const bool get = method == bhttp::verb::get || method == bhttp::verb::head;
  if (path == "/api/version" && get) {
    return ex->Respond(OllamaResponse(200, {{"version", kOllamaApiVersion}, {"spillway", "ollama-api"}}, v));
  }
  if (path == "/api/tags" && get) return blocking([this, v] { return OllamaResponse(200, OllamaTags(), v); });
  if (path == "/api/ps" && get) return blocking([this, v] { return OllamaResponse(200, OllamaRunning(), v); });
  const bool generation =
      path == "/api/chat" || path == "/api/generate" || path == "/api/embed" || path == "/api/embeddings";
  // (Asked with another method, a route falls through to its 405: AllowedMethods.)
  const bool post = method == bhttp::verb::post;
  if (generation && post) return HandleOllamaGeneration(req, std::move(ex), path);
  if (path == "/api/show" && post) {
    auto body = ParseBody(req);
    if (!body.ok()) return ex->Respond(OllamaErrorResponse(body.status(), v));
    // "name" is the older clients' spelling of "model".
    const json name = body->is_object() ? body->value("model", body->value("name", json())) : json();
    if (!name.is_string()) return ex->Respond(OllamaErrorResponse(Status::InvalidArgument("'model' is required"), v));
    const auto* svc = OllamaService(name.get<std::string>());
    if (!svc) return ex->Respond(OllamaResponse(404, {{"error", "model '" + name.get<std::string>() + "' not found"}}, v));
    return blocking([this, svc, v] {
      auto shown = OllamaShow(*svc);
      return shown.ok() ? OllamaResponse(200, *shown, v) : OllamaErrorResponse(shown.status(), v);
    });
  }
  for (const char* store_route : {"/api/pull", "/api/push", "/api/create", "/api/copy", "/api/delete", "/api/blobs/"}) {
    if (path.rfind(store_route, 0) == 0) {
      return ex->Respond(OllamaResponse(
          501, {{"error", "Spillway does not pull, push, create, copy or delete models: it serves the models its "
                          "config names (files, or ollama:NAME:TAG read from Ollama's store)"}}, v));
    }
  }
  if (const char* allow = AllowedMethods(path)) return ex->Respond(MethodNotAllowed(req.method_string(), path, allow, true, v));
  ex->Respond(OllamaErrorResponse(Status::NotFound("no route for " + std::string(req.method_string()) + " " + path), v));
}

void Gateway::HandleOllamaGeneration(http::Request& req, std::shared_ptr<http::Exchange> ex, const std::string& path) {
  const unsigned v = req.version();
  auto fail = [&](const Status& st) { ex->Respond(OllamaErrorResponse(st, v)); };
  auto body = ParseBody(req);
  if (!body.ok()) return fail(body.status());
  auto call = api::TranslateOllamaRequest(RouteOf(path), *body);
  if (!call.ok()) return fail(call.status());
  const auto* svc = OllamaService(call->model);
  if (!svc) return ex->Respond(OllamaResponse(404, {{"error", "model '" + call->model + "' not found"}}, v));
  const api::OllamaReplyContext ctx{call->route, call->model, clock_.NowMs()};
  auto out = std::make_shared<OllamaExchange>(std::move(ex), ctx, clock_,
                                              [this](std::function<void()> f) { PostBlocking(std::move(f)); });
  // keep_alive acts on a service whose accelerator placements load and
  // unload (residency keep_alive / on_demand), as Ollama's does on a model:
  // it stays loaded that long once idle, counted from when the last
  // request ended (negative: until told otherwise; 0: unloaded once idle).
  // A pinned service stays as configured.
  // A request refused (invalid, a full queue, the journal) or replayed for
  // its Idempotency-Key changes nothing: a generation's is applied once it
  // is taken (HandleGeneration's on_accepted).
  bool movable = false;
  for (const auto& p : svc->placements) movable |= p.device != "cpu" && svc->residency.mode != "pinned";
  const auto apply_keep_alive = [this, keep_alive_s = call->keep_alive_s, svc, out, movable] {
    if (keep_alive_s) {
      if (!movable) {
        out->AddHeader("X-Spillway-Keep-Alive", "not applied: service '" + svc->name + "' is " +
                                                    (svc->residency.mode == "pinned" ? "pinned" : "on the CPU only") +
                                                    " (residency is set per service in the config)");
      } else {
        const double k = *keep_alive_s;
        {
          std::lock_guard<std::mutex> lk(residency_mu_);
          keep_alive_idle_ms_[svc->name] = k < 0 ? INT64_MAX : static_cast<int64_t>(k * 1000);
        }
        out->AddHeader("X-Spillway-Keep-Alive", k < 0 ? "applied: kept loaded"
                                                 : k == 0 ? "applied: unloaded once idle"
                                                          : "applied: kept loaded until idle for " +
                                                                std::to_string(static_cast<int64_t>(k)) + " s");
      }
    } else if (movable) {
      std::lock_guard<std::mutex> lk(residency_mu_);
      keep_alive_idle_ms_.erase(svc->name);  // this request: the configured keep_alive_s
    }
  };
  if (call->load_only) {  // Ollama loads the model (or, with keep_alive 0, unloads it)
    // (A load begun now would be stopped with the gateway.)
    if (stopping_) return out->Respond(OllamaErrorResponse(StoppingRefusal(), v));
    apply_keep_alive();
    if (movable && !(call->keep_alive_s && *call->keep_alive_s == 0)) {
      for (size_t i = 0; i < svc->placements.size(); ++i) {
        if (svc->placements[i].device == "cpu") continue;
        // Wanted now, as by a request: idle from here, not from the last
        // request's end (its replica was released at once once ready).
        board_.Touch(svc->name, i);
        supervisor_.Demand(WorkerKey(*svc, i));
      }
    }
    // keep_alive 0 on a model that unloads: Ollama's "unload" (once idle).
    const bool unload = movable && call->keep_alive_s && *call->keep_alive_s == 0;
    auto res = OllamaResponse(200, api::OllamaLoadAnswer(ctx, clock_.NowMs(), unload), v);
    return out->RespondTranslated(std::move(res));
  }
  // As Ollama: thinking or tools asked of a model whose template has none is a 400.
  if (Status st = OllamaCapable(*svc, *call); !st.ok()) return out->RespondTranslated(OllamaErrorResponse(st, v));
  call->openai["model"] = svc->name;
  if (call->endpoint != "embedding") {
    // num_predict is an upper bound, as Ollama's runner takes it: none (or
    // -1, -2, 0) generates to the end of the context, and a larger one than
    // the context has room for ends there ("length"), never refused. So: the
    // service's cap at most, lowered to the room beside the prompt
    // (admission and the worker, "spillway_fit_context").
    const auto n = call->openai.find("max_tokens");
    const int64_t asked = n != call->openai.end() && n->is_number_integer() ? n->get<int64_t>() : svc->max_tokens;
    call->openai["max_tokens"] = std::min<int64_t>(asked, svc->max_tokens);
    call->openai["spillway_fit_context"] = true;
  }
  // The OpenAI parser's verdict, with the fields named as the client sent them.
  const Status valid = call->endpoint == "chat"         ? api::ParseChatRequest(call->openai).status()
                       : call->endpoint == "completion" ? api::ParseCompletionRequest(call->openai).status()
                                                        : api::ParseEmbeddingRequest(call->openai).status();
  if (!valid.ok()) return out->RespondTranslated(OllamaErrorResponse(api::OllamaFieldNames(valid, *call), v));
  http::Request translated = req;
  translated.target(call->endpoint == "chat"         ? "/v1/chat/completions"
                    : call->endpoint == "completion" ? "/v1/completions"
                                                     : "/v1/embeddings");
  translated.body() = call->openai.dump(-1, ' ', false, json::error_handler_t::replace);
  if (translated.body().size() > config_.WorkerMaxBodyBytes()) {  // (many small tool calls, each given an id and a type)
    return out->RespondTranslated(OllamaErrorResponse(
        Status::PayloadTooLarge("the request as translated for the model (" + std::to_string(translated.body().size()) +
                                " bytes) exceeds what a worker takes (" + std::to_string(config_.WorkerMaxBodyBytes()) +
                                " bytes: twice max_body_bytes and 64 KiB)"), v));
  }
  translated.prepare_payload();
  HandleGeneration(translated, out, call->endpoint, apply_keep_alive, api::kTranslationDepth);
}

Status Gateway::OllamaCapable(const config::ServiceConfig& svc, const api::OllamaCall& call) const {
  const bool thinks = call.openai.contains("reasoning_format");  // think: true, or an effort
  const auto tools = call.openai.find("tools");
  const bool uses_tools = tools != call.openai.end() && tools->is_array() && !tools->empty();
  if (!thinks && !uses_tools) return Status::Ok();
  // As read at start (or by the last /api/show or /api/tags): never a
  // header read on this I/O thread.
  auto m = model_summaries_.Cached(svc.model);
  if (!m) return Status::Ok();  // (not readable: its request says why)
  const std::string quoted = "\"" + call.model + "\"";
  if (thinks && !m->thinking) return Status::InvalidArgument(quoted + " does not support thinking");
  if (uses_tools && !m->tools) return Status::InvalidArgument(quoted + " does not support tools");
  return Status::Ok();
}

json Gateway::OllamaTags() const {
  json models = json::array();
  for (const auto& svc : config_.services) {
    auto m = model_summaries_.Get(svc.model);
    if (!m.ok()) continue;  // a file gone since the start: its requests say why
    models.push_back({{"name", OllamaName(svc.name)},
                      {"model", OllamaName(svc.name)},
                      {"modified_at", api::OllamaTimestamp(m->modified_unix_s * 1000)},
                      {"size", m->size},
                      {"digest", Digest(svc, *m)},
                      {"details", Details(*m)}});
  }
  return {{"models", models}};
}

namespace {

// A GGUF array as Ollama's /api/show gives it unless asked to be verbose:
// up to 5 entries as they are, a longer one empty (a tokenizer's vocabulary
// is not sent). A short array of strings is not kept by the reader: empty
// too. (It was null: a client iterating it failed.)
json ShortArray(const gguf::Value& v) {
  json out = json::array();
  if (v.array_len > 5 || v.numbers.size() != v.array_len) return out;
  // (GGUF's types: 0-5, 10 and 11 integers, 7 bool, 6 and 12 floats.)
  const uint32_t t = v.array_type;
  const bool integer = t <= 5 || t == 10 || t == 11;
  for (const double d : v.numbers) {
    if (t == 7) out.push_back(d != 0);
    else if (integer) out.push_back(static_cast<int64_t>(d));
    else out.push_back(d);
  }
  return out;
}

}  // namespace

StatusOr<json> Gateway::OllamaShow(const config::ServiceConfig& svc) const {
  auto meta = gguf::ReadGgufFile(svc.model);
  if (!meta.ok()) return Status::Unavailable(meta.status().message());
  const auto m = models::Summarize(svc.model, *meta, 0);
  json info = json::object();
  for (const auto& [key, value] : meta->kv) {
    using Kind = gguf::Value::Kind;
    if (key == "tokenizer.chat_template") continue;  // it is "template"
    switch (value.kind) {
      case Kind::kInt: info[key] = value.i; break;
      case Kind::kUint: info[key] = value.u; break;
      case Kind::kFloat: info[key] = value.f; break;
      case Kind::kBool: info[key] = value.b; break;
      case Kind::kString: info[key] = value.s; break;
      case Kind::kArray: info[key] = ShortArray(value); break;
    }
  }
  info["general.parameter_count"] = m.parameters;
  const std::string tmpl = meta->String("tokenizer.chat_template").value_or("");
  json capabilities = m.embedding ? json::array({"embedding"}) : json::array({"completion"});
  if (m.tools) capabilities.push_back("tools");
  if (m.thinking) capabilities.push_back("thinking");
  return json{{"modelfile", ""},
              {"parameters", ""},
              {"template", tmpl},
              {"details", Details(m)},
              {"model_info", info},
              {"capabilities", capabilities},
              {"spillway", {{"service", svc.name}, {"model", svc.model_name}, {"file", svc.model},
                            {"template_family", m.template_family}}}};
}

json Gateway::OllamaRunning() const {
  json models = json::array();
  const auto workers = supervisor_.Snapshot();
  const int64_t now = clock_.NowMs();
  for (const auto& svc : config_.services) {
    for (size_t i = 0; i < svc.placements.size(); ++i) {
      const std::string key = WorkerKey(svc, i);
      const upstream::WorkerView* w = nullptr;
      for (const auto& x : workers) {
        if (x.key == key && x.state == upstream::WorkerState::kReady) w = &x;
      }
      if (!w) continue;
      uint64_t size = 0, vram = 0;
      if (w->info) {
        const json info = json::parse(*w->info, nullptr, false);
        const json buffers = info.is_object() && info.contains("memory") && info["memory"].is_object()
                                 ? info["memory"].value("buffers", json::array())
                                 : json::array();
        for (const auto& b : buffers) {
          if (!b.is_object() || !b.contains("total") || !b["total"].is_number_unsigned()) continue;
          const uint64_t total = b["total"].get<uint64_t>();
          size += total;
          if (!protocol::IsHostBuffer(b)) vram += total;
        }
      }
      // A pinned or warm replica stays while the gateway runs; an on-demand
      // one goes once idle for its keep-alive (an accelerator placement's,
      // IdleReplica) or idle_unload_s (a CPU replica's).
      const int64_t forever = int64_t{100} * 365 * 86400 * 1000;
      const int64_t idle_ms = !w->on_demand                         ? forever
                              : svc.placements[i].device == "cpu" ? static_cast<int64_t>(svc.failover.idle_unload_s * 1000)
                                                                  : std::min(KeepAliveMs(svc), forever);
      const int64_t expires_ms = now + idle_ms;
      auto m = model_summaries_.Get(svc.model);
      models.push_back({{"name", OllamaName(svc.name)},
                        {"model", OllamaName(svc.name)},
                        {"size", size},
                        {"digest", m.ok() ? Digest(svc, *m) : ""},
                        {"details", m.ok() ? Details(*m) : json::object()},
                        {"expires_at", api::OllamaTimestamp(expires_ms)},
                        {"size_vram", vram},
                        // What one request may hold (Ollama's num_ctx): its slot's share of the pool.
                        {"context_length", RequestContext(svc, i)},
                        {"spillway", {{"placement", svc.placements[i].Name()}, {"role", svc.placements[i].role}}}});
      break;  // one entry per service: the first ready placement serves it
    }
  }
  return {{"models", models}};
}

}  // namespace spillway::gateway
