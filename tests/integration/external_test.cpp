// External services (config::ExternalConfig) through a real gateway: a fake
// upstream (tests/fakes/fake_upstream_main.cpp) started by Spillway's
// supervisor, and whisper.cpp's real whisper-server behind
// /v1/audio/transcriptions.
#include <gtest/gtest.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/hash.h"
#include "common/proc_file.h"
#include "devices/sim_ledger.h"
#include "devices/telemetry.h"
#include "gateway_calls.h"
#include "gateway_process.h"
#include "scoped_sim_dir.h"
#include "whisper_server.h"
#include "worker_process.h"

namespace spillway::testing {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

// The process whose parent is `parent` (the first found), 0 when none.
pid_t ChildOf(pid_t parent) {
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const auto pid = static_cast<pid_t>(std::stol(name));
    if (const auto f = ReadProcStat(pid); f && f->ppid == parent) return pid;
  }
  return 0;
}

std::string FakeUpstream() { return EnvOr("FAKE_UPSTREAM"); }

// A [[service]] for the fake upstream, started by Spillway, logging each request to `log`.
std::string FakeService(const std::string& name, const std::string& log, const std::string& more = "",
                        const std::string& fake_args = "") {
  std::ostringstream os;
  os << "[[service]]\nname = \"" << name << "\"\nkind = \"external\"\n"
     << "command = \"" << FakeUpstream() << " --port ${PORT} --log " << log << fake_args << "\"\n"
     << "routes = { \"/v1/audio/transcriptions\" = \"/inference\", \"/v1/rerank\" = \"/v1/rerank\", "
        "\"/v1/chat/completions\" = \"/v1/chat/completions\" }\n"
     << more;
  return os.str();
}

int LinesWith(const std::string& log, const std::string& needle) {
  std::ifstream f(log);
  std::string line;
  int n = 0;
  while (std::getline(f, line)) n += line.find(needle) != std::string::npos;
  return n;
}

std::string Multipart(const std::string& boundary, const std::vector<std::pair<std::string, std::string>>& fields,
                      const std::string& file) {
  std::string b;
  for (const auto& [k, v] : fields) {
    b += "--" + boundary + "\r\nContent-Disposition: form-data; name=\"" + k + "\"\r\n\r\n" + v + "\r\n";
  }
  b += "--" + boundary + "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"clip.wav\"\r\n"
       "Content-Type: audio/wav\r\n\r\n" + file + "\r\n--" + boundary + "--\r\n";
  return b;
}

json ExternalStatus(uint16_t port, const std::string& name) {
  json s = Body(Call(port, "GET", "/v1/status"));
  for (const auto& e : s["externals"]) {
    if (e["name"] == name) return e;
  }
  return json();
}

// Its status once its state is ready, or the last read after `tries` reads 50 ms apart.
json WaitExternalReady(uint16_t port, const std::string& name, int tries = 200) {
  json st = json::object();
  for (int i = 0; i < tries && st.value("state", "") != "ready"; ++i) {
    std::this_thread::sleep_for(50ms);
    st = ExternalStatus(port, name);
  }
  return st;
}

class ExternalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(FakeUpstream().empty()) << "FAKE_UPSTREAM is set by ctest";
    dir_ = MakeScratchDir();
    log_ = dir_ + "/upstream.log";
  }
  std::unique_ptr<GatewayProcess> Start(const std::string& toml) {
    auto g = std::make_unique<GatewayProcess>(toml);
    EXPECT_TRUE(g->Start()) << g->Output();
    return g;
  }
  std::string dir_, log_;
};

TEST_F(ExternalTest, MultipartBodiesGoThroughUntouchedAndAreJournaled) {
  auto g = Start(TestConfig(2, FakeService("fake", log_)));
  // Bytes a rewrite would break: NULs, CR LF, a boundary-like line, high bytes.
  static constexpr char kHead[] = "RIFF\0\0\r\n--not-the-boundary\r\n";
  std::string audio(kHead, sizeof kHead - 1);  // (28 bytes: the NULs included, the terminator not)
  for (int i = 0; i < 4096; ++i) audio += static_cast<char>(i * 37 % 256);
  const std::string boundary = "spillway-test-7d2f";
  const std::string body = Multipart(boundary, {{"model", "fake"}, {"response_format", "json"}}, audio);
  const std::string type = "multipart/form-data; boundary=" + boundary;
  auto r = Call(g->port(), "POST", "/v1/audio/transcriptions", body, {{"Content-Type", type}, {"X-Request-Id", "mp-1"}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json a = Body(r);
  EXPECT_EQ(a["path"], "/inference") << "routes map the gateway's path onto the upstream's";
  EXPECT_EQ(a["body_sha256"], Sha256Hex(body)) << "the body reaches the upstream byte for byte";
  EXPECT_EQ(a["content_type"], type) << "with its boundary";
  EXPECT_EQ(a["request_id"], "mp-1");
  EXPECT_EQ(r.headers["x-spillway-placement"], "fake");
  const json rec = WaitTerminal(g->port(), "mp-1");
  EXPECT_EQ(rec["state"], "completed") << rec.dump();
  EXPECT_EQ(rec["endpoint"], "/v1/audio/transcriptions");
  // One service serves the route: the model may be left out. A JSON route too.
  r = Call(g->port(), "POST", "/v1/audio/transcriptions", Multipart(boundary, {}, "x"), {{"Content-Type", type}});
  EXPECT_EQ(r.status, 200) << r.body;
  r = Call(g->port(), "POST", "/v1/rerank", R"({"model":"fake","query":"q","documents":["a","b"]})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r)["path"], "/v1/rerank");
  // The server's own 503 comes with its Retry-After, which the client hears.
  r = Call(g->port(), "POST", "/v1/rerank", R"({"model":"fake","query":"q","fake_status":"503"})");
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(r.headers["retry-after"], "7") << r.body;
  // A chat request naming the external service goes there, unvalidated by the worker's parser.
  r = Call(g->port(), "POST", "/v1/chat/completions", R"({"model":"fake","messages":"not OpenAI's shape"})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r)["path"], "/v1/chat/completions");
  // Wrong input is a clear error, and nothing reaches the upstream.
  const int before = LinesWith(log_, "/");
  EXPECT_EQ(Call(g->port(), "POST", "/v1/rerank", R"({"model":"chat","query":"q"})").status, 400) << "chat serves no rerank";
  EXPECT_EQ(Call(g->port(), "POST", "/v1/images/generations", R"({"model":"fake"})").status, 400);
  EXPECT_EQ(Call(g->port(), "POST", "/v1/rerank", R"({"model":"nobody"})").status, 404);
  EXPECT_EQ(Call(g->port(), "POST", "/v1/rerank", "{not json").status, 400);
  EXPECT_EQ(Call(g->port(), "POST", "/v1/audio/transcriptions", "x", {{"Content-Type", "multipart/form-data"}}).status, 400)
      << "a multipart body without a boundary";
  EXPECT_EQ(LinesWith(log_, "/"), before);
  // Listed with its routes.
  bool listed = false;
  const json models = Body(Call(g->port(), "GET", "/v1/models"));
  for (const auto& m : models["data"]) listed |= m["id"] == "fake";
  EXPECT_TRUE(listed);
}

// With external services alone, a chat, completion or embedding request
// may leave out its model when one service serves the route, as any other
// route's: it was a 400 ("'model' is required"), Spillway's own services'
// rule. Two that serve it: the 400 says so.
TEST_F(ExternalTest, WithExternalsAloneAChatToTheOnlyServerMayLeaveOutItsModel) {
  auto g = Start("max_queue = 64\n" + FakeService("fake", log_));
  auto r = Call(g->port(), "POST", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}]})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r)["path"], "/v1/chat/completions");
  EXPECT_EQ(r.headers["x-spillway-placement"], "fake");
  g.reset();
  auto two = Start("max_queue = 64\n" + FakeService("fake", log_) + FakeService("other", dir_ + "/other.log"));
  r = Call(two->port(), "POST", "/v1/chat/completions", R"({"messages":[]})");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("several services serve"), std::string::npos) << r.body;
}

TEST_F(ExternalTest, ANonIdempotentRequestThatReachedTheServerIsNeverSentAgain) {
  auto g = Start(TestConfig(2, FakeService("fake", log_) + FakeService("fake-idem", dir_ + "/idem.log", "idempotent = true\n")));
  auto r = Call(g->port(), "POST", "/v1/rerank", R"({"model":"fake","fake_crash":1})", {{"X-Request-Id", "crash-1"}});
  EXPECT_EQ(r.status, 502) << r.body;
  EXPECT_NE(r.body.find("not idempotent"), std::string::npos) << r.body;
  EXPECT_EQ(r.headers["x-should-retry"], "false") << "an SDK would send it again on its own";
  EXPECT_EQ(LinesWith(log_, "crash-1"), 1) << "delivered once, never again";
  EXPECT_EQ(WaitTerminal(g->port(), "crash-1")["state"], "failed");
  // The supervisor brings the server back: the next request is served.
  json ok = json::object();
  for (int i = 0; i < 100 && ok.value("path", "").empty(); ++i) {
    auto n = Call(g->port(), "POST", "/v1/rerank", R"({"model":"fake"})");
    if (n.status == 200) ok = Body(n);
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_EQ(ok.value("path", ""), "/v1/rerank");
  // An idempotent service's request is sent again (here it crashes each time: three tries, then 502).
  r = Call(g->port(), "POST", "/v1/rerank", R"({"model":"fake-idem","fake_crash":1})", {{"X-Request-Id", "crash-2"}});
  EXPECT_EQ(r.status, 502) << r.body;
  EXPECT_EQ(LinesWith(dir_ + "/idem.log", "crash-2"), 3) << "sent again, at most three times";
}

TEST_F(ExternalTest, CancelClosesTheUpstreamConnectionAndStreamsAreRelayed) {
  auto g = Start(TestConfig(2, FakeService("fake", log_)));
  auto slow = std::async(std::launch::async, [&] {
    return http::Fetch("127.0.0.1", g->port(), "POST", "/v1/rerank", R"({"model":"fake","fake_delay_ms":20000})",
                       {{"X-Request-Id", "slow-1"}}, 30s);
  });
  for (int i = 0; i < 200 && LinesWith(log_, "slow-1") == 0; ++i) std::this_thread::sleep_for(20ms);
  ASSERT_EQ(LinesWith(log_, "slow-1"), 1);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(Call(g->port(), "DELETE", "/v1/requests/slow-1").status, 200);
  auto r = slow.get();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 499) << r->body;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s) << "cancelled at once, not after the upstream's 20 s";
  EXPECT_EQ(WaitTerminal(g->port(), "slow-1")["state"], "cancelled");

  // A stream is relayed as it comes and journaled whole once it ends.
  auto s = Call(g->port(), "POST", "/v1/chat/completions", R"({"model":"fake","fake_stream":4})", {{"X-Request-Id", "st-1"}});
  ASSERT_EQ(s.status, 200);
  EXPECT_EQ(s.headers["content-type"], "text/event-stream");
  EXPECT_NE(s.body.find("{\"event\":3}"), std::string::npos) << s.body;
  const json rec = WaitTerminal(g->port(), "st-1");
  EXPECT_EQ(rec["state"], "completed");
}

// Past the stop's grace, an external service's requests end as the next
// start will find them, each client told why (they were cut with their
// connections): sent to an idempotent server, the answer is withheld and
// the next start sends it again; sent to one that is not idempotent, it
// fails; still waiting for its turn, it is refused, to be sent again.
TEST_F(ExternalTest, TheStopsCutTellsEachClientWhatTheNextStartDoes) {
  const std::string idem_log = dir_ + "/idem.log";
  GatewayProcess gw(TestConfig(2, "shutdown_grace_s = 0.3\n" + FakeService("fake", log_) +
                                      FakeService("fake-idem", idem_log, "idempotent = true\nconcurrency = 1\n")));
  ASSERT_TRUE(gw.Start()) << gw.Output();
  auto send = [port = gw.port()](const std::string& model, const std::string& id, int delay_ms) {
    return std::async(std::launch::async, [=] {
      auto r = http::Fetch("127.0.0.1", port, "POST", "/v1/rerank",
                           json{{"model", model}, {"fake_delay_ms", delay_ms}}.dump(), {{"X-Request-Id", id}}, 30s);
      return r.ok() ? *r : http::ClientResponse{};
    });
  };
  auto once = send("fake", "ext-once", 20000);
  auto idem = send("fake-idem", "ext-idem", 3000);
  for (int i = 0; i < 250 && (LinesWith(log_, "ext-once") == 0 || LinesWith(idem_log, "ext-idem") == 0); ++i) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_EQ(LinesWith(idem_log, "ext-idem"), 1);
  auto waits = send("fake-idem", "ext-waits", 0);  // behind ext-idem (concurrency 1)
  for (int i = 0; i < 250 && Body(Call(gw.port(), "GET", "/v1/requests/ext-waits")).value("state", "") != "queued"; ++i) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_EQ(::kill(gw.pid(), SIGTERM), 0);

  const auto i = idem.get();
  EXPECT_EQ(i.status, 503) << i.body;
  EXPECT_NE(i.body.find("answer_withheld"), std::string::npos) << i.body;
  EXPECT_NE(i.body.find("the next start sends it again"), std::string::npos) << i.body;
  const auto o = once.get();
  EXPECT_EQ(o.status, 503) << o.body;
  EXPECT_NE(o.body.find("not idempotent, so it is not sent again"), std::string::npos) << o.body;
  EXPECT_EQ(o.Header("x-should-retry"), "false") << "an SDK would send it again on its own";
  const auto w = waits.get();
  EXPECT_EQ(w.status, 503) << w.body;
  EXPECT_NE(w.body.find("before the request reached service 'fake-idem'; send it again"), std::string::npos) << w.body;
  EXPECT_EQ(w.Header("retry-after"), "5");
  ASSERT_TRUE(gw.WaitExit(std::chrono::seconds(30))) << gw.Output();

  ASSERT_TRUE(gw.Start()) << gw.Output();
  EXPECT_EQ(WaitTerminal(gw.port(), "ext-idem").value("state", ""), "completed");
  EXPECT_EQ(LinesWith(idem_log, "ext-idem"), 2) << "sent again by the next start";
  EXPECT_EQ(Body(Call(gw.port(), "GET", "/v1/requests/ext-once")).value("state", ""), "failed");
  EXPECT_EQ(Body(Call(gw.port(), "GET", "/v1/requests/ext-waits")).value("state", ""), "failed");
  EXPECT_EQ(LinesWith(log_, "ext-once"), 1) << "never sent again";
}

// A relayed stream the server cuts short ends as cut for the client too: its
// connection closes without the chunked body's last chunk (it ended cleanly,
// so a client took what it had for the whole answer). And a "stream" that
// is not a boolean is the server's to judge, the body forwarded untouched
// (it was a 500 from the gateway).
TEST_F(ExternalTest, ARelayedStreamCutShortEndsAsCutForTheClient) {
  auto g = Start(TestConfig(2, FakeService("fake", log_)));
  auto r = http::Fetch("127.0.0.1", g->port(), "POST", "/v1/chat/completions",
                       R"({"model":"fake","fake_stream":2,"fake_cut":1})", {{"X-Request-Id", "cut-1"}}, 30s);
  EXPECT_FALSE(r.ok()) << "a cut stream read as whole: " << r->body;
  EXPECT_EQ(WaitTerminal(g->port(), "cut-1")["state"], "failed");
  json ok = json::object();
  for (int i = 0; i < 100 && ok.value("path", "").empty(); ++i) {  // the supervisor brings the server back
    auto n = Call(g->port(), "POST", "/v1/rerank", R"({"model":"fake","stream":null})");
    if (n.status == 200) ok = Body(n);
    EXPECT_NE(n.status, 500) << n.body;
    if (n.status != 200) std::this_thread::sleep_for(100ms);
  }
  EXPECT_EQ(ok.value("path", ""), "/v1/rerank");
}

// A relayed answer longer than what is kept (64 MiB) reaches its client
// whole, but its Idempotency-Key cannot replay it: a 409 says so (the
// replay was a 200 carrying a short note in place of the audio).
TEST_F(ExternalTest, ARelayedAnswerTooLongToKeepIsNotReplayedAsANote) {
  auto g = Start(TestConfig(2, FakeService("fake", log_)));
  const std::string body = R"({"model":"fake","fake_audio_mib":65})";
  auto r = http::Fetch("127.0.0.1", g->port(), "POST", "/v1/chat/completions", body, {{"Idempotency-Key", "long-1"}}, 60s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body.size(), size_t{65} << 20);
  const auto again = Call(g->port(), "POST", "/v1/chat/completions", body, {{"Idempotency-Key", "long-1"}});
  EXPECT_EQ(again.status, 409) << again.body.substr(0, 300);
  EXPECT_NE(again.body.find("too long to keep"), std::string::npos) << again.body.substr(0, 300);
  EXPECT_EQ(LinesWith(log_, "/v1/chat/completions"), 1) << "not sent again either";
}

// X-Request-Timeout bounds a request at an external service too: the
// upstream's connection is closed at the deadline and the answer is 504,
// sent once, the server not suspected (it kept its 20 s answer before).
TEST_F(ExternalTest, ADeadlineEndsARequestAtTheServerWith504) {
  auto g = Start(TestConfig(2, FakeService("fake", log_, "idempotent = true\n") +
                                   FakeService("fake-once", dir_ + "/once.log")));
  {
    // Past its deadline after a server that is not idempotent had it whole:
    // it may have acted on it, so an SDK must not send it again on its own.
    auto r = Call(g->port(), "POST", "/v1/rerank", R"({"model":"fake-once","fake_delay_ms":20000})",
                  {{"X-Request-Id", "late-once"}, {"X-Request-Timeout", "1"}});
    EXPECT_EQ(r.status, 504) << r.body;
    EXPECT_EQ(r.headers["x-should-retry"], "false") << "an SDK would send it again on its own";
    EXPECT_NE(r.body.find("may_have_run"), std::string::npos) << r.body;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto r = Call(g->port(), "POST", "/v1/rerank", R"({"model":"fake","fake_delay_ms":20000})",
                {{"X-Request-Id", "late-1"}, {"X-Request-Timeout", "1"}});
  EXPECT_EQ(r.status, 504) << r.body;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s) << "not ended at its deadline";
  EXPECT_NE(r.body.find("X-Request-Timeout"), std::string::npos) << r.body;
  EXPECT_EQ(WaitTerminal(g->port(), "late-1")["state"], "failed");
  EXPECT_EQ(LinesWith(log_, "late-1"), 1) << "an idempotent request past its deadline is not sent again";
  const auto next = Call(g->port(), "POST", "/v1/rerank", R"({"model":"fake"})", {{"X-Request-Timeout", "30"}});
  EXPECT_EQ(next.status, 200) << next.body;
  const std::string passed_on = Body(next).value("request_timeout", "");  // what is left of it
  EXPECT_TRUE(passed_on.rfind("30.", 0) == 0 || passed_on.rfind("29.", 0) == 0) << next.body;
}

// A server that answers 101 Switching Protocols (or no HTTP status) gave no
// answer to relay: 502, and its connection, in another protocol now, is not kept.
TEST_F(ExternalTest, AnAnswerThatIsNotAFinalOneIs502) {
  auto g = Start(TestConfig(2, FakeService("fake", log_)));
  auto r = Call(g->port(), "POST", "/v1/rerank", R"({"model":"fake","fake_status":101})", {{"X-Request-Id", "up-1"}});
  EXPECT_EQ(r.status, 502) << r.body;
  EXPECT_NE(r.body.find("status 101"), std::string::npos) << r.body;
  EXPECT_EQ(r.headers["x-should-retry"], "false") << "the server had it: an SDK must not send it again";
  EXPECT_EQ(WaitTerminal(g->port(), "up-1")["state"], "failed");
  const auto next = Call(g->port(), "POST", "/v1/rerank", R"({"model":"fake"})");
  EXPECT_EQ(next.status, 200) << next.body;
}

TEST_F(ExternalTest, EachServiceHasItsOwnLineAndABusyOneStarvesNoOther) {
  auto g = Start(TestConfig(2, FakeService("fake", log_, "concurrency = 1\nmax_queue = 1\n")));
  auto call = [&](const std::string& id) {
    return std::async(std::launch::async, [&, id] {
      return http::Fetch("127.0.0.1", g->port(), "POST", "/v1/rerank", R"({"model":"fake","fake_delay_ms":3000})",
                         {{"X-Request-Id", id}}, 30s);
    });
  };
  auto a = call("line-a");
  for (int i = 0; i < 200 && LinesWith(log_, "line-a") == 0; ++i) std::this_thread::sleep_for(10ms);
  auto b = call("line-b");
  for (int i = 0; i < 400 && ExternalStatus(g->port(), "fake")["requests"].value("waiting", 0) < 1; ++i) {
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_EQ(ExternalStatus(g->port(), "fake")["requests"]["waiting"], 1) << ExternalStatus(g->port(), "fake").dump();
  // Concurrency 1 and one waiting: the third is refused at once.
  auto c = Call(g->port(), "POST", "/v1/rerank", R"({"model":"fake"})");
  EXPECT_EQ(c.status, 503) << c.body;
  EXPECT_NE(c.body.find("max_queue"), std::string::npos) << c.body;
  EXPECT_EQ(LinesWith(log_, "line-b"), 0) << "waits for its turn, not sent beside the running one";
  // Another service answers meanwhile.
  const auto t0 = std::chrono::steady_clock::now();
  auto e = Call(g->port(), "POST", "/v1/embeddings", R"({"model":"embed","input":"hello"})");
  EXPECT_EQ(e.status, 200) << e.body;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s) << "waited behind the busy line (3 s a request)";
  EXPECT_EQ(a.get()->status, 200);
  auto rb = b.get();
  EXPECT_EQ(rb->status, 200) << rb->body;
  EXPECT_EQ(LinesWith(log_, "line-b"), 1);
  const json st = ExternalStatus(g->port(), "fake");
  EXPECT_EQ(st["requests"]["finished"]["completed"], 2) << st.dump();
}

TEST_F(ExternalTest, OnDemandStartsWithItsFirstRequestAndStopsWhenIdle) {
  auto g = Start(TestConfig(2, FakeService("fake", log_, "residency = \"on_demand\"\nkeep_alive_s = 3\n"
                                           "priority = \"background\"\n", " --ready-after-ms 300")));
  json st = ExternalStatus(g->port(), "fake");
  EXPECT_EQ(st["state"], "stopped") << st.dump();
  auto r = Call(g->port(), "POST", "/v1/rerank", R"({"model":"fake"})");
  ASSERT_EQ(r.status, 200) << r.body;
  st = ExternalStatus(g->port(), "fake");
  EXPECT_EQ(st["starts"], 1);
  EXPECT_GE(st["measured_load_s"].get<double>(), 0.3) << "ready once its health path answered";
  // A background service's server runs at niceness 19 (started through
  // coreutils' nice, which execs it: spillway-tie's child).
  const int leader = st.value("pid", 0);
  ASSERT_GT(leader, 0) << st.dump();
  const pid_t pid = ChildOf(leader);
  ASSERT_GT(pid, 0) << "no server under " << leader;
  std::istringstream stat(ReadTextFile("/proc/" + std::to_string(pid) + "/stat"));
  std::string field;
  std::getline(stat, field, ')');
  for (int i = 3; i <= 19 && stat >> field; ++i) {
  }
  EXPECT_EQ(std::atoi(field.c_str()), 19);
  EXPECT_NE(ReadTextFile("/proc/" + std::to_string(pid) + "/cmdline").find("fake-upstream"), std::string::npos);
  EXPECT_EQ(ReadTextFile("/proc/" + std::to_string(pid) + "/cmdline").find("spillway-tie"), std::string::npos);
  // Idle past keep_alive_s: stopped; the next request starts it again.
  for (int i = 0; i < 100 && st["state"] != "stopped"; ++i) {
    std::this_thread::sleep_for(100ms);
    st = ExternalStatus(g->port(), "fake");
  }
  EXPECT_EQ(st["state"], "stopped") << st.dump();
  r = Call(g->port(), "POST", "/v1/rerank", R"({"model":"fake"})");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(ExternalStatus(g->port(), "fake")["starts"], 2);
}

// A server Spillway started is never adopted (the next gateway stops it), so
// it goes with its gateway, one killed with -9 too: it held its device
// memory until some later gateway came, or for good.
TEST_F(ExternalTest, AServerSpillwayStartedEndsWithAGatewayKilledWithoutWarning) {
  auto g = Start(TestConfig(2, FakeService("fake", log_)));
  ASSERT_EQ(Call(g->port(), "POST", "/v1/rerank", R"({"model":"fake"})").status, 200);
  const int pid = ExternalStatus(g->port(), "fake").value("pid", 0);
  ASSERT_GT(pid, 0);
  g->Kill9();
  for (int i = 0; i < 100 && devices::ProcessAlive(pid, 0); ++i) std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(devices::ProcessAlive(pid, 0)) << "the external server (pid " << pid << ") outlived its gateway";
}

// A wrapper script (one whose server it starts without exec) and what it
// starts live in one process group, led by spillway-tie. Written once for
// the tests below: the server's pid goes to `servers`.
std::string WrapperConfig(const std::string& dir, const std::string& log) {
  const std::string script = dir + "/wrap.sh";
  {
    std::ofstream f(script);
    f << "#!/bin/sh\n\"$@\" &\necho $! >> " << dir << "/servers\nwait\n";
  }
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  return TestConfig(2, "[[service]]\nname = \"fake\"\nkind = \"external\"\ncommand = \"" + script + " " +
                           FakeUpstream() + " --port ${PORT} --log " + log +
                           "\"\nroutes = { \"/v1/rerank\" = \"/v1/rerank\" }\n");
}

// The pids of a wrapped server started by `g` (one request served): the
// group's leader, as /v1/status shows it, and the server the wrapper
// started (written to `dir`/servers); 0 for what was not found.
struct Wrapped {
  pid_t leader = 0, server = 0;
};
Wrapped StartWrapped(GatewayProcess& g, const std::string& dir) {
  Wrapped w;
  if (!g.Start() || Call(g.port(), "POST", "/v1/rerank", R"({"model":"fake"})").status != 200) return w;
  w.leader = ExternalStatus(g.port(), "fake").value("pid", 0);
  std::ifstream f(dir + "/servers");
  for (pid_t p = 0; f >> p;) w.server = p;
  return w;
}

// Alive, not a zombie.
bool Running(pid_t pid) { return devices::ProcessAlive(pid, 0); }

// Killed with -9, the gateway takes a wrapper's server with it, not only
// the wrapper: util-linux's setpriv tied only the process it execs (the
// wrapper), and the server ran on in its group with its port and device
// memory until some later gateway came, or for good.
TEST_F(ExternalTest, AWrappedServerEndsWithAGatewayKilledWithoutWarning) {
  GatewayProcess g(WrapperConfig(dir_, log_));
  const auto [leader, server] = StartWrapped(g, dir_);
  ASSERT_GT(server, 0) << g.Output();
  ASSERT_NE(server, leader);
  std::error_code ec;
  const std::string exe = std::filesystem::read_symlink("/proc/" + std::to_string(leader) + "/exe", ec).string();
  EXPECT_NE(exe.find("spillway-tie"), std::string::npos) << "the group's leader is " << exe;
  g.Kill9();
  for (int i = 0; i < 160 && (Running(server) || Running(leader)); ++i) std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(Running(server)) << "the wrapper's server (pid " << server << ") outlived its gateway";
  EXPECT_FALSE(Running(leader)) << "its group's leader (pid " << leader << ") outlived its gateway";
  if (Running(server)) kill(server, SIGKILL);
}

// What a wrapper left in its group when its leader went without stopping it
// (spillway-tie killed with the gateway, as the OOM killer might: it had no
// moment to act) is stopped by the next gateway before it starts the
// server anew. It saw the leader gone, forgot it, and started a second
// server beside the first, which kept its memory and port for good.
TEST_F(ExternalTest, WhatAWrapperLeftRunningIsStoppedByTheNextGateway) {
  GatewayProcess g(WrapperConfig(dir_, log_));
  const auto [leader, server] = StartWrapped(g, dir_);
  ASSERT_GT(server, 0) << g.Output();
  ASSERT_NE(server, leader);
  struct KillLeft {  // (however the test ends)
    pid_t server;
    ~KillLeft() {
      if (Running(server)) kill(server, SIGKILL);
    }
  } kill_left{server};
  // Stopped first, the leader cannot act on its gateway's death; then killed.
  ASSERT_EQ(kill(leader, SIGSTOP), 0);
  auto stopped = [&] {
    const auto f = ReadProcStat(leader);
    return f && f->state == 'T';
  };
  for (int i = 0; i < 200 && !stopped(); ++i) std::this_thread::sleep_for(5ms);
  g.Kill9();
  ASSERT_EQ(kill(leader, SIGKILL), 0);
  for (int i = 0; i < 100 && Running(leader); ++i) std::this_thread::sleep_for(20ms);
  ASSERT_FALSE(Running(leader));
  ASSERT_TRUE(Running(server)) << "the wrapper's server did not outlive its leader: nothing to test";
  ASSERT_TRUE(g.Start()) << g.Output();
  EXPECT_FALSE(Running(server)) << "the server a wrapper left (pid " << server << ") runs beside the new one";
  EXPECT_NE(g.Output().find("outlived it"), std::string::npos) << g.Output();
  ASSERT_EQ(Call(g.port(), "POST", "/v1/rerank", R"({"model":"fake"})").status, 200);
}

// What a server started through a wrapper holds is its, not the wrapper's
// (measured by the leader's pid alone, it read 0: the declared profile stood
// in for good, and the server's memory was listed as another program's).
// So for a server whose memory is in processes it starts (Ollama's runners).
TEST_F(ExternalTest, AWrappedServersMemoryIsMeasuredWithItsGroup) {
  ScopedSimDir sim("external-group");
  ASSERT_TRUE(devices::SimLedger::Create(0, 1024ull << 20).ok());
  const std::string script = dir_ + "/wrap.sh";
  {
    std::ofstream f(script);
    f << "#!/bin/sh\n\"$@\" &\necho $! >> " << dir_ << "/servers\nwait\n";
  }
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  auto g = Start(TestConfig(2, "[[device]]\nname = \"sim:0\"\nheadroom_mib = 0\nheadroom_pct = 0\n"
                               "[[service]]\nname = \"fake\"\nkind = \"external\"\ncommand = \"" + script + " " +
                               FakeUpstream() + " --port ${PORT} --log " + log_ + " --sim-device 0 --resident-mib 300" +
                               "\"\nroutes = { \"/v1/rerank\" = \"/v1/rerank\" }\ndevice = \"sim:0\"\nresident_mib = 50\n"));
  json st = json::object();
  for (int i = 0; i < 100 && st.value("resident_source", "") != "measured"; ++i) {
    std::this_thread::sleep_for(50ms);
    st = ExternalStatus(g->port(), "fake").value("memory", json::object());
  }
  EXPECT_EQ(st["resident_bytes"], 300ull << 20) << "the server's, not its wrapper's: " << st.dump();
  EXPECT_EQ(st["resident_source"], "measured");
  pid_t server = 0;
  {
    std::ifstream f(dir_ + "/servers");
    f >> server;
  }
  ASSERT_GT(server, 0);
  json dev;
  const json status = Body(Call(g->port(), "GET", "/v1/status"));
  for (const auto& d : status["devices"]) {
    if (d["name"] == "sim:0") dev = d;
  }
  ASSERT_TRUE(dev.is_object()) << status.dump();
  for (const auto& o : dev.value("other_processes", json::array())) {
    EXPECT_NE(o["pid"], server) << "the wrapped server is listed as another program: " << dev.dump(1);
  }
  // Its host RAM too: the server's (proportional) resident set, not the shell's alone.
  const auto server_rss = devices::HostTelemetry().ProcessPss(server);
  ASSERT_TRUE(server_rss.ok());
  for (int i = 0; i < 60 && ExternalStatus(g->port(), "fake")["memory"].value("host_rss_bytes", uint64_t{0}) < *server_rss;
       ++i) {
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_GE(ExternalStatus(g->port(), "fake")["memory"].value("host_rss_bytes", uint64_t{0}), *server_rss * 9 / 10);
}

// An on-demand server that cannot start is started again only for a request
// that wants it: restarted for nobody, a model that cannot load was reloaded
// every 30 s for good, unloading other services' models for its room. And
// what it says is its own: a start that wrote nothing does not show the
// line an earlier start wrote.
TEST_F(ExternalTest, AnOnDemandServerThatFailsToStartWaitsForTheNextRequest) {
  const std::string script = dir_ + "/broken.sh";
  {
    std::ofstream f(script);
    f << "#!/bin/sh\necho x >> " << dir_ << "/starts\n"
      << "[ \"$(wc -l < " << dir_ << "/starts)\" -eq 1 ] && echo 'first start: cannot open the model' >&2\nexit 3\n";
  }
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  auto g = Start(TestConfig(2, "[[service]]\nname = \"broken\"\nkind = \"external\"\ncommand = \"" + script +
                                   " ${PORT}\"\nroutes = { \"/v1/rerank\" = \"/v1/rerank\" }\n"
                                   "residency = \"on_demand\"\nstart_timeout_s = 1\npriority = \"background\"\n"));
  auto starts = [&] { return LinesWith(dir_ + "/starts", "x"); };
  auto r = Call(g->port(), "POST", "/v1/rerank", R"({"model":"broken"})", {{"X-Request-Timeout", "1.5"}});
  EXPECT_NE(r.status, 200) << r.body;
  json st;
  for (int i = 0; i < 100; ++i) {  // its last start ends
    st = ExternalStatus(g->port(), "broken");
    if (st["state"] == "stopped" && st.value("pid", 0) == 0) break;
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_EQ(st["state"], "stopped") << st.dump();
  const int tried = starts();
  ASSERT_GE(tried, 2) << st.dump();
  EXPECT_EQ(st.value("last_error", "").find("first start"), std::string::npos)
      << "a later start that wrote nothing shows the first one's line: " << st.dump();
  // Nobody wants it: it stays stopped (its backoff was 1-2 s).
  std::this_thread::sleep_for(3500ms);
  EXPECT_EQ(starts(), tried) << ExternalStatus(g->port(), "broken").dump();
  EXPECT_EQ(ExternalStatus(g->port(), "broken")["state"], "stopped");
  // The next request starts it again.
  (void)Call(g->port(), "POST", "/v1/rerank", R"({"model":"broken"})", {{"X-Request-Timeout", "1"}});
  EXPECT_GT(starts(), tried);
}

TEST_F(ExternalTest, MemoryOnTheDeviceIsMeasuredAndATransientPeakWaitsForRoom) {
  ScopedSimDir sim("external");
  ASSERT_TRUE(devices::SimLedger::Create(0, 1024ull << 20).ok());
  auto g = Start(TestConfig(2, "[[device]]\nname = \"sim:0\"\nheadroom_mib = 0\nheadroom_pct = 0\n" +
                                   FakeService("fake", log_, "device = \"sim:0\"\nresident_mib = 50\ntransient_mib = 600\n",
                                               " --sim-device 0 --resident-mib 300")));
  json st = WaitExternalReady(g->port(), "fake", 100);
  EXPECT_EQ(st["memory"]["resident_bytes"], 300ull << 20) << "measured replaces the declared 50 MiB: " << st.dump();
  EXPECT_EQ(st["memory"]["resident_source"], "measured");
  // 724 MiB free: a request's declared 600 MiB peak fits; while someone else
  // holds 300 MiB it does not, and the request waits (told why) until it does.
  auto used = [] {
    auto l = devices::SimLedger::Open(0);
    return l.ok() ? (*l)->Snapshot().used : 0;
  };
  const uint64_t before = used();
  pid_t holder = SpawnTool({"sim", "hold", "sim:0", "--mib", "300", "--seconds", "2"}, "spillway");
  for (int i = 0; i < 400 && used() < before + (300ull << 20); ++i) std::this_thread::sleep_for(5ms);
  ASSERT_GE(used(), before + (300ull << 20)) << "the hold never took its memory";
  const auto t0 = std::chrono::steady_clock::now();
  auto r = Call(g->port(), "POST", "/v1/rerank", R"({"model":"fake","fake_transient_mib":200})");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_GT(std::chrono::steady_clock::now() - t0, 1s) << "waited for the hold to expire";
  kill(holder, SIGTERM);
  waitpid(holder, nullptr, 0);
}

// Two services on one device: a request of the second leaves room for the
// peak of the first's request already sent there. (Counted per service, it
// saw 824 MiB free, needed its own 450 and went at once, where the first's
// 450 MiB peak might still come.)
TEST_F(ExternalTest, ATransientPeakLeavesRoomForAnotherServicesRequestOnTheDevice) {
  ScopedSimDir sim("external-two");
  ASSERT_TRUE(devices::SimLedger::Create(0, 1024ull << 20).ok());
  const std::string device = "device = \"sim:0\"\nresident_mib = 100\ntransient_mib = 450\n";
  auto g = Start(TestConfig(2, "[[device]]\nname = \"sim:0\"\nheadroom_mib = 0\nheadroom_pct = 0\n" +
                                   FakeService("a", log_, device, " --sim-device 0 --resident-mib 100") +
                                   FakeService("b", log_, device, " --sim-device 0 --resident-mib 100")));
  for (const char* name : {"a", "b"}) {
    const json st = WaitExternalReady(g->port(), name);
    ASSERT_EQ(st.value("state", ""), "ready") << st.dump();
  }
  // 824 MiB free: a's request (its peak declared 450 MiB) goes; b's, while
  // a's runs, needs 450 more than that and waits for it to end.
  auto first = std::async(std::launch::async, [&] {
    return Call(g->port(), "POST", "/v1/rerank", R"({"model":"a","fake_delay_ms":2000})", {{"X-Request-Id", "room-a"}});
  });
  for (int i = 0; i < 200 && LinesWith(log_, "room-a") == 0; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(LinesWith(log_, "room-a"), 1) << "a's request never reached its server";
  const auto t0 = std::chrono::steady_clock::now();
  auto second = Call(g->port(), "POST", "/v1/rerank", R"({"model":"b"})");
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(second.status, 200) << second.body;
  EXPECT_EQ(first.get().status, 200);
  EXPECT_GT(waited, 1s) << "b's request went while a's peak could still come";
}

// A server's start leaves room for the peak of a request already sent on
// the device: b (on demand, 500 MiB) waits for a's request (its peak
// declared 450 MiB, not allocated yet) to end before it loads. The start
// gate read 924 MiB free and started b at once, on the room a's request
// was sent with.
TEST_F(ExternalTest, AServersStartLeavesRoomForAPeakAlreadySentOnTheDevice) {
  ScopedSimDir sim("external-start");
  ASSERT_TRUE(devices::SimLedger::Create(0, 1024ull << 20).ok());
  auto g = Start(TestConfig(2, "[[device]]\nname = \"sim:0\"\nheadroom_mib = 0\nheadroom_pct = 0\n" +
                                   FakeService("a", log_, "device = \"sim:0\"\nresident_mib = 100\ntransient_mib = 450\n",
                                               " --sim-device 0 --resident-mib 100") +
                                   FakeService("b", log_,
                                               "device = \"sim:0\"\nresident_mib = 500\nresidency = \"on_demand\"\n",
                                               " --sim-device 0 --resident-mib 500")));
  const json st = WaitExternalReady(g->port(), "a");
  ASSERT_EQ(st.value("state", ""), "ready") << st.dump();
  ASSERT_EQ(ExternalStatus(g->port(), "b").value("state", ""), "stopped");
  auto first = std::async(std::launch::async, [&] {
    return Call(g->port(), "POST", "/v1/rerank", R"({"model":"a","fake_delay_ms":2000})", {{"X-Request-Id", "start-a"}});
  });
  for (int i = 0; i < 200 && LinesWith(log_, "start-a") == 0; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(LinesWith(log_, "start-a"), 1) << "a's request never reached its server";
  const auto t0 = std::chrono::steady_clock::now();
  auto second = Call(g->port(), "POST", "/v1/rerank", R"({"model":"b"})");
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(second.status, 200) << second.body;
  EXPECT_EQ(first.get().status, 200);
  EXPECT_GT(waited, 1s) << "b loaded while a's peak could still come";
}

TEST_F(ExternalTest, WhisperServerTranscribesBehindTheGateway) {
  if (const std::string why = WhisperServerMissing(); !why.empty()) GTEST_SKIP() << why;
  const std::string model = WriteWhisperModelFile(dir_ + "/tiny-whisper.bin");
  std::ostringstream os;
  os << "[[service]]\nname = \"whisper\"\nkind = \"external\"\nmodel = \"" << model << "\"\n"
     << "command = \"" << EnvOr("WHISPER_SERVER") << " --host 127.0.0.1 --port ${PORT} -m ${MODEL} -t 2\"\n"
     << "routes = { \"/v1/audio/transcriptions\" = \"/inference\" }\nidempotent = true\n";
  auto g = Start(TestConfig(2, os.str()));
  const std::string boundary = "spillway-whisper";
  const std::string body =
      Multipart(boundary, {{"model", "whisper"}, {"temperature", "0"}, {"temperature_inc", "0"}, {"response_format", "json"}},
                WavBytes(440, 1));
  auto r = Call(g->port(), "POST", "/v1/audio/transcriptions", body,
                {{"Content-Type", "multipart/form-data; boundary=" + boundary}, {"X-Request-Id", "wh-1"}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(Body(r)["text"].is_string()) << r.body;
  // The same clip straight to a whisper-server of our own: the same text.
  WhisperServer direct(model, MakeScratchDir());
  ASSERT_TRUE(direct.ready());
  EXPECT_EQ(Body(r)["text"], TranscriptText(direct.Transcribe(WavBytes(440, 1))));
  EXPECT_EQ(WaitTerminal(g->port(), "wh-1")["state"], "completed");
}

TEST_F(ExternalTest, LlamaServerStartedBySpillwayAndAServerThatRunsAlready) {
  const std::string llama_server = EnvOr("LLAMA_SERVER");
  if (llama_server.empty()) GTEST_SKIP() << "LLAMA_SERVER is not set (run through ctest)";
  // A server Spillway did not start: the fake upstream, on a port it picks and prints.
  const pid_t running = SpawnProcess({FakeUpstream(), "--port", "0", "--log", log_}, dir_ + "/running.out", dir_ + "/running.err");
  uint16_t port = 0;
  for (int i = 0; i < 200 && port == 0; ++i) {
    std::this_thread::sleep_for(20ms);
    std::sscanf(ReadTextFile(dir_ + "/running.out").c_str(), "fake-upstream listening on %hu", &port);
  }
  ASSERT_NE(port, 0);
  std::ostringstream os;
  os << "[[service]]\nname = \"lsrv\"\nkind = \"external\"\nmodel = \"" << ModelPath("tiny-embed") << "\"\n"
     << "command = \"" << llama_server
     << " -m ${MODEL} --host 127.0.0.1 --port ${PORT} --embeddings -c 512 -t 1 --no-warmup\"\n"
     << "routes = { \"/v1/embeddings\" = \"/v1/embeddings\" }\nidempotent = true\n"
     << "[[service]]\nname = \"running\"\nkind = \"external\"\nurl = \"http://127.0.0.1:" << port << "\"\n"
     << "routes = { \"/v1/rerank\" = \"/v1/rerank\" }\nstart_timeout_s = 6\n";  // (its restart fits, loaded too)
  auto g = Start(TestConfig(2, os.str()));
  // llama.cpp's own server behind the gateway's /v1/embeddings.
  auto e = Call(g->port(), "POST", "/v1/embeddings", R"({"model":"lsrv","input":"hello world"})");
  ASSERT_EQ(e.status, 200) << e.body;
  const json ej = Body(e);
  ASSERT_TRUE(ej["data"][0]["embedding"].is_array()) << e.body;
  EXPECT_GT(ej["data"][0]["embedding"].size(), 8u);
  // The embed service of the same file, through spillway-worker: the same dimension.
  auto w = Call(g->port(), "POST", "/v1/embeddings", R"({"model":"embed","input":"hello world"})");
  ASSERT_EQ(w.status, 200) << w.body;
  EXPECT_EQ(Body(w)["data"][0]["embedding"].size(), ej["data"][0]["embedding"].size());
  // The server that runs already: proxied, shown as not Spillway's to start or stop.
  auto r = Call(g->port(), "POST", "/v1/rerank", R"({"model":"running","query":"q"})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r)["path"], "/v1/rerank");
  EXPECT_EQ(ExternalStatus(g->port(), "running")["state"], "external");
  // Restarted: a request that cannot reach it meanwhile waits (nothing was
  // sent) and is served once it is back. It was answered 502 within a
  // second, its three tries spent on refused connections.
  kill(running, SIGKILL);
  waitpid(running, nullptr, 0);
  auto waiting = std::async(std::launch::async, [&] {
    return Call(g->port(), "POST", "/v1/rerank", R"({"model":"running","query":"q"})", {{"X-Request-Id", "back-1"}});
  });
  for (int i = 0; i < 500 && Body(Call(g->port(), "GET", "/v1/requests/back-1")).value("attempts", 0) < 3; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  // Queued between its tries, told why (it read as waiting for its turn).
  std::string reason;
  for (int i = 0; i < 500 && reason.find("trying again") == std::string::npos; ++i) {
    reason = Body(Call(g->port(), "GET", "/v1/requests/back-1")).value("queue", json::object()).value("reason", "");
    if (reason.find("trying again") == std::string::npos) std::this_thread::sleep_for(10ms);
  }
  EXPECT_NE(reason.find("service 'running' could not be reached ("), std::string::npos) << reason;
  EXPECT_NE(reason.find("); trying again in "), std::string::npos) << reason;
  const pid_t back = SpawnProcess({FakeUpstream(), "--port", std::to_string(port), "--log", log_}, dir_ + "/back.out",
                                  dir_ + "/back.err");
  r = waiting.get();
  EXPECT_EQ(r.status, 200) << r.body;
  kill(back, SIGKILL);
  waitpid(back, nullptr, 0);
  // Gone for longer than its start_timeout_s: 502, not hung.
  const auto t0 = std::chrono::steady_clock::now();
  r = Call(g->port(), "POST", "/v1/rerank", R"({"model":"running","query":"q"})");
  EXPECT_EQ(r.status, 502) << r.body;
  EXPECT_NE(r.body.find("could not be reached"), std::string::npos) << r.body;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 15s);
  // Known gone for longer than that: the next request is answered at its
  // first refused connection. It waited its own start_timeout_s again (a
  // line of them failed one batch of `concurrency` at a time).
  const auto t1 = std::chrono::steady_clock::now();
  r = Call(g->port(), "POST", "/v1/rerank", R"({"model":"running","query":"q"})");
  EXPECT_EQ(r.status, 502) << r.body;
  EXPECT_LT(std::chrono::steady_clock::now() - t1, 2s) << "its own start_timeout_s waited again";
  // The status says so (it has no health checks: its last request tells).
  const json gone = ExternalStatus(g->port(), "running");
  EXPECT_EQ(gone["state"], "unreachable") << gone.dump();
  EXPECT_FALSE(gone.value("last_error", "").empty()) << gone.dump();
}

}  // namespace
}  // namespace spillway::testing
