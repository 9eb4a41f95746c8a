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
  for (const char* known : {"cpu", "cuda:0", "sim:3"}) EXPECT_TRUE(KnownDeviceName(known)) << known;
  // The host is "cpu" alone: "cpu:0" was taken for an accelerator.
  for (const char* unknown : {"cpu:0", "cpu:1", "rocm:0", "sim0"}) EXPECT_FALSE(KnownDeviceName(unknown)) << unknown;
}

}  // namespace
}  // namespace spillway
