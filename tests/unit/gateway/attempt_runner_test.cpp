// The attempt runner against an in-process fake worker, with a recording
// client exchange: each way an attempt can end comes back as its typed
// outcome, a stream reaches the client through the ReplyWriter event by event
// (head with the first event, never before), and a continuation carries the
// delivered tokens.
#include "gateway/attempt_runner.h"

#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>

#include <nlohmann/json.hpp>

#include <functional>
#include <optional>
#include <vector>

#include "api/openai_response.h"
#include "fake_worker.h"
#include "gateway/ollama_exchange.h"
#include "recording_exchange.h"

namespace spillway::gateway {
namespace {

namespace net = boost::asio;
using Kind = failover::AttemptOutcome::Kind;
using nlohmann::json;
using spillway::testing::FakeWorker;
using spillway::testing::RecordingExchange;

std::string Chunk(const std::string& text, int token) {
  return api::SseEvent({{"choices", {{{"index", 0}, {"text", text}}}}, {"spillway", {{"tokens", {token}}}}});
}

std::string WorkerErrorBody(Status st) { return api::ErrorBody(st).dump(); }

// A worker whose answer depends on the path: /ok, /busy, /oom (a KV
// allocation failure), /stream (three tokens), /cut (a stream that fails in
// compute after two), /refuse (a stream refused with a 400), and /resume
// (echoes the continuation it was asked for).
FakeWorker Worker(std::string* last_body, std::vector<std::shared_ptr<http::Exchange>>* held) {
  return FakeWorker([last_body, held](http::Request& req, std::shared_ptr<http::Exchange> ex) {
    const std::string target(req.target());
    *last_body = req.body();
    if (target == "/silent") return held->push_back(std::move(ex));  // answers nothing (held until the test ends)
    auto respond = [&](int status, const std::string& body) {
      ex->Respond(http::MakeResponse(static_cast<unsigned>(status), body, "application/json"));
    };
    if (target == "/ok") return respond(200, R"({"choices":[{"text":"hi"}]})");
    if (target == "/busy") return respond(503, WorkerErrorBody(Status::ResourceExhausted("every slot is taken")));
    if (target == "/oom") {
      return respond(503, WorkerErrorBody(Status::ResourceExhausted("kv alloc failed").WithPhase(FailurePhase::kKv)));
    }
    if (target == "/refuse") return respond(400, WorkerErrorBody(Status::InvalidArgument("prompt too long")));
    ex->StartStream(http::MakeResponse(200, "", "text/event-stream"));
    if (target == "/resume") {
      const json b = json::parse(req.body());
      ex->Write(Chunk("resumed after " + std::to_string(b["spillway_resume"]["tokens"].size()), 9));
    } else {
      ex->Write(Chunk("a", 1));
      ex->Write(Chunk("b", 2));
      if (target == "/cut") {
        ex->Write(api::SseEvent(api::ErrorBody(Status::ResourceExhausted("compute").WithPhase(FailurePhase::kCompute))));
        return ex->End();
      }
      ex->Write(Chunk("c", 3));
    }
    ex->Write(api::kSseDone);
    if (target == "/done-then-gone") return ex->Abort();  // cut after [DONE], before the stream's last chunk
    ex->End();
  });
}

struct Fixture {
  net::io_context ioc;
  upstream::ConnectionPool pool;
  std::string worker_saw;
  std::vector<std::shared_ptr<http::Exchange>> held_by_worker;
  FakeWorker worker = Worker(&worker_saw, &held_by_worker);
  // (Held answers go before the server whose connections they post to.)
  ~Fixture() { held_by_worker.clear(); }
  std::shared_ptr<RecordingExchange> client = std::make_shared<RecordingExchange>();
  ReplyWriter reply{client, "req-1", 11};
  failover::StreamProgress progress;
  std::atomic<bool> cancelled{false};
  int first_events = 0;

  AttemptResult Run(const std::string& path, bool stream, const std::function<void(AttemptSpec&)>& tweak = nullptr) {
    AttemptRunner runner(pool, reply, progress, cancelled, [this] { ++first_events; }, 1 << 20);
    AttemptSpec spec;
    spec.port = worker.port();
    spec.path = path;
    spec.body = R"({"prompt":"x","max_tokens":3})";
    spec.stream = stream;
    spec.served.placement = "cpu:0/99";
    spec.served.decision = "reroute";
    spec.served.attempts = 2;
    spec.role = "fallback";
    if (tweak) tweak(spec);
    std::optional<AttemptResult> out;
    auto co = [&]() -> net::awaitable<void> { out.emplace(co_await runner.Run(spec)); };
    net::co_spawn(net::make_strand(ioc), co(), net::detached);
    ioc.restart();
    ioc.run();
    return *out;
  }
};

TEST(AttemptRunnerTest, EachWayAnAttemptEndsIsItsOwnOutcome) {
  Fixture f;
  ASSERT_TRUE(f.worker.ok());
  const AttemptResult ok = f.Run("/ok", false);
  EXPECT_EQ(ok.outcome.kind, Kind::kAnswered);
  EXPECT_EQ(ok.status, 200);
  EXPECT_NE(ok.body.find("hi"), std::string::npos);

  const AttemptResult busy = f.Run("/busy", false);
  EXPECT_EQ(busy.outcome.kind, Kind::kBusy);
  EXPECT_EQ(busy.status, 503);  // kept: the answer when waiting ends

  const AttemptResult oom = f.Run("/oom", false);
  EXPECT_EQ(oom.outcome.kind, Kind::kFailed);
  EXPECT_EQ(oom.outcome.phase, FailurePhase::kKv);
  EXPECT_FALSE(oom.unreachable);

  const AttemptResult refused = f.Run("/refuse", false);
  EXPECT_EQ(refused.outcome.kind, Kind::kAnswered);
  EXPECT_EQ(refused.status, 400);

  f.cancelled = true;  // a cancelled request's non-answer is a cancel, not the worker's error
  EXPECT_EQ(f.Run("/busy", false).outcome.kind, Kind::kCancelled);
  f.cancelled = false;
  EXPECT_FALSE(f.client->done() || f.client->streamed()) << "the runner answers no client by itself";
}

TEST(AttemptRunnerTest, AWorkerThatCannotBeReachedIsAFailureWithNoPhase) {
  Fixture f;
  AttemptRunner runner(f.pool, f.reply, f.progress, f.cancelled, nullptr, 1 << 20);
  AttemptSpec spec;
  spec.port = 1;  // nothing listens there
  spec.path = "/ok";
  std::optional<AttemptResult> out;
  auto co = [&]() -> net::awaitable<void> { out.emplace(co_await runner.Run(spec)); };
  net::co_spawn(net::make_strand(f.ioc), co(), net::detached);
  f.ioc.run();
  ASSERT_TRUE(out);
  EXPECT_EQ(out->outcome.kind, Kind::kFailed);
  EXPECT_EQ(out->outcome.phase, FailurePhase::kNone);
  EXPECT_TRUE(out->unreachable);
}

TEST(AttemptRunnerTest, AStreamReachesTheClientEventByEventWithItsHeadFirst) {
  Fixture f;
  const AttemptResult r = f.Run("/stream", true);
  EXPECT_EQ(r.outcome.kind, Kind::kAnswered);
  EXPECT_EQ(r.stream_state, journal::State::kCompleted);
  EXPECT_TRUE(f.client->streamed());
  EXPECT_EQ(f.first_events, 1);
  EXPECT_EQ(f.client->header("X-Request-Id"), "req-1");
  EXPECT_EQ(f.client->header("X-Spillway-Placement"), "cpu:0/99");
  EXPECT_EQ(f.client->header("X-Spillway-Attempts"), "2");
  EXPECT_EQ(f.client->body(), Chunk("a", 1) + Chunk("b", 2) + Chunk("c", 3) + api::kSseDone);
  EXPECT_EQ(f.reply.stored(), f.client->body()) << "what the journal keeps is what the client got";
  EXPECT_EQ(f.progress.tokens(), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_FALSE(f.client->done()) << "the lifecycle ends the stream, after the journal";
}

TEST(AttemptRunnerTest, ARefusedStreamTellsTheClientNothingAndKeepsTheWorkersAnswer) {
  Fixture f;
  const AttemptResult r = f.Run("/refuse", true);
  EXPECT_EQ(r.outcome.kind, Kind::kAnswered);
  EXPECT_TRUE(r.head_refused);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.stream_state, journal::State::kFailed);
  EXPECT_NE(r.body.find("prompt too long"), std::string::npos);
  EXPECT_FALSE(f.client->streamed());
  EXPECT_EQ(f.first_events, 0);
}

TEST(AttemptRunnerTest, AStreamCutInComputeIsAContinuableFailureAndTheContinuationCarriesTheTokens) {
  Fixture f;
  const AttemptResult cut = f.Run("/cut", true);
  EXPECT_EQ(cut.outcome.kind, Kind::kFailed);
  EXPECT_EQ(cut.outcome.phase, FailurePhase::kCompute);
  EXPECT_TRUE(cut.outcome.delivered);
  EXPECT_TRUE(cut.outcome.continuable);
  EXPECT_EQ(f.client->body(), Chunk("a", 1) + Chunk("b", 2)) << "the error event is not relayed";

  const AttemptResult resumed = f.Run("/resume", true);
  EXPECT_EQ(resumed.outcome.kind, Kind::kAnswered);
  EXPECT_EQ(json::parse(f.worker_saw)["spillway_resume"]["tokens"], json({1, 2}));
  EXPECT_EQ(f.first_events, 2) << "each attempt's first event: the continuation's placement answers too";
  EXPECT_EQ(f.client->body().rfind(Chunk("a", 1) + Chunk("b", 2) + ": spillway: continued on", 0), 0u)
      << "one stream for the client, across attempts: " << f.client->body();
  EXPECT_NE(f.client->body().find(": spillway: continued on cpu:0/99 after a failure"), std::string::npos);
  EXPECT_NE(f.client->body().find("resumed after 2"), std::string::npos);
}

// [DONE] relayed, then the worker's connection cut before the stream's
// terminator (the worker gone at that moment, or a deadline passing while a
// slow reader drains): the client has the whole answer, so the stream
// completed. It was a failure: a continuation replayed its end (a second
// finish and [DONE]), or an error event followed [DONE], the request
// journaled failed.
TEST(AttemptRunnerTest, AStreamCutAfterItsDoneIsComplete) {
  Fixture f;
  const AttemptResult r = f.Run("/done-then-gone", true);
  EXPECT_EQ(r.outcome.kind, Kind::kAnswered);
  EXPECT_EQ(r.stream_state, journal::State::kCompleted);
  EXPECT_EQ(f.client->body(), Chunk("a", 1) + Chunk("b", 2) + Chunk("c", 3) + std::string(api::kSseDone));
}

// An attempt without a deadline that outlasts its bound (the gateway's own:
// an hour, or 600 s of a stream's silence) says it timed out, apart from a
// worker that could not be reached: the lifecycle ends the request then,
// instead of taking a healthy placement for a crashed one (its breaker
// tripped, and the request ran again from scratch, three times).
TEST(AttemptRunnerTest, AnUnboundedAttemptThatOutlastsItsBoundSaysItTimedOut) {
  Fixture f;
  const AttemptResult r = f.Run("/silent", false, [](AttemptSpec& s) {
    s.timeout = std::chrono::milliseconds(200);
    s.bounded = false;
  });
  EXPECT_EQ(r.outcome.kind, Kind::kFailed);
  EXPECT_TRUE(r.timed_out);
  EXPECT_FALSE(r.deadline) << "not the request's deadline: it has none";
}

// A stream of a declared fallback model, cut and continued on another
// placement of that model (its CPU replica, with the CPU path's lower
// max_tokens): the continuation says where it went on and its limits. The
// fallback model's note took its place, and the limits went unsaid.
TEST(AttemptRunnerTest, AContinuationOfAFallbackModelsStreamSaysItsLimits) {
  Fixture f;
  auto fallback_model = [](AttemptSpec& s) { s.served.fallback_model = "small.gguf"; };
  ASSERT_EQ(f.Run("/cut", true, fallback_model).outcome.kind, Kind::kFailed);
  const AttemptResult resumed = f.Run("/resume", true, [&](AttemptSpec& s) {
    fallback_model(s);
    s.served.limits = "max_tokens=4 (CPU path)";
  });
  EXPECT_EQ(resumed.outcome.kind, Kind::kAnswered);
  EXPECT_NE(f.client->body().find(": spillway: continued on cpu:0/99 after a failure, limits max_tokens=4 (CPU path)"),
            std::string::npos) << f.client->body();
}

// A stream cancelled while a slow reader holds its relay back (much unsent)
// stops at once: it stayed paused, so the worker's end of the stream was
// never read, and the request held its slot, and sent the client what the
// worker wrote before it stopped, for as long as the reader took.
TEST(AttemptRunnerTest, ACancelEndsAStreamPausedForASlowReader) {
  Fixture f;
  f.client->pretend_unsent = 8 << 20;  // a reader that takes nothing now
  AttemptRunner runner(f.pool, f.reply, f.progress, f.cancelled, [] {}, 1 << 20);
  AttemptSpec spec;
  spec.port = f.worker.port();
  spec.path = "/stream";
  spec.body = R"({"prompt":"x","max_tokens":3})";
  spec.stream = true;
  spec.served.placement = "cpu:0/99";
  spec.role = "fallback";
  std::optional<AttemptResult> out;
  auto co = [&]() -> net::awaitable<void> { out.emplace(co_await runner.Run(spec)); };
  net::co_spawn(net::make_strand(f.ioc), co(), net::detached);
  net::steady_timer cancel(f.ioc, std::chrono::milliseconds(100));
  cancel.async_wait([&](boost::system::error_code) { f.cancelled = true; });
  f.ioc.run_for(std::chrono::seconds(5));
  ASSERT_TRUE(out.has_value()) << "a cancelled stream stayed paused for its slow reader";
  EXPECT_EQ(out->outcome.kind, Kind::kCancelled);
  EXPECT_EQ(f.client->received().find("\"c\""), std::string::npos) << "relayed after its cancel: " << f.client->received();
}

TEST(ReplyWriterTest, AWaitingStreamStartsEarlyAndThenSaysWhereItRuns) {
  auto client = std::make_shared<RecordingExchange>();
  ReplyWriter reply(client, "req-2", 11);
  reply.WaitingNote("the CPU line is busy", 2.2);
  EXPECT_TRUE(reply.head_sent());
  EXPECT_FALSE(reply.events_started());
  EXPECT_EQ(client->header("X-Spillway-Estimated-Delay"), "3");
  ServedBy s;
  s.placement = "cpu:0/99";
  s.limits = "max_tokens 64";
  reply.BeginStream(s, "fallback");
  EXPECT_NE(client->body().find(": spillway: running on cpu:0/99 (fallback), limits max_tokens 64"), std::string::npos);
  const std::string final_events = reply.StoreFinalError(api::ErrorBody(Status::Unavailable("gone")));
  EXPECT_EQ(reply.stored().substr(reply.stored().find("\n\n") + 2), final_events)
      << "comments are not stored, the final error is (after who served it)";
  reply.SendFinal(final_events);
  EXPECT_TRUE(client->done());
}

// A fallback's one-word answer, as a worker streams it (then its end and [DONE]).
void SendFallbackAnswer(ReplyWriter& reply) {
  reply.Event(Chunk("hello", 7));
  reply.Event(api::SseEvent({{"choices", {{{"index", 0}, {"text", ""}, {"finish_reason", "stop"}}}},
                             {"spillway", {{"tokens", {8}}, {"timings", json::object()}}}}));
  reply.Event(api::kSseDone);
}

// The last line of an Ollama stream, checked to name the fallback.
void ExpectLastLineNamesTheFallback(const std::string& body) {
  ASSERT_FALSE(body.empty());
  const size_t last = body.rfind('\n', body.size() - 2);
  const json final_line = json::parse(body.substr(last == std::string::npos ? 0 : last + 1));
  EXPECT_EQ(final_line["done"], true) << body;
  EXPECT_EQ(final_line["spillway"]["fallback_model"], "tiny-chat-b") << body;
  EXPECT_EQ(final_line["spillway"]["limits"], "max_tokens 64") << body;
  EXPECT_EQ(final_line["response"], "") << body;
  EXPECT_NE(body.find("\"response\":\"hello\""), std::string::npos) << body;
}

// An Ollama stream that waited (its head went before anyone chose where it
// runs) and was then served by a declared fallback model says so in its last
// line, as a whole answer says it in its body: NDJSON has no comments.
TEST(ReplyWriterTest, AnOllamaStreamThatWaitedNamesTheFallbackModelInItsLastLine) {
  auto client = std::make_shared<RecordingExchange>();
  FakeClock clock;
  auto ollama = std::make_shared<OllamaExchange>(client, api::OllamaReplyContext{api::OllamaRoute::kGenerate, "chat", 0},
                                                 clock);
  ReplyWriter reply(ollama, "req-3", 11);
  reply.WaitingNote("the GPU is full", 1.0);
  ServedBy s;
  s.placement = "cpu:0/99";
  s.fallback_model = "tiny-chat-b";
  s.limits = "max_tokens 64";
  reply.BeginStream(s, "fallback");
  SendFallbackAnswer(reply);
  reply.EndStream();
  ExpectLastLineNamesTheFallback(client->body());
}

// A degraded stream replayed for its Idempotency-Key tells its client who
// served it, as its head (SSE) or its last line (Ollama) did: what is stored
// begins with a comment saying so, which SSE clients ignore.
TEST(ReplyWriterTest, AReplayedDegradedStreamStillNamesWhoServedIt) {
  ReplyWriter reply(nullptr, "req-4", 11);  // (a stream whose client is gone is stored alike)
  ServedBy s;
  s.placement = "cpu:0/99";
  s.decision = "reroute";
  s.attempts = 2;
  s.degraded = "served by cpu:0/99 (fallback)";
  s.fallback_model = "tiny-chat-b";
  s.limits = "max_tokens 64";
  reply.BeginStream(s, "fallback");
  SendFallbackAnswer(reply);
  const std::string stored = reply.stored();
  ASSERT_EQ(stored.rfind(": ", 0), 0u) << "an SSE comment first: " << stored;

  // The SSE replay's head, as Gateway::Process builds it.
  auto res = http::MakeResponse(200, stored, "text/event-stream", 11);
  auto served = ReplyWriter::StoredServedBy(stored);
  ASSERT_TRUE(served.has_value());
  ReplyWriter::Describe(res, *served);
  EXPECT_EQ(res["X-Spillway-Fallback-Model"], "tiny-chat-b");
  EXPECT_EQ(res["X-Spillway-Limits"], "max_tokens 64");
  EXPECT_EQ(res["X-Spillway-Placement"], "cpu:0/99");
  EXPECT_EQ(res["X-Spillway-Degraded"], "served by cpu:0/99 (fallback)");
  EXPECT_EQ(res["X-Spillway-Attempts"], "2");

  // The Ollama replay: the stored stream translated whole.
  auto client = std::make_shared<RecordingExchange>();
  FakeClock clock;
  OllamaExchange ollama(client, api::OllamaReplyContext{api::OllamaRoute::kGenerate, "chat", 0}, clock);
  ollama.Respond(http::MakeResponse(200, stored, "text/event-stream", 11));
  ExpectLastLineNamesTheFallback(client->body());

  // A stream served plainly by its primary is stored as it was sent.
  ReplyWriter plain(nullptr, "req-5", 11);
  ServedBy primary;
  primary.placement = "sim:0/99";
  plain.BeginStream(primary, "primary");
  plain.Event(Chunk("hi", 3));
  EXPECT_EQ(plain.stored(), Chunk("hi", 3));
  EXPECT_FALSE(ReplyWriter::StoredServedBy(plain.stored()).has_value());
}

// A chat stream that left out its oldest messages says so in its head
// (X-Spillway-Dropped-Messages), and its replay's head again; one whose head
// went out while it waited says it in the comment that says where it runs.
TEST(ReplyWriterTest, AStreamsDroppedMessagesAreSaidInItsReplayAndAfterAnEarlyHead) {
  ReplyWriter reply(nullptr, "req-6", 11);
  ServedBy s;
  s.placement = "sim:0/99";
  s.dropped_messages = "4";
  reply.BeginStream(s, "primary");
  reply.Event(Chunk("hi", 3));
  auto res = http::MakeResponse(200, reply.stored(), "text/event-stream", 11);
  auto served = ReplyWriter::StoredServedBy(reply.stored());
  ASSERT_TRUE(served.has_value()) << reply.stored();
  ReplyWriter::Describe(res, *served);
  EXPECT_EQ(res["X-Spillway-Dropped-Messages"], "4");

  auto client = std::make_shared<RecordingExchange>();
  ReplyWriter early(client, "req-7", 11);
  early.WaitingNote("every slot is busy", 2);
  early.BeginStream(s, "primary");
  EXPECT_NE(client->body().find(": running on sim:0/99 (primary), its 4 oldest messages left out"), std::string::npos)
      << client->body();
}

// An error once a stream has begun is its last event: it was a whole HTTP
// answer written inside the stream's body (a waiting stream whose attempt
// the journal could not record). A relayed answer's stream, in the server's
// own format, ends as cut instead.
TEST(ReplyWriterTest, AnErrorAfterTheHeadEndsTheStream) {
  auto client = std::make_shared<RecordingExchange>();
  ReplyWriter reply(client, "req-5", 11);
  reply.WaitingNote("the CPU line is busy", 2);
  reply.Error(Status::Unavailable("the journal cannot write"));
  EXPECT_TRUE(client->done());
  EXPECT_FALSE(client->aborted());
  EXPECT_EQ(client->status(), 200u);
  const std::string body = client->body();
  EXPECT_NE(body.find("data: {\"error\""), std::string::npos) << body;
  EXPECT_NE(body.find("the journal cannot write"), std::string::npos) << body;
  EXPECT_EQ(body.rfind(api::kSseDone), body.size() - std::string(api::kSseDone).size()) << body;

  auto relayed = std::make_shared<RecordingExchange>();
  ReplyWriter relay(relayed, "req-6", 11);
  relay.BeginRelay(200, "audio/wav", {});
  relay.Event("RIFF");
  relay.Error(Status::Unavailable("the server went away"));
  EXPECT_TRUE(relayed->aborted());
  EXPECT_EQ(relayed->body(), "RIFF");
}

TEST(ReplyWriterTest, WithoutAClientEverythingIsStoredAndNothingIsSent) {
  ReplyWriter reply(nullptr, "req-3", 11);
  reply.WaitingNote("waiting", 1);
  reply.BeginStream({}, "primary");
  reply.Event("data: 1\n\n");
  reply.Error(Status::Unavailable("x"));
  EXPECT_TRUE(reply.events_started());
  EXPECT_FALSE(reply.head_sent());
  EXPECT_EQ(reply.stored(), "data: 1\n\n");
}

// A relayed answer past its bound still reaches the client whole, but is
// not kept whole (it was: an external server's long relayed answer grew the
// gateway's memory and the journal without limit).
TEST(ReplyWriterTest, ABoundedStoreKeepsANoteInsteadOfALongAnswer) {
  auto client = std::make_shared<RecordingExchange>();
  ReplyWriter reply(client, "req-4", 11);
  reply.BeginRelay(200, "audio/wav", {});
  reply.BoundStored(10);
  reply.Event("0123456789");
  EXPECT_TRUE(reply.stored_whole());
  EXPECT_EQ(reply.stored(), "0123456789");
  reply.Event("abcdef");
  EXPECT_FALSE(reply.stored_whole());
  EXPECT_LT(reply.stored().size(), 200u);
  EXPECT_NE(reply.stored().find("not kept"), std::string::npos) << reply.stored();
  EXPECT_NE(client->body().find("0123456789abcdef"), std::string::npos) << "the client gets every byte";
}

}  // namespace
}  // namespace spillway::gateway
