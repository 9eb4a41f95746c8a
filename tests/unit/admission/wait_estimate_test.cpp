// The wait estimate from running requests and measured throughput.
#include "admission/wait_estimate.h"

#include <gtest/gtest.h>

namespace spillway::admission {
namespace {

// 100 prompt tokens/s, 10 generated tokens/s: a request of 100 + 50 runs 6 s.
PoolNow Pool(uint64_t cells_free, uint32_t slots_free, std::vector<RunningRequest> running) {
  return {std::move(running), cells_free, slots_free, 100, 10};
}

TEST(WaitEstimateTest, FreeNowIsNoWait) {
  EXPECT_EQ(EstimateWaitS(Pool(500, 1, {}), 200), 0.0);
}

TEST(WaitEstimateTest, WaitsForTheRunningRequestsThatFreeEnoughInTheOrderTheyEnd) {
  // One ends in 6 - 1 = 5 s (150 cells), another in 6 - 4 = 2 s (150 cells); 100 free.
  const PoolNow p = Pool(100, 0, {{150, 100, 50, 1.0}, {150, 100, 50, 4.0}});
  EXPECT_DOUBLE_EQ(*EstimateWaitS(p, 200), 2.0);   // the first to end frees enough
  EXPECT_DOUBLE_EQ(*EstimateWaitS(p, 300), 5.0);   // both must end
  EXPECT_DOUBLE_EQ(*EstimateWaitS(p, 150, 150), 5.0) << "cells wanted by requests ahead come first";
  EXPECT_FALSE(EstimateWaitS(p, 500)) << "more than the pool ever holds";
}

TEST(WaitEstimateTest, ARequestPastItsExpectedEndIsExpectedAnyMoment) {
  const PoolNow p = Pool(0, 0, {{150, 100, 50, 60.0}});
  EXPECT_DOUBLE_EQ(*EstimateWaitS(p, 100), kOverdueS);
}

TEST(WaitEstimateTest, AFullSlotTableWaitsEvenWithCellsFree) {
  const PoolNow p = Pool(1000, 0, {{150, 100, 50, 3.0}});
  EXPECT_DOUBLE_EQ(*EstimateWaitS(p, 100), 3.0);
}

// A pool of per-slot cells (kv_unified = false, the default): a request
// takes a whole slot, so the first slot to free is the wait. Counted by the
// cells the running requests asked, a request of 600 in slots of 1024
// waited for three to end (80 s instead of 10), and one of 1020 "never fit"
// (told "about 1 s").
TEST(WaitEstimateTest, APerSlotPoolFreesAWholeSlotWhenARequestEnds) {
  // Four slots of 1024, each running a request of 250 cells (121 s each); they end in 10, 40, 80 and 120 s.
  PoolNow p = Pool(0, 0, {{250, 100, 1200, 111.0}, {250, 100, 1200, 81.0}, {250, 100, 1200, 41.0}, {250, 100, 1200, 1.0}});
  p.per_slot_cells = 1024;
  EXPECT_DOUBLE_EQ(*EstimateWaitS(p, 600), 10.0);
  EXPECT_DOUBLE_EQ(*EstimateWaitS(p, 1020), 10.0);
  EXPECT_DOUBLE_EQ(*EstimateWaitS(p, 600, 600, 1), 40.0) << "one ahead takes the first slot";
  EXPECT_FALSE(EstimateWaitS(p, 1025)) << "no slot holds it";
  p.cells_free = 1024;
  p.slots_free = 1;
  EXPECT_EQ(EstimateWaitS(p, 1000), 0.0);
}

TEST(WaitEstimateTest, NothingMeasuredIsNoEstimate) {
  PoolNow p = Pool(0, 0, {{150, 100, 50, 1.0}});
  p.gen_tps = 0;
  EXPECT_FALSE(EstimateWaitS(p, 100));
  p.gen_tps = 10;
  p.prompt_tps = 0;  // generation measured, prompts not yet: counted at the generation rate
  EXPECT_DOUBLE_EQ(*EstimateWaitS(p, 100), 150 / 10.0 - 1.0);
}

}  // namespace
}  // namespace spillway::admission
