// Who gives room on an accelerator (admission/eviction.h).
#include "admission/eviction.h"

#include <gtest/gtest.h>

namespace spillway::admission {
namespace {

constexpr uint64_t kMiB = 1 << 20;

Resident R(const std::string& name, int priority, uint64_t mib, int running = 0, double reload_s = 1, double rate = 0,
           bool pinned = false) {
  Resident r;
  r.key = name + ".0";
  r.service = name;
  r.priority = priority;
  r.bytes = mib * kMiB;
  r.running = running;
  r.reload_s = reload_s;
  r.requests_per_min = rate;
  r.pinned = pinned;
  return r;
}

TEST(EvictionTest, FitsWithoutUnloadingAnything) {
  const auto p = PlanEviction(100 * kMiB, 100 * kMiB, 0, "x.0", {R("a", 1, 500)});
  EXPECT_TRUE(p.fits);
  EXPECT_TRUE(p.evict.empty());
}

TEST(EvictionTest, NeverPinnedNeverHigherPriorityNeverItself) {
  const std::vector<Resident> rs = {R("chat", 0, 800, 0, 1, 0, /*pinned=*/true), R("interactive", 0, 800),
                                    R("me", 1, 800)};
  const auto p = PlanEviction(500 * kMiB, 100 * kMiB, /*batch*/ 1, "me.0", rs);
  EXPECT_FALSE(p.fits) << "only the pinned, the higher and itself could give room";
  EXPECT_TRUE(p.evict.empty()) << "nothing is unloaded when unloading cannot help";
  EXPECT_NE(p.reason.find("would free only 0 MiB"), std::string::npos) << p.reason;
}

TEST(EvictionTest, PrefersIdleThenLowerPriorityThenLowestCost) {
  const std::vector<Resident> rs = {
      R("batch-busy", 1, 400, /*running=*/2),
      R("batch-costly", 1, 400, 0, /*reload_s=*/20, /*rate=*/6),   // cost 120
      R("batch-cheap", 1, 400, 0, /*reload_s=*/2, /*rate=*/1),     // cost 2
      R("background", 2, 400, 0, /*reload_s=*/50, /*rate=*/10),   // lowest priority first, whatever its cost
      R("interactive-idle", 0, 400, 0, 0.1, 0),
  };
  auto p = PlanEviction(500 * kMiB, 100 * kMiB, 0, "chat.0", rs);
  ASSERT_TRUE(p.fits) << p.reason;
  EXPECT_EQ(p.evict, (std::vector<std::string>{"background.0"}));
  p = PlanEviction(900 * kMiB, 100 * kMiB, 0, "chat.0", rs);
  EXPECT_EQ(p.evict, (std::vector<std::string>{"background.0", "batch-cheap.0"}));
  p = PlanEviction(1300 * kMiB, 100 * kMiB, 0, "chat.0", rs);
  EXPECT_EQ(p.evict, (std::vector<std::string>{"background.0", "batch-cheap.0", "batch-costly.0"}));
  // An interactive request may evict an idle interactive service of equal rank, after the lower ranks.
  p = PlanEviction(1700 * kMiB, 100 * kMiB, 0, "chat.0", rs);
  EXPECT_EQ(p.evict, (std::vector<std::string>{"background.0", "batch-cheap.0", "batch-costly.0", "interactive-idle.0"}));
  EXPECT_TRUE(p.drain.empty());
  // Busy work last, and drained (interactive over batch only).
  p = PlanEviction(2100 * kMiB, 100 * kMiB, 0, "chat.0", rs);
  ASSERT_TRUE(p.fits) << p.reason;
  EXPECT_EQ(p.evict.back(), "batch-busy.0");
  EXPECT_EQ(p.drain, (std::vector<std::string>{"batch-busy.0"}));
  // A batch requester cannot take a busy batch service's room.
  p = PlanEviction(900 * kMiB, 100 * kMiB, 1, "other.0", {R("batch-busy", 1, 2000, 3)});
  EXPECT_FALSE(p.fits);
}

// On a shared (not exclusive) device too, a service still loading, or just
// loaded with requests waiting for it, is busy: a peer of its class does not
// take its room (two that do not fit together undid each other's loads for
// good, neither serving a request); a higher priority still may.
TEST(EvictionTest, ALoadingServiceIsBusyForItsPeers) {
  Resident loading = R("a", 0, 600);
  loading.starting = true;
  loading.state_ms = 5000;
  loading.waiting = 1;
  auto p = PlanEviction(500 * kMiB, 100 * kMiB, 0, "b.0", {loading});
  EXPECT_FALSE(p.fits) << p.reason;
  EXPECT_TRUE(p.evict.empty());
  Resident just_loaded = R("a", 1, 600);
  just_loaded.state_ms = 500;
  just_loaded.waiting = 2;
  EXPECT_FALSE(PlanEviction(500 * kMiB, 100 * kMiB, 1, "b.0", {just_loaded}).fits);
  // For a higher priority: taken (drained).
  p = PlanEviction(500 * kMiB, 100 * kMiB, 0, "chat.0", {just_loaded});
  ASSERT_TRUE(p.fits) << p.reason;
  EXPECT_EQ(p.evict, (std::vector<std::string>{"a.0"}));
  // A load that has hung past its bound, or a backlog that never reached it, holds nothing for ever.
  loading.state_ms = kExclusiveStartWaitMs + 1;
  EXPECT_TRUE(PlanEviction(500 * kMiB, 100 * kMiB, 0, "b.0", {loading}).fits);
}

TEST(EvictionTest, DeclaredCostOverridesTheMeasuredOne) {
  auto cheap = R("declared", 1, 400, 0, /*reload_s=*/100, 10);
  cheap.evict_cost = 0.5;
  const auto p = PlanEviction(500 * kMiB, 200 * kMiB, 0, "chat.0", {R("measured", 1, 400, 0, 1, 1), cheap});
  EXPECT_EQ(p.evict, (std::vector<std::string>{"declared.0"}));
}

TEST(EvictionTest, AnExclusiveDeviceUnloadsEveryOtherServiceEvenWhenTheRoomSuffices) {
  // llama-swap's swap group: one at a time, whatever the priorities; busy ones drain first.
  const std::vector<Resident> rs = {R("chat", 0, 100, 0, 1, 0, /*pinned=*/true), R("interactive", 0, 100, /*running=*/2),
                                    R("batch", 1, 50), R("me", 2, 10)};
  const auto p = PlanEviction(10 * kMiB, 900 * kMiB, /*background*/ 2, "me.0", rs, /*exclusive=*/true);
  EXPECT_TRUE(p.fits);
  EXPECT_EQ(p.evict, (std::vector<std::string>{"interactive.0", "batch.0"})) << "never the pinned one, nor itself";
  EXPECT_EQ(p.drain, (std::vector<std::string>{"interactive.0"}));
  EXPECT_EQ(p.freed, 150 * kMiB);
  EXPECT_NE(p.reason.find("exclusive"), std::string::npos) << p.reason;
  // Alone on it, or beside its own other placement: nothing to unload.
  Resident mine = R("me", 0, 10);
  mine.key = "me.1";
  EXPECT_TRUE(PlanEviction(10 * kMiB, 900 * kMiB, 0, "me.0", {R("me", 0, 10), mine}, true).evict.empty());
  // Two never load at once, and neither undoes the other's load: one still starting, or just loaded with
  // requests waiting for it and none running yet, serves them first; the load waits (and is asked again soon).
  Resident starting = R("starting", 1, 0);
  starting.starting = true;
  starting.waiting = 1;
  auto wait = PlanEviction(10 * kMiB, 900 * kMiB, 0, "me.0", {R("batch", 1, 50), starting}, true);
  EXPECT_TRUE(wait.wait);
  EXPECT_FALSE(wait.fits);
  EXPECT_TRUE(wait.evict.empty());
  EXPECT_NE(wait.reason.find("starting is still loading"), std::string::npos) << wait.reason;
  Resident loaded = R("loaded", 1, 40);
  loaded.waiting = 3;
  wait = PlanEviction(10 * kMiB, 900 * kMiB, 0, "me.0", {loaded}, true);
  EXPECT_TRUE(wait.wait);
  EXPECT_NE(wait.reason.find("loaded has just loaded and serves its 3 waiting"), std::string::npos) << wait.reason;
  // Once its requests run it is an ordinary busy service: drained, then unloaded.
  loaded.running = 1;
  const auto go = PlanEviction(10 * kMiB, 900 * kMiB, 0, "me.0", {loaded}, true);
  EXPECT_FALSE(go.wait);
  EXPECT_EQ(go.drain, (std::vector<std::string>{"loaded.0"}));
  // Both waits are bounded: a load that hangs, or a backlog that never reaches the service, does not hold the
  // device for ever; one already being unloaded blocks nobody.
  starting.state_ms = kExclusiveStartWaitMs;
  EXPECT_FALSE(PlanEviction(10 * kMiB, 900 * kMiB, 0, "me.0", {starting}, true).wait);
  loaded.running = 0;
  loaded.state_ms = kExclusiveServeFirstMs;
  EXPECT_FALSE(PlanEviction(10 * kMiB, 900 * kMiB, 0, "me.0", {loaded}, true).wait);
  loaded.state_ms = 0;
  loaded.evicting = true;
  EXPECT_FALSE(PlanEviction(10 * kMiB, 900 * kMiB, 0, "me.0", {loaded}, true).wait);
  // Pinned services never block: they are never unloaded anyway.
  Resident pinned = R("pinned", 0, 10, 0, 1, 0, true);
  pinned.starting = true;
  EXPECT_FALSE(PlanEviction(10 * kMiB, 900 * kMiB, 0, "me.0", {pinned}, true).wait);
  // Even with every other one gone it would not fit: nothing is unloaded.
  const auto no = PlanEviction(2000 * kMiB, 100 * kMiB, 0, "me.0", rs, true);
  EXPECT_FALSE(no.fits);
  EXPECT_TRUE(no.evict.empty());
}

// A load no request waits for, of a service used `rate` times a minute.
Demand NotAwaited(double rate, bool recently_used) {
  Demand d;
  d.awaited = false;
  d.requests_per_min = rate;
  d.recently_used = recently_used;
  return d;
}

// An on-demand load asked again after its requests went to the CPU path is
// for nobody: it unloads a lower class, and an idle peer of its own class
// only when that one is used less (a peer that just served would load again
// for its own next request; an idle model kept a used one on the CPU for
// good); a waiting request's load still may take any idle peer.
TEST(EvictionTest, ALoadNobodyWaitsForUnloadsALowerClassOrAPeerUsedLess) {
  const std::vector<Resident> rs = {R("interactive-idle", 0, 400, 0, 1, /*rate=*/2), R("batch-idle", 1, 200)};
  const Demand nobody = NotAwaited(2, /*recently_used=*/true);  // used as much as the peer
  auto p = PlanEviction(500 * kMiB, 100 * kMiB, 0, "chat.0", rs, false, nobody);
  EXPECT_FALSE(p.fits) << "only the batch service (200 MiB) may give room: not enough";
  EXPECT_TRUE(p.evict.empty());
  EXPECT_NE(p.reason.find("no request waits for this load"), std::string::npos) << p.reason;
  p = PlanEviction(300 * kMiB, 100 * kMiB, 0, "chat.0", rs, false, nobody);
  ASSERT_TRUE(p.fits) << p.reason;
  EXPECT_EQ(p.evict, (std::vector<std::string>{"batch-idle.0"}));
  // Used more than the peer, and in use now: the idle peer gives its room.
  p = PlanEviction(500 * kMiB, 100 * kMiB, 0, "chat.0", rs, false, NotAwaited(3, /*recently_used=*/true));
  ASSERT_TRUE(p.fits) << p.reason;
  EXPECT_EQ(p.evict, (std::vector<std::string>{"batch-idle.0", "interactive-idle.0"}));
  // Its last request minutes ago (its rate only looks higher as the peer's old requests age out): the peer stays.
  EXPECT_FALSE(PlanEviction(500 * kMiB, 100 * kMiB, 0, "chat.0", rs, false, NotAwaited(3, false)).fits);
  // A peer already being unloaded blocks nobody on an exclusive device.
  Resident going = R("interactive-idle", 0, 400, 0, 1, 2);
  going.evicting = true;
  EXPECT_TRUE(PlanEviction(10 * kMiB, 900 * kMiB, 0, "me.0", {going}, true, nobody).fits);
  // A request waits: as before.
  p = PlanEviction(500 * kMiB, 100 * kMiB, 0, "chat.0", rs, false, Demand{});
  ASSERT_TRUE(p.fits) << p.reason;
  EXPECT_EQ(p.evict, (std::vector<std::string>{"batch-idle.0", "interactive-idle.0"}));
  // Room enough without unloading anyone: it loads either way.
  EXPECT_TRUE(PlanEviction(50 * kMiB, 100 * kMiB, 0, "chat.0", rs, false, nobody).fits);
  // An exclusive device: a peer of its class used as much stays; a lower one alone is unloaded.
  p = PlanEviction(10 * kMiB, 900 * kMiB, 0, "me.0", rs, /*exclusive=*/true, nobody);
  EXPECT_FALSE(p.fits);
  EXPECT_TRUE(p.evict.empty());
  EXPECT_NE(p.reason.find("interactive-idle is loaded there, used as much"), std::string::npos) << p.reason;
  p = PlanEviction(10 * kMiB, 900 * kMiB, 0, "me.0", {R("batch-idle", 1, 200)}, true, nobody);
  ASSERT_TRUE(p.fits) << p.reason;
  EXPECT_EQ(p.evict, (std::vector<std::string>{"batch-idle.0"}));
}

// Two services of one priority that do not fit together take turns: a busy
// one that has served a turn (kFairTurnMs since it was ready) is drained for
// a peer whose requests have waited a turn. Without it, a service kept busy
// kept its peer's requests waiting until they timed out, for as long as its
// own traffic lasted.
TEST(EvictionTest, ABusyPeerOfOnePriorityGivesWayAfterItsTurn) {
  Resident busy = R("a", 0, 600, /*running=*/2);
  busy.state_ms = kFairTurnMs;  // ready, and served a whole turn
  Demand waited;
  waited.waited_ms = kFairTurnMs;
  auto p = PlanEviction(500 * kMiB, 100 * kMiB, 0, "b.0", {busy}, false, waited);
  ASSERT_TRUE(p.fits) << p.reason;
  EXPECT_EQ(p.evict, (std::vector<std::string>{"a.0"}));
  EXPECT_EQ(p.drain, (std::vector<std::string>{"a.0"})) << "its running requests end first";

  // Not before the waiting requests have waited a turn; the refusal says when.
  waited.waited_ms = kFairTurnMs - 1;
  p = PlanEviction(500 * kMiB, 100 * kMiB, 0, "b.0", {busy}, false, waited);
  EXPECT_FALSE(p.fits);
  EXPECT_TRUE(p.evict.empty());
  EXPECT_NE(p.reason.find("busy with its priority: a, which gives way once it has served 30 s"), std::string::npos)
      << p.reason;
  // Not before the busy one has served a turn since it loaded.
  waited.waited_ms = 10 * kFairTurnMs;
  busy.state_ms = kFairTurnMs - 1;
  EXPECT_FALSE(PlanEviction(500 * kMiB, 100 * kMiB, 0, "b.0", {busy}, false, waited).fits);
  // Nor while it is still loading, however long.
  Resident loading = busy;
  loading.starting = true;
  loading.state_ms = 2 * kFairTurnMs;
  EXPECT_FALSE(PlanEviction(500 * kMiB, 100 * kMiB, 0, "b.0", {loading}, false, waited).fits);
  busy.state_ms = kFairTurnMs;
  // Never for a lower priority, nor for a load no request waits for.
  EXPECT_FALSE(PlanEviction(500 * kMiB, 100 * kMiB, /*batch*/ 1, "b.0", {busy}, false, waited).fits);
  Demand nobody = waited;
  nobody.awaited = false;
  EXPECT_FALSE(PlanEviction(500 * kMiB, 100 * kMiB, 0, "b.0", {busy}, false, nobody).fits);
  // A load nobody waits for gets no turn, however much more its service is used.
  nobody.recently_used = true;
  nobody.requests_per_min = 100;
  EXPECT_FALSE(PlanEviction(500 * kMiB, 100 * kMiB, 0, "b.0", {busy}, false, nobody).fits);
  // A service takes no turn from itself: its own busy placement there stays.
  Resident own = busy;
  own.key = "b.1";
  own.service = "b";
  EXPECT_FALSE(PlanEviction(500 * kMiB, 100 * kMiB, 0, "b.0", {own}, false, waited).fits);
  // Idle peers still go first: a busy one is drained only when they are not enough.
  p = PlanEviction(500 * kMiB, 100 * kMiB, 0, "b.0", {busy, R("idle", 0, 500)}, false, waited);
  ASSERT_TRUE(p.fits) << p.reason;
  EXPECT_EQ(p.evict, (std::vector<std::string>{"idle.0"}));
  // A higher priority still takes a busy batch service at once, turn or not.
  Resident batch = R("batch", 1, 600, 1);
  p = PlanEviction(500 * kMiB, 100 * kMiB, 0, "b.0", {batch}, false, Demand{});
  ASSERT_TRUE(p.fits) << p.reason;
  EXPECT_EQ(p.drain, (std::vector<std::string>{"batch.0"}));
}

// A service's own turn (fair_turn_s): a model that takes long to load wants
// longer turns, or each swap costs more than the turn serves; 0 keeps it
// until its requests stop (only a higher priority takes it).
TEST(EvictionTest, ATurnIsTheBusyServicesOwn) {
  Resident busy = R("a", 0, 600, /*running=*/2);
  busy.turn_ms = 2 * kFairTurnMs;
  busy.state_ms = kFairTurnMs;
  Demand waited;
  waited.waited_ms = kFairTurnMs;
  auto p = PlanEviction(500 * kMiB, 100 * kMiB, 0, "b.0", {busy}, false, waited);
  EXPECT_FALSE(p.fits) << "drained after the default turn, not its own";
  EXPECT_NE(p.reason.find("which gives way once it has served 60 s"), std::string::npos) << p.reason;
  busy.state_ms = 2 * kFairTurnMs;
  EXPECT_FALSE(PlanEviction(500 * kMiB, 100 * kMiB, 0, "b.0", {busy}, false, waited).fits)
      << "the waiting requests have not waited its turn";
  waited.waited_ms = 2 * kFairTurnMs;
  EXPECT_TRUE(PlanEviction(500 * kMiB, 100 * kMiB, 0, "b.0", {busy}, false, waited).fits);

  busy.turn_ms = 0;
  waited.waited_ms = busy.state_ms = 100 * kFairTurnMs;
  p = PlanEviction(500 * kMiB, 100 * kMiB, 0, "b.0", {busy}, false, waited);
  EXPECT_FALSE(p.fits) << "fair_turn_s = 0 gave a turn";
  EXPECT_NE(p.reason.find("which gives way only to a higher priority (fair_turn_s = 0)"), std::string::npos) << p.reason;
  Resident batch = busy;
  batch.priority = 1;
  EXPECT_TRUE(PlanEviction(500 * kMiB, 100 * kMiB, 0, "b.0", {batch}, false, Demand{}).fits);
  // Two busy peers, each said with its own turn (the longest was said of both).
  Resident other = R("c", 0, 600, 1);
  other.turn_ms = 2 * kFairTurnMs;
  waited.waited_ms = 0;
  p = PlanEviction(500 * kMiB, 100 * kMiB, 0, "b.0", {busy, other}, false, waited);
  EXPECT_NE(p.reason.find("busy with its priority: a, which gives way only to a higher priority (fair_turn_s = 0); "
                          "c, which gives way once it has served 60 s and this load's requests have waited as long "
                          "(0 s so far)"),
            std::string::npos)
      << p.reason;
}

TEST(EvictionTest, Windows) {
  EXPECT_TRUE(InWindow({}, 720));
  EXPECT_TRUE(InWindow({"02:00-05:00"}, 2 * 60));
  EXPECT_TRUE(InWindow({"02:00-05:00"}, 5 * 60 - 1));
  EXPECT_FALSE(InWindow({"02:00-05:00"}, 5 * 60));
  EXPECT_FALSE(InWindow({"02:00-05:00"}, 1 * 60 + 59));
  EXPECT_TRUE(InWindow({"23:00-01:30"}, 23 * 60 + 30)) << "crosses midnight";
  EXPECT_TRUE(InWindow({"23:00-01:30"}, 60));
  EXPECT_FALSE(InWindow({"23:00-01:30"}, 2 * 60));
  EXPECT_TRUE(InWindow({"09:00-10:00", "13:00-14:00"}, 13 * 60 + 5));
}

}  // namespace
}  // namespace spillway::admission
