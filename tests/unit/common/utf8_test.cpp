#include "common/utf8.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace spillway {
namespace {

TEST(Utf8Test, ValidTextIsUnchangedAndInvalidBytesBecomeReplacementCharacters) {
  const std::string valid = "plain, caf\xC3\xA9, \xE2\x96\x88 bar, \xF0\x9F\x98\x80";
  EXPECT_EQ(ValidUtf8(valid), valid);
  EXPECT_EQ(ValidUtf8(""), "");
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(ValidUtf8("cut \xE2\x96"), "cut " + r + r) << "a character cut at the end";
  EXPECT_EQ(ValidUtf8("\x96\x88 start"), r + r + " start") << "stray continuation bytes";
  EXPECT_EQ(ValidUtf8("Latin-1 mod\xE8le"), "Latin-1 mod" + r + "le");
  EXPECT_EQ(ValidUtf8("\xC0\xAF"), r + r) << "an overlong '/'";
  EXPECT_EQ(ValidUtf8("\xED\xA0\x80"), r + r + r) << "a surrogate";
  EXPECT_EQ(ValidUtf8("\xF4\x90\x80\x80"), r + r + r + r) << "past U+10FFFF";
  // What matters downstream: JSON can be written from it.
  for (const char* bad : {"\xE2\x96", "\xFF", "a\xC3", "\xF0\x9F\x98"}) {
    EXPECT_NO_THROW((void)nlohmann::json(ValidUtf8(bad)).dump()) << bad;
  }
}

TEST(Utf8Test, AbbreviatedCutsOnACharacterBoundary) {
  EXPECT_EQ(Abbreviated("short", 5), "short");
  EXPECT_EQ(Abbreviated("abcdefgh", 6), "abc...");
  // "caf\xC3\xA9" cut at 5 bytes would split the \xC3\xA9: it goes whole.
  EXPECT_EQ(Abbreviated("cafe caf\xC3\xA9 au lait", 12), "cafe caf...");
  EXPECT_EQ(Abbreviated("\xE2\x96\x88\xE2\x96\x88", 5), "...");
  EXPECT_EQ(Abbreviated("\xC3\xA9t\xC3\xA9", 2), "\xC3\xA9");  // no room for the mark
  EXPECT_EQ(ValidUtf8(Abbreviated("\xE2\x96\x88\xE2\x96\x88\xE2\x96\x88", 8)), "\xE2\x96\x88...");
}

TEST(Utf8Test, TerminalSafeReplacesControlCharacters) {
  EXPECT_EQ(TerminalSafe("a\tb\nc caf\xC3\xA9"), "a\tb\nc caf\xC3\xA9") << "text, tabs and lines stay";
  EXPECT_EQ(TerminalSafe("x\x1b]52;c;ZXZpbA==\x07y"), "x?]52;c;ZXZpbA==?y") << "OSC 52 (the clipboard)";
  EXPECT_EQ(TerminalSafe("\r\x7f\xC2\x9b" "1m\xC2\xA0"), "???1m\xC2\xA0") << "CR, DEL, C1 CSI; U+00A0 stays";
}

}  // namespace
}  // namespace spillway
