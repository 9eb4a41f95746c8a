#include "worker/faults.h"

#include <gtest/gtest.h>

namespace spillway::worker {
namespace {

TEST(FaultSpecTest, ParsesEveryFault) {
  auto f = ParseFault("fail-next=kv");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->kind, FaultSpec::kFailNext);
  EXPECT_EQ(f->arg, SPILLWAY_SIM_PHASE_KV);
  f = ParseFault("fail-next=reserve");
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(f->via_reserve);
  EXPECT_EQ(f->arg, SPILLWAY_SIM_PHASE_COMPUTE);
  EXPECT_EQ(ParseFault("fail-after-bytes=1048576")->arg, 1048576);
  EXPECT_EQ(ParseFault("hang=1.5")->arg, 1500);
  EXPECT_EQ(ParseFault("lose-at-token=7")->arg, 7);
  EXPECT_EQ(ParseFault("compute-error")->kind, FaultSpec::kComputeError);
  EXPECT_EQ(ParseFault("kv-full")->kind, FaultSpec::kKvFull);
  EXPECT_EQ(ParseFault("compute-abort")->kind, FaultSpec::kComputeAbort);
  EXPECT_EQ(ParseFault("lose-device")->kind, FaultSpec::kLoseDevice);
  EXPECT_EQ(ParseFault("clear")->kind, FaultSpec::kClear);
}

TEST(FaultSpecTest, RejectsBadSpecs) {
  for (const char* bad : {"", "fail-next", "fail-next=disk", "fail-after-bytes=-1", "fail-after-bytes=x", "hang=-2",
                          "hang=1e9", "lose-at-token=0", "compute-error=1", "kv-full=1", "explode", "lose-device=now"}) {
    EXPECT_FALSE(ParseFault(bad).ok()) << bad;
  }
}

TEST(FaultInjectorTest, WithoutASimDeviceFaultsAreRefused) {
  FaultInjector f(nullptr);
  Status st = f.Arm("compute-error");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("sim device"), std::string::npos);
  EXPECT_FALSE(f.ArmAll("clear;explode").ok());
  EXPECT_FALSE(f.ToJson()["sim"].get<bool>());
}

}  // namespace
}  // namespace spillway::worker
