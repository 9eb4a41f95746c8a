// Routing a request to an external service (gateway/external_route.h) and
// each service's line (gateway/external_lines.h): pure, no I/O.
#include <gtest/gtest.h>

#include "config/config.h"
#include "gateway/external_lines.h"
#include "gateway/external_route.h"

namespace spillway::gateway {
namespace {

using namespace std::string_literals;

// (""s: the file's bytes hold a NUL.)
const std::string kBody =
    "--b0\r\nContent-Disposition: form-data; name=\"file\"; filename=\"model\"\r\n\r\nRIFF\0model\r\n"
    "--b0\r\nContent-Disposition: form-data; name=\"modelx\"\r\n\r\nno\r\n"
    "--b0\r\ncontent-disposition: form-data; name=\"model\"\r\n\r\nwhisper\r\n"
    "--b0--\r\n"s;

TEST(ExternalRouteTest, MultipartFields) {
  EXPECT_EQ(MultipartBoundary("multipart/form-data; boundary=b0"), "b0");
  EXPECT_EQ(MultipartBoundary("Multipart/Form-Data; charset=x; boundary=\"a b\""), "a b");
  EXPECT_EQ(MultipartBoundary("multipart/form-data"), "");
  EXPECT_EQ(MultipartBoundary("application/json; boundary=x"), "");
  EXPECT_EQ(MultipartBoundary("multipart/form-data; boundary=" + std::string(71, 'x')), "") << "RFC 2046: at most 70";
  EXPECT_EQ(MultipartField(kBody, "b0", "model"), "whisper") << "the field, not the file named 'model' or 'modelx'";
  EXPECT_EQ(MultipartField(kBody, "b0", "language"), std::nullopt);
  EXPECT_EQ(MultipartField(kBody, "b0", "model", 3), std::nullopt) << "longer than allowed";
  // Truncated or malformed bodies are absent fields, never a crash.
  for (size_t n = 0; n < kBody.size(); ++n) (void)MultipartField(kBody.substr(0, n), "b0", "model");
  EXPECT_EQ(MultipartField("--b0\r\nno headers end", "b0", "model"), std::nullopt);
}

// A retried upload with a new random boundary is the same payload for its
// Idempotency-Key (python-requests and httpx draw one per request); another
// file is not.
TEST(ExternalRouteTest, APayloadsHashIgnoresItsMultipartBoundary) {
  auto form = [](const std::string& b, const std::string& audio) {
    return "--" + b + "\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper\r\n--" + b +
           "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\n" + audio + "\r\n--" + b + "--\r\n";
  };
  const std::string a = PayloadForHash("multipart/form-data; boundary=aaaa1111", form("aaaa1111", "RIFF..."));
  EXPECT_EQ(a, PayloadForHash("multipart/form-data; boundary=\"bb22\"", form("bb22", "RIFF...")));
  EXPECT_NE(a, PayloadForHash("multipart/form-data; boundary=bb22", form("bb22", "RIFF!!!")));
  EXPECT_EQ(PayloadForHash("application/json", R"({"a":1})"), "application/json\n{\"a\":1}");
  // Two parts, and one part whose text holds what a delimiter was written
  // as ("--"): two payloads, two hashes.
  const std::string two = "--X\r\nP1\r\n--X\r\nP2\r\n--X--\r\n", one = "--Y\r\nP1\r\n--\r\nP2\r\n--Y--\r\n";
  EXPECT_NE(PayloadForHash("multipart/form-data; boundary=X", two), PayloadForHash("multipart/form-data; boundary=Y", one));
}

TEST(ExternalRouteTest, RequestedModelAndChoice) {
  const auto model = [](std::string_view type, std::string_view body) -> StatusOr<std::string> {
    auto f = ReadRequestedFields(type, body);
    if (!f.ok()) return f.status();
    return f->model;
  };
  EXPECT_EQ(*model("multipart/form-data; boundary=b0", kBody), "whisper");
  EXPECT_EQ(*model("application/json", R"({"model":"r"})"), "r");
  EXPECT_EQ(*model("", R"({"query":"q"})"), "");
  EXPECT_EQ(*model("", R"({"model":null})"), "");
  EXPECT_EQ(*model("", R"({"model":"a","x":{"model":"b"},"model":"c"})"), "c") << "top level, the last one";
  EXPECT_FALSE(model("application/json", "[1]").ok());
  EXPECT_FALSE(model("application/json", R"({"model":3})").ok());
  EXPECT_FALSE(model("application/json", R"({"model":["r"]})").ok());
  EXPECT_FALSE(model("application/json", R"({"model":"r")").ok()) << "cut short";
  EXPECT_FALSE(model("multipart/form-data", "x").ok()) << "multipart without a boundary";
  // "stream": only true is a stream (the rest is the server's to judge).
  EXPECT_TRUE(ReadRequestedFields("", R"({"stream":true,"x":{"stream":false}})")->stream);
  EXPECT_FALSE(ReadRequestedFields("", R"({"stream":"true"})")->stream);
  EXPECT_FALSE(ReadRequestedFields("", R"({"stream":true,"stream":1})")->stream);
  // The body's limits hold before anything is built: deep nesting is refused by its limit.
  api::JsonLimits limits;
  limits.max_depth = 8;
  const auto deep = ReadRequestedFields("", R"({"model":"r","a":)" + std::string(100, '[') + std::string(100, ']') + "}",
                                        limits);
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.status().message().find("8"), std::string::npos) << deep.status().message();

  config::GatewayConfig c;
  config::ExternalConfig a, b;
  a.name = "a";
  a.routes = {{"/v1/audio/transcriptions", "/inference"}, {"/v1/rerank", "/v1/rerank"}};
  b.name = "b";
  b.routes = {{"/v1/rerank", "/rerank"}};
  config::ServiceConfig chat;
  chat.name = "chat";
  c.externals = {a, b};
  c.services = {chat};
  EXPECT_EQ((*ChooseExternal(c, "/v1/audio/transcriptions", ""))->name, "a") << "the only one serving it";
  EXPECT_EQ((*ChooseExternal(c, "/v1/rerank", "b"))->name, "b");
  EXPECT_EQ(ChooseExternal(c, "/v1/rerank", "").status().code(), StatusCode::kInvalidArgument) << "two serve it";
  EXPECT_EQ(ChooseExternal(c, "/v1/rerank", "chat").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ChooseExternal(c, "/v1/rerank", "nobody").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(ChooseExternal(c, "/v1/audio/speech", "").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(ChooseExternal(c, "/v1/audio/transcriptions", "b").status().code(), StatusCode::kInvalidArgument);
}

// The line of one external service "s" that runs one request at a time.
config::ExternalConfig OneAtATime(int max_queue) {
  config::ExternalConfig e;
  e.name = "s";
  e.concurrency = 1;
  e.max_queue = max_queue;
  return e;
}

TEST(ExternalLinesTest, FirstComeFirstServedWithinConcurrencyAndQueue) {
  ExternalLines lines({OneAtATime(1)}, 0);
  EXPECT_TRUE(lines.Join("s", "r1"));
  EXPECT_TRUE(lines.TryStart("s", "r1", 10));
  EXPECT_TRUE(lines.Join("s", "r2"));
  EXPECT_FALSE(lines.Join("s", "r3")) << "max_queue waiting";
  // A request accepted before a restart takes its place whatever the bound
  // (it never had a turn and failed at 60 s), behind those already there.
  EXPECT_TRUE(lines.Join("s", "r3-recovered", /*past_bound=*/true));
  EXPECT_EQ(lines.Position("s", "r3-recovered"), 2);
  lines.Leave("s", "r3-recovered");
  EXPECT_FALSE(lines.TryStart("s", "r2", 20)) << "concurrency 1";
  EXPECT_EQ(lines.Position("s", "r2"), 1);
  lines.Finished("s", "completed", 30);
  EXPECT_FALSE(lines.Idle("s", 0, 30)) << "r2 waits";
  EXPECT_TRUE(lines.TryStart("s", "r2", 40));
  EXPECT_TRUE(lines.Join("s", "r4"));
  EXPECT_TRUE(lines.Join("s", "r5") == false);
  lines.Leave("s", "r4");  // cancelled while waiting
  EXPECT_TRUE(lines.Join("s", "r5"));
  EXPECT_FALSE(lines.TryStart("s", "r4", 50)) << "gone from the line";
  lines.Finished("s", "failed", 60);
  EXPECT_TRUE(lines.TryStart("s", "r5", 70));
  lines.Finished("s", "completed", 100);
  EXPECT_FALSE(lines.Idle("s", 50, 120));
  EXPECT_TRUE(lines.Idle("s", 50, 150));
  const auto j = lines.Json("s", 150);
  EXPECT_EQ(j["finished"]["completed"], 2);
  EXPECT_EQ(j["finished"]["failed"], 1);
  // Measured memory: at rest the resident bytes, above them while running the peak.
  lines.Observe("s", 7, 100);
  EXPECT_TRUE(lines.Join("s", "r6"));
  EXPECT_TRUE(lines.TryStart("s", "r6", 200));
  lines.Observe("s", 7, 160);
  lines.Observe("s", 7, 130);
  EXPECT_EQ(lines.Measured("s"), (std::pair<uint64_t, uint64_t>{100, 60}));
  // Another process (a restart): its resident size is measured again before
  // any peak is taken from it; the peak measured stays meanwhile.
  lines.Observe("s", 8, 500);
  EXPECT_EQ(lines.Measured("s"), (std::pair<uint64_t, uint64_t>{0, 60})) << "running: not its size at rest";
  lines.Finished("s", "completed", 210);
  lines.Observe("s", 8, 110);
  EXPECT_EQ(lines.Measured("s"), (std::pair<uint64_t, uint64_t>{110, 60}));
}

// Requests that joined and will run at once (their Accept still being
// committed) do not count against max_queue, and one of them does not hold
// back another that has a free place: with 4 free places and max_queue 0,
// the second of two requests arriving together got 503 "0 waiting".
TEST(ExternalLinesTest, RequestsThatRunAtOnceDoNotCountAgainstTheQueue) {
  auto e = OneAtATime(0);
  e.concurrency = 4;
  ExternalLines lines({e}, 0);
  EXPECT_TRUE(lines.Join("s", "a"));
  EXPECT_TRUE(lines.Join("s", "b")) << "refused as if a waited";
  EXPECT_TRUE(lines.TryStart("s", "b", 1)) << "held back behind a, with places free";
  EXPECT_TRUE(lines.Join("s", "c"));
  EXPECT_TRUE(lines.Join("s", "d"));
  EXPECT_FALSE(lines.Join("s", "e")) << "a, c, d take the three free places: e would wait, and max_queue is 0";
  EXPECT_TRUE(lines.TryStart("s", "a", 2));
  EXPECT_TRUE(lines.TryStart("s", "d", 3));
  EXPECT_TRUE(lines.TryStart("s", "c", 4));
  EXPECT_EQ(lines.Waiting("s"), 0);
}

// A client's X-Request-Id sent again while its first request waits: the
// second (refused as a duplicate) leaves with its own place, the later one;
// the first keeps its turn.
TEST(ExternalLinesTest, ASecondRequestUnderAnIdTakesOnlyItsOwnPlaceOut) {
  ExternalLines lines({OneAtATime(4)}, 0);
  EXPECT_TRUE(lines.Join("s", "busy"));
  EXPECT_TRUE(lines.TryStart("s", "busy", 1));
  EXPECT_TRUE(lines.Join("s", "job-17"));
  EXPECT_TRUE(lines.Join("s", "other"));
  EXPECT_TRUE(lines.Join("s", "job-17"));  // the duplicate, refused next by the journal
  lines.Leave("s", "job-17");
  EXPECT_EQ(lines.Position("s", "job-17"), 1) << "the first keeps its place";
  EXPECT_EQ(lines.Waiting("s"), 2);
  lines.Finished("s", "completed", 2);
  EXPECT_TRUE(lines.TryStart("s", "job-17", 3));
}

// Room for a request's transient peak is left for the requests already sent
// (RoomTakers), not for those that hold a running place while they wait for
// room themselves: two waiting for room counted each other and neither ran.
TEST(ExternalLinesTest, OnlyRequestsSentWithRoomCountAgainstTheNext) {
  auto e = OneAtATime(4);
  e.concurrency = 2;
  ExternalLines lines({e}, 0);
  EXPECT_TRUE(lines.Join("s", "a"));
  EXPECT_TRUE(lines.Join("s", "b"));
  EXPECT_TRUE(lines.TryStart("s", "a", 1));
  EXPECT_TRUE(lines.TryStart("s", "b", 1));
  EXPECT_EQ(lines.Running("s"), 2);
  EXPECT_EQ(lines.RoomTakers("s"), 0) << "both wait for room: neither holds any";
  // One check at a time: two checked together would both see the same free
  // memory, and both pass where only one peak fits.
  ASSERT_TRUE(lines.BeginRoomCheck("s"));
  EXPECT_FALSE(lines.BeginRoomCheck("s")) << "b waits for a's check";
  lines.EndRoomCheck("s", /*took=*/true);
  EXPECT_EQ(lines.RoomTakers("s"), 1) << "b's check counts a's peak";
  ASSERT_TRUE(lines.BeginRoomCheck("s"));
  lines.EndRoomCheck("s", /*took=*/false);  // no room for b: it waits
  EXPECT_EQ(lines.RoomTakers("s"), 1);
  lines.Finished("s", "completed", 2, /*took_room=*/false);  // b gave up waiting
  EXPECT_EQ(lines.RoomTakers("s"), 1);
  lines.Finished("s", "completed", 3, /*took_room=*/true);
  EXPECT_EQ(lines.RoomTakers("s"), 0);
}

// What is above the resident size while several requests run is their
// peaks together: one request's is that over the requests sent. The sum was
// taken as one request's peak, and charged again for each one beside the
// next (four requests of 200 MiB made the next need 3,200 MiB).
TEST(ExternalLinesTest, APeakMeasuredWhileSeveralRunIsSharedOutAmongThem) {
  auto e = OneAtATime(4);
  e.concurrency = 4;
  ExternalLines lines({e}, 0);
  lines.Observe("s", 7, 1000);  // at rest
  for (const char* id : {"a", "b", "c"}) {
    ASSERT_TRUE(lines.Join("s", id));
    ASSERT_TRUE(lines.TryStart("s", id, 1));
  }
  for (int i = 0; i < 2; ++i) {  // a and b sent; c holds its place, waiting for room
    ASSERT_TRUE(lines.BeginRoomCheck("s"));
    lines.EndRoomCheck("s", /*took=*/true);
  }
  lines.Observe("s", 7, 1400);
  EXPECT_EQ(lines.Measured("s"), (std::pair<uint64_t, uint64_t>{1000, 200}));
  lines.Observe("s", 7, 1300);
  EXPECT_EQ(lines.Measured("s").second, 200u) << "the highest stays";
}

// The memory a room check reads is the device's: two services on one device
// check one at a time, and each check leaves room for the peaks already sent
// by either. (Checked per service, two requests of two services saw the same
// free memory at once and both passed where one peak fit.)
TEST(ExternalLinesTest, RoomChecksAreOneAtATimePerDeviceAndCountEveryServiceThere) {
  auto a = OneAtATime(4), b = OneAtATime(4), c = OneAtATime(4);
  a.name = "a", b.name = "b", c.name = "c";
  a.device = b.device = "cuda:0";
  c.device = "cuda:1";
  ExternalLines lines({a, b, c}, 0);
  ASSERT_TRUE(lines.BeginRoomCheck("a"));
  EXPECT_FALSE(lines.BeginRoomCheck("b")) << "b's device is being checked for a";
  lines.EndRoomCheck("b", /*took=*/false);  // (b began none: a's check goes on)
  EXPECT_FALSE(lines.BeginRoomCheck("b")) << "b ended a's check";
  ASSERT_TRUE(lines.BeginRoomCheck("c")) << "another device is checked meanwhile";
  lines.EndRoomCheck("c", /*took=*/true);
  lines.EndRoomCheck("a", /*took=*/true);
  ASSERT_TRUE(lines.BeginRoomCheck("b"));
  EXPECT_EQ(lines.RoomTakersOn("cuda:0"), (std::vector<std::pair<std::string, int>>{{"a", 1}}))
      << "b's check leaves room for a's peak";
  lines.EndRoomCheck("b", /*took=*/true);
  EXPECT_EQ(lines.RoomTakersOn("cuda:0"), (std::vector<std::pair<std::string, int>>{{"a", 1}, {"b", 1}}));
  EXPECT_EQ(lines.RoomTakersOn("cuda:1"), (std::vector<std::pair<std::string, int>>{{"c", 1}}));
  lines.Finished("a", "completed", 1, /*took_room=*/true);
  EXPECT_EQ(lines.RoomTakersOn("cuda:0"), (std::vector<std::pair<std::string, int>>{{"b", 1}}));
}

// A load's start (the start gate) checks the device's memory one at a time
// with the requests' checks there: each counted on the same free memory (the
// request sent with room for its peak, the load let through).
TEST(ExternalLinesTest, TheStartGatesCheckOfADeviceExcludesTheRequestsChecksThere) {
  auto a = OneAtATime(4), c = OneAtATime(4);
  a.name = "a", c.name = "c";
  a.device = "cuda:0";
  c.device = "cuda:1";
  ExternalLines lines({a, c}, 0);
  ASSERT_TRUE(lines.BeginDeviceCheck("cuda:0", "the start of x.0"));
  EXPECT_FALSE(lines.BeginRoomCheck("a")) << "a request's check while a load's runs";
  EXPECT_FALSE(lines.BeginDeviceCheck("cuda:0", "the start of y.0")) << "two loads' checks at once";
  EXPECT_TRUE(lines.BeginRoomCheck("c")) << "another device is checked meanwhile";
  lines.EndRoomCheck("c", /*took=*/false);
  lines.EndDeviceCheck("cuda:0", "the start of y.0");  // (not the one that runs: it goes on)
  EXPECT_FALSE(lines.BeginRoomCheck("a"));
  lines.EndDeviceCheck("cuda:0", "the start of x.0");
  ASSERT_TRUE(lines.BeginRoomCheck("a"));
  EXPECT_FALSE(lines.BeginDeviceCheck("cuda:0", "the start of x.0")) << "a load's check while a request's runs";
  lines.EndRoomCheck("a", /*took=*/true);
  EXPECT_TRUE(lines.BeginDeviceCheck("cuda:0", "the start of x.0"));
}

// Eviction: a server whose line never empties (batch requests queued all
// day) still goes once nothing runs on it; and the release happens under
// the line's lock, against a start that asks whether the server is still up
// (a request started on a server released in between, and got a 502).
TEST(ExternalLinesTest, AnEvictedServerGoesWhenNothingRunsAndNothingStartsOnItAfter) {
  ExternalLines lines({OneAtATime(8)}, 0);
  ASSERT_TRUE(lines.Join("s", "r1"));
  ASSERT_TRUE(lines.TryStart("s", "r1", 10));
  ASSERT_TRUE(lines.Join("s", "r2"));
  bool released = false;
  auto release = [&] { released = true; };
  EXPECT_FALSE(lines.ReleaseIfIdle("s", 0, 20, /*evicted=*/true, release)) << "r1 runs";
  lines.Finished("s", "completed", 30);
  EXPECT_FALSE(lines.ReleaseIfIdle("s", 0, 30, /*evicted=*/false, release)) << "r2 waits: kept while not evicted";
  EXPECT_TRUE(lines.ReleaseIfIdle("s", 0, 30, /*evicted=*/true, release));
  EXPECT_TRUE(released);
  EXPECT_FALSE(lines.TryStart("s", "r2", 40, [&] { return !released; })) << "its server is gone";
  EXPECT_EQ(lines.Position("s", "r2"), 1) << "it keeps its place for the server's return";
  released = false;
  EXPECT_TRUE(lines.TryStart("s", "r2", 50, [&] { return !released; }));
}

}  // namespace
}  // namespace spillway::gateway
