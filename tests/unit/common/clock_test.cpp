// The gateway's clock (common/clock.h): unix milliseconds moved by a monotonic clock.
#include "common/clock.h"

#include <gtest/gtest.h>

namespace spillway {
namespace {

int64_t g_wall = 0, g_mono = 0;
int64_t FakeWall() { return g_wall; }
int64_t FakeMono() { return g_mono; }

// A step of the wall clock (NTP at boot, a board without a real-time clock)
// moved every interval measured with it: forward, every start timeout fired
// at once (loading workers killed as failed starts); back, health checks
// waited until the workers' orphan timeout ended them.
TEST(SystemClockTest, IntervalsFollowTheMonotonicClockWhateverTheWallClockDoes) {
  g_wall = 1'700'000'000'000;
  g_mono = 5'000;
  const SystemClock clock(&FakeWall, &FakeMono);
  EXPECT_EQ(clock.NowMs(), 1'700'000'000'000);  // unix time, as read at the start
  g_mono += 1'500;
  EXPECT_EQ(clock.NowMs(), 1'700'000'001'500);
  g_wall += 3'600'000;  // stepped an hour forward
  g_mono += 10;
  EXPECT_EQ(clock.NowMs(), 1'700'000'001'510);
  g_wall -= 7'200'000;  // and two back
  g_mono += 10;
  EXPECT_EQ(clock.NowMs(), 1'700'000'001'520);
  // A time of day (an accelerator window) is the wall clock's, as it reads now.
  EXPECT_EQ(clock.WallMs(), g_wall);
  // The real one: unix milliseconds of today, moving forward.
  const SystemClock real;
  const int64_t a = real.NowMs();
  EXPECT_GT(a, int64_t{1'600'000'000'000});
  EXPECT_LE(a, real.NowMs());
}

}  // namespace
}  // namespace spillway
