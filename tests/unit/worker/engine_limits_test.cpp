// The engine's per-request cell limit (engine.h: RequestCellLimit).
#include <gtest/gtest.h>

#include "worker/engine.h"

namespace spillway::worker {
namespace {

// A model whose positions are a learned table (GPT-2: 1024 rows) served with
// a larger context: a generation past the table aborted the worker (ggml's
// get_rows assert on the CPU, out-of-bounds reads on CUDA), every request of
// the worker lost with it. Its requests now fit within the table.
TEST(EngineLimitsTest, ARequestStaysWithinTheTrainedContextOfAModelWithoutRotaryPositions) {
  EXPECT_EQ(RequestCellLimit(2048, 1024, /*rotary_positions=*/false), 1024);
  EXPECT_EQ(RequestCellLimit(512, 1024, false), 512);   // a slot's share below the table
  EXPECT_EQ(RequestCellLimit(2048, 0, false), 2048);    // no trained context recorded
  // Rotary positions have no table: the context is the configuration's (past
  // n_ctx_train the model degrades, llama.cpp warns; nothing aborts).
  EXPECT_EQ(RequestCellLimit(8192, 4096, true), 8192);
}

// An embedding input past what the model takes, when its request asks for
// truncation: its first tokens, and its end token when the tokenizer adds
// one (a BERT-style model's [SEP], an EOS some models pool at).
TEST(EngineLimitsTest, ATruncatedInputKeepsItsStartAndItsEndToken) {
  std::vector<int32_t> t = {1, 10, 11, 12, 13, 2};
  TruncateInput(&t, 4, /*keep_end=*/true);
  EXPECT_EQ(t, (std::vector<int32_t>{1, 10, 11, 2}));
  t = {1, 10, 11, 12, 13, 2};
  TruncateInput(&t, 4, /*keep_end=*/false);
  EXPECT_EQ(t, (std::vector<int32_t>{1, 10, 11, 12}));
  t = {1, 10, 11};
  TruncateInput(&t, 4, true);
  EXPECT_EQ(t, (std::vector<int32_t>{1, 10, 11})) << "one that fits is left alone";
  TruncateInput(&t, 0, true);
  EXPECT_EQ(t, (std::vector<int32_t>{1})) << "at least one token";
}

}  // namespace
}  // namespace spillway::worker
