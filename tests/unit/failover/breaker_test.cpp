#include "failover/breaker.h"

#include <gtest/gtest.h>

namespace spillway::failover {
namespace {

TEST(BreakerTest, OpensAfterConsecutiveFailuresAndProbesAfterEjection) {
  FakeClock clock;
  Breaker b({3, 30000, 300000}, clock);
  EXPECT_TRUE(b.Usable());
  b.OnFailure("alloc");
  b.OnSuccess();  // not consecutive
  b.OnFailure("alloc");
  b.OnFailure("alloc");
  EXPECT_TRUE(b.Usable());
  b.OnFailure("alloc");
  EXPECT_EQ(b.state(), BreakerState::kOpen);
  EXPECT_FALSE(b.Usable());
  clock.Advance(29999);
  EXPECT_FALSE(b.Usable());
  clock.Advance(1);
  EXPECT_EQ(b.state(), BreakerState::kHalfOpen) << "shown as a request would find it, before one asks";
  EXPECT_TRUE(b.Usable());
  EXPECT_EQ(b.state(), BreakerState::kHalfOpen);
  b.OnSuccess();
  EXPECT_EQ(b.state(), BreakerState::kClosed);
}

TEST(BreakerTest, EjectionGrowsWithRepeatedTripsAndIsCapped) {
  FakeClock clock;
  Breaker b({3, 30000, 100000}, clock);
  b.Trip("device lost");
  EXPECT_EQ(b.open_until_ms() - clock.NowMs(), 30000);
  clock.Advance(30000);
  ASSERT_TRUE(b.Usable());
  b.OnFailure("probe failed");  // a failed half-open probe opens again, for longer
  EXPECT_EQ(b.state(), BreakerState::kOpen);
  EXPECT_EQ(b.open_until_ms() - clock.NowMs(), 60000);
  clock.Advance(60000);
  ASSERT_TRUE(b.Usable());
  b.Trip("again");
  EXPECT_EQ(b.open_until_ms() - clock.NowMs(), 90000);
  clock.Advance(90000);
  b.Usable();
  b.Trip("again");
  EXPECT_EQ(b.open_until_ms() - clock.NowMs(), 100000);  // capped
  EXPECT_EQ(b.ejections(), 4);
  EXPECT_EQ(b.last_reason(), "again");
}

// As in Envoy, the ejection count comes down while the breaker stays
// closed: one ejection forgiven per base ejection time closed. It only grew:
// a placement that crashed a few times in its life was ejected for the
// maximum at its next crash (and a lone placement's requests waited it out).
TEST(BreakerTest, EjectionsAreForgivenWhileItStaysClosed) {
  FakeClock clock;
  Breaker b({3, 30000, 300000}, clock);
  for (int i = 0; i < 3; ++i) {  // three crashes in a row, each probe closing it again at once
    b.Trip("crash");
    clock.Advance(b.open_until_ms() - clock.NowMs());
    ASSERT_TRUE(b.Usable());
    b.OnSuccess();
  }
  EXPECT_EQ(b.ejections(), 3);
  clock.Advance(60000);  // closed for two base ejection times: two forgiven
  b.Trip("crash");
  EXPECT_EQ(b.ejections(), 2);
  EXPECT_EQ(b.open_until_ms() - clock.NowMs(), 60000);
  clock.Advance(60000);
  ASSERT_TRUE(b.Usable());
  b.OnSuccess();
  clock.Advance(3600000);  // an hour of health: as new
  b.Trip("crash");
  EXPECT_EQ(b.open_until_ms() - clock.NowMs(), 30000);
}

// A crashed worker's replacement passed its readiness check: the next
// request probes it instead of waiting out the ejection (30 s, while the
// only placement's new worker was ready after one); a failed probe opens it
// again, for longer, and then (a crash loop) it waits that out whatever
// restarts.
TEST(BreakerTest, AReadyReplacementIsProbedBeforeTheEjectionEnds) {
  FakeClock clock;
  Breaker b({3, 30000, 300000}, clock);
  b.Uneject();
  EXPECT_EQ(b.state(), BreakerState::kClosed) << "nothing to uneject";
  b.Trip("worker exited: signal 9");
  clock.Advance(700);
  EXPECT_FALSE(b.Usable());
  b.Uneject();
  EXPECT_EQ(b.state(), BreakerState::kHalfOpen);
  EXPECT_TRUE(b.Usable());
  b.OnFailure("worker exited: signal 9");  // the probe crashed it again
  EXPECT_EQ(b.state(), BreakerState::kOpen);
  EXPECT_EQ(b.ejections(), 2);
  EXPECT_EQ(b.open_until_ms(), clock.NowMs() + 60000);
  b.Uneject();  // restarted again: a crash loop keeps its growing ejection
  EXPECT_FALSE(b.Usable());
  clock.Advance(60000);
  EXPECT_TRUE(b.Usable());
  b.OnSuccess();
  EXPECT_EQ(b.state(), BreakerState::kClosed);
  // Ejections forgiven while it stays closed: a crash a day later is a first again.
  clock.Advance(int64_t{24} * 3600 * 1000);
  b.Trip("worker exited: signal 9");
  EXPECT_EQ(b.ejections(), 1);
  b.Uneject();
  EXPECT_TRUE(b.Usable());
}

// Half-open lets one request probe at a time: the others find it not usable
// until the probe's result, or its end without one. All of them went to a
// device that still failed, each to fail there (Envoy's un-ejection). A
// probe without a result holds it for probe_hold_ms (5 s) at most.
TEST(BreakerTest, AHalfOpenBreakerLetsOneProbeThroughAtATime) {
  FakeClock clock;
  Breaker b({3, 30000, 300000}, clock);
  b.BeginProbe("a");
  EXPECT_TRUE(b.probe().empty()) << "a closed breaker has no probe";
  b.Trip("out of memory");
  clock.Advance(30000);
  ASSERT_TRUE(b.Usable());
  b.BeginProbe("a");
  EXPECT_EQ(b.state(), BreakerState::kHalfOpen);
  EXPECT_FALSE(b.Usable()) << "a second request while the probe is out";
  b.BeginProbe("b");
  EXPECT_TRUE(b.Probing("a"));
  b.EndProbe("b");
  EXPECT_FALSE(b.Usable()) << "only the probe's own end frees it";
  b.EndProbe("a");  // cancelled: no result
  ASSERT_TRUE(b.Usable()) << "the next request probes";
  b.BeginProbe("b");
  b.OnFailure("out of memory");
  EXPECT_EQ(b.state(), BreakerState::kOpen);
  EXPECT_TRUE(b.probe().empty());
  clock.Advance(60000);
  ASSERT_TRUE(b.Usable());
  b.BeginProbe("c");
  clock.Advance(4999);
  EXPECT_FALSE(b.Usable());
  clock.Advance(1);  // a long answer without a result yet: the next request probes too
  ASSERT_TRUE(b.Usable());
  b.BeginProbe("d");
  EXPECT_TRUE(b.Probing("d"));
  EXPECT_TRUE(b.Probing("c")) << "still a probe: its first event or result counts";
  EXPECT_EQ(b.probe(), "d");
  b.EndProbe("c");
  EXPECT_FALSE(b.Usable()) << "the earlier probe's end frees nothing";
  b.OnSuccess();  // (either one's result counts)
  EXPECT_EQ(b.state(), BreakerState::kClosed);
  EXPECT_TRUE(b.Usable());
  b.BeginProbe("e");
  EXPECT_TRUE(b.Usable()) << "closed: every request goes";
}

TEST(BreakerTest, OneIncidentReportedTwiceIsOneEjection) {
  FakeClock clock;
  Breaker b({3, 30000, 300000}, clock);
  b.Trip("request failed: device lost");
  clock.Advance(100);
  b.Trip("worker exited: device lost");  // the same incident, seen by the supervisor
  EXPECT_EQ(b.ejections(), 1);
  EXPECT_EQ(b.open_until_ms(), clock.NowMs() - 100 + 30000);
  EXPECT_EQ(b.last_reason(), "worker exited: device lost");
}

// Requests in flight when it opened fail too: the same incident, one
// ejection (they opened it again, 60 s instead of 30).
TEST(BreakerTest, FailuresOfAttemptsInFlightWhenItOpenedAreTheSameIncident) {
  FakeClock clock;
  Breaker b({3, 30000, 300000}, clock);
  for (int i = 0; i < 6; ++i) b.OnFailure("kv alloc failed " + std::to_string(i));
  EXPECT_EQ(b.ejections(), 1);
  EXPECT_EQ(b.open_until_ms() - clock.NowMs(), 30000);
  EXPECT_EQ(b.last_reason(), "kv alloc failed 5");
  clock.Advance(30000);
  ASSERT_TRUE(b.Usable());
  b.OnSuccess();
  EXPECT_EQ(b.state(), BreakerState::kClosed);
}

}  // namespace
}  // namespace spillway::failover
