// Hostile input and hostile neighbours (issue 7): bodies that used to crash
// the gateway and its workers, other tenants' requests, workers called past
// the gateway, private state, connections beyond the file-descriptor limit,
// requests that wait for a busy worker. After each, the gateway and its
// workers still answer a normal request and nothing acknowledged is lost.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <nlohmann/json.hpp>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <regex>
#include <sstream>
#include <thread>

#include "api/http_client.h"
#include "gateway_calls.h"
#include "gateway_process.h"
#include "journal_check.h"
#include "worker_process.h"

namespace spillway::testing {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;
namespace net = boost::asio;

const http::HeaderList kA = {{"Authorization", "Bearer key-a"}};
const http::HeaderList kB = {{"Authorization", "Bearer key-b"}};
const http::HeaderList kOp = {{"Authorization", "Bearer key-op"}};

std::string Nested(size_t depth) { return std::string(depth, '[') + "1" + std::string(depth, ']'); }

unsigned ModeOf(const std::string& p) {
  struct stat st {};
  ::stat(p.c_str(), &st);
  return st.st_mode & 07777;
}

std::string ReadText(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Nothing acknowledged is lost: once what a test started has settled, every
// request the journal accepted is in exactly one terminal state.
void ExpectJournalSettles(const std::string& state_dir) {
  JournalCheck j;
  for (int i = 0; i < 500; ++i) {
    j = CheckJournal(state_dir);
    if (j.problems.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(j.problems.empty()) << ::testing::PrintToString(j.problems);
}

// Resident memory of a process, in MiB.
double RssMiB(pid_t pid) {
  std::istringstream in(ReadText("/proc/" + std::to_string(pid) + "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return -1;
}

class HostileTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    gw_ = new GatewayProcess(TestConfig(2, "api_keys = [\"key-a\", \"key-b\"]\noperator_keys = [\"key-op\"]\n"
                                           "max_requests_per_key = 3\n"));
    setenv("SPILLWAY_API_KEYS", "key-env", 1);  // must not reach the workers
    const bool started = gw_->Start(std::chrono::seconds(60), false);
    unsetenv("SPILLWAY_API_KEYS");
    ASSERT_TRUE(started) << gw_->Output();
    for (int i = 0; i < 3000; ++i) {  // /readyz is open; wait for both services
      if (Call(gw_->port(), "GET", "/readyz").status == 200) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  static void TearDownTestSuite() {
    delete gw_;
    gw_ = nullptr;
  }
  void TearDown() override { ExpectJournalSettles(gw_->state_dir()); }
  static json Worker(const std::string& service) {
    json s = Body(Call(gw_->port(), "GET", "/v1/status", "", kOp));
    for (const auto& svc : s["services"]) {
      if (svc["name"] == service) return svc["placements"][0];
    }
    return json();
  }
  // A normal request through the gateway, and the chat worker's health.
  static void StillServes() {
    auto r = Call(gw_->port(), "POST", "/v1/chat/completions", Chat(4), kA);
    EXPECT_EQ(r.status, 200) << r.body;
    const json w = Worker("chat");
    auto h = http::Fetch("127.0.0.1", w["port"].get<uint16_t>(), "GET", "/health", "", WorkerAuth());
    ASSERT_TRUE(h.ok());
    EXPECT_EQ(h->status, 200);
  }
  static GatewayProcess* gw_;
};
GatewayProcess* HostileTest::gw_ = nullptr;

TEST_F(HostileTest, DeeplyNestedBodiesAre400AtTheGatewayAndAtTheWorker) {
  const uint16_t p = gw_->port();
  // 100,000 levels in an unknown field: about 200 kB.
  const std::string unknown = R"({"model":"chat","messages":[{"role":"user","content":"x"}],"x":)" + Nested(100000) + "}";
  auto r = Call(p, "POST", "/v1/chat/completions", unknown, kA);
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("json_max_depth"), std::string::npos) << r.body;
  // ... and inside tools[].parameters.
  const std::string tools = R"({"model":"chat","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function",)"
                            R"("function":{"name":"f","parameters":{"type":"object","properties":{"a":)" +
                            Nested(100000) + "}}}}]}";
  r = Call(p, "POST", "/v1/chat/completions", tools, kA);
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("deeper than 64 levels"), std::string::npos) << r.body;
  // The same body sent to the worker directly (with its secret).
  const uint16_t wp = Worker("chat")["port"].get<uint16_t>();
  auto w = http::Fetch("127.0.0.1", wp, "POST", "/v1/chat/completions", unknown, WorkerAuth());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->status, 400) << w->body;
  auto tok = http::Fetch("127.0.0.1", wp, "POST", "/v1/worker/tokenize?endpoint=chat", tools, WorkerAuth());
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ(tok->status, 400);
  StillServes();
}

TEST_F(HostileTest, RequestsBelongToTheKeyThatMadeThem) {
  const uint16_t p = gw_->port();
  auto mine = Call(p, "POST", "/v1/completions", json{{"model", "chat"}, {"prompt", "x"}, {"max_tokens", 2}}.dump(), kA);
  ASSERT_EQ(mine.status, 200) << mine.body;
  const std::string id = mine.Header("x-request-id");
  EXPECT_TRUE(std::regex_match(id, std::regex("req_[0-9a-f]{24}"))) << id;
  EXPECT_EQ(Call(p, "GET", "/v1/requests/" + id, "", kA).status, 200);
  auto other = Call(p, "GET", "/v1/requests/" + id, "", kB);
  EXPECT_EQ(other.status, 404) << other.body;
  EXPECT_EQ(other.body.find("result"), std::string::npos);  // nothing of A's answer
  EXPECT_EQ(Call(p, "DELETE", "/v1/requests/" + id, "", kB).status, 404);
  EXPECT_EQ(Call(p, "GET", "/v1/requests/" + id, "", kOp).status, 200);  // the operator sees everything

  // B cannot cancel A's running request; the operator can.
  http::HeaderList a_named = kA;
  a_named.emplace_back("X-Request-Id", "owned-running");
  auto running = std::async(std::launch::async, [&] { return Call(p, "POST", "/v1/chat/completions", Chat(3500), a_named); });
  for (int i = 0; i < 500 && Body(Call(p, "GET", "/v1/requests/owned-running", "", kA)).value("state", "") != "running"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(Call(p, "DELETE", "/v1/requests/owned-running", "", kB).status, 404);
  EXPECT_EQ(Body(Call(p, "GET", "/v1/requests/owned-running", "", kA))["state"], "running");
  EXPECT_EQ(Call(p, "DELETE", "/v1/requests/owned-running", "", kOp).status, 200);
  EXPECT_EQ(running.get().status, 499);
  EXPECT_EQ(WaitTerminal(p, "owned-running", 60, kA)["state"], "cancelled");
}

TEST_F(HostileTest, EachKeyHasABoundedNumberOfRequestsInFlight) {
  const uint16_t p = gw_->port();
  std::vector<std::future<http::ClientResponse>> held;
  for (int i = 0; i < 3; ++i) {
    http::HeaderList h = kA;
    h.emplace_back("X-Request-Id", "per-key-" + std::to_string(i));
    // Two run (their cells fit the pool together), the third waits for a
    // slot; long enough to be running still at the end, on a loaded machine too.
    held.push_back(std::async(std::launch::async, [p, h] { return Call(p, "POST", "/v1/chat/completions", Chat(3500), h); }));
  }
  for (int i = 0; i < 500; ++i) {  // all three accepted (running or waiting for a slot)
    int known = 0;
    for (int k = 0; k < 3; ++k) known += Call(p, "GET", "/v1/requests/per-key-" + std::to_string(k), "", kA).status == 200;
    if (known == 3) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto fourth = Call(p, "POST", "/v1/chat/completions", Chat(2), kA);
  EXPECT_EQ(fourth.status, 429) << fourth.body;
  EXPECT_EQ(fourth.Header("retry-after"), "1");
  EXPECT_NE(fourth.body.find("max_requests_per_key"), std::string::npos);
  // The same key however its scheme is written: the same places (and requests).
  auto spelled = Call(p, "POST", "/v1/chat/completions", Chat(2), {{"Authorization", "BEARER   key-a"}});
  EXPECT_EQ(spelled.status, 429) << spelled.body;
  EXPECT_EQ(Call(p, "GET", "/v1/requests/per-key-0", "", {{"Authorization", "bearer key-a"}}).status, 200);
  // Another key is not affected.
  auto other = Call(p, "POST", "/v1/embeddings", json{{"model", "embed"}, {"input", "x"}}.dump(), kB);
  EXPECT_EQ(other.status, 200) << other.body;
  for (int k = 0; k < 3; ++k) Call(p, "DELETE", "/v1/requests/per-key-" + std::to_string(k), "", kA);
  for (auto& f : held) EXPECT_EQ(f.get().status, 499);
  StillServes();
}

TEST_F(HostileTest, InternalFieldsFromClientsAreDropped) {
  const uint16_t p = gw_->port();
  const json plain = {{"model", "chat"}, {"prompt", "The fox"}, {"max_tokens", 6}, {"temperature", 0}};
  json resumed = plain;
  resumed["spillway_resume"] = {{"tokens", {999999, 1, 2}}, {"text_bytes", 3}};
  auto a = Call(p, "POST", "/v1/completions", plain.dump(), kA);
  auto b = Call(p, "POST", "/v1/completions", resumed.dump(), kA);
  ASSERT_EQ(a.status, 200) << a.body;
  ASSERT_EQ(b.status, 200) << b.body;  // not a continuation, not an error naming a token
  EXPECT_EQ(Body(a)["choices"][0]["text"], Body(b)["choices"][0]["text"]);
  // Malformed, dropped as well (it was refused: 400 naming a field the client need not know).
  json malformed = plain;
  malformed["spillway_resume"] = "not an object";
  malformed["spillway_drop_messages"] = {{"x", 1}};
  auto c = Call(p, "POST", "/v1/completions", malformed.dump(), kA);
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(Body(a)["choices"][0]["text"], Body(c)["choices"][0]["text"]);
}

TEST_F(HostileTest, WorkersAnswerOnlyTheirGateway) {
  const json w = Worker("chat");
  const uint16_t wp = w["port"].get<uint16_t>();
  const std::string body = json{{"prompt", "x"}, {"max_tokens", 2}}.dump();
  auto no_secret = http::Fetch("127.0.0.1", wp, "POST", "/v1/completions", body);
  ASSERT_TRUE(no_secret.ok());
  EXPECT_EQ(no_secret->status, 401) << no_secret->body;
  auto wrong = http::Fetch("127.0.0.1", wp, "POST", "/v1/worker/faults", R"({"faults":["lose-device"]})", {},
                           std::chrono::seconds(5));
  EXPECT_EQ(wrong->status, 401);
  EXPECT_EQ(http::Fetch("127.0.0.1", wp, "DELETE", "/v1/worker/requests/someone", "")->status, 401);
  auto rebound = http::Fetch("127.0.0.1", wp, "POST", "/v1/completions", body, WorkerAuth({{"Host", "evil.example"}}));
  EXPECT_EQ(rebound->status, 403) << rebound->body;
  auto browser = http::Fetch("127.0.0.1", wp, "POST", "/v1/completions", body, WorkerAuth({{"Origin", "http://evil.example"}}));
  EXPECT_EQ(browser->status, 403);
  EXPECT_EQ(http::Fetch("127.0.0.1", wp, "POST", "/v1/completions", body, WorkerAuth())->status, 200);
  // The gateway's keys are not in a worker's environment.
  const std::string env = ReadText("/proc/" + std::to_string(w["pid"].get<int>()) + "/environ");
  ASSERT_FALSE(env.empty());
  EXPECT_EQ(env.find("SPILLWAY_API_KEYS"), std::string::npos);
  EXPECT_NE(env.find("PATH="), std::string::npos);
}

TEST_F(HostileTest, StateIsPrivate) {
  const std::string d = gw_->state_dir();
  EXPECT_EQ(ModeOf(d), 0700u);
  EXPECT_EQ(ModeOf(d + "/journal.db"), 0600u);
  EXPECT_EQ(ModeOf(d + "/logs/chat.0.log"), 0600u);
  EXPECT_EQ(ModeOf(d + "/run/chat.0.port"), 0600u);
  // A state directory others may write to is refused, with the fix named.
  const std::string open = (fs::temp_directory_path() / ("spillway-open-state-" + std::to_string(getpid()))).string();
  fs::create_directories(open);
  ::chmod(open.c_str(), 0777);
  const std::string cfg = open + ".toml";
  { std::ofstream(cfg) << TestConfig(1); }
  int rc = 0;
  const std::string out = RunCommand(BinDir() + "/spillway serve --config " + cfg + " --listen 127.0.0.1:0 --state-dir " +
                                     open + " 2>&1", &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("others may write"), std::string::npos) << out;
  fs::remove_all(open);
  fs::remove(cfg);
}

// A request that finds the worker busy waits without writing an attempt per
// retry: one attempt, journaled when it runs.
TEST_F(HostileTest, WaitingForABusyWorkerWritesOneAttempt) {
  const uint16_t p = gw_->port();
  const uint16_t wp = Worker("chat")["port"].get<uint16_t>();
  // Both slots taken behind the gateway's back: the worker answers "busy".
  std::vector<std::future<void>> hogs;
  for (int i = 0; i < 2; ++i) {
    hogs.push_back(std::async(std::launch::async, [wp, i] {
      (void)http::Fetch("127.0.0.1", wp, "POST", "/v1/completions",
                        json{{"prompt", "x"}, {"max_tokens", 3000}, {"ignore_eos", true}}.dump(),
                        WorkerAuth({{"X-Request-Id", "hog-" + std::to_string(i)}}), std::chrono::seconds(120));
    }));
  }
  auto info = [wp] {
    auto r = http::Fetch("127.0.0.1", wp, "GET", "/v1/worker/info", "", WorkerAuth(), std::chrono::seconds(5));
    return r.ok() ? json::parse(r->body, nullptr, false) : json::object();
  };
  json i0;
  for (int i = 0; i < 1000; ++i) {  // both hogs decoding
    i0 = info();
    if (i0.contains("slots") && i0["slots"]["busy"] == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(i0["slots"]["busy"], 2) << i0.dump();
  http::HeaderList h = kA;
  h.emplace_back("X-Request-Id", "waits-for-busy");
  auto waiting = std::async(std::launch::async, [&] { return Call(p, "POST", "/v1/chat/completions", Chat(2), h); });
  // Until the worker has answered it "busy" a few times (each retry is a request it receives).
  const uint64_t received = i0["requests"]["received"].get<uint64_t>();
  bool retried = false;
  for (int i = 0; i < 2000 && !retried; ++i) {
    retried = info()["requests"]["received"].get<uint64_t>() >= received + 3;
    if (!retried) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(retried) << info().dump();
  for (int i = 0; i < 2; ++i) {
    (void)http::Fetch("127.0.0.1", wp, "DELETE", "/v1/worker/requests/hog-" + std::to_string(i), "", WorkerAuth());
  }
  for (auto& f : hogs) f.get();
  EXPECT_EQ(waiting.get().status, 200);
  const json rec = WaitTerminal(p, "waits-for-busy", 60, kA);
  EXPECT_EQ(rec["state"], "completed");
  EXPECT_EQ(rec["attempts"], 1);
  EXPECT_EQ(rec["attempt_log"].size(), 1u) << rec.dump();

  // Six at once on two slots: they wait in the gateway, one attempt each.
  std::vector<std::future<http::ClientResponse>> six;
  for (int i = 0; i < 6; ++i) {
    http::HeaderList hi = (i % 2) ? kA : kB;
    hi.emplace_back("X-Request-Id", "six-" + std::to_string(i));
    six.push_back(std::async(std::launch::async, [p, hi] { return Call(p, "POST", "/v1/chat/completions", Chat(60), hi); }));
  }
  for (auto& f : six) EXPECT_EQ(f.get().status, 200);
  for (int i = 0; i < 6; ++i) {
    const json r = Body(Call(p, "GET", "/v1/requests/six-" + std::to_string(i), "", kOp));
    EXPECT_EQ(r["attempts"], 1) << r.dump();
  }
}

// While a stream runs, its client sends hundreds of MiB more: the gateway
// stops reading it instead of buffering it.
TEST_F(HostileTest, PipeliningDuringAStreamDoesNotGrowTheGateway) {
  const double before = RssMiB(gw_->pid());
  net::io_context ioc;
  net::ip::tcp::socket sock(ioc);
  sock.connect({net::ip::make_address("127.0.0.1"), gw_->port()});
  const std::string body = Chat(3900, true);  // long enough to outlast the flood (~2 s here)
  net::write(sock, net::buffer("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer key-a\r\n"
                               "X-Request-Id: flood\r\nContent-Type: application/json\r\nContent-Length: " +
                               std::to_string(body.size()) + "\r\n\r\n" + body));
  sock.non_blocking(true);
  const std::string chunk(1 << 20, 'G');
  size_t sent = 0;
  auto last = std::chrono::steady_clock::now();
  while (sent < (size_t{512} << 20) && std::chrono::steady_clock::now() - last < std::chrono::milliseconds(1500)) {
    boost::system::error_code ec;
    const size_t n = sock.write_some(net::buffer(chunk), ec);
    if (n > 0) {
      sent += n;
      last = std::chrono::steady_clock::now();
    } else if (ec && ec != net::error::would_block) {
      break;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  const double after = RssMiB(gw_->pid());
  std::printf("pipelining flood: sent %zu MiB, gateway RSS %.0f -> %.0f MiB\n", sent >> 20, before, after);
  EXPECT_LT(sent, size_t{128} << 20);
  EXPECT_LT(after - before, 64.0);
  sock.close();
  Call(gw_->port(), "DELETE", "/v1/requests/flood", "", kA);
  StillServes();
}

// With few file descriptors (a hard limit of 200) and 260 idle connections,
// the gateway refuses what it cannot hold and keeps serving; nothing throws
// out of the supervisor.
TEST(HostileFdTest, RunningOutOfFileDescriptorsDoesNotKillTheGateway) {
  GatewayProcess gw(TestConfig(1));
  gw.SetCommandPrefix({"/usr/bin/prlimit", "--nofile=200:200", "--"});
  ASSERT_TRUE(gw.Start()) << gw.Output();
  std::vector<std::unique_ptr<net::ip::tcp::socket>> idle;
  net::io_context ioc;
  for (int i = 0; i < 260; ++i) {
    auto s = std::make_unique<net::ip::tcp::socket>(ioc);
    boost::system::error_code ec;
    s->connect({net::ip::make_address("127.0.0.1"), gw.port()}, ec);
    if (!ec) idle.push_back(std::move(s));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // three health-check rounds
  EXPECT_EQ(::kill(gw.pid(), 0), 0) << gw.Output();
  idle.clear();
  int status = 0;
  for (int i = 0; i < 300 && status != 200; ++i) {
    auto r = http::Fetch("127.0.0.1", gw.port(), "POST", "/v1/chat/completions", Chat(2), {}, std::chrono::seconds(30));
    status = r.ok() ? r->status : 0;
    if (status != 200) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(status, 200) << gw.Output();
  const json s = Body(Call(gw.port(), "GET", "/v1/status"));
  EXPECT_EQ(s["services"][0]["placements"][0].value("restarts", 0), 0) << s.dump();
  ExpectJournalSettles(gw.state_dir());
}

// Each thread `spillway serve` starts fails in turn (the process or user
// thread limit): serve says so and exits 1, or, past its start, runs and
// stops cleanly. It ended in std::terminate (a joinable thread destroyed
// while unwinding) or hung for ever without listening (Asio's thread_pool
// joined its running threads without stopping them).
TEST(HostileThreadTest, AThreadThatCannotStartEndsServeWithAReasonNeverACrashOrAHang) {
  int ran = 0;
  for (int n = 1; n <= 60 && ran < 2; ++n) {
    GatewayProcess gw(TestConfig(1));
    gw.SetCommandPrefix({"/usr/bin/env", "FAIL_THREAD_AT=" + std::to_string(n), std::string("LD_PRELOAD=") + FAIL_THREAD_LIB});
    const bool up = gw.Start(std::chrono::seconds(30), /*wait_ready=*/false);
    if (up) {
      // Listening; a thread it starts after that (an event loop's) may still
      // fail, and then it ends by itself, saying why. Stopped once its loop
      // answers (or it has ended): a SIGTERM before its handler runs is not
      // what this test is about.
      for (int i = 0; i < 100; ++i) {
        if (http::Fetch("127.0.0.1", gw.port(), "GET", "/readyz", "", {}, std::chrono::seconds(1)).ok()) break;
        if (gw.Output().find("ulimit -u") != std::string::npos) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      gw.Stop();
      const int st = gw.exit_status();
      const bool said = gw.Output().find("ulimit -u") != std::string::npos;
      if (!said) ++ran;  // every thread of its start came up (the n-th is a later one)
      EXPECT_TRUE((WIFEXITED(st) && WEXITSTATUS(st) == 0) ||
                  (said && ((WIFEXITED(st) && WEXITSTATUS(st) == 1) || (WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM))))
          << "thread " << n << ": status " << st << "\n" << gw.Output();
      continue;
    }
    ran = 0;
    ASSERT_NE(gw.exit_status(), -1) << "thread " << n << ": neither listening nor ended after 30 s\n" << gw.Output();
    EXPECT_TRUE(WIFEXITED(gw.exit_status()) && WEXITSTATUS(gw.exit_status()) == 1)
        << "thread " << n << ": status " << gw.exit_status() << "\n" << gw.Output();
    EXPECT_NE(gw.Output().find("ulimit -u"), std::string::npos) << "thread " << n << ": no reason given\n" << gw.Output();
  }
  EXPECT_EQ(ran, 2) << "serve never started with every thread of its start";
}

}  // namespace
}  // namespace spillway::testing
