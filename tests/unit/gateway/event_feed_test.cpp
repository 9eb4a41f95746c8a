// The event feed: what a subscriber hears, in what order, and what a slow or
// gone subscriber costs (nothing).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "common/clock.h"
#include "gateway/event_feed.h"

namespace spillway::gateway {
namespace {

using nlohmann::json;

class FakeExchange : public http::Exchange {
 public:
  void Respond(http::Response) override {}
  void StartStream(http::Response) override {}
  void Write(std::string data) override {
    std::lock_guard<std::mutex> lk(mu);
    written += data;
  }
  void End() override { ended = true; }
  void OnDisconnect(std::function<void()>) override {}
  bool disconnected() const override { return gone; }
  size_t unsent_bytes() const override { return unsent; }
  std::string Text() {
    std::lock_guard<std::mutex> lk(mu);
    return written;
  }
  size_t Count(const std::string& what) {
    const std::string t = Text();
    size_t n = 0;
    for (size_t p = t.find(what); p != std::string::npos; p = t.find(what, p + 1)) ++n;
    return n;
  }
  std::mutex mu;
  std::string written;
  std::atomic<bool> ended{false}, gone{false};
  std::atomic<size_t> unsent{0};
};

json Snapshot(const std::string& breaker, uint64_t used) {
  return {{"services", {{{"name", "chat"}, {"placements", {{{"key", "chat.0"}, {"placement", "sim:0/99"}, {"state", "ready"},
                                                            {"breaker", {{"state", breaker}, {"ejections", breaker == "open" ? 1 : 0}}}}}}}}},
          {"devices", {{{"name", "sim:0"}, {"used_bytes", used}, {"total_bytes", 1000}}}}};
}

template <typename F>
bool Eventually(F f) {
  for (int i = 0; i < 300; ++i) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

EventFeed::Subscriber Sub(std::shared_ptr<FakeExchange> ex) {
  return {ex, [](const json& s) { return s; }, [](const Incident& i) { return IncidentJson(i); }};
}

struct FeedTest : ::testing::Test {
  FakeClock clock;
  IncidentLog log;
  std::mutex mu;
  json next = Snapshot("closed", 100);
  json Sample() {
    std::lock_guard<std::mutex> lk(mu);
    return next;
  }
  void Set(json j) {
    std::lock_guard<std::mutex> lk(mu);
    next = std::move(j);
  }
  EventFeed::Options Fast() {
    EventFeed::Options o;
    o.period = std::chrono::milliseconds(20);
    o.min_gap = std::chrono::milliseconds(5);
    o.keepalive = std::chrono::milliseconds(60000);
    return o;
  }
};

TEST_F(FeedTest, ASubscriberHearsHistoryAndASnapshotAtOnceThenChangesAndIncidents) {
  EventFeed feed([this] { return Sample(); }, log, clock, Fast());
  feed.Start();
  auto ex = std::make_shared<FakeExchange>();
  feed.Subscribe(Sub(ex));
  ASSERT_TRUE(Eventually([&] { return ex->Count("event: snapshot") == 1; })) << ex->Text();
  EXPECT_EQ(ex->Text().rfind("event: history\n", 0), 0u) << "history first";
  // Nothing changes (the clock stands still): no more snapshots.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(ex->Count("event: snapshot"), 1u);
  // A breaker trips: an incident, then the changed snapshot that lists it.
  Set(Snapshot("open", 300));
  ASSERT_TRUE(Eventually([&] { return ex->Count("event: snapshot") == 2; })) << ex->Text();
  const std::string t = ex->Text();
  const size_t incident = t.find("event: incident\ndata: ");
  ASSERT_NE(incident, std::string::npos) << t;
  EXPECT_LT(incident, t.rfind("event: snapshot"));
  EXPECT_NE(t.find("\"kind\":\"breaker\"", incident), std::string::npos);
  EXPECT_EQ(log.Recent(10).size(), 1u);
  // The memory history keeps a point per sample.
  const json h = feed.MemoryHistory();
  ASSERT_TRUE(h.contains("sim:0"));
  EXPECT_EQ(h["sim:0"].back()[1], 300);
  // An incident from elsewhere (the journal) reaches the stream too.
  log.Add({0, 1, "cancelled", "chat", "", "", "req_9", "", "cancelled", ""});
  feed.Kick();
  ASSERT_TRUE(Eventually([&] { return ex->Text().find("req_9") != std::string::npos; }));
  feed.Stop();
  EXPECT_TRUE(ex->ended);
}

// Samples kicked between two periods (each request's change kicks one)
// update the history's last point: a point per period, so 600 of them are
// 10 minutes however busy the gateway (150 s on one kicked 4 times a second).
TEST_F(FeedTest, TheMemoryHistoryKeepsAPointPerPeriod) {
  auto opts = Fast();
  opts.period = std::chrono::milliseconds(1000);
  EventFeed feed([this] { return Sample(); }, log, clock, opts);
  feed.Start();
  for (int i = 1; i <= 8; ++i) {  // 2 s by the clock, a sample every 250 ms
    clock.Advance(250);
    Set(Snapshot("closed", 100 + i));
    feed.Kick();
    ASSERT_TRUE(Eventually([&] {
      const json h = feed.MemoryHistory();
      return h.contains("sim:0") && h["sim:0"].back()[1] == 100 + i;
    })) << i;
  }
  const json h = feed.MemoryHistory()["sim:0"];
  EXPECT_LE(h.size(), 3u) << h.dump();
  EXPECT_EQ(h.back()[1], 108) << "the last point holds the latest sample";
  feed.Stop();
}

TEST_F(FeedTest, AKeepaliveSnapshotComesEvenWithoutAChange) {
  auto opts = Fast();
  opts.keepalive = std::chrono::milliseconds(1000);
  EventFeed feed([this] { return Sample(); }, log, clock, opts);
  feed.Start();
  auto ex = std::make_shared<FakeExchange>();
  feed.Subscribe(Sub(ex));
  ASSERT_TRUE(Eventually([&] { return ex->Count("event: snapshot") == 1; }));
  clock.Advance(1500);
  ASSERT_TRUE(Eventually([&] { return ex->Count("event: snapshot") == 2; })) << ex->Text();
}

TEST_F(FeedTest, ASlowReaderSkipsSnapshotsAndAGoneOneIsDropped) {
  EventFeed feed([this] { return Sample(); }, log, clock, Fast());
  feed.Start();
  auto slow = std::make_shared<FakeExchange>(), gone = std::make_shared<FakeExchange>();
  feed.Subscribe(Sub(slow));
  feed.Subscribe(Sub(gone));
  ASSERT_TRUE(Eventually([&] { return slow->Count("event: snapshot") == 1 && gone->Count("event: snapshot") == 1; }));
  EXPECT_EQ(feed.subscribers(), 2u);
  slow->unsent = 10 << 20;
  gone->gone = true;
  const size_t incidents_before = slow->Count("event: incident");
  Set(Snapshot("closed", 500));
  log.Add({0, 1, "cancelled", "chat", "", "", "req_slow", "", "cancelled", ""});  // (a failed request's, as they keep coming)
  ASSERT_TRUE(Eventually([&] { return feed.subscribers() == 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(slow->Count("event: snapshot"), 1u) << "a slow reader's backlog must not grow";
  EXPECT_EQ(slow->Count("event: incident"), incidents_before) << "nor by incidents";
  slow->unsent = 0;
  Set(Snapshot("closed", 600));
  ASSERT_TRUE(Eventually([&] { return slow->Count("event: snapshot") == 2; }));
  EXPECT_EQ(gone->Count("event: snapshot"), 1u);
}

TEST_F(FeedTest, EachSubscriberSeesItsOwnView) {
  EventFeed feed([this] { return Sample(); }, log, clock, Fast());
  feed.Start();
  auto ex = std::make_shared<FakeExchange>();
  feed.Subscribe({ex, [](const json&) { return json{{"mine", true}}; }, [](const Incident&) { return json(nullptr); }});
  ASSERT_TRUE(Eventually([&] { return ex->Count("event: snapshot") == 1; }));
  EXPECT_NE(ex->Text().find("data: {\"mine\":true}"), std::string::npos);
  Set(Snapshot("open", 100));
  ASSERT_TRUE(Eventually([&] { return ex->Count("event: snapshot") == 2; }));
  EXPECT_EQ(ex->Count("event: incident"), 0u) << "a hidden incident is not written";
}

TEST_F(FeedTest, KicksInABurstCostOneSamplePerGap) {
  std::atomic<int> samples{0};
  EventFeed::Options opts;
  opts.period = std::chrono::milliseconds(10000);
  opts.min_gap = std::chrono::milliseconds(200);
  EventFeed feed([&] {
    ++samples;
    return Sample();
  }, log, clock, opts);
  feed.Start();
  ASSERT_TRUE(Eventually([&] { return samples == 1; }));
  auto kick_for = [&](int ms) {
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(ms)) {
      feed.Kick();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  // Nobody watches: kicks cost nothing (the periodic sample is enough).
  kick_for(300);
  EXPECT_EQ(samples.load(), 1);
  feed.Subscribe(Sub(std::make_shared<FakeExchange>()));
  const int before = samples.load();
  kick_for(500);
  feed.Stop();
  EXPECT_GE(samples.load() - before, 2);
  EXPECT_LE(samples.load() - before, 4) << "500 ms of kicks, one sample per 200 ms at most";
}

}  // namespace
}  // namespace spillway::gateway
