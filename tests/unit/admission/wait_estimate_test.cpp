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
