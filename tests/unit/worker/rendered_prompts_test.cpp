// The worker's kept chat renderings (worker/rendered_prompts.h): what the key
// leaves out and keeps, how long an entry lives, and what leaves first.
#include "worker/rendered_prompts.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace spillway::worker {
namespace {

using nlohmann::json;

void Keep(RenderedPrompts& kept, const std::string& key, const std::string& prompt, size_t tokens = 4) {
  ChatPlan plan;
  plan.prompt = prompt;
  kept.Put(key, plan, std::vector<int32_t>(tokens, 7));
}

const json kMessages = json::array({{{"role", "user"}, {"content", "hello"}}});

TEST(RenderedPromptsTest, TheKeyLeavesOutOnlyWhatATemplateNeverReads) {
  const json body = {{"messages", kMessages}, {"temperature", 0.5}};
  const std::string key = RenderedPrompts::KeyOf(body, kMessages);
  // What the gateway changes between its count and the run, and a retry's seed.
  json run = body;
  run["max_tokens"] = 12;
  run["max_completion_tokens"] = 12;
  run["seed"] = 99;
  run["spillway_fit_context"] = true;
  run["spillway_drop_messages"] = 0;
  run["spillway_resume"] = {{"tokens", json::array({1, 2})}, {"text_bytes", 3}};
  EXPECT_EQ(RenderedPrompts::KeyOf(run, kMessages), key);
  // The same body written otherwise (member order, spacing) is the same key.
  EXPECT_EQ(RenderedPrompts::KeyOf(json::parse(R"({ "temperature" : 0.5, "messages":[{"content":"hello","role":"user"}]})"),
                                   kMessages),
            key);
  // Anything else may change the rendering: another key.
  for (const char* member : {"tools", "tool_choice", "response_format", "stream", "chat_template_kwargs",
                             "reasoning_format", "parallel_tool_calls", "temperature"}) {
    json other = body;
    other[member] = json::array({1});
    EXPECT_NE(RenderedPrompts::KeyOf(other, kMessages), key) << member;
  }
  // The messages rendered, not the body's own: a kept tail is its own key.
  const json tail = json::array({{{"role", "user"}, {"content", "hello again"}}});
  EXPECT_NE(RenderedPrompts::KeyOf(body, tail), key);
  EXPECT_EQ(RenderedPrompts::KeyOf(json::array({1}), kMessages), "");
  // A completion's text is a key of its own kind: never a chat's.
  EXPECT_NE(RenderedPrompts::KeyOfText(key), key);
  EXPECT_EQ(RenderedPrompts::KeyOfText("a b"), RenderedPrompts::KeyOfText("a b"));
  EXPECT_NE(RenderedPrompts::KeyOfText("a b"), RenderedPrompts::KeyOfText("a  b"));
}

TEST(RenderedPromptsTest, AnEntryLivesItsTimeAndIsFoundAsKept) {
  FakeClock clock;
  RenderedPrompts kept(clock, 4, 1 << 20, 30'000);
  const std::string key = RenderedPrompts::KeyOf(json{{"messages", kMessages}}, kMessages);
  EXPECT_EQ(kept.Find(key), nullptr);
  Keep(kept, key, "<prompt>", 5);
  auto found = kept.Find(key);
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->plan.prompt, "<prompt>");
  EXPECT_EQ(found->tokens.size(), 5u);
  EXPECT_EQ(kept.Find(key + " "), nullptr);
  EXPECT_EQ(kept.Find(""), nullptr);
  clock.Advance(29'999);
  EXPECT_NE(kept.Find(key), nullptr);
  clock.Advance(1);
  EXPECT_EQ(kept.Find(key), nullptr) << "a template may print today's date: kept 30 s at most";
  const auto st = kept.stats();
  EXPECT_EQ(st.hits, 2u);
  EXPECT_EQ(st.misses, 4u);
  EXPECT_EQ(st.entries, 0u);
  EXPECT_EQ(st.bytes, 0u);
  // What expired is let go without a Find (the worker's info says so).
  Keep(kept, key, "<prompt>", 5);
  EXPECT_EQ(kept.stats().entries, 1u);
  clock.Advance(30'000);
  EXPECT_EQ(kept.stats().entries, 0u);
  EXPECT_EQ(kept.stats().bytes, 0u);
}

TEST(RenderedPromptsTest, TheLeastRecentlyUsedLeavesFirst) {
  FakeClock clock;
  RenderedPrompts kept(clock, 3, 1 << 20, 30'000);
  for (const char* k : {"a", "b", "c"}) Keep(kept, k, k);
  ASSERT_NE(kept.Find("a"), nullptr);  // b is now the least recently used
  Keep(kept, "d", "d");
  EXPECT_EQ(kept.Find("b"), nullptr);
  for (const char* k : {"a", "c", "d"}) EXPECT_NE(kept.Find(k), nullptr) << k;
  EXPECT_EQ(kept.stats().entries, 3u);
  // Put again: replaced, not added.
  Keep(kept, "a", "a2");
  EXPECT_EQ(kept.Find("a")->plan.prompt, "a2");
  EXPECT_EQ(kept.stats().entries, 3u);
}

TEST(RenderedPromptsTest, BytesAreBoundedAndALargeRenderingIsNotKept) {
  FakeClock clock;
  RenderedPrompts kept(clock, 100, 64 << 10, 30'000);
  Keep(kept, "huge", std::string(20 << 10, 'x'));  // past a quarter of the bytes
  EXPECT_EQ(kept.Find("huge"), nullptr);
  for (int i = 0; i < 10; ++i) Keep(kept, "k" + std::to_string(i), std::string(10 << 10, 'y'));
  const auto st = kept.stats();
  EXPECT_LE(st.bytes, size_t{64 << 10});
  EXPECT_LT(st.entries, 10u);
  EXPECT_NE(kept.Find("k9"), nullptr) << "the latest stays";
  EXPECT_EQ(kept.Find("k0"), nullptr) << "the oldest went";
}

TEST(RenderedPromptsTest, NoneKeptWhenOff) {
  FakeClock clock;
  RenderedPrompts kept(clock, 0, 1 << 20, 30'000);
  EXPECT_FALSE(kept.enabled());
  Keep(kept, "a", "a");
  EXPECT_EQ(kept.Find("a"), nullptr);
  EXPECT_EQ(kept.stats().entries, 0u);
}

}  // namespace
}  // namespace spillway::worker
