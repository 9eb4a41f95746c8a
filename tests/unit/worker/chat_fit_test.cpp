#include "worker/chat_fit.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace spillway::worker {
namespace {

using nlohmann::json;

json Msg(const std::string& role, const std::string& content) { return {{"role", role}, {"content", content}}; }

// Each message's content length is its "tokens"; a candidate fits in `limit`.
auto FitsWithin(size_t limit, int* calls = nullptr) {
  return [limit, calls](const json& messages) {
    if (calls) ++*calls;
    size_t n = 0;
    for (const auto& m : messages) n += m["content"].get<std::string>().size();
    return n <= limit;
  };
}

TEST(ChatFitTest, KeepsTheSystemMessagesAndTheLongestTailThatFits) {
  const json messages = {Msg("system", "SS"),        Msg("user", "u1u1u1u1"), Msg("assistant", "a1a1a1a1"),
                         Msg("user", "u2u2"),        Msg("assistant", "a2a2"), Msg("user", "u3")};
  // 2 (system) + 4 + 4 + 2 = 12: from the second user message on.
  auto kept = KeepLatestThatFit(messages, FitsWithin(12));
  ASSERT_TRUE(kept);
  EXPECT_EQ(kept->dropped, 2);
  ASSERT_EQ(kept->messages.size(), 4u);
  EXPECT_EQ(kept->messages[0], messages[0]);
  EXPECT_EQ(kept->messages[1], messages[3]);
  EXPECT_EQ(kept->messages.back(), messages[5]);
}

TEST(ChatFitTest, ATailBeginsAtAUsersMessageNeverAtAnAnswerOrAToolResult) {
  const json messages = {Msg("user", "u1u1u1u1"), Msg("assistant", "a1"), Msg("tool", "t1"),
                         Msg("assistant", "a2"),  Msg("user", "u2")};
  // From a1 on would fit (8), but a tail begins at a user's message: u2 alone.
  auto kept = KeepLatestThatFit(messages, FitsWithin(8));
  ASSERT_TRUE(kept);
  EXPECT_EQ(kept->dropped, 4);
  ASSERT_EQ(kept->messages.size(), 1u);
  EXPECT_EQ(kept->messages[0], messages[4]);
}

TEST(ChatFitTest, SystemMessagesAnywhereBeforeTheTailAreKeptInTheirOrder) {
  const json messages = {Msg("system", "S1"), Msg("user", "u1u1u1u1u1"), Msg("developer", "D2"),
                         Msg("assistant", "a1a1a1a1a1"), Msg("user", "u2")};
  auto kept = KeepLatestThatFit(messages, FitsWithin(6));
  ASSERT_TRUE(kept);
  EXPECT_EQ(kept->dropped, 2);
  EXPECT_EQ(kept->messages, json::array({messages[0], messages[2], messages[4]}));
}

TEST(ChatFitTest, TheLastMessageIsKeptWhateverItsRole) {
  const json messages = {Msg("user", "u1u1u1u1"), Msg("assistant", "a1a1a1a1"), Msg("tool", "t1")};
  auto kept = KeepLatestThatFit(messages, FitsWithin(2));
  ASSERT_TRUE(kept);
  EXPECT_EQ(kept->dropped, 2);
  EXPECT_EQ(kept->messages, json::array({messages[2]}));
}

TEST(ChatFitTest, NothingWhenTheLastMessageDoesNotFitAlone) {
  const json messages = {Msg("system", "SS"), Msg("user", "u1"), Msg("user", "u2u2u2u2")};
  EXPECT_FALSE(KeepLatestThatFit(messages, FitsWithin(9)));
  EXPECT_FALSE(KeepLatestThatFit(json::array({Msg("user", "long")}), FitsWithin(1)));  // (one message: nothing to leave out)
}

// Qwen3's template refuses a conversation without a user's message, Gemma's
// one that does not alternate: a tail a template refuses does not fit, and
// the longest tail that begins at a user's message is still found.
TEST(ChatFitTest, ATemplatesRefusalOfTheLastMessageAloneHidesNoTailThatFits) {
  for (int turns : {1, 4}) {
    json messages = json::array();
    for (int i = 0; i < turns; ++i) {
      messages.push_back(Msg("user", std::string(20, 'u')));
      messages.push_back(Msg("assistant", std::string(20, 'a')));
    }
    messages.push_back(Msg("user", "u"));
    messages.push_back(Msg("assistant", "call"));
    messages.push_back(Msg("tool", "result"));
    const auto sized = FitsWithin(30);
    auto kept = KeepLatestThatFit(messages, [&](const json& m) {
      bool user = false;
      for (const auto& x : m) user |= x["role"] == "user";
      return user && sized(m);  // ("No user query found in messages.")
    });
    ASSERT_TRUE(kept) << turns;
    EXPECT_EQ(kept->dropped, 2 * turns);
    EXPECT_EQ(kept->messages.size(), 3u);
  }
}

TEST(ChatFitTest, TheWholeConversationIsNeverTriedAgain) {
  // [system, user, ...]: the first user's tail is the whole conversation.
  const json messages = {Msg("system", "S"), Msg("user", "u1"), Msg("assistant", "a1"), Msg("user", "u2")};
  std::vector<size_t> tried;
  auto kept = KeepLatestThatFit(messages, [&](const json& m) {
    tried.push_back(m.size());
    return true;
  });
  ASSERT_TRUE(kept);
  EXPECT_EQ(tried, std::vector<size_t>({2u})) << "only [S, u2]";
}

TEST(ChatFitTest, WithoutOldestLeavesOutAsManyAsAnotherWorkerCounted) {
  const json messages = {Msg("system", "S"), Msg("user", "u1"), Msg("assistant", "a1"), Msg("system", "S2"),
                         Msg("user", "u2"),  Msg("assistant", "a2"), Msg("user", "u3")};
  auto k = WithoutOldest(messages, 2);
  EXPECT_EQ(k.dropped, 2);
  EXPECT_EQ(k.messages, json::array({messages[0], messages[3], messages[4], messages[5], messages[6]}));
  EXPECT_EQ(WithoutOldest(messages, 0).messages, messages);
  EXPECT_EQ(WithoutOldest(messages, 99).messages, json::array({messages[0], messages[3], messages[6]}))
      << "never the last message";
  EXPECT_EQ(WithoutOldest(messages, 99).dropped, 4);
}

TEST(ChatFitTest, ALongConversationIsRenderedAFewTimesNotOncePerMessage) {
  json messages = json::array();
  for (int i = 0; i < 1000; ++i) messages.push_back(Msg(i % 2 ? "assistant" : "user", std::string(10, 'x')));
  messages.push_back(Msg("user", "last"));
  int calls = 0;
  auto kept = KeepLatestThatFit(messages, FitsWithin(504, &calls));
  ASSERT_TRUE(kept);
  // The longest tail within 504: 50 messages of 10 and the last (4).
  EXPECT_EQ(kept->messages.size(), 51u);
  EXPECT_EQ(kept->dropped, 950);
  EXPECT_LE(calls, 12);
}

}  // namespace
}  // namespace spillway::worker
