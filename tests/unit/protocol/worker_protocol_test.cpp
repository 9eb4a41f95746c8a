#include "protocol/worker_protocol.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "api/openai_response.h"

namespace spillway::protocol {
namespace {

using nlohmann::json;

// What the worker writes (api::ErrorBody) is what the gateway reads back.
TEST(WorkerProtocolTest, ErrorsRoundTripThroughTheWorkersOwnEncoding) {
  Status busy = Status::ResourceExhausted("every slot is busy");
  auto e = ParseWorkerError(503, api::ErrorBody(busy).dump());
  ASSERT_TRUE(e);
  EXPECT_TRUE(e->busy());
  EXPECT_FALSE(e->placement_failure());
  EXPECT_EQ(e->message, "every slot is busy");

  Status kv = Status::ResourceExhausted("KV allocation failed");
  kv.WithPhase(FailurePhase::kKv);
  e = ParseWorkerError(503, api::ErrorBody(kv).dump());
  ASSERT_TRUE(e);
  EXPECT_FALSE(e->busy());  // an allocation failure is not "busy": it moves elsewhere
  EXPECT_TRUE(e->placement_failure());
  EXPECT_EQ(e->phase, FailurePhase::kKv);
  EXPECT_EQ(e->ToStatus().phase(), FailurePhase::kKv);

  e = ParseWorkerError(499, api::ErrorBody(Status::Cancelled("request cancelled")).dump());
  ASSERT_TRUE(e);
  EXPECT_TRUE(e->cancelled());
  EXPECT_FALSE(ParseWorkerError(200, "{}"));
}

// A reason (OpenAI's context_length_exceeded) is the body's "code" that
// clients read; the code it refines rides beside it and is read back, so a
// worker's 400 stays an invalid argument (and a 503 with a reason stays busy).
TEST(WorkerProtocolTest, AReasonIsTheClientsCodeAndTheStatusCodeIsKept) {
  const Status past = Status::InvalidArgument("prompt of 9000 tokens does not fit").WithReason(kContextLengthExceeded);
  const json body = api::ErrorBody(past);
  EXPECT_EQ(body["error"]["code"], "context_length_exceeded");
  EXPECT_EQ(body["error"]["status"], "invalid_argument");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  auto e = ParseWorkerError(400, body.dump());
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, StatusCode::kInvalidArgument);
  EXPECT_EQ(e->reason, "context_length_exceeded");
  EXPECT_EQ(e->ToStatus().reason(), "context_length_exceeded");
  e = ParseWorkerError(503, api::ErrorBody(Status::ResourceExhausted("full").WithReason("kv_full")).dump());
  ASSERT_TRUE(e);
  EXPECT_TRUE(e->busy());
  // Without a reason: no "status", and "code" is the code's name, as before.
  const json plain = api::ErrorBody(Status::InvalidArgument("x"));
  EXPECT_EQ(plain["error"]["code"], "invalid_argument");
  EXPECT_FALSE(plain["error"].contains("status"));
  e = ParseWorkerError(400, plain.dump());
  ASSERT_TRUE(e);
  EXPECT_TRUE(e->reason.empty());
}

// A worker's HTTP layer refuses before its handlers when it holds too many
// bodies or connections: a busy worker (waited for, sent again), not an
// internal error passed on to the client as a 503.
TEST(WorkerProtocolTest, TheHttpLayersOverloadIsABusyWorker) {
  for (const char* code : {"server_busy", "too_many_connections"}) {
    auto e = ParseWorkerError(503, std::string(R"({"error":{"message":"retry shortly","code":")") + code + R"("}})");
    ASSERT_TRUE(e);
    EXPECT_TRUE(e->busy()) << code;
    EXPECT_FALSE(e->placement_failure()) << code;
  }
  auto e = ParseWorkerError(413, R"({"error":{"message":"request body too large","code":"body_too_large"}})");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, StatusCode::kPayloadTooLarge);
}

TEST(WorkerProtocolTest, AnythingElseIsAnErrorWithItsBodyNotABusyWorker) {
  auto e = ParseWorkerError(503, "<html>resource_exhausted</html>");  // no substring matching
  ASSERT_TRUE(e);
  EXPECT_FALSE(e->busy());
  EXPECT_EQ(e->code, StatusCode::kInternal);
  EXPECT_NE(e->message.find("<html>"), std::string::npos);
  e = ParseWorkerError(500, R"({"error":{"message":"boom","code":"internal"}})");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->phase, FailurePhase::kCompute);  // a worker's 500 is a failure in compute
  e = ParseWorkerError(503, R"({"error":{"message":"x","code":"no_such_code","phase":"warp"}})");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, StatusCode::kInternal);
  EXPECT_EQ(e->phase, FailurePhase::kNone);
  EXPECT_FALSE(ParseStreamError(json::parse(R"({"choices":[]})")));
  EXPECT_TRUE(ParseStreamError(json::parse(R"({"error":{"message":"m","code":"cancelled"}})"))->cancelled());
}

TEST(WorkerProtocolTest, HealthReports) {
  for (Health h : {Health::kOk, Health::kDeviceLost, Health::kStalled, Health::kError}) {
    HealthReport r;
    r.state = h;
    r.stalled_ms = 7;
    const auto back = HealthReport::FromBody(r.ToJson().dump());
    EXPECT_EQ(back.state, h);
    EXPECT_EQ(back.stalled_ms, 7);
    EXPECT_EQ(back.replace_now(), h == Health::kDeviceLost || h == Health::kStalled);
  }
  EXPECT_EQ(HealthReport::FromBody("device_lost").state, Health::kError);  // not a report
  EXPECT_FALSE(HealthReport::FromBody("{\"status\":\"ok\",\"note\":\"device_lost\"}").replace_now());
}

TEST(WorkerProtocolTest, TimingsFromABodyOrAStreamsLastEvent) {
  auto t = TimingsOf(R"({"spillway":{"timings":{"prompt_ms":10,"generation_ms":20,"prompt_tokens":5,"generated_tokens":3}}})");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->prompt_ms, 10);
  EXPECT_EQ(t->generated_tokens, 3);
  t = TimingsOf(
      "data: {\"spillway\":{\"timings\":{\"prompt_ms\":3}}}\n\ndata: {\"choices\":[]}\n\n"
      "data: {\"spillway\":{\"timings\":{\"prompt_ms\":4}}}\n\ndata: [DONE]\n\n");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->prompt_ms, 4);  // the last event that carries them
  // CRLF lines, no space after "data:", and a last line without its newline.
  t = TimingsOf("data:{\"spillway\":{\"timings\":{\"prompt_ms\":5}}}\r\n\r\ndata: [DONE]");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->prompt_ms, 5);
  EXPECT_FALSE(TimingsOf("data: {\"choices\":[]}\n\ndata: [DONE]\n\n"));
  EXPECT_FALSE(TimingsOf(""));
  EXPECT_FALSE(TimingsOf("\n\n"));
  EXPECT_FALSE(TimingsOf("{\"choices\":[]}"));
}

// The prompt tokens a worker found in its cache (prefix reuse) travel in the
// header and the body; the time per prompt token is the computed ones'.
TEST(WorkerProtocolTest, TimingsCarryTheCachedPromptTokens) {
  const Timings sent{12.5, 3, 900, 4, 880};
  const auto back = Timings::FromHeader(sent.ToHeader());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->cached_tokens, 880);
  EXPECT_EQ(back->computed_prompt_tokens(), 20);
  const auto in_body = TimingsOf(json{{"spillway", {{"timings", sent.ToJson()}}}}.dump());
  ASSERT_TRUE(in_body);
  EXPECT_EQ(in_body->cached_tokens, 880);
  // An older worker's header has none: all of the prompt was computed.
  const auto old = Timings::FromHeader("prompt_ms=2;generation_ms=1;prompt_tokens=7;generated_tokens=1");
  ASSERT_TRUE(old);
  EXPECT_EQ(old->cached_tokens, 0);
  EXPECT_EQ(old->computed_prompt_tokens(), 7);
  EXPECT_EQ(Timings{}.ToHeader().find("cached_tokens"), std::string::npos);  // (said only when there are some)
}

// TimingsOf reads the timings as it parses (SAX); the reference is what it
// did before with a document, from the whole parse (Timings::FromJson).
// Random documents built from the members it reads (duplicated, nested, of
// other types, cut short), alone and as a stream's event, must give the
// same timings. (Finding the event in a stream is unchanged, and tested above.)
std::optional<Timings> ReferenceTimingsIn(const std::string& doc) {
  json j = json::parse(doc, nullptr, false);
  if (j.is_object() && j.contains("spillway") && j["spillway"].is_object() && j["spillway"].contains("timings")) {
    return Timings::FromJson(j["spillway"]["timings"]);
  }
  return std::nullopt;
}

std::string RandomTimingsJson(std::mt19937& rng, int depth) {
  static const char* kKeys[] = {"spillway", "timings", "prompt_ms", "generation_ms", "prompt_tokens",
                                "generated_tokens", "cached_tokens", "choices", "x"};
  static const char* kScalars[] = {"1", "-7", "18446744073709551615", "2.5", "1e2", "true", "null", "\"t\""};
  const int pick = static_cast<int>(rng() % 10);
  if (depth > 4 || pick < 3) return kScalars[rng() % (sizeof kScalars / sizeof *kScalars)];
  if (pick < 9) {  // an object, keys may repeat
    std::string out = "{";
    for (int i = 0, n = static_cast<int>(rng() % 6); i < n; ++i) {
      out += (i ? ",\"" : "\"") + std::string(kKeys[rng() % (sizeof kKeys / sizeof *kKeys)]) + "\":" +
             RandomTimingsJson(rng, depth + 1);
    }
    return out + "}";
  }
  std::string out = "[";
  for (int i = 0, n = static_cast<int>(rng() % 3); i < n; ++i) out += (i ? "," : "") + RandomTimingsJson(rng, depth + 1);
  return out + "]";
}

TEST(WorkerProtocolTest, TimingsReadAsTheWholeParsedDocumentSays) {
  std::mt19937 rng(51);
  int found = 0;
  for (int i = 0; i < 30000; ++i) {
    auto doc = [&] {
      std::string members;  // the timings' own, maybe given twice
      for (int k = static_cast<int>(rng() % 6); k > 0; --k) {
        static const char* kNames[] = {"prompt_ms", "generation_ms", "prompt_tokens", "generated_tokens",
                                       "cached_tokens"};
        members += std::string(members.empty() ? "" : ",") + "\"" + kNames[rng() % 5] + "\":" +
                   (rng() % 3 ? std::to_string(rng() % 1000) + (rng() % 2 ? ".25" : "") : RandomTimingsJson(rng, 3));
      }
      switch (rng() % 4) {
        case 0: return RandomTimingsJson(rng, 0);
        case 1: return "{\"spillway\":" + RandomTimingsJson(rng, 1) + ",\"x\":1}";
        default: return "{\"choices\":[],\"spillway\":{\"timings\":{" + members + "}" +
                        (rng() % 4 ? std::string() : ",\"timings\":" + RandomTimingsJson(rng, 2)) + "}" +
                        (rng() % 6 ? std::string() : ",\"spillway\":" + RandomTimingsJson(rng, 1)) + "}";
      }
    };
    std::string body = doc();
    if (rng() % 10 == 0) body.resize(rng() % (body.size() + 1));  // cut short
    const auto want = ReferenceTimingsIn(body);
    const bool named = body.find("\"timings\"") != std::string::npos;  // (a stream's event is read when it names them)
    for (const auto& [got, expected] : {std::pair{TimingsOf(body), want},
                                        std::pair{TimingsOf("data: " + body + "\n\ndata: [DONE]\n\n"),
                                                  named ? want : std::nullopt}}) {
      ASSERT_EQ(got.has_value(), expected.has_value()) << body;
      if (!expected) continue;
      ASSERT_EQ(got->prompt_ms, expected->prompt_ms) << body;
      ASSERT_EQ(got->generation_ms, expected->generation_ms) << body;
      ASSERT_EQ(got->prompt_tokens, expected->prompt_tokens) << body;
      ASSERT_EQ(got->generated_tokens, expected->generated_tokens) << body;
      ASSERT_EQ(got->cached_tokens, expected->cached_tokens) << body;
    }
    found += want.has_value();
  }
  EXPECT_GT(found, 3000);  // (the corpus reaches the timings: one that stopped doing so would prove nothing)
}

// The header form carries the same numbers exactly (shortest round-trip form).
TEST(WorkerProtocolTest, TimingsRoundTripThroughTheirHeader) {
  const Timings sent{1.884181, 0.445174, 2, 1};
  const std::string h = sent.ToHeader();
  EXPECT_EQ(h, "prompt_ms=1.884181;generation_ms=0.445174;prompt_tokens=2;generated_tokens=1");
  const auto got = Timings::FromHeader(h);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->prompt_ms, sent.prompt_ms);
  EXPECT_EQ(got->generation_ms, sent.generation_ms);
  EXPECT_EQ(got->prompt_tokens, sent.prompt_tokens);
  EXPECT_EQ(got->generated_tokens, sent.generated_tokens);
  // A later worker's extra keys are ignored; a missing one counts 0.
  const auto more = Timings::FromHeader("prompt_ms=3;queue_ms=9");
  ASSERT_TRUE(more);
  EXPECT_EQ(more->prompt_ms, 3);
  EXPECT_EQ(more->generated_tokens, 0);
  EXPECT_FALSE(Timings::FromHeader("prompt_ms"));
  EXPECT_FALSE(Timings::FromHeader("prompt_ms=fast"));
}

TEST(WorkerProtocolTest, AWorkerOfAnotherVersionIsRefusedWithTheReason) {
  auto info = WorkerInfo::FromJson(json{{"protocol_version", kWorkerProtocolVersion}, {"pid", 4242}});
  ASSERT_TRUE(info);
  EXPECT_TRUE(CheckCompatible(*info).ok());
  EXPECT_EQ(info->pid, 4242);
  info = WorkerInfo::FromJson(json{{"protocol_version", kWorkerProtocolVersion + 1}});
  const Status st = CheckCompatible(*info);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("different builds"), std::string::npos);
  EXPECT_FALSE(CheckCompatible(*WorkerInfo::FromJson(json::object())).ok());  // no version: an old worker
}

// Host memory is what llama.cpp says is (its "host" flag): CUDA's pinned
// CUDA_Host buffers are the host's RAM, though not named CPU; a worker that
// does not say is read by name, as before.
TEST(WorkerProtocolTest, HostBuffersAreTheWorkersFlagElseACpuName) {
  EXPECT_TRUE(IsHostBuffer(json{{"name", "CUDA_Host"}, {"host", true}}));
  EXPECT_FALSE(IsHostBuffer(json{{"name", "CUDA0"}, {"host", false}}));
  EXPECT_TRUE(IsHostBuffer(json{{"name", "CPU_Mapped"}}));
  EXPECT_FALSE(IsHostBuffer(json{{"name", "CUDA_Host"}}));  // (an older worker: by name)
  EXPECT_FALSE(IsHostBuffer(json{{"name", 3}}));
  EXPECT_FALSE(IsHostBuffer(json::array()));
  auto info = WorkerInfo::FromJson({{"memory", {{"buffers", {{{"name", "CUDA0"}, {"host", false}, {"total", 10u}},
                                                             {{"name", "CUDA_Host"}, {"host", true}, {"total", 5u}},
                                                             {{"name", "CPU"}, {"total", 1u}}}}}}});
  ASSERT_TRUE(info);
  ASSERT_EQ(info->buffers.size(), 3u);
  EXPECT_FALSE(info->buffers[0].host);
  EXPECT_TRUE(info->buffers[1].host);
  EXPECT_TRUE(info->buffers[2].host);
}

// What the gateway reads of a worker's info, typed: the worker's own shape
// reads whole; fields of the wrong type read as absent, never throw (they
// were read with json accessors that threw, dropping the status page).
TEST(WorkerProtocolTest, WorkerInfoReadsTypedFieldsAndSurvivesWrongTypes) {
  const json good = {{"protocol_version", kWorkerProtocolVersion},
                     {"fingerprint", {{"id", "fp-1"}}},
                     {"memory", {{"buffers", {{{"name", "CUDA0"}, {"total", 100u}}, {{"name", "CPU"}, {"total", 7u}}}}}},
                     {"slots", {{"total", 4}, {"busy", 1}, {"queued", 2}}},
                     {"context", {{"created", false}, {"last_create_ms", 12.5}}}};
  auto info = WorkerInfo::FromJson(good);
  ASSERT_TRUE(info);
  EXPECT_EQ(info->fingerprint_id, "fp-1");
  ASSERT_EQ(info->buffers.size(), 2u);
  EXPECT_EQ(info->buffers[0].name, "CUDA0");
  EXPECT_EQ(info->buffers[0].total, 100u);
  ASSERT_TRUE(info->slots);
  EXPECT_EQ(info->slots->busy, 1);
  EXPECT_EQ(info->slots->queued, 2);
  EXPECT_FALSE(info->context_created);
  EXPECT_EQ(info->last_context_ms, 12.5);
  EXPECT_EQ(info->memory, good["memory"]);

  for (const json& bad : {json{{"fingerprint", "fp"}},
                          json{{"fingerprint", {{"id", 3}}}},
                          json{{"memory", {{"buffers", "none"}}}},
                          json{{"memory", {{"buffers", {{{"name", 1}, {"total", "big"}}, 5}}}}},
                          json{{"memory", 7}},
                          json{{"slots", {{"total", 4}, {"busy", "1"}, {"queued", 0}}}},
                          json{{"slots", json::array()}},
                          json{{"context", {{"created", "yes"}, {"last_create_ms", "12"}}}},
                          json{{"context", 1}}}) {
    std::optional<WorkerInfo> w;
    ASSERT_NO_THROW(w = WorkerInfo::FromJson(bad)) << bad.dump();
    ASSERT_TRUE(w) << bad.dump();
    EXPECT_TRUE(w->fingerprint_id.empty()) << bad.dump();
    EXPECT_TRUE(w->buffers.empty()) << bad.dump();
    EXPECT_FALSE(w->slots) << bad.dump();
    EXPECT_TRUE(w->context_created) << bad.dump();
    EXPECT_FALSE(w->last_context_ms) << bad.dump();
  }
}

TEST(WorkerProtocolTest, TokenizeReply) {
  const TokenizeReply r{12, 4096, 256};
  auto back = TokenizeReply::FromJson(r.ToJson());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->prompt_tokens, 12);
  EXPECT_EQ(back->dropped_messages, 0);
  const TokenizeReply cut{300, 512, 256, 6};
  EXPECT_EQ(TokenizeReply::FromJson(cut.ToJson())->dropped_messages, 6);
  EXPECT_FALSE(TokenizeReply::FromJson(json{{"prompt_tokens", 12}, {"dropped_messages", -2}}));
  EXPECT_FALSE(TokenizeReply::FromJson(json{{"prompt_tokens", "12"}}));
  // Another field of another type is no reply either (it threw: a type_error out of admission).
  EXPECT_FALSE(TokenizeReply::FromJson(json{{"prompt_tokens", 12}, {"ctx", "4096"}}));
  EXPECT_FALSE(TokenizeReply::FromJson(json{{"prompt_tokens", 12}, {"default_max_tokens", 1e12}}));
  EXPECT_FALSE(TokenizeReply::FromJson(json{{"prompt_tokens", -1}}));
  // What a run now would find cached (prefix reuse): never more than the prompt; none from an older worker.
  const TokenizeReply cached{900, 4096, 256, 0, 880};
  EXPECT_EQ(TokenizeReply::FromJson(cached.ToJson())->cached_tokens, 880);
  EXPECT_EQ(TokenizeReply::FromJson(json{{"prompt_tokens", 12}})->cached_tokens, 0);
  EXPECT_EQ(TokenizeReply::FromJson(json{{"prompt_tokens", 12}, {"cached_tokens", 50}})->cached_tokens, 12);
  EXPECT_FALSE(TokenizeReply::FromJson(json{{"prompt_tokens", 12}, {"cached_tokens", "5"}}));
}

}  // namespace
}  // namespace spillway::protocol
