#include "common/names.h"

#include <gtest/gtest.h>

namespace spillway {
namespace {

TEST(NamesTest, DeviceNames) {
  EXPECT_EQ(ParseDeviceName("cpu")->index, -1);
  auto d = ParseDeviceName("cuda:12");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->kind, "cuda");
  EXPECT_EQ(d->index, 12);
  EXPECT_EQ(ParseDeviceName("sim:0")->kind, "sim");
  for (const char* bad : {"", "cuda", "cuda:", ":1", "sim:x", "sim:-1", "sim:+1", "sim:1234567", "cpu:0x", "sim:00", "cuda:01"}) {
    EXPECT_FALSE(ParseDeviceName(bad)) << bad;
  }
}

}  // namespace
}  // namespace spillway
