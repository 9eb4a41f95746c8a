#include "failover/stream_progress.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "stream_progress_reference.h"

namespace spillway::failover {
namespace {

TEST(StreamProgressTest, CollectsTokensAndBytes) {
  StreamProgress p;
  std::string phase;
  EXPECT_EQ(p.Observe("data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"}}],\"spillway\":{\"tokens\":[10,11]}}\n\n", &phase),
            StreamProgress::Event::kChunk);
  p.Observe("data: {\"choices\":[{\"text\":\"lo\"}],\"spillway\":{\"tokens\":[12]}}\n\n", &phase);
  EXPECT_EQ(p.tokens(), (std::vector<int32_t>{10, 11, 12}));
  EXPECT_EQ(p.text_bytes(), 5u);
  EXPECT_TRUE(p.Continuable());
  EXPECT_EQ(p.Observe(": a comment\n\n", &phase), StreamProgress::Event::kOther);
  EXPECT_EQ(p.Observe("data: [DONE]\n\n", &phase), StreamProgress::Event::kDone);
}

TEST(StreamProgressTest, ErrorEventsReportTheirPhase) {
  StreamProgress p;
  std::string phase = "x";
  EXPECT_EQ(p.Observe("data: {\"error\":{\"message\":\"m\",\"phase\":\"device\"}}\n\n", &phase), StreamProgress::Event::kError);
  EXPECT_EQ(phase, "device");
  p.Observe("data: {\"error\":{\"message\":\"m\"}}\n\n", &phase);
  EXPECT_EQ(phase, "");
}

TEST(StreamProgressTest, DeliveredToolCallsAreNeverContinuedPast) {
  StreamProgress p;
  p.Observe("data: {\"choices\":[{\"delta\":{\"content\":\"ok\"}}],\"spillway\":{\"tokens\":[1]}}\n\n", nullptr);
  EXPECT_TRUE(p.Continuable());
  p.Observe("data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"name\":\"add\"}}]}}]}\n\n", nullptr);
  EXPECT_TRUE(p.tool_calls_delivered());
  EXPECT_FALSE(p.Continuable());
  StreamProgress q;
  q.Observe("data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n", nullptr);
  EXPECT_FALSE(q.Continuable());
  // Held by the client's side until the stream's end (Ollama's translation): not delivered yet.
  StreamProgress held;
  held.set_tool_calls_held(true);
  held.Observe("data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"name\":\"add\"}}]}}],\"spillway\":{\"tokens\":[2]}}\n\n", nullptr);
  EXPECT_FALSE(held.tool_calls_delivered());
  EXPECT_TRUE(held.Continuable());
}

TEST(StreamProgressTest, TextWithoutTokenIdsCannotBeReproduced) {
  StreamProgress p;  // an upstream that does not report token ids
  p.Observe("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n", nullptr);
  EXPECT_FALSE(p.Continuable());
  StreamProgress none;
  EXPECT_TRUE(none.Continuable());  // nothing delivered: a fresh run is fine
}

// The worker puts one step's token ids on the last of the events the step
// made (its reasoning, then its text; a tool call's last arguments, then
// the next one's start): a stream cut between them delivered text no id
// stands for, and a continuation would generate that step again (its
// reasoning twice; in Ollama's held tool calls, arguments appended twice).
TEST(StreamProgressTest, TextWhoseIdsHaveNotComeYetIsNotContinued) {
  StreamProgress p;
  p.Observe("data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n", nullptr);
  EXPECT_TRUE(p.Continuable()) << "a role chunk delivers nothing";
  p.Observe("data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"Let me\"}}]}\n\n", nullptr);
  EXPECT_TRUE(p.ids_pending());
  EXPECT_FALSE(p.Continuable()) << "reasoning delivered, no id for it yet (cut here, a continuation was a fresh run)";
  p.Observe("data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"spillway\":{\"tokens\":[7,8,9]}}\n\n", nullptr);
  EXPECT_FALSE(p.ids_pending());
  EXPECT_TRUE(p.Continuable());
  p.Observe("data: {\"choices\":[{\"delta\":{\"reasoning_content\":\" think\"}}]}\n\n", nullptr);
  EXPECT_FALSE(p.Continuable()) << "cut between a step's reasoning and its text";
  p.Observe("data: {\"choices\":[{\"text\":\"\"}],\"spillway\":{\"tokens\":[10]}}\n\n", nullptr);
  EXPECT_TRUE(p.Continuable());
  // Held tool calls (Ollama's translation): continuable only once their step's ids came.
  StreamProgress held;
  held.set_tool_calls_held(true);
  held.Observe("data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"1}\"}}]}}]}\n\n", nullptr);
  EXPECT_FALSE(held.Continuable()) << "the first call's last arguments, the ids on the next event";
  held.Observe("data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":1,\"function\":{\"name\":\"b\"}}]}}],\"spillway\":{\"tokens\":[3]}}\n\n", nullptr);
  EXPECT_TRUE(held.Continuable());
}

TEST(StreamProgressTest, TheStreamsErrorEventIsTypedAndClearedForTheNextAttempt) {
  StreamProgress p;
  std::string phase;
  p.Observe("data: {\"error\":{\"message\":\"request cancelled\",\"code\":\"cancelled\"}}\n\n", &phase);
  ASSERT_TRUE(p.last_error());
  EXPECT_TRUE(p.last_error()->cancelled());
  EXPECT_EQ(phase, "");  // not a placement failure
  p.ClearError();
  EXPECT_FALSE(p.last_error());
  p.Observe("data: {\"choices\":[{\"delta\":{\"content\":\"cancelled\"}}]}\n\n", &phase);
  EXPECT_FALSE(p.last_error());  // the word in content is not an error
}

TEST(StreamProgressTest, GarbageIsIgnored) {
  StreamProgress p;
  EXPECT_EQ(p.Observe("data: {not json\n\n", nullptr), StreamProgress::Event::kOther);
  EXPECT_EQ(p.Observe("data: {\"choices\":5,\"spillway\":{\"tokens\":\"x\"}}\n\n", nullptr), StreamProgress::Event::kChunk);
  EXPECT_TRUE(p.tokens().empty());
}

// Observe reads an event's few members as it parses (SAX); the reference
// (tests/fakes/stream_progress_reference.h) reads the whole parsed document,
// as Observe did before. Random events built from the members it reads
// (duplicated, nested, of other types, cut short) must leave both with the
// same progress.
// A random JSON text whose keys are mostly the ones Observe reads.
std::string RandomValue(std::mt19937& rng, int depth) {
  static const char* kKeys[] = {"choices", "spillway", "tokens", "delta", "content", "text", "finish_reason",
                                "tool_calls", "error", "message", "index", "x"};
  static const char* kScalars[] = {"1", "-7", "4294967297", "2.5", "1e2", "true", "false", "null", "\"\"",
                                   "\"ab\"", "\"tool_calls\"", "\"stop\"", "\"h\\u00e9\\n\""};
  const int pick = static_cast<int>(rng() % 10);
  if (depth > 4 || pick < 4) return kScalars[rng() % (sizeof kScalars / sizeof *kScalars)];
  std::string out;
  if (pick < 7) {  // an object, keys may repeat
    out = "{";
    const int n = static_cast<int>(rng() % 5);
    for (int i = 0; i < n; ++i) {
      if (i) out += ",";
      out += std::string("\"") + kKeys[rng() % (sizeof kKeys / sizeof *kKeys)] + "\":" + RandomValue(rng, depth + 1);
    }
    return out + "}";
  }
  out = "[";
  const int n = static_cast<int>(rng() % 4);
  for (int i = 0; i < n; ++i) out += (i ? "," : "") + RandomValue(rng, depth + 1);
  return out + "]";
}

TEST(StreamProgressTest, EdgeEventsReadAsTheWholeParsedEventSays) {
  const char* kEvents[] = {
      "data: {\"choices\":[{\"delta\":{\"content\":\"ab\",\"content\":1}}]}\n\n",
      "data: {\"choices\":[{\"finish_reason\":\"tool_calls\",\"finish_reason\":null}]}\n\n",
      "data: {\"spillway\":{\"tokens\":[1]},\"spillway\":2}\n\n",
      "data: {\"spillway\":{\"tokens\":[1],\"tokens\":[2,3]}}\n\n",
      "data: {\"spillway\":{\"tokens\":[[4],-4294967297,4294967297,1.0,5]}}\n\n",
      "data: {\"error\":{},\"error\":\"s\",\"choices\":[{\"text\":\"t\"}]}\n\n",
      "data: {\"error\":\"s\",\"error\":{\"message\":\"m\",\"phase\":\"device\"}}\n\n",
      "data: {\"choices\":[5,{\"text\":\"later\"}]}\n\n",
      "data: {\"choices\":[{\"delta\":{\"tool_calls\":[]}},{\"delta\":{\"tool_calls\":[1]}}]}\n\n",
      "data: {\"choices\":[{\"delta\":5,\"text\":\"h\\u00e9\"}]}\n\n",
      "data: {\"\\u0063hoices\":[{\"text\":\"escaped key\"}]}\n\n",
      "data: {\"choices\":[{\"text\":\"x\"}]} trailing\n\n",
      "data: {\"choices\":[{\"text\":\"one\"}]}\ndata: {\"choices\":[{\"text\":\"two\"}]}\n\n",
      "data: [1,2]\n\n", "data: \"x\"\n\n", "data: \n\n", ": comment\n\n", "data: [DONE]\n\n",
  };
  for (const char* event : kEvents) {
    StreamProgress p;
    StreamProgressReference r;
    std::string phase;
    EXPECT_EQ(p.Observe(event, &phase), r.Observe(event)) << event;
    EXPECT_EQ(p.tokens(), r.tokens) << event;
    EXPECT_EQ(p.text_bytes(), r.text_bytes) << event;
    EXPECT_EQ(p.tool_calls_delivered(), r.tool_calls) << event;
    EXPECT_EQ(p.finished(), r.finished) << event;
    EXPECT_EQ(p.ids_pending(), r.ids_pending) << event;
    EXPECT_EQ(p.last_error().has_value(), r.error) << event;
  }
}

TEST(StreamProgressTest, ReadsWhatTheWholeParsedEventSays) {
  std::mt19937 rng(51);
  int chunks = 0, errors = 0, with_tokens = 0, with_text = 0, with_tool_calls = 0, finished = 0;
  for (int i = 0; i < 30000; ++i) {
    std::string body;
    auto scalar = [&] { return RandomValue(rng, 5); };  // (past the depth: a scalar)
    auto tokens = [&] {
      std::string t = "[";
      for (int k = static_cast<int>(rng() % 3); k > 0; --k) t += std::to_string(rng() % 50000) + (k > 1 ? "," : "");
      return rng() % 4 ? t + "]" : RandomValue(rng, 2);
    };
    // A member given twice, the second time maybe of another type (the last one counts).
    auto twice = [&](const char* key, const std::function<std::string()>& value) {
      std::string m = std::string("\"") + key + "\":" + value();
      return rng() % 2 ? m + ",\"" + key + "\":" + (rng() % 2 ? value() : RandomValue(rng, 3)) : m;
    };
    switch (rng() % 9) {  // mostly an object at the top, as the worker's events are
      case 8: body = "{\"choices\":[{\"delta\":{" + twice("content", scalar) + "," + twice("tool_calls", [&] { return RandomValue(rng, 3); }) +
                     "}," + twice("text", scalar) + "," + twice("finish_reason", scalar) +
                     (rng() % 4 ? std::string() : ",\"delta\":" + RandomValue(rng, 2)) + "}]," +
                     twice("spillway", [&] { return "{" + twice("tokens", tokens) + "}"; }) + "," +
                     twice("error", [&] { return RandomValue(rng, 2); }) + "}"; break;
      case 0: body = RandomValue(rng, 0); break;
      case 1: body = "{\"choices\":[{\"delta\":{\"content\":" + scalar() + ",\"tool_calls\":" + RandomValue(rng, 3) +
                     "},\"finish_reason\":" + scalar() + "}],\"spillway\":{\"tokens\":" + tokens() + "}}"; break;
      case 2: body = "{\"choices\":[{\"text\":" + scalar() + ",\"finish_reason\":" + scalar() + "}," + RandomValue(rng, 2) +
                     "],\"spillway\":{\"tokens\":" + tokens() + "}}"; break;
      case 3: body = rng() % 2 ? "{\"error\":{\"message\":\"m\",\"phase\":\"device\"},\"x\":" + RandomValue(rng, 2) + "}"
                               : "{\"error\":" + RandomValue(rng, 1) + ",\"choices\":[{\"text\":\"t\"}]}"; break;
      default: body = "{\"choices\":" + RandomValue(rng, 1) + ",\"spillway\":" + RandomValue(rng, 1) + "," +
                      std::string(rng() % 2 ? "\"choices\"" : "\"x\"") + ":" + RandomValue(rng, 1) + "}"; break;
    }
    if (rng() % 10 == 0) body.resize(rng() % (body.size() + 1));  // cut short
    const std::string event = "data: " + body + "\n\n";
    StreamProgress p;  // (each event alone: what one says is not hidden by what earlier ones set)
    StreamProgressReference r;
    std::string phase;
    const auto got = p.Observe(event, &phase);
    const auto want = r.Observe(event);
    ASSERT_EQ(got, want) << event;
    ASSERT_EQ(p.tokens(), r.tokens) << event;
    ASSERT_EQ(p.text_bytes(), r.text_bytes) << event;
    ASSERT_EQ(p.tool_calls_delivered(), r.tool_calls) << event;
    ASSERT_EQ(p.finished(), r.finished) << event;
    ASSERT_EQ(p.ids_pending(), r.ids_pending) << event;
    ASSERT_EQ(p.last_error().has_value(), r.error) << event;
    chunks += got == StreamProgress::Event::kChunk;
    errors += got == StreamProgress::Event::kError;
    with_tokens += !r.tokens.empty();
    with_text += r.text_bytes > 0;
    with_tool_calls += r.tool_calls;
    finished += r.finished;
  }
  // (The corpus reaches each kind of event: a generator that stopped doing so would prove nothing.)
  EXPECT_GT(chunks, 5000);
  EXPECT_GT(errors, 100);
  EXPECT_GT(with_tokens, 300);
  EXPECT_GT(with_text, 300);
  EXPECT_GT(with_tool_calls, 100);
  EXPECT_GT(finished, 300);
}

}  // namespace
}  // namespace spillway::failover
