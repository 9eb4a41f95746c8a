#include "worker/output_text.h"

#include <gtest/gtest.h>

namespace spillway::worker {
namespace {

TEST(OutputTextTest, WithoutStopsEverythingIsReadyAtOnce) {
  OutputText t({});
  EXPECT_FALSE(t.Append("Hello"));
  EXPECT_EQ(t.TakeReady(), "Hello");
  EXPECT_FALSE(t.Append(" world"));
  EXPECT_EQ(t.TakeReady(), " world");
  EXPECT_EQ(t.TakeRest(), "");
}

TEST(OutputTextTest, StopStringSplitAcrossPiecesIsHeldBackThenCut) {
  OutputText t({"END"});
  EXPECT_FALSE(t.Append("abc E"));
  EXPECT_EQ(t.TakeReady(), "abc ");  // "E" might begin the stop string
  EXPECT_FALSE(t.Append("N"));
  EXPECT_EQ(t.TakeReady(), "");
  EXPECT_TRUE(t.Append("Dxyz"));
  EXPECT_EQ(t.text(), "abc ");
  EXPECT_EQ(t.TakeRest(), "");
  EXPECT_TRUE(t.Append("more"));  // ignored after the stop
  EXPECT_EQ(t.text(), "abc ");
}

TEST(OutputTextTest, FalseStartIsReleased) {
  OutputText t({"END"});
  t.Append("xEN");
  EXPECT_EQ(t.TakeReady(), "x");
  EXPECT_FALSE(t.Append("Q"));
  EXPECT_EQ(t.TakeReady(), "ENQ");
}

TEST(OutputTextTest, EarliestOfSeveralStopsWins) {
  OutputText t({"bb", "a"});
  EXPECT_TRUE(t.Append("xxbbya"));
  EXPECT_EQ(t.text(), "xx");
}

TEST(OutputTextTest, StopInsideOnePiece) {
  OutputText t({"\n\n"});
  EXPECT_TRUE(t.Append("line\n\nnext"));
  EXPECT_EQ(t.TakeRest(), "line");
}

TEST(OutputTextTest, IncompleteUtf8IsHeldBack) {
  OutputText t({});
  const std::string euro = "\xE2\x82\xAC";  // U+20AC
  t.Append("a" + euro.substr(0, 2));
  EXPECT_EQ(t.TakeReady(), "a");
  t.Append(euro.substr(2));
  EXPECT_EQ(t.TakeReady(), euro);
}

TEST(OutputTextTest, RestFlushesHeldText) {
  OutputText t({"STOP"});
  t.Append("abcST");
  EXPECT_EQ(t.TakeReady(), "abc");
  EXPECT_EQ(t.TakeRest(), "ST");
  EXPECT_EQ(t.text(), "abcST");
}

TEST(Utf8Test, CompletePrefix) {
  EXPECT_EQ(Utf8CompletePrefix(""), 0u);
  EXPECT_EQ(Utf8CompletePrefix("abc"), 3u);
  EXPECT_EQ(Utf8CompletePrefix("a\xF0\x9F\x98"), 1u);
  EXPECT_EQ(Utf8CompletePrefix("a\xF0\x9F\x98\x80"), 5u);
  EXPECT_EQ(Utf8CompletePrefix("\xC3"), 0u);
}

}  // namespace
}  // namespace spillway::worker
