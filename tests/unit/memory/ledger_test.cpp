#include "memory/ledger.h"

#include <gtest/gtest.h>

#include <random>
#include <set>

namespace spillway::memory {
namespace {

constexpr uint64_t kMiB = 1 << 20;

TEST(LedgerTest, HeadroomAbsoluteOrPercent) {
  EXPECT_EQ((Headroom{100, 0}).For(1000), 100u);
  EXPECT_EQ((Headroom{100, 20}).For(1000), 200u);
  EXPECT_EQ((Headroom{5000, 0}).For(1000), 1000u);
}

TEST(LedgerTest, PredictedReservationsNeverExceedCapacityMinusHeadroom) {
  DeviceLedger l("sim:0", 1000 * kMiB, {100 * kMiB, 0});
  EXPECT_TRUE(l.Reserve("a", 600 * kMiB, 0).ok());
  EXPECT_EQ(l.Available(), 300 * kMiB);
  Status st = l.Reserve("b", 301 * kMiB, 0);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("needs 301 MiB, 300 MiB available"), std::string::npos) << st.message();
  EXPECT_TRUE(l.Reserve("b", 300 * kMiB, 0).ok());
  l.Release("a");
  EXPECT_EQ(l.reserved(), 300 * kMiB);
  // Re-reserving a key replaces it; a refused replacement keeps the old one.
  EXPECT_TRUE(l.Reserve("b", 500 * kMiB, 0).ok());
  EXPECT_FALSE(l.Reserve("b", 950 * kMiB, 0).ok());
  EXPECT_EQ(l.reserved(), 500 * kMiB);
}

TEST(LedgerTest, ObservedFreeLowerThanPredictedWins) {
  DeviceLedger l("cuda:0", 1000 * kMiB, {50 * kMiB, 0});
  l.Observe(400 * kMiB, 1);  // another process holds 600 MiB Spillway never reserved
  EXPECT_EQ(l.Available(), 350 * kMiB);
  EXPECT_FALSE(l.Reserve("a", 400 * kMiB, 1).ok());
  EXPECT_TRUE(l.Reserve("a", 300 * kMiB, 1).ok());
  // Until a reading shows the allocation, it counts as in flight against observed free.
  EXPECT_EQ(l.in_flight(), 300 * kMiB);
  EXPECT_EQ(l.Available(), 50 * kMiB);
  l.Observe(100 * kMiB, 2);  // the worker has allocated: observed free dropped by 300
  EXPECT_EQ(l.in_flight(), 0u);
  EXPECT_EQ(l.Available(), 50 * kMiB);
  // The other process frees its memory: prediction now bounds.
  l.Observe(700 * kMiB, 3);
  EXPECT_EQ(l.Available(), 650 * kMiB);
}

TEST(CellPoolTest, ReserveRelease) {
  CellPool p(100);
  EXPECT_TRUE(p.Reserve("a", 60));
  EXPECT_TRUE(p.Reserve("a", 60));  // idempotent
  EXPECT_FALSE(p.Reserve("b", 41));
  EXPECT_TRUE(p.Reserve("b", 40));
  EXPECT_EQ(p.free(), 0u);
  p.Release("a");
  p.Release("a");
  EXPECT_EQ(p.free(), 60u);
}

// Property: across 10 000 random request lifecycles (admitted, then completed,
// failed or cancelled, in any interleaving) no cell and no byte leaks, and the
// reservations never exceed the pool or the device.
TEST(CellPoolTest, NoLeaksAfterTenThousandRandomLifecycles) {
  std::mt19937_64 rng(7);
  CellPool pool(4096);
  DeviceLedger dev("sim:0", 8192 * kMiB, {512 * kMiB, 5});
  std::set<std::string> live;
  uint64_t seq = 0;
  int admitted = 0;
  for (int i = 0; i < 10000; ++i) {
    const std::string id = "r" + std::to_string(i);
    const uint32_t cells = 1 + static_cast<uint32_t>(rng() % 1500);
    if (pool.Reserve(id, cells)) {
      (void)dev.Reserve(id, cells * kMiB / 4, seq);  // may be refused: the device is the tighter bound
      live.insert(id);
      ++admitted;
    }
    if (rng() % 3 == 0) dev.Observe(dev.capacity() - dev.reserved(), ++seq);
    // End some live requests: completion, failure and cancellation all release.
    while (!live.empty() && rng() % 2 == 0) {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      pool.Release(*it);
      dev.Release(*it);
      if (rng() % 5 == 0) pool.Release(*it);  // a late duplicate release (cancel after failure) is harmless
      live.erase(it);
    }
    ASSERT_LE(pool.reserved(), pool.total());
    ASSERT_LE(dev.reserved(), dev.capacity() - dev.headroom());
    ASSERT_EQ(pool.active(), live.size());
  }
  for (const auto& id : live) {
    pool.Release(id);
    dev.Release(id);
  }
  EXPECT_GT(admitted, 5000);
  EXPECT_EQ(pool.reserved(), 0u);
  EXPECT_EQ(pool.active(), 0u);
  EXPECT_EQ(dev.reserved(), 0u);
}

}  // namespace
}  // namespace spillway::memory

namespace spillway::memory {
namespace {

TEST(CellPoolTest, PerSlotStreamsGiveEachRequestAWholeSlot) {
  CellPool pool(4096, 4);  // 1024 cells per slot
  EXPECT_EQ(pool.request_capacity(), 1024u);
  EXPECT_FALSE(pool.Reserve("too-long", 1025));  // never fits one slot, however empty the pool
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(pool.Reserve("r" + std::to_string(i), 10));
  EXPECT_EQ(pool.reserved(), 4096u);  // each took its slot's whole stream
  EXPECT_EQ(pool.free_for_request(), 0u);
  EXPECT_FALSE(pool.Reserve("r4", 10));
  pool.Release("r2");
  EXPECT_EQ(pool.free_for_request(), 1024u);
  EXPECT_TRUE(pool.Reserve("r4", 1024));
}

TEST(CellPoolTest, UnifiedPoolReservesWhatEachRequestNeeds) {
  CellPool pool(4096);
  EXPECT_EQ(pool.request_capacity(), 4096u);
  EXPECT_TRUE(pool.Reserve("a", 3000));
  EXPECT_EQ(pool.free_for_request(), 1096u);
  EXPECT_FALSE(pool.Reserve("b", 1100));
  EXPECT_TRUE(pool.Reserve("b", 1096));
}

}  // namespace
}  // namespace spillway::memory
