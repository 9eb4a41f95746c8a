// `spillway status` and `spillway requests` against a running gateway.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include <cstdio>
#include <string>
#include <thread>

#include "cli/status_command.h"
#include "fake_worker.h"
#include "gateway_calls.h"
#include "gateway_process.h"
#include "worker_process.h"

namespace spillway::testing {
namespace {

using nlohmann::json;

struct CliRun {
  int code = -1;
  std::string out;  // stdout and stderr
};

CliRun Spillway(const std::string& env, const std::string& args) {
  const std::string cmd = env + " " + BinDir() + "/spillway " + args + " 2>&1";
  CliRun r;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) r.out.append(buf, n);
  const int st = pclose(f);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

size_t Count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST(StatusCommandTest, TablesJsonWatchAndCancellingARequest) {
  GatewayProcess gw(TestConfig(1, "api_keys = [\"sk-a\"]\n"));
  ASSERT_TRUE(gw.Start()) << gw.Output();
  const std::string url = "--url http://127.0.0.1:" + std::to_string(gw.port());
  const std::string key = "SPILLWAY_API_KEY=sk-a";

  CliRun r = Spillway(key, "status " + url);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"SERVICE", "chat", "embed", "ready", "DEVICE", "cpu", "weights", "no request is running"}) {
    EXPECT_NE(r.out.find(s), std::string::npos) << s << " in\n" << r.out;
  }
  // Without the key: the gateway's refusal and what to do.
  r = Spillway("SPILLWAY_API_KEY=", "status " + url);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("401"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("SPILLWAY_API_KEY"), std::string::npos) << r.out;
  // Nobody there.
  r = Spillway(key, "status --url http://127.0.0.1:1");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("no gateway answers at 127.0.0.1:1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("is it running?"), std::string::npos) << r.out;
  // A command's typo says so, and the closest command (it said "A subcommand is required").
  r = Spillway("", "statsu");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("no command 'statsu' (did you mean 'status'?)"), std::string::npos) << r.out;
  // An option without its value, another option after it: refused, not
  // taken as the value (serve started on the demo with a state directory
  // named --check). A flag before an option is no such case.
  r = Spillway("", "serve --state-dir --check");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--state-dir needs a value, and '--check' is an option"), std::string::npos) << r.out;
  r = Spillway("", "--help serve");  // (no command first: the check above looked it up, and aborted)
  EXPECT_EQ(r.code, 0) << r.out;
  r = Spillway("", "serve --check --config /nonexistent/spillway.toml");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("cannot read config file /nonexistent/spillway.toml"), std::string::npos) << r.out;

  r = Spillway(key, "status --json " + url);
  ASSERT_EQ(r.code, 0) << r.out;
  const json j = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j["services"].size(), 2u);

  r = Spillway(key + " timeout -s INT 3", "status --watch 0.5 " + url);  // (two redraws, loaded too)
  EXPECT_GE(Count(r.out, "\x1b[2J"), 2u) << r.out;

  // A running request and one waiting behind it (one slot).
  auto post = [&](const std::string& id) {
    const uint16_t p = gw.port();
    return std::thread([p, id] {
      (void)http::Fetch("127.0.0.1", p, "POST", "/v1/chat/completions", Chat(4000),
                        {{"Authorization", "Bearer sk-a"}, {"X-Request-Id", id}}, std::chrono::seconds(120));
    });
  };
  std::thread a = post("cli-running");
  for (int i = 0; i < 500 && Spillway(key, "requests list " + url).out.find("cli-running") == std::string::npos; ++i) {}
  std::thread b = post("cli-waiting");
  for (int i = 0; i < 200; ++i) {
    r = Spillway(key, "requests " + url);  // `list` is the default
    if (r.out.find("cli-waiting") != std::string::npos) break;
  }
  EXPECT_NE(r.out.find("REQUEST"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cli-waiting  chat     waiting"), std::string::npos) << r.out;
  r = Spillway(key, "requests cancel cli-waiting " + url);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, "cli-waiting: cancelled\n");
  r = Spillway(key, "requests show cli-waiting " + url);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.rfind("cli-waiting  cancelled  service chat", 0), 0u) << r.out;
  r = Spillway(key, "requests show cli-waiting --json " + url);
  EXPECT_EQ(json::parse(r.out, nullptr, false).value("state", ""), "cancelled") << r.out;
  r = Spillway(key, "requests show nope " + url);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("404"), std::string::npos) << r.out;
  // An id is one path segment: "cli-waiting?x=1" is not request cli-waiting
  // (as typed, its query was dropped and cli-waiting shown, or cancelled).
  r = Spillway(key, "requests show 'cli-waiting?x=1' " + url);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("404"), std::string::npos) << r.out;
  EXPECT_EQ(Spillway(key, "requests cancel cli-running " + url).code, 0);
  a.join();
  b.join();
  // The incidents section tells both cancels (each once its end's rows are
  // committed, moments after the client heard of it).
  for (int i = 0; i < 200; ++i) {
    r = Spillway(key, "status " + url);
    if (Count(r.out, "  cancelled  chat: cli-") >= 2) break;
  }
  EXPECT_NE(r.out.find("RECENT INCIDENTS"), std::string::npos) << r.out;
  EXPECT_EQ(Count(r.out, "  cancelled  chat: cli-"), 2u) << r.out;
}

// A --url that answers what a Spillway gateway would not (another server,
// an Ollama-shaped error, a JSON array): a clear message and exit 1, never
// an abort and a core dump (nlohmann's type errors were uncaught).
// External servers have rows of their own: their state (an unreachable one
// says why and for how long) and, on a device, what they hold or their
// resident size (they printed as "weights 0.0 MiB, KV 0.0 MiB" and no state).
TEST(StatusCommandTest, ExternalServersShowTheirStateAndMemory) {
  const json status = {
      {"services", json::array()},
      {"externals",
       {{{"name", "rerank"}, {"state", "unreachable"}, {"url", "http://127.0.0.1:9"}, {"unreachable_s", 42.0},
         {"last_error", "connection refused"}, {"requests", {{"running", 0}, {"waiting", 2}}}}}},
      {"devices",
       {{{"name", "sim:0"}, {"total_bytes", 1 << 30}, {"used_bytes", 0}, {"free_bytes", 1 << 30},
         {"services", {{{"kind", "external"}, {"service", "rerank"}, {"held_bytes", 0}, {"resident_bytes", 8 << 20}}}}}}},
      {"requests", json::array()}};
  const std::string out = cli::StatusTable(status);
  EXPECT_NE(out.find("unreachable"), std::string::npos) << out;
  EXPECT_NE(out.find("rerank: unreachable for 42 s: connection refused"), std::string::npos) << out;
  EXPECT_NE(out.find("rerank (external): 8.0 MiB resident"), std::string::npos) << out;
  EXPECT_EQ(out.find("weights"), std::string::npos) << out;
}

TEST(StatusCommandTest, AServerThatIsNotAGatewayIsAClearError) {
  FakeWorker odd([](http::Request& req, std::shared_ptr<http::Exchange> ex) {
    const std::string target(req.target());
    if (target == "/v1/status") return ex->Respond(http::MakeResponse(200, "[]", "application/json"));
    ex->Respond(http::MakeResponse(404, R"({"error":"not found"})", "application/json"));
  });
  ASSERT_TRUE(odd.ok());
  const std::string url = "--url http://127.0.0.1:" + std::to_string(odd.port());
  CliRun r = Spillway("", "status " + url);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("not a Spillway gateway's"), std::string::npos) << r.out;
  r = Spillway("", "requests show some-id " + url);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("answered 404: not found"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace spillway::testing
