#include "worker/grammar_bounds.h"

#include <gtest/gtest.h>

#include "worker/chat_template.h"

namespace spillway::worker {
namespace {

TEST(GrammarBoundsTest, ARepetitionWhoseMaximumIsBelowItsMinimumIsRefused) {
  const Status st = CheckRepetitionBounds("root ::= \"a\"{10,1}");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("at least 10 and at most 1"), std::string::npos) << st.message();
  EXPECT_FALSE(CheckRepetitionBounds("root ::= x { 3 , 2 }\nx ::= [a-z]").ok()) << "spaces inside";
}

TEST(GrammarBoundsTest, WellFormedRepetitionsAndTextThatLooksLikeOnePass) {
  for (const char* g : {"root ::= \"a\"{1,10}", "root ::= \"a\"{3}", "root ::= \"a\"{2,}", "root ::= \"a\"{0,0}",
                        "root ::= \"{10,1}\"",              // a literal's text
                        "root ::= [{}0-9,]+",               // a character class
                        "root ::= \"a\" # {10,1} a comment\n",
                        "root ::= \"\\\"{10,1}\"",          // an escaped quote inside a literal
                        "root ::= [\\]{10,1}]"}) {          // an escaped bracket inside a class
    EXPECT_TRUE(CheckRepetitionBounds(g).ok()) << g << ": " << CheckRepetitionBounds(g).ToString();
  }
  EXPECT_TRUE(CheckRepetitionBounds("root ::= \"a\"{99999999999999999999999,99999999999999999999999}").ok())
      << "(too large: llama.cpp's own limit refuses it)";
}

// What a client's JSON schema becomes through llama.cpp's converter: the
// bounds it writes are the ones checked (a schema of minLength 10 and
// maxLength 1 had the worker allocate rules until the host ran out).
TEST(GrammarBoundsTest, SchemasWithAMinimumAboveTheirMaximumAreRefused) {
  int converted = 0;
  for (const char* schema : {R"({"type":"string","minLength":10,"maxLength":1})",
                             R"({"type":"array","items":{"type":"integer"},"minItems":5,"maxItems":2})",
                             R"({"type":"string","pattern":"^a{10,1}$"})"}) {
    api::ResponseFormat f;
    f.type = api::ResponseFormatType::kJsonSchema;
    f.schema = schema;
    auto g = ResponseFormatGrammar(f);
    if (!g.ok()) continue;  // (refused by the converter itself: as good)
    ++converted;
    EXPECT_FALSE(CheckRepetitionBounds(g->gbnf).ok()) << schema << "\n" << g->gbnf;
  }
  EXPECT_GE(converted, 2) << "the converter refused them itself: nothing checked here";
  api::ResponseFormat fine;
  fine.type = api::ResponseFormatType::kJsonSchema;
  fine.schema = R"({"type":"string","minLength":1,"maxLength":10,"pattern":"^a{1,3}$"})";
  auto g = ResponseFormatGrammar(fine);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_TRUE(CheckRepetitionBounds(g->gbnf).ok()) << g->gbnf;
}

}  // namespace
}  // namespace spillway::worker
