#include "failover/stream_progress.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace spillway::failover
