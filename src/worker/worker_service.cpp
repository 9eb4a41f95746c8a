#include "worker/worker_service.h"

#include <boost/asio/post.hpp>

#include "common/survive.h"
#include "protocol/worker_protocol.h"

#include <unistd.h>

#include <ggml-backend.h>

#include <nlohmann/json.hpp>

#include "api/openai_request.h"
#include "api/openai_response.h"
#include "common/mutation.h"
#include "common/secret.h"
#include "worker/chat_fit.h"
#include "worker/reply_writer.h"
#include "worker/sampling.h"

namespace spillway::worker {

using nlohmann::json;
namespace bhttp = boost::beast::http;

namespace {

// What the kept renderings may hold, and for how long (rendered_prompts.h):
// the count and its run are milliseconds apart, a retry seconds.
constexpr size_t kRenderedPromptBytes = 32 << 20;
// What the kept prompts' texts and tokens may hold (prompt_tokens.h): a
// 100,000-token conversation is about 0.8 MB of both.
constexpr size_t kKeptPromptTokenBytes = 32 << 20;
constexpr int64_t kRenderedPromptMs = 30'000;

http::Response JsonResponse(unsigned status, const json& body, unsigned version) {
  return http::MakeResponse(status, body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json",
                            version);
}

http::Response ErrorResponse(const Status& st, unsigned version) {
  auto res = JsonResponse(static_cast<unsigned>(HttpStatusFor(st.code())), api::ErrorBody(st), version);
  if (st.retry_after_s() > 0) res.set(bhttp::field::retry_after, std::to_string(st.retry_after_s()));
  return res;
}

bool ValidRequestId(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' || c == ':')) return false;
  }
  return true;
}

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A disconnect noticed after the answer went out must not cancel: the
// engine would remember the id and refuse a retry or replay that reuses it.
// Wraps `job`'s on_done; returns what a disconnect calls (OnDisconnect).
std::function<void()> CancelUnlessAnswered(Engine* engine, Job& job) {
  auto finished = std::make_shared<std::atomic<bool>>(false);
  job.on_done = [finished, done = std::move(job.on_done)](JobResult r) {
    finished->store(true);
    done(std::move(r));
  };
  return [engine, id = job.id, finished] {
    if (!finished->load()) engine->Cancel(id);
  };
}

}  // namespace

WorkerService::WorkerService(const Model& model, Engine& engine, Placement placement, ServiceOptions opts,
                             FaultInjector* faults)
    : model_(model),
      engine_(engine),
      placement_(std::move(placement)),
      opts_(opts),
      faults_(faults),
      started_(std::chrono::system_clock::now()),
      rng_(std::random_device{}()),
      rendered_(clock_, opts_.rendered_prompts, kRenderedPromptBytes, kRenderedPromptMs),
      prompt_tokens_(model.vocab(), opts_.kept_prompt_tokens, kKeptPromptTokenBytes) {}

std::string WorkerService::RequestId(const http::Request& req) {
  auto it = req.find("x-request-id");
  if (it != req.end()) {
    const std::string v(it->value());
    if (ValidRequestId(v)) return v;
  }
  return "req-" + RandomHex(8);  // not from rng_, whose seeds are returned in answers
}

uint32_t WorkerService::FreshSeed() {
  std::lock_guard<std::mutex> lk(rng_mu_);
  return static_cast<uint32_t>(rng_() % 0xFFFFFFFFull);  // never LLAMA_DEFAULT_SEED
}

Status WorkerService::CheckCaller(const http::Request& req) const {
  // DNS rebinding and pages in a browser: only loopback names, no Origin.
  auto host = req.find(bhttp::field::host);
  if (host == req.end()) return Status::PermissionDenied("a Host header is required");
  const std::string h = http::HostOnly(std::string_view(host->value().data(), host->value().size()));
  if (h != "127.0.0.1" && h != "localhost" && h != "[::1]") {
    return Status::PermissionDenied("Host '" + h + "' is not allowed: a worker answers loopback names only");
  }
  if (req.find(bhttp::field::origin) != req.end()) {
    return Status::PermissionDenied("requests from browsers (with an Origin) are not allowed: call the gateway");
  }
  if (opts_.secret.empty()) return Status::Ok();
  auto auth = req.find(bhttp::field::authorization);
  const std::string_view given = auth == req.end() ? std::string_view()
                                                   : std::string_view(auth->value().data(), auth->value().size());
  constexpr std::string_view kBearer = "Bearer ";
  if (given.substr(0, kBearer.size()) != kBearer || !SecretEquals(given.substr(kBearer.size()), opts_.secret)) {
    return Status::Unauthenticated("this worker answers its supervising gateway only "
                                   "(Authorization: Bearer <the worker secret>)");
  }
  return Status::Ok();
}

void WorkerService::Handle(http::Request req, std::shared_ptr<http::Exchange> ex) {
  const std::string target(req.target());
  const std::string path = target.substr(0, target.find('?'));
  const auto method = req.method();
  const unsigned v = req.version();
  auto respond_error = [&](const Status& st) { ex->Respond(ErrorResponse(st, v)); };
  if (Status st = CheckCaller(req); !st.ok()) return respond_error(st);
  last_caller_.store(std::chrono::steady_clock::now().time_since_epoch().count());
  const bool prepared = method == bhttp::verb::post &&
                        (path == "/v1/chat/completions" || path == "/v1/completions" || path == "/v1/embeddings" ||
                         path == protocol::kTokenizePath || path == protocol::kApplyTemplatePath);
  if (prepared && req.body().size() > kInlineBodyBytes) {
    return boost::asio::post(prep_.get_executor(), [this, req = std::move(req), ex = std::move(ex)]() mutable {
      if (ex->disconnected()) return;  // its caller gave up while it waited (a gateway's count that timed out)
      // (As on the I/O threads: an exception answers 500, never ends the worker.)
      RunSurviving("spillway-worker: preparing a request", [&] { Route(req, std::move(ex)); });
    });
  }
  Route(req, std::move(ex));
}

void WorkerService::Stop() {
  prep_.join();  // (it runs what it holds: each answers, or is refused by the engine)
}

void WorkerService::Route(const http::Request& req, std::shared_ptr<http::Exchange> ex) {
  const std::string target(req.target());
  const std::string path = target.substr(0, target.find('?'));
  const auto method = req.method();
  const unsigned v = req.version();
  auto respond_error = [&](const Status& st) { ex->Respond(ErrorResponse(st, v)); };

  if (path == protocol::kHealthPath) {
    if (method != bhttp::verb::get) return respond_error(Status(StatusCode::kInvalidArgument, "use GET"));
    auto st = engine_.stats();
    // Stalled: no step for progress_timeout_s, and for four times the longest
    // step this worker has finished (a large model's prompt chunk on a CPU
    // takes its time and is not a hang; a step that never ends is).
    const bool stalled =
        st.stalled_ms > std::max<int64_t>(static_cast<int64_t>(opts_.progress_timeout_s * 1000), 4 * st.longest_step_ms);
    const bool ok = st.healthy && !stalled;
    protocol::HealthReport report;
    report.state = ok ? protocol::Health::kOk
                   : st.device_lost ? protocol::Health::kDeviceLost
                   : stalled        ? protocol::Health::kStalled
                                    : protocol::Health::kError;
    report.stalled_ms = st.stalled_ms;
    if (!st.healthy) report.error = st.last_error;
    return ex->Respond(JsonResponse(ok ? 200 : 503, report.ToJson(), v));
  }
  if (path == protocol::kInfoPath && method == bhttp::verb::get) return ex->Respond(JsonResponse(200, Info(), v));
  if (path == "/v1/models" && method == bhttp::verb::get) {
    json body = {{"object", "list"},
                 {"data", json::array({{{"id", model_.name()}, {"object", "model"}, {"owned_by", "spillway"},
                                        {"created", std::chrono::duration_cast<std::chrono::seconds>(
                                                        started_.time_since_epoch()).count()}}})}};
    return ex->Respond(JsonResponse(200, body, v));
  }
  if (path == protocol::kCancelAllPath && method == bhttp::verb::delete_) {
    return ex->Respond(JsonResponse(200, json{{"cancelled", engine_.CancelAll()}}, v));
  }
  if (path.rfind(protocol::kCancelPrefix, 0) == 0 && method == bhttp::verb::delete_) {
    const std::string id = path.substr(protocol::kCancelPrefix.size());
    if (!ValidRequestId(id)) return respond_error(Status::InvalidArgument("malformed request id"));
    if (!engine_.Cancel(id)) return respond_error(Status::NotFound("no queued or running request '" + id + "'"));
    return ex->Respond(JsonResponse(200, json{{"id", id}, {"cancelled", true}}, v));
  }
  if (path == protocol::kTokenizePath && method == bhttp::verb::post) {
    // The prompt's token count for the gateway's admission decision, for the
    // same body a generation route would get (?endpoint=chat|completion).
    const bool chat = target.find("endpoint=completion") == std::string::npos;
    // (fit_cells: the context a chat with "truncate" is cut for, its service's primary's.)
    int32_t fit_cells = 0;
    if (const auto f = target.find("fit_cells="); f != std::string::npos) {
      const long long n = std::atoll(target.c_str() + f + 10);
      fit_cells = n > 0 && n <= INT32_MAX ? static_cast<int32_t>(n) : 0;
    }
    auto prompt = PromptFor(req.body(), chat, fit_cells);
    if (!prompt.ok()) return respond_error(prompt.status());
    const protocol::TokenizeReply reply{static_cast<int>(prompt->tokens.size()), static_cast<int>(engine_.options().ctx),
                                        static_cast<int>(opts_.default_max_tokens),
                                        std::max(0, prompt->dropped_messages), engine_.CachedPrefixFor(prompt->tokens)};
    return ex->Respond(JsonResponse(200, reply.ToJson(), v));
  }
  if (path == protocol::kApplyTemplatePath && method == bhttp::verb::post) {
    // As llama-server's route (its "prompt"), plus the tokens the worker would decode.
    auto prompt = PromptFor(req.body(), /*chat=*/true);
    if (!prompt.ok()) return respond_error(prompt.status());
    return ex->Respond(JsonResponse(200, json{{"prompt", prompt->text}, {"tokens", prompt->tokens}}, v));
  }
  if (path == protocol::kFaultsPath && method == bhttp::verb::post) {
    if (!faults_) return respond_error(Status::InvalidArgument("fault injection is not available"));
    if (opts_.secret.empty()) {
      return respond_error(Status::PermissionDenied("fault routes need the worker secret (this worker runs with --no-auth)"));
    }
    auto body = api::ParseJsonBody(req.body(), opts_.json_limits);
    if (!body.ok()) return respond_error(body.status());
    auto it = body->find("faults");
    if (it == body->end() || !it->is_array()) return respond_error(Status::InvalidArgument("'faults' must be an array of strings"));
    for (const auto& f : *it) {
      if (!f.is_string()) return respond_error(Status::InvalidArgument("'faults' must be an array of strings"));
      if (Status st = faults_->Arm(f.get<std::string>()); !st.ok()) return respond_error(st);
    }
    return ex->Respond(JsonResponse(200, faults_->ToJson(), v));
  }
  const bool chat = path == "/v1/chat/completions";
  if (chat || path == "/v1/completions" || path == "/v1/embeddings") {
    if (method != bhttp::verb::post) return respond_error(Status::InvalidArgument("use POST for " + path));
    requests_.fetch_add(1);
    if (path == "/v1/embeddings") return HandleEmbeddings(req, std::move(ex));
    return HandleGeneration(req, std::move(ex), chat);
  }
  return respond_error(Status::NotFound("no route for " + std::string(req.method_string()) + " " + path));
}

StatusOr<WorkerService::Prompt> WorkerService::PromptFor(const std::string& text, bool chat, int32_t fit_cells) const {
  auto body = api::ParseJsonBody(text, opts_.json_limits);
  if (!body.ok()) return body.status();
  Prompt p;
  std::vector<int32_t> given_tokens;
  std::optional<std::vector<int32_t>> known_tokens;  // chat: counted already
  if (chat) {
    auto r = api::ParseChatRequest(*body);
    if (!r.ok()) return r.status();
    if (!model_.chat()) return Status::InvalidArgument("this model has no chat template");
    const json none;
    auto tools = body->find("tools");
    const json& tool_list = tools == body->end() ? none : *tools;
    const json& messages = body->at("messages");
    // A rendering kept from the gateway's count of this chat, or an earlier
    // try of it; kept for the next (`keep`: not a tail that "truncate" tried
    // and may not take, which would only push out others' renderings).
    auto render = [&](const json& m, bool keep = true) -> StatusOr<std::pair<ChatPlan, std::vector<int32_t>>> {
      const std::string key = rendered_.enabled() ? RenderedPrompts::KeyOf(*body, m) : std::string();
      if (auto kept = rendered_.Find(key)) return std::make_pair(kept->plan, kept->tokens);
      auto plan = model_.chat()->Render(m, tool_list, *r);
      if (!plan.ok()) return plan.status();
      auto tokens = prompt_tokens_.Tokenize(plan->prompt, keep);
      if (!tokens.ok()) return tokens.status();
      if (keep) rendered_.Put(key, *plan, *tokens);
      return std::make_pair(std::move(*plan), std::move(*tokens));
    };
    // As many left out as the worker that counted the prompt left (the
    // gateway's pin: every placement reads the same prompt).
    auto rendered = r->drop_messages ? [&] {
      KeptMessages kept = WithoutOldest(messages, *r->drop_messages);
      p.dropped_messages = kept.dropped;
      return render(kept.messages);
    }() : render(messages);
    if (!rendered.ok()) return rendered.status();
    // What an answer needs beside its prompt at the least: its max_tokens,
    // or (an upper bound, or none) one token; and a continuation's
    // delivered tokens and one more.
    const int32_t resumed = static_cast<int32_t>(r->gen.resume_tokens.size());
    const int32_t least = std::max(r->gen.max_tokens && !r->gen.fit_context ? *r->gen.max_tokens : 1, resumed + 1);
    if (r->drop_messages && static_cast<int64_t>(rendered->second.size()) + least > engine_.CellsPerRequest()) {
      return Status::InvalidArgument(
          "without the " + std::to_string(p.dropped_messages) + " oldest messages the gateway's count left out, the " +
          "conversation is " + std::to_string(rendered->second.size()) + " tokens, more than the " +
          std::to_string(engine_.CellsPerRequest()) + " tokens of this placement's context hold beside " +
          std::to_string(least) + " for the answer")
          .WithReason(kContextLengthExceeded);
    }
    if (r->truncate && !r->drop_messages) {
      p.dropped_messages = 0;
      // Beside the prompt: the answer's max_tokens, or, when that is an upper
      // bound (an Ollama request's num_predict) or unset, a quarter of the
      // cells at most (Ollama's runner shifts its context while it
      // generates; a worker does not, so a kept tail leaves room up front).
      // And a continuation's delivered tokens and one more.
      // (Another placement's context, within the positions the model was trained on, as this one's is.)
      const int32_t cells = fit_cells > 0 ? RequestCellLimit(fit_cells, model_.n_ctx_train(), model_.rotary_positions())
                                          : engine_.CellsPerRequest();
      int32_t room = r->gen.max_tokens && !r->gen.fit_context
                         ? *r->gen.max_tokens
                         : std::min(r->gen.max_tokens.value_or(opts_.default_max_tokens), std::max(1, cells / 4));
      room = std::max(room, resumed + 1);
      const int64_t limit = int64_t{cells} - room;
      if (static_cast<int64_t>(rendered->second.size()) > limit && limit > 0) {
        Status refused;  // the last candidate's refusal by the template
        std::optional<std::pair<ChatPlan, std::vector<int32_t>>> best;  // (the last that fit is the one kept)
        auto kept = KeepLatestThatFit(messages, [&](const json& candidate) {
          auto c = render(candidate, /*keep=*/false);
          if (!c.ok()) {
            refused = c.status();
            return false;
          }
          if (static_cast<int64_t>(c->second.size()) > limit) return false;
          best = std::move(*c);
          return true;
        });
        // Nothing kept fits beside the room a truncate leaves, but the whole
        // conversation fits beside the least answer (that room was a default,
        // or an upper bound): served whole, its answer shortened to what is
        // left, as it is without truncate (asking never does worse than not).
        const bool whole_fits = static_cast<int64_t>(rendered->second.size()) + least <= int64_t{cells};
        if (!kept && !whole_fits) {
          return Status::InvalidArgument(
              "the conversation (" + std::to_string(rendered->second.size()) + " tokens) does not fit the " +
              std::to_string(cells) + " tokens of context beside " + std::to_string(room) +
              " for the answer, and no tail of it that keeps its last message does either" +
              (refused.ok() ? "" : " (the chat template refused one: " + refused.message() + ")"))
              .WithReason(kContextLengthExceeded);
        }
        if (kept) {
          rendered = std::move(*best);
          p.dropped_messages = kept->dropped;
          if (rendered_.enabled()) {  // (the tail taken: what the run, pinned to it, renders)
            rendered_.Put(RenderedPrompts::KeyOf(*body, kept->messages), rendered->first, rendered->second);
          }
        }
      }
    }
    auto& plan = rendered->first;
    known_tokens = std::move(rendered->second);
    p.text = std::move(plan.prompt);
    p.grammar = std::move(plan.grammar);
    p.preserved_tokens = std::move(plan.preserved_tokens);
    p.extra_stops = std::move(plan.stops);
    p.chat = std::move(plan.syntax);
    p.gen = std::move(r->gen);
  } else {
    auto r = api::ParseCompletionRequest(*body);
    if (!r.ok()) return r.status();
    auto grammar = ResponseFormatGrammar(r->gen.response_format);
    if (!grammar.ok()) return grammar.status();
    p.grammar = std::move(*grammar);
    p.gen = std::move(r->gen);
    p.text = std::move(r->prompt);
    given_tokens = std::move(r->prompt_tokens);
  }
  if (!p.grammar.empty()) SPILLWAY_RETURN_IF_ERROR(CheckGrammar(p.grammar, model_.vocab()));
  SPILLWAY_RETURN_IF_ERROR(CheckLogitBias(p.gen.sampling.logit_bias, model_.vocab()));
  if (known_tokens) {
    p.tokens = std::move(*known_tokens);
    return p;
  }
  if (!given_tokens.empty()) {
    auto checked = model_.CheckTokens(given_tokens);
    if (!checked.ok()) return checked.status();
    p.tokens = std::move(*checked);
    return p;
  }
  // A completion's text, tokenized for its count and its run once too.
  const std::string key = rendered_.enabled() ? RenderedPrompts::KeyOfText(p.text) : std::string();
  if (auto kept = rendered_.Find(key)) {
    p.tokens = kept->tokens;
    return p;
  }
  auto tokens = prompt_tokens_.Tokenize(p.text);
  if (!tokens.ok()) return tokens.status();
  rendered_.Put(key, ChatPlan{}, *tokens);
  p.tokens = std::move(*tokens);
  return p;
}

void WorkerService::HandleGeneration(const http::Request& req, std::shared_ptr<http::Exchange> ex, bool chat) {
  const unsigned v = req.version();
  auto fail = [&](const Status& st) {
    auto res = ErrorResponse(st, v);
    ex->Respond(std::move(res));
  };
  if (model_.is_embedding()) return fail(Status::InvalidArgument("this worker serves an embedding model; use /v1/embeddings"));
  auto prompt = PromptFor(req.body(), chat);
  if (!prompt.ok()) return fail(prompt.status());
  api::GenerationRequest& gen = prompt->gen;
  // What one request may hold: its slot's share of the context (the whole
  // context said instead, a prompt under it was refused later "per slot").
  const int ctx = engine_.CellsPerRequest();
  const int n_prompt = static_cast<int>(prompt->tokens.size());
  if (n_prompt >= ctx) {
    return fail(Status::InvalidArgument("prompt of " + std::to_string(n_prompt) + " tokens does not fit the context of " +
                                        std::to_string(ctx) + " tokens" +
                                        (ctx < engine_.options().ctx && !engine_.options().kv_unified ? " per slot" : ""))
                    .WithReason(kContextLengthExceeded));
  }

  auto job = std::make_shared<Job>();
  job->id = RequestId(req);
  job->prompt = std::move(prompt->tokens);
  // Unset: what fits beside the prompt in the cells one request may hold (its slot's share, or the whole pool).
  job->max_tokens =
      gen.max_tokens.value_or(std::max(1, std::min(opts_.default_max_tokens, engine_.CellsPerRequest() - n_prompt)));
  // An upper bound only (an Ollama request's num_predict): what fits beside the prompt.
  if (gen.fit_context) job->max_tokens = std::max(1, std::min(job->max_tokens, engine_.CellsPerRequest() - n_prompt));
  job->stop = gen.stop;
  job->stop.insert(job->stop.end(), prompt->extra_stops.begin(), prompt->extra_stops.end());
  job->preserved_tokens = std::move(prompt->preserved_tokens);
  if (gen.logprobs) job->top_logprobs = gen.top_logprobs;
  job->ignore_eos = gen.ignore_eos;
  if (!gen.resume_tokens.empty()) {
    if (opts_.secret.empty()) {
      return fail(Status::PermissionDenied("'spillway_resume' is internal: only a supervising gateway (with the worker "
                                           "secret) may send it"));
    }
    auto checked = model_.CheckTokens(gen.resume_tokens);
    if (!checked.ok()) return fail(checked.status());
    job->resume_tokens = std::move(*checked);
    job->resume_text_bytes = gen.resume_text_bytes;
  }
  job->sampling = ResolveSampling(gen.sampling, model_.sampler_defaults(), FreshSeed());
  job->sampling.grammar = std::move(prompt->grammar);

  ReplyHeader header{chat ? api::Endpoint::kChat : api::Endpoint::kCompletion, job->id,
                     gen.model.empty() ? model_.name() : gen.model, UnixNow()};
  const std::string id = job->id;
  json meta = {{"request_id", id},
               {"placement", placement_.ToJson()},
               {"seed", job->sampling.seed},
               {"max_tokens", job->max_tokens},
               {"fingerprint", model_.fingerprint().id}};
  const int dropped = prompt->dropped_messages;  // (-1: no "truncate")
  if (dropped > 0) meta["dropped_messages"] = dropped;

  auto timings_of = [](const JobResult& r) {
    return protocol::Timings{r.prompt_ms, r.generation_ms, static_cast<double>(r.prompt_tokens),
                             static_cast<double>(r.completion_tokens), static_cast<double>(r.cached_tokens)};
  };
  auto finish_meta = [meta](const JobResult& r) {
    json m = meta;
    m["timings"] = {{"prompt_ms", r.prompt_ms}, {"generation_ms", r.generation_ms},
                    {"prompt_tokens", r.prompt_tokens}, {"generated_tokens", r.completion_tokens},
                    {"cached_tokens", r.cached_tokens}};
    return m;
  };

  // The stream header must reach the connection before the engine's first
  // chunk: the callbacks take this mutex, which is held from Submit() until
  // the header is queued.
  auto gate = std::make_shared<std::mutex>();
  if (!gen.stream) {
    auto syntax = prompt->chat ? std::make_shared<ChatSyntax>(*prompt->chat) : nullptr;
    const bool logprobs = gen.logprobs;
    job->on_done = [ex, v, header, syntax, logprobs, finish_meta, timings_of, dropped](JobResult r) {
      if (!r.status.ok()) return ex->Respond(ErrorResponse(r.status, v));
      json out = WholeReply(header, r.text, r.finish_reason, {r.prompt_tokens, r.completion_tokens, r.cached_tokens}, syntax.get(),
                            logprobs ? &r.logprobs : nullptr);
      out["spillway"] = finish_meta(r);
      auto res = JsonResponse(200, out, v);
      res.set("X-Request-Id", header.id);
      res.set(std::string(protocol::kTimingsHeader), timings_of(r).ToHeader());
      if (dropped >= 0) res.set(std::string(protocol::kDroppedMessagesHeader), std::to_string(dropped));
      ex->Respond(std::move(res));
    };
  } else {
    auto reply = std::make_shared<StreamReply>(header, prompt->chat);
    const bool include_usage = gen.include_usage;
    job->on_text = [ex, reply, gate](std::string_view text, const std::vector<int32_t>& ids,
                                     const std::vector<api::TokenLogprob>& logprobs) {
      std::lock_guard<std::mutex> g(*gate);
      // Carries the token ids, which let the gateway continue this stream elsewhere.
      if (std::string events = reply->Text(text, ids, logprobs); !events.empty()) ex->Write(events);
    };
    if (!job->resume_tokens.empty()) {
      // The replayed text is parsed, not sent: deltas continue from what the
      // client has. Cancelled when it is not what the client counted.
      const uint64_t delivered = job->resume_text_bytes;
      job->on_replayed = [reply, delivered](std::string_view text) { return reply->Replayed(text, delivered); };
    }
    job->on_done = [ex, reply, include_usage, finish_meta, gate](JobResult r) {
      std::lock_guard<std::mutex> g(*gate);
      if (!r.status.ok()) {
        ex->Write(api::SseEvent(api::ErrorBody(r.status)));
      } else {
        const api::Usage usage{r.prompt_tokens, r.completion_tokens, r.cached_tokens};
        ex->Write(reply->Finish(r.finish_reason, finish_meta(r), include_usage ? &usage : nullptr));
      }
      ex->Write(api::kSseDone);
      ex->End();
    };
  }
  // A streamed continuation that holds max_tokens tokens already (its new
  // placement's cap, a CPU path's, at or below what was delivered) is at its
  // length: it ends so ("length"; its usage, the delivered tokens), as a run
  // under that cap would have, with nothing new to generate. The engine
  // refused it, and the client's stream ended as failed after its answer.
  if (gen.stream && !job->resume_tokens.empty() &&
      static_cast<int64_t>(job->resume_tokens.size()) >= int64_t{job->max_tokens}) {
    auto reply = std::make_shared<StreamReply>(header, prompt->chat);
    (void)reply->Replayed("", 0);  // the message began with what was delivered: no role again
    JobResult r;
    r.finish_reason = "length";
    r.prompt_tokens = static_cast<int>(job->prompt.size());
    r.completion_tokens = static_cast<int>(job->resume_tokens.size());
    auto head = http::MakeResponse(200, "", "text/event-stream", v);
    head.set(bhttp::field::cache_control, "no-cache");
    head.set("X-Request-Id", id);
    if (dropped >= 0) head.set(std::string(protocol::kDroppedMessagesHeader), std::to_string(dropped));
    ex->StartStream(std::move(head));
    const api::Usage usage{r.prompt_tokens, r.completion_tokens, r.cached_tokens};  // (nothing computed: 0 cached)
    ex->Write(reply->Finish(r.finish_reason, finish_meta(r), gen.include_usage ? &usage : nullptr));
    ex->Write(api::kSseDone);
    ex->End();
    return;
  }
  auto cancel = CancelUnlessAnswered(&engine_, *job);
  std::unique_lock<std::mutex> header_lock(*gate);
  Status st = engine_.Submit(job);
  if (!st.ok()) return fail(st);
  if (gen.stream) {
    auto head = http::MakeResponse(200, "", "text/event-stream", v);
    head.set(bhttp::field::cache_control, "no-cache");
    head.set("X-Request-Id", id);
    if (dropped >= 0) head.set(std::string(protocol::kDroppedMessagesHeader), std::to_string(dropped));
    ex->StartStream(std::move(head));
  }
  header_lock.unlock();
  ex->OnDisconnect(std::move(cancel));
}

void WorkerService::HandleEmbeddings(const http::Request& req, std::shared_ptr<http::Exchange> ex) {
  const unsigned v = req.version();
  auto fail = [&](const Status& st) { ex->Respond(ErrorResponse(st, v)); };
  if (!model_.is_embedding()) return fail(Status::InvalidArgument("this worker serves a generative model, not embeddings"));
  auto body = api::ParseJsonBody(req.body(), opts_.json_limits);
  if (!body.ok()) return fail(body.status());
  auto r = api::ParseEmbeddingRequest(*body);
  if (!r.ok()) return fail(r.status());
  auto job = std::make_shared<Job>();
  job->id = RequestId(req);
  job->embedding = true;
  // Asked to, an input longer than the model takes is cut (its end token
  // kept), and the answer says how many were.
  const size_t limit = static_cast<size_t>(std::max(1, engine_.EmbeddingInputLimit()));
  int truncated = 0;
  for (const auto& in : r->inputs) {
    auto t = model_.Tokenize(in, true);
    if (!t.ok()) return fail(t.status());
    if (r->truncate && t->size() > limit) {
      TruncateInput(&*t, limit, model_.IsEndToken(t->back()));  // (what the tokenizer put there, not its flags)
      ++truncated;
    }
    job->inputs.push_back(std::move(*t));
  }
  const std::string model_name = r->model.empty() ? model_.name() : r->model;
  const std::string id = job->id;
  const bool base64 = r->base64;
  job->on_done = [ex, v, model_name, id, base64, truncated](JobResult res) {
    if (!res.status.ok()) return ex->Respond(ErrorResponse(res.status, v));
    auto out = JsonResponse(200, api::EmbeddingsBody(model_name, res.embeddings, res.prompt_tokens, base64), v);
    out.set("X-Request-Id", id);
    if (truncated > 0) out.set(std::string(protocol::kTruncatedInputsHeader), std::to_string(truncated));
    // The gateway's throughput estimate, without parsing the vectors.
    out.set(std::string(protocol::kTimingsHeader),
            protocol::Timings{res.prompt_ms, 0, static_cast<double>(res.prompt_tokens), 0}.ToHeader());
    ex->Respond(std::move(out));
  };
  auto cancel = CancelUnlessAnswered(&engine_, *job);
  Status st = engine_.Submit(job);
  if (!st.ok()) return fail(st);
  ex->OnDisconnect(std::move(cancel));
}

json WorkerService::Info() const {
  const auto st = engine_.stats();
  const auto rendered = rendered_.stats();
  const auto kept_tokens = prompt_tokens_.stats();
  json buffers = json::array();
  for (const auto& b : engine_.memory_breakdown()) {
    buffers.push_back({{"name", b.name}, {"host", b.host}, {"model", b.model}, {"context", b.context},
                       {"compute", b.compute}, {"total", b.model + b.context + b.compute}});
  }
  json devices = json::array();
  auto add_device = [&](ggml_backend_dev_t dev) {
    size_t free = 0, total = 0;
    ggml_backend_dev_memory(dev, &free, &total);
    devices.push_back({{"name", ggml_backend_dev_name(dev)}, {"description", ggml_backend_dev_description(dev)},
                       {"free", free}, {"total", total}});
  };
  for (auto* dev : model_.devices()) add_device(dev);
  if (auto* cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)) add_device(cpu);
  const int version = protocol::kWorkerProtocolVersion + (MutationActive("protocol-skew") ? 1 : 0);  // tests only
  return {{"protocol_version", version},
          {"pid", ::getpid()},  // an adopting gateway checks that its record's process answers
          {"model", model_.Describe()},
          {"placement", placement_.ToJson()},
          {"fingerprint", model_.fingerprint().ToJson()},
          {"memory", {{"buffers", buffers}, {"devices", devices}}},
          {"slots", {{"total", st.slots_total}, {"busy", st.slots_busy}, {"queued", st.queued}}},
          {"kv_cells", {{"total", st.cells_total}, {"reserved", st.cells_reserved},
                        {"per_request", st.cells_per_request}, {"unified", st.kv_unified}}},
          {"requests", {{"received", requests_.load()}, {"completed", st.completed}, {"failed", st.failed},
                        {"cancelled", st.cancelled}}},
          {"prefix_reuse", {{"on", engine_.ReusesPrefixes()}, {"reused_prompt_tokens", st.reused_prompt_tokens}}},
          {"rendered_prompts", {{"kept", rendered.entries}, {"bytes", rendered.bytes}, {"hits", rendered.hits},
                                {"misses", rendered.misses}}},
          {"prompt_tokens", {{"on", prompt_tokens_.enabled()}, {"kept", kept_tokens.entries},
                             {"bytes", kept_tokens.bytes}, {"continued", kept_tokens.hits},
                             {"whole", kept_tokens.misses}, {"repeated", kept_tokens.repeats},
                             {"reused_tokens", kept_tokens.reused_tokens}}},
          {"health", {{"ok", st.healthy}, {"device_lost", st.device_lost}, {"stalled_ms", st.stalled_ms},
                      {"longest_step_ms", st.longest_step_ms},
                      {"contexts_rebuilt", st.contexts_rebuilt},
                      {"last_error", st.last_error}}},
          {"context", {{"created", st.context_created}, {"lazy", engine_.options().lazy_context},
                       {"contexts_created", st.contexts_created}, {"last_create_ms", st.last_context_ms}}},
          {"faults", faults_ ? faults_->ToJson() : json(nullptr)},
          {"defaults", {{"max_tokens", opts_.default_max_tokens}}}};
}

}  // namespace spillway::worker
