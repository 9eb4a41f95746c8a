// Integration tests of `spillway serve`: real gateway and worker processes.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>

#include <sys/wait.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "api/http_client.h"
#include "common/clock.h"
#include "gateway_calls.h"
#include "gateway_process.h"
#include "journal/journal.h"
#include "worker_process.h"

namespace spillway::testing {
namespace {

using nlohmann::json;

// The worker of a service, from /v1/status.
json WorkerStatus(uint16_t port, const std::string& service) {
  json s = Body(Call(port, "GET", "/v1/status"));
  for (const auto& svc : s["services"]) {
    if (svc["name"] == service) return svc["placements"][0];
  }
  return json();
}

// A count of the worker's requests: received, completed, failed, cancelled.
uint64_t WorkerCount(uint16_t gateway_port, const std::string& service, const char* which) {
  const json w = WorkerStatus(gateway_port, service);
  auto info = http::Fetch("127.0.0.1", w["port"].get<uint16_t>(), "GET", "/v1/worker/info", "", WorkerAuth());
  return json::parse(info->body)["requests"][which].get<uint64_t>();
}
uint64_t WorkerReceived(uint16_t gateway_port, const std::string& service) {
  return WorkerCount(gateway_port, service, "received");
}

class GatewayTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    gw_ = new GatewayProcess(TestConfig(2));
    ASSERT_TRUE(gw_->Start()) << gw_->Output();
  }
  static void TearDownTestSuite() {
    delete gw_;
    gw_ = nullptr;
  }
  static GatewayProcess* gw_;
};
GatewayProcess* GatewayTest::gw_ = nullptr;

TEST_F(GatewayTest, ServesEveryRouteWithRequestIds) {
  const uint16_t p = gw_->port();
  auto chat = Call(p, "POST", "/v1/chat/completions", Chat(8));
  ASSERT_EQ(chat.status, 200) << chat.body;
  const std::string id = chat.Header("x-request-id");
  EXPECT_EQ(Body(chat)["id"], id);
  EXPECT_EQ(Body(chat)["model"], "chat");
  EXPECT_EQ(Body(chat)["usage"]["completion_tokens"], 8);
  json rec = Body(Call(p, "GET", "/v1/requests/" + id));
  EXPECT_EQ(rec["state"], "completed");
  EXPECT_EQ(rec["attempts"], 1);
  EXPECT_EQ(rec["placement"], "cpu");
  EXPECT_EQ(rec["result"]["body"]["choices"][0]["message"]["content"], Body(chat)["choices"][0]["message"]["content"]);

  // The same chat again: its prompt is found in the worker's cache, and the usage says so (passed on as the worker wrote it).
  auto again = Call(p, "POST", "/v1/chat/completions", Chat(8));
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(Body(again)["usage"]["prompt_tokens_details"]["cached_tokens"], Body(again)["usage"]["prompt_tokens"].get<int>() - 1);

  auto stream = Call(p, "POST", "/v1/chat/completions", Chat(8, true));
  ASSERT_EQ(stream.status, 200);
  EXPECT_EQ(http::ParseSseData(stream.body).back(), "[DONE]");
  json srec = WaitTerminal(p, stream.Header("x-request-id"));
  EXPECT_EQ(srec["state"], "completed");
  EXPECT_NE(srec["result"]["text"].get<std::string>().find("[DONE]"), std::string::npos);

  auto comp = Call(p, "POST", "/v1/completions", json{{"model", "chat"}, {"prompt", "x"}, {"max_tokens", 3}}.dump());
  EXPECT_EQ(comp.status, 200) << comp.body;
  auto emb = Call(p, "POST", "/v1/embeddings", json{{"model", "embed"}, {"input", {"a", "b"}}}.dump());
  ASSERT_EQ(emb.status, 200) << emb.body;
  EXPECT_EQ(Body(emb)["data"].size(), 2u);
  auto models = Body(Call(p, "GET", "/v1/models"));
  EXPECT_EQ(models["data"].size(), 2u);
  EXPECT_EQ(Call(p, "GET", "/healthz").status, 200);
  EXPECT_EQ(Call(p, "GET", "/readyz").status, 200);
  // What a worker says of itself is fetched by the supervisor every second (status asks no worker).
  json status;
  for (int i = 0; i < 200; ++i) {
    status = Body(Call(p, "GET", "/v1/status"));
    const json& w = status["services"][0]["placements"][0];
    if (!w["memory"].is_null() && w.contains("prefix_reuse") && w["prefix_reuse"]["reused_prompt_tokens"].get<int>() > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(status["services"][0]["placements"][0]["state"], "ready");
  EXPECT_TRUE(status["services"][0]["placements"][0]["prefix_reuse"]["on"].get<bool>());
  EXPECT_GT(status["services"][0]["placements"][0]["prefix_reuse"]["reused_prompt_tokens"].get<int>(), 0);
  EXPECT_FALSE(status["services"][0]["placements"][0]["memory"].is_null());
  EXPECT_LT(status["services"][0]["placements"][0]["info_age_ms"].get<int64_t>(), 5000);
  EXPECT_EQ(status["journal"]["synchronous"], "full");
  const std::string metrics = Call(p, "GET", "/metrics").body;
  EXPECT_NE(metrics.find("spillway_requests_total{service=\"chat\",outcome=\"completed\",placement=\"cpu\",key=\"chat.0\"}"),
            std::string::npos) << metrics;
  EXPECT_NE(metrics.find("spillway_request_duration_seconds_bucket"), std::string::npos);
  EXPECT_NE(metrics.find("spillway_queue_depth"), std::string::npos);
  EXPECT_NE(metrics.find("spillway_worker_restarts_total"), std::string::npos);
  // The text format Prometheus parses: one TYPE line per family, each
  // family's samples together (two services interleaved them, and the
  // scrape was refused), and values as integers where they are ones.
  {
    std::map<std::string, std::string> type_of;
    std::vector<std::string> families;  // in order, consecutive repeats collapsed
    std::istringstream in(metrics);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("# TYPE ", 0) == 0) {
        std::istringstream t(line.substr(7));
        std::string name, type;
        t >> name >> type;
        EXPECT_TRUE(type_of.emplace(name, type).second) << "a second TYPE line for " << name;
        continue;
      }
      if (line.empty() || line[0] == '#') continue;
      std::string name = line.substr(0, line.find_first_of("{ "));
      for (const char* suffix : {"_bucket", "_sum", "_count"}) {
        const std::string base = name.substr(0, name.size() - std::min(name.size(), std::strlen(suffix)));
        if (name.size() > base.size() && name.compare(base.size(), std::string::npos, suffix) == 0 &&
            type_of.count(base) && type_of[base] == "histogram") {
          name = base;
        }
      }
      if (families.empty() || families.back() != name) families.push_back(name);
      EXPECT_EQ(line.find("e+"), std::string::npos) << "an exponent: " << line;
    }
    std::set<std::string> seen;
    for (const auto& f : families) EXPECT_TRUE(seen.insert(f).second) << f << "'s samples are not together";
  }
  // A client may name its request; a reused name is refused.
  auto named = Call(p, "POST", "/v1/chat/completions", Chat(2), {{"X-Request-Id", "my-request-1"}});
  EXPECT_EQ(named.Header("x-request-id"), "my-request-1");
  EXPECT_EQ(Call(p, "POST", "/v1/chat/completions", Chat(2), {{"X-Request-Id", "my-request-1"}}).status, 409);
}

// A retry under the id of a request still running is refused before the
// journal sees it, and the running one goes on untouched.
TEST_F(GatewayTest, AnIdStillRunningIsRefusedAndTheRunningRequestGoesOn) {
  const uint16_t p = gw_->port();
  auto first = std::async(std::launch::async, [&] {
    // (Long enough to be running still when the twin comes, on a loaded machine too.)
    return Call(p, "POST", "/v1/chat/completions", Chat(3500), {{"X-Request-Id", "busy-id"}});
  });
  for (int k = 0; k < 500 && Body(Call(p, "GET", "/v1/requests/busy-id")).value("state", "") != "running"; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  auto twin = Call(p, "POST", "/v1/chat/completions", Chat(2), {{"X-Request-Id", "busy-id"}});
  EXPECT_EQ(twin.status, 409) << twin.body;
  EXPECT_FALSE(twin.Header("retry-after").empty());
  EXPECT_EQ(first.get().status, 200);
  EXPECT_EQ(WaitTerminal(p, "busy-id")["state"], "completed");
}

TEST_F(GatewayTest, BadInputsGetOpenAiErrorsAndTheGatewayKeepsServing) {
  const uint16_t p = gw_->port();
  struct Case {
    std::string path, body;
    int status;
  };
  const std::vector<Case> cases = {
      {"/v1/chat/completions", "{broken", 400},
      {"/v1/chat/completions", R"({"model":"chat","messages":"hi"})", 400},
      {"/v1/chat/completions", R"({"model":"chat","messages":[{"role":"user","content":"x"}],"max_tokens":"5"})", 400},
      {"/v1/chat/completions", R"({"model":"chat","messages":[{"role":"user","content":"x"}],"max_tokens":999999})", 400},
      {"/v1/chat/completions", R"({"model":"nosuch","messages":[{"role":"user","content":"x"}]})", 404},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}]})", 400},
      {"/v1/embeddings", R"({"model":"embed","input":[1,2]})", 400},
      {"/v1/requests/none", "", 404},
      {"/v1/unknown", "{}", 404},
  };
  for (const auto& c : cases) {
    auto r = Call(p, c.body.empty() ? "GET" : "POST", c.path, c.body);
    EXPECT_EQ(r.status, c.status) << c.body << " -> " << r.body;
    EXPECT_TRUE(Body(r).contains("error")) << r.body;
  }
  auto big = Call(p, "POST", "/v1/chat/completions", std::string(9 << 20, 'x'));
  EXPECT_EQ(big.status, 413);
  auto bad_id = Call(p, "POST", "/v1/chat/completions", Chat(2), {{"X-Request-Id", "bad id!"}});
  EXPECT_EQ(bad_id.status, 400);
  EXPECT_EQ(Call(p, "POST", "/v1/chat/completions", Chat(2)).status, 200);
}

// Null is "unset" to OpenAI, and Pydantic's model_dump() sends it for every
// field a client left out; a history tool call may omit "type". The gateway
// accepted these, and the worker (llama.cpp's chat layer) then refused them
// with a 400 after admission and journaling ("Failed to parse tools: ...").
TEST_F(GatewayTest, NullsAndOmittedToolCallFieldsReachTheModelAsUnset) {
  const std::string body = R"({"model":"chat","max_tokens":4,"messages":[
      {"role":"user","content":"What is the weather?","name":null},
      {"role":"assistant","content":null,"reasoning_content":null,
       "tool_calls":[{"id":"call_1","function":{"name":"weather","arguments":"{}"}}]},
      {"role":"tool","tool_call_id":"call_1","name":null,"content":"sunny"}],
    "tools":[{"type":"function","function":{"name":"weather","description":null,
              "parameters":{"type":"object","properties":{}}}}]})";
  auto r = Call(gw_->port(), "POST", "/v1/chat/completions", body);
  EXPECT_EQ(r.status, 200) << r.body;
}

TEST_F(GatewayTest, IdempotencyKeyRunsTheModelOnce) {
  const uint16_t p = gw_->port();
  const uint64_t before = WorkerReceived(p, "chat");
  const std::string body = Chat(16, false, "idempotent");
  std::vector<std::future<http::ClientResponse>> futures;
  for (int i = 0; i < 20; ++i) {
    futures.push_back(std::async(std::launch::async, [&] {
      http::ClientResponse r;
      // Retry while the first is in flight (409), as a client following the draft would.
      for (int k = 0; k < 500; ++k) {
        r = Call(p, "POST", "/v1/chat/completions", body, {{"Idempotency-Key", "key-20"}});
        if (r.status != 409) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      return r;
    }));
  }
  std::set<std::string> bodies, ids;
  int replayed = 0;
  for (auto& f : futures) {
    auto r = f.get();
    EXPECT_EQ(r.status, 200) << r.body;
    bodies.insert(r.body);
    ids.insert(r.Header("x-request-id"));
    replayed += r.Header("idempotent-replayed") == "true";
  }
  EXPECT_EQ(bodies.size(), 1u);
  EXPECT_EQ(ids.size(), 1u);
  EXPECT_EQ(replayed, 19);
  EXPECT_EQ(WorkerReceived(p, "chat") - before, 1u);  // exactly one model execution
  // Same key, other payload: 422.
  auto other = Call(p, "POST", "/v1/chat/completions", Chat(16, false, "different"), {{"Idempotency-Key", "key-20"}});
  EXPECT_EQ(other.status, 422) << other.body;
  // Same key while the first still runs: 409.
  auto slow = std::async(std::launch::async, [&] {
    return Call(p, "POST", "/v1/chat/completions", Chat(3500),
                {{"Idempotency-Key", "key-slow"}, {"X-Request-Id", "idem-slow"}});
  });
  for (int k = 0; k < 500 && Body(Call(p, "GET", "/v1/requests/idem-slow")).value("state", "") != "running"; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  auto conflict = Call(p, "POST", "/v1/chat/completions", Chat(3500), {{"Idempotency-Key", "key-slow"}});
  EXPECT_EQ(conflict.status, 409) << conflict.body;
  EXPECT_EQ(conflict.Header("x-request-id"), "idem-slow");
  Call(p, "DELETE", "/v1/requests/idem-slow");
  slow.get();
}

TEST_F(GatewayTest, CancelWorksQueuedRunningAndOnDisconnect) {
  const uint16_t p = gw_->port();
  const uint64_t completed_before = WorkerCount(p, "chat", "completed");
  // Running: DELETE /v1/requests/{id}.
  auto running = std::async(std::launch::async, [&] {
    return Call(p, "POST", "/v1/chat/completions", Chat(3500), {{"X-Request-Id", "cancel-running"}});
  });
  http::ClientResponse del;
  for (int i = 0; i < 300; ++i) {
    del = Call(p, "DELETE", "/v1/requests/cancel-running");
    if (del.status == 200) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(del.status, 200) << del.body;
  EXPECT_EQ(Body(del)["cancel_requested"], true) << del.body;
  EXPECT_EQ(running.get().status, 499);
  EXPECT_EQ(WaitTerminal(p, "cancel-running")["state"], "cancelled");
  EXPECT_EQ(Call(p, "DELETE", "/v1/requests/cancel-running").status, 409);  // already ended
  // And the worker was stopped, not left to generate all its tokens (a
  // cancel that read the request's row while it was not yet live here
  // answered 200 and stopped nothing).
  EXPECT_EQ(WorkerCount(p, "chat", "completed"), completed_before);

  // Disconnect while streaming.
  {
    namespace net = boost::asio;
    net::io_context ioc;
    net::ip::tcp::socket sock(ioc);
    sock.connect({net::ip::make_address("127.0.0.1"), p});
    const std::string body = Chat(3500, true);
    const std::string req = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-Id: cancel-disc\r\n"
                            "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                            "\r\n\r\n" + body;
    net::write(sock, net::buffer(req));
    char buf[512];
    sock.read_some(net::buffer(buf));
    sock.close();
  }
  EXPECT_EQ(WaitTerminal(p, "cancel-disc")["state"], "cancelled");
}

TEST_F(GatewayTest, RequestTimeoutIs504AndFreesTheWorker) {
  const uint16_t p = gw_->port();
  const auto t0 = std::chrono::steady_clock::now();
  auto r = Call(p, "POST", "/v1/chat/completions", Chat(3500), {{"X-Request-Timeout", "0.3"}, {"X-Request-Id", "deadline-1"}});
  EXPECT_EQ(r.status, 504) << r.body;
  EXPECT_EQ(Body(r)["error"]["code"], "deadline_exceeded");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_EQ(WaitTerminal(p, "deadline-1")["state"], "failed");
  EXPECT_EQ(Call(p, "POST", "/v1/chat/completions", Chat(2), {{"X-Request-Timeout", "soon"}}).status, 400);
  // The worker's slot was freed: the next request runs at once.
  EXPECT_EQ(Call(p, "POST", "/v1/chat/completions", Chat(2)).status, 200);
}

TEST(GatewayAccessTest, KeysHostsAndOrigins) {
  setenv("SPILLWAY_API_KEYS", "sk-test-1, sk-test-2", 1);
  GatewayProcess gw(TestConfig(1, "allowed_origins = [\"http://localhost:3000\"]\n"
                                  "allowed_hosts = [\"127.0.0.1\", \"::1\", \"Spillway.Home\"]"));
  const bool started = gw.Start();  // the gateway reads the keys at start
  unsetenv("SPILLWAY_API_KEYS");
  ASSERT_TRUE(started) << gw.Output();
  const uint16_t p = gw.port();
  const auto missing = Call(p, "GET", "/v1/models");
  EXPECT_EQ(missing.status, 401);
  EXPECT_EQ(missing.Header("www-authenticate"), "Bearer") << "a 401 names its scheme (RFC 9110)";
  EXPECT_EQ(Call(p, "GET", "/v1/models", "", {{"Authorization", "Bearer wrong"}}).status, 401);
  EXPECT_EQ(Call(p, "GET", "/v1/models", "", {{"Authorization", "Bearer sk-test-2"}}).status, 200);
  // The scheme in any case, the host in any case, an IPv6 literal with or without brackets.
  EXPECT_EQ(Call(p, "GET", "/v1/models", "", {{"Authorization", "bearer  sk-test-2"}}).status, 200);
  EXPECT_EQ(Call(p, "GET", "/v1/models", "", {{"Authorization", "Bearer sk-test-2"}, {"Host", "spillway.home:8480"}}).status, 200);
  EXPECT_EQ(Call(p, "GET", "/v1/models", "", {{"Authorization", "Bearer sk-test-2"}, {"Host", "[::1]:8480"}}).status, 200);
  EXPECT_EQ(Call(p, "GET", "/v1/models", "", {{"Authorization", "Bearersk-test-2"}}).status, 401);
  EXPECT_EQ(Call(p, "GET", "/healthz").status, 200);  // liveness needs no key
  auto evil = Call(p, "GET", "/v1/models", "", {{"Authorization", "Bearer sk-test-1"}, {"Host", "evil.example:8480"}});
  EXPECT_EQ(evil.status, 403) << evil.body;
  EXPECT_EQ(Call(p, "GET", "/v1/models", "", {{"Authorization", "Bearer sk-test-1"}, {"Origin", "http://evil.example"}}).status, 403);
  const auto page = Call(p, "GET", "/v1/models", "", {{"Authorization", "Bearer sk-test-1"}, {"Origin", "http://localhost:3000"}});
  EXPECT_EQ(page.status, 200);
  // CORS: the allowed page may read the answer, and its preflight (no key) is answered.
  EXPECT_EQ(page.Header("access-control-allow-origin"), "http://localhost:3000");
  EXPECT_NE(page.Header("access-control-expose-headers").find("X-Request-Id"), std::string::npos);
  const auto preflight = Call(p, "OPTIONS", "/v1/chat/completions", "",
                              {{"Origin", "http://localhost:3000"}, {"Access-Control-Request-Method", "POST"},
                               {"Access-Control-Request-Headers", "authorization, content-type, x-stainless-os"}});
  EXPECT_EQ(preflight.status, 204) << preflight.body;
  EXPECT_EQ(preflight.Header("access-control-allow-origin"), "http://localhost:3000");
  EXPECT_EQ(preflight.Header("access-control-allow-headers"), "authorization, content-type, x-stainless-os")
      << "an SDK's own headers too";
  EXPECT_NE(preflight.Header("access-control-allow-methods").find("POST"), std::string::npos);
  const auto unkeyed = Call(p, "GET", "/v1/models", "", {{"Origin", "http://localhost:3000"}});
  EXPECT_EQ(unkeyed.status, 401);
  EXPECT_EQ(unkeyed.Header("access-control-allow-origin"), "http://localhost:3000") << "the page reads why";
  const auto foreign = Call(p, "OPTIONS", "/v1/chat/completions", "", {{"Origin", "http://evil.example"}});
  EXPECT_EQ(foreign.status, 403);
  EXPECT_EQ(foreign.Header("access-control-allow-origin"), "");
  // An Ollama route is refused in Ollama's shape, {"error": "<message>"}: its
  // clients read the error as a string ("[object Object]" otherwise).
  auto ollama = Call(p, "POST", "/api/chat", R"({"model":"chat","messages":[]})");
  EXPECT_EQ(ollama.status, 401);
  EXPECT_TRUE(Body(ollama)["error"].is_string()) << ollama.body;
  ollama = Call(p, "GET", "/api/tags", "", {{"Authorization", "Bearer sk-test-1"}, {"Host", "evil.example:8480"}});
  EXPECT_EQ(ollama.status, 403);
  EXPECT_TRUE(Body(ollama)["error"].is_string()) << ollama.body;
}

TEST(GatewayConfigTest, BadConfigsRefuseToStart) {
  GatewayProcess typo("listne = \"127.0.0.1:1\"\n");
  EXPECT_FALSE(typo.Start(std::chrono::seconds(10)));
  EXPECT_NE(typo.Output().find(":1: 'listne' is not a known key"), std::string::npos) << typo.Output();
  GatewayProcess missing("[[service]]\nname = \"x\"\nmodel = \"/nonexistent.gguf\"\n");
  EXPECT_FALSE(missing.Start(std::chrono::seconds(10)));
  EXPECT_NE(missing.Output().find("not found"), std::string::npos) << missing.Output();
  // Beyond loopback without any API key: refused, with the way out named.
  const std::string cfg = (std::filesystem::temp_directory_path() / "spillway-remote.toml").string();
  { std::ofstream(cfg) << TestConfig(1); }
  int rc = 0;
  const std::string out =
      RunCommand(BinDir() + "/spillway serve --config " + cfg + " --listen 0.0.0.0:0 --state-dir /tmp/spillway-remote-state 2>&1", &rc);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("allow_unauthenticated_remote"), std::string::npos) << out;
  std::filesystem::remove(cfg);
}

// What cannot work is refused at start with the file, the key and the
// reason; with --keep-going the placement is marked unavailable instead and
// a request to it is answered at once with why.
TEST(GatewayStartupTest, ANonGgufModelOrAMissingDeviceIsRefusedAtStartOrMarkedUnavailable) {
  const std::string fake = (std::filesystem::temp_directory_path() / "spillway-fake-model.gguf").string();
  { std::ofstream(fake) << "this is text, not a model\n"; }
  GatewayProcess text("[[service]]\nname = \"x\"\nmodel = \"" + fake + "\"\n[[service.placement]]\ndevice = \"cpu\"\n");
  EXPECT_FALSE(text.Start(std::chrono::seconds(10)));
  EXPECT_NE(text.Output().find(fake), std::string::npos) << text.Output();
  EXPECT_NE(text.Output().find("service[0].model"), std::string::npos) << text.Output();
  EXPECT_NE(text.Output().find("refusing to start"), std::string::npos) << text.Output();
  std::filesystem::remove(fake);

  const std::string gpu = TestConfig(1) + "[[service]]\nname = \"gpu\"\nmodel = \"" + ModelPath("tiny-chat") +
                          "\"\n[[service.placement]]\ndevice = \"cuda:7\"\ngpu_layers = 99\n";
  GatewayProcess refused(gpu);
  EXPECT_FALSE(refused.Start(std::chrono::seconds(10)));
  EXPECT_NE(refused.Output().find("service[2].placement[0].device"), std::string::npos) << refused.Output();
  EXPECT_NE(refused.Output().find("cuda"), std::string::npos) << refused.Output();

  // A model file that is missing is such a placement too (a typo in a path:
  // --keep-going refused it as a config error, every other service down with it).
  const std::string missing = "/nonexistent/spillway-gone.gguf";
  GatewayProcess gone("[[service]]\nname = \"gone\"\nmodel = \"" + missing + "\"\n[[service.placement]]\ndevice = \"cpu\"\n");
  EXPECT_FALSE(gone.Start(std::chrono::seconds(10)));
  EXPECT_NE(gone.Output().find(missing + " not found"), std::string::npos) << gone.Output();
  EXPECT_NE(gone.Output().find("--keep-going"), std::string::npos) << gone.Output();
  GatewayProcess kept(gpu + "[[service]]\nname = \"gone\"\nmodel = \"" + missing +
                      "\"\n[[service.placement]]\ndevice = \"cpu\"\n");
  kept.SetExtraArgs({"--keep-going"});
  ASSERT_TRUE(kept.Start(std::chrono::seconds(60), /*wait_ready=*/false)) << kept.Output();
  const uint16_t p = kept.port();
  for (int i = 0; i < 500 && Call(p, "POST", "/v1/chat/completions", Chat(2)).status != 200; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(Call(p, "POST", "/v1/chat/completions", Chat(2)).status, 200);  // the other services serve
  const auto t0 = std::chrono::steady_clock::now();
  json body = json::parse(Chat(2));
  body["model"] = "gpu";
  auto r = Call(p, "POST", "/v1/chat/completions", body.dump());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));  // at once, not a silent wait
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_NE(r.body.find("unavailable"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("cuda"), std::string::npos) << r.body;
  // Until a restart with it fixed: clients are told not to retry it.
  EXPECT_EQ(r.headers["x-should-retry"], "false");
  EXPECT_EQ(r.headers.count("retry-after"), 0u) << r.headers["retry-after"];
  body["model"] = "gone";
  r = Call(p, "POST", "/v1/chat/completions", body.dump());
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_NE(r.body.find(missing), std::string::npos) << r.body;
  // /readyz gives each such placement's reason (it said "see /v1/status").
  const json ready = Body(Call(p, "GET", "/readyz"));
  EXPECT_NE(ready["reasons"].value("gone", json::array()).dump().find(missing), std::string::npos) << ready.dump();
  EXPECT_NE(ready["reasons"].value("gpu", json::array()).dump().find("cuda"), std::string::npos) << ready.dump();
}

// A worker that cannot start (here a stand-in that says why and exits, as a
// worker on a machine without its GPU does) is reported where a person
// looks, and a request for it gets 503 with that reason at once.
// A model that loads for longer than start_timeout_s (a large one on a slow
// disk) is not killed while it keeps loading, and a request sent meanwhile
// waits for it: the timeout counts from its last load progress. Here the
// slow-load fault stretches the load to 6 s, in steps under 3 s, against a
// 4 s start timeout: it was killed at 4 s, every time.
TEST(GatewayStartupTest, AModelThatKeepsLoadingPastItsStartTimeoutIsWaitedFor) {
  ::setenv("SPILLWAY_FAULTS", "slow-load=6", 1);  // the workers inherit it (and only they read it)
  GatewayProcess gw("[[service]]\nname = \"chat\"\nmodel = \"" + ModelPath("tiny-chat") +
                    "\"\n[[service.placement]]\ndevice = \"cpu\"\nctx = 1024\nslots = 1\nthreads = 1\n"
                    "start_timeout_s = 4\n");
  const bool started = gw.Start(std::chrono::seconds(30), /*wait_ready=*/false);
  ::unsetenv("SPILLWAY_FAULTS");
  ASSERT_TRUE(started) << gw.Output();
  auto r = Call(gw.port(), "POST", "/v1/chat/completions", Chat(2));
  EXPECT_EQ(r.status, 200) << r.body;
  const json w = WorkerStatus(gw.port(), "chat");
  EXPECT_EQ(w.value("failed_starts", -1), 0) << w.dump();
  EXPECT_EQ(w.value("restarts", -1), 0) << w.dump();
}

TEST(GatewayStartupTest, AWorkerThatKeepsFailingToStartIsReportedAndRequestsGetItsReasonAtOnce) {
  const std::string script = (std::filesystem::temp_directory_path() / "spillway-failing-worker.sh").string();
  {
    std::ofstream f(script);
    f << "#!/bin/sh\necho '{\"phase\":\"device\",\"message\":\"no CUDA-capable device is detected\"}' >&2\nexit 2\n";
  }
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  GatewayProcess gw(TestConfig(1));
  gw.SetExtraArgs({"--worker-bin", script});
  ASSERT_TRUE(gw.Start(std::chrono::seconds(30), /*wait_ready=*/false)) << gw.Output();
  const uint16_t p = gw.port();
  json w;
  for (int i = 0; i < 500; ++i) {
    w = WorkerStatus(p, "chat");
    if (w.value("failed_starts", 0) >= 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(w.value("failed_starts", 0), 2) << w.dump();
  EXPECT_NE(w.value("last_error", "").find("no CUDA-capable device"), std::string::npos) << w.dump();
  EXPECT_TRUE(w.contains("next_start_in_s")) << w.dump();
  const auto t0 = std::chrono::steady_clock::now();
  auto r = Call(p, "POST", "/v1/chat/completions", Chat(4));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_NE(r.body.find("no CUDA-capable device"), std::string::npos) << r.body;
  EXPECT_FALSE(r.Header("retry-after").empty());
  auto ready = Call(p, "GET", "/readyz");
  EXPECT_EQ(ready.status, 503);
  EXPECT_NE(ready.body.find("no CUDA-capable device"), std::string::npos) << ready.body;
  EXPECT_NE(gw.Output().find("failed to start"), std::string::npos) << gw.Output();
  std::filesystem::remove(script);
}

// A worker that hangs at start (never ready, never exits: a load stuck in a
// driver) holds a request no longer than its placement's start timeout: the
// request hears why while it waits (a stream's SSE comments), then gets 503
// with the reason, and the hung process is killed.
TEST(GatewayStartupTest, AWorkerThatHangsAtStartHoldsARequestNoLongerThanItsStartTimeout) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("spillway-hang-" + std::to_string(getpid()))).string();
  std::filesystem::create_directories(dir);
  const std::string script = dir + "/hanging-worker.sh", pids = dir + "/pids";
  {
    std::ofstream f(script);
    f << "#!/bin/sh\necho $$ >> " << pids << "\necho 'loading the model...' >&2\nexec sleep 600\n";
  }
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  std::string cfg = TestConfig(1);
  cfg.insert(cfg.find("threads = 1\n") + 12, "start_timeout_s = 3\n");
  GatewayProcess gw(cfg);
  gw.SetExtraArgs({"--worker-bin", script});
  ASSERT_TRUE(gw.Start(std::chrono::seconds(30), /*wait_ready=*/false)) << gw.Output();
  const uint16_t p = gw.port();
  json body = json::parse(Chat(4));
  body["stream"] = true;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = Call(p, "POST", "/v1/chat/completions", body.dump());
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(waited, std::chrono::seconds(8)) << r.body;  // its start timeout (3 s) plus a start already under way
  // A stream hears why it waits, then why it failed.
  EXPECT_NE(r.body.find(": spillway: waiting for a worker: cpu is starting"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("within 3 s (start_timeout_s)"), std::string::npos) << r.body;
  // By now the hung start was killed: the next request hears that reason.
  auto plain = Call(p, "POST", "/v1/chat/completions", Chat(4));
  EXPECT_EQ(plain.status, 503) << plain.body;
  EXPECT_NE(plain.body.find("did not become ready within 3 s (start_timeout_s)"), std::string::npos) << plain.body;
  EXPECT_FALSE(plain.Header("retry-after").empty());
  EXPECT_NE(gw.Output().find("did not become ready within 3 s"), std::string::npos) << gw.Output();
  gw.Stop();
  // Every hung worker it started was killed, none left behind.
  std::ifstream in(pids);
  int n = 0;
  for (pid_t pid; in >> pid; ++n) EXPECT_NE(kill(pid, 0), 0) << "worker " << pid << " still runs";
  EXPECT_GE(n, 2);
  std::filesystem::remove_all(dir);
}

// `spillway doctor` says what a config needs that this machine lacks, one line
// per check with a fix, and fails only then.
TEST(GatewayStartupTest, DoctorNamesAMissingModelAndPassesAGoodConfig) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("spillway-doctor-" + std::to_string(getpid()))).string();
  std::filesystem::create_directories(dir);
  { std::ofstream(dir + "/good.toml") << TestConfig(1); }
  { std::ofstream(dir + "/bad.toml") << TestConfig(1) << "[[service]]\nname = \"gone\"\nmodel = \"" << dir << "/gone.gguf\"\n"; }
  const std::string common = " --listen 127.0.0.1:0 --state-dir " + dir + "/state 2>&1";
  int rc = -1;
  std::string out = RunCommand(BinDir() + "/spillway doctor --config " + dir + "/good.toml" + common, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("ok    model    service 'chat'"), std::string::npos) << out;
  EXPECT_NE(out.find("ok    plan     service 'embed' on cpu"), std::string::npos) << out;
  EXPECT_NE(out.find("0 failures"), std::string::npos) << out;
  out = RunCommand(BinDir() + "/spillway doctor --config " + dir + "/bad.toml" + common, &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("FAIL  model    service 'gone' (key service[2].model): cannot open " + dir + "/gone.gguf"),
            std::string::npos) << out;
  EXPECT_NE(out.find("fix: "), std::string::npos) << out;
  EXPECT_NE(out.find("ok    model    service 'chat'"), std::string::npos) << out;  // the rest is still checked
  // An external server's device and command, as serve checks them (doctor said all was well).
  { std::ofstream(dir + "/ext.toml") << TestConfig(1) << "[[service]]\nname = \"ext\"\nkind = \"external\"\n"
                                     << "command = \"" << dir << "/no-server --port ${PORT}\"\n"
                                     << "routes = { \"/v1/rerank\" = \"/v1/rerank\" }\ndevice = \"sim:7\"\n"; }
  out = RunCommand(BinDir() + "/spillway doctor --config " + dir + "/ext.toml" + common, &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("FAIL  device   "), std::string::npos) << out;
  EXPECT_NE(out.find("sim:7"), std::string::npos) << out;
  EXPECT_NE(out.find("service 'ext': command " + dir + "/no-server is not an executable file"), std::string::npos) << out;
  EXPECT_NE(out.find("ok    external the servers it starts end with the gateway"), std::string::npos) << out;
  // An embedding placement whose ctx is not a multiple of its slots: its worker refuses to start (doctor said OK).
  std::string odd = TestConfig(1);
  const auto at = odd.rfind("ctx = 512");
  ASSERT_NE(at, std::string::npos);
  odd.replace(at, 9, "ctx = 513");
  { std::ofstream(dir + "/odd.toml") << odd; }
  out = RunCommand(BinDir() + "/spillway doctor --config " + dir + "/odd.toml" + common, &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("FAIL  shape    service 'embed' placement 0 (cpu, key service[1].placement[0].ctx): an embedding "
                     "model needs ctx (513) to be a multiple of slots (2)"),
            std::string::npos) << out;
  EXPECT_NE(out.find("ctx = 512)"), std::string::npos) << out;
  std::filesystem::remove_all(dir);
}

// Two services that take turns on a device: a turn longer than the other's
// requests wait for its load (its start_timeout_s and a minute) is never
// reached while the first stays busy; doctor says so, with both keys.
TEST(GatewayStartupTest, DoctorWarnsOfATurnLongerThanTheOthersRequestsWait) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("spillway-doctor-turns-" + std::to_string(getpid()))).string();
  std::filesystem::create_directories(dir);
  auto config = [&](double turn_s, double start_timeout_s) {
    std::ostringstream os;
    os << "[[device]]\nname = \"sim:0\"\n";
    for (const char* name : {"chat", "chat2"}) {
      os << "[[service]]\nname = \"" << name << "\"\nmodel = \"" << ModelPath("tiny-chat") << "\"\n"
         << "residency = \"on_demand\"\nfair_turn_s = " << (std::string(name) == "chat" ? turn_s : 30) << "\n"
         << "[[service.placement]]\ndevice = \"sim:0\"\ngpu_layers = 99\nctx = 512\nslots = 1\nthreads = 1\n"
         << "start_timeout_s = " << start_timeout_s << "\n";
    }
    return os.str();
  };
  const std::string common = " --listen 127.0.0.1:0 --state-dir " + dir + "/state 2>&1";
  int rc = -1;
  { std::ofstream(dir + "/long.toml") << config(600, 120); }
  std::string out = RunCommand(BinDir() + "/spillway doctor --config " + dir + "/long.toml" + common, &rc);
  EXPECT_NE(out.find("warn  turns    on sim:0, service 'chat' serves turns of 600 s (fair_turn_s), but a request of "
                     "'chat2' waits at most 180 s for its load (start_timeout_s and a minute)"),
            std::string::npos) << out;
  EXPECT_NE(out.find("fix: lower fair_turn_s of 'chat' well below 180 s"), std::string::npos) << out;
  EXPECT_NE(out.find("or raise start_timeout_s of 'chat2'"), std::string::npos) << out;
  EXPECT_EQ(out.find("service 'chat2' serves turns"), std::string::npos) << "its 30 s turn fits: " << out;
  EXPECT_EQ(out.find("ok    turns"), std::string::npos) << out;
  // An external server's request waits for its start only its start_timeout_s and 5 s.
  {
    std::ofstream(dir + "/ext.toml") << config(30, 120) << "[[service]]\nname = \"ext\"\nkind = \"external\"\n"
                                     << "command = \"/bin/true ${PORT}\"\nroutes = { \"/v1/rerank\" = \"/v1/rerank\" }\n"
                                     << "device = \"sim:0\"\nresidency = \"on_demand\"\nstart_timeout_s = 20\n";
  }
  out = RunCommand(BinDir() + "/spillway doctor --config " + dir + "/ext.toml" + common, &rc);
  EXPECT_NE(out.find("service 'chat' serves turns of 30 s (fair_turn_s), but a request of 'ext' waits at most 25 s for "
                     "its load (start_timeout_s and 5 s)"),
            std::string::npos) << out;
  EXPECT_EQ(out.find("but a request of 'chat' waits"), std::string::npos) << "ext's 30 s turn fits chat's 180 s: " << out;
  // The other's wait raised past the turn: nothing to say.
  { std::ofstream(dir + "/waits.toml") << config(600, 600); }
  out = RunCommand(BinDir() + "/spillway doctor --config " + dir + "/waits.toml" + common, &rc);
  EXPECT_EQ(out.find("warn  turns"), std::string::npos) << out;
  EXPECT_NE(out.find("ok    turns    each turn on a shared device ends before the other services' requests stop waiting"),
            std::string::npos) << out;
  std::filesystem::remove_all(dir);
}

// A worker that speaks another protocol version (here: a deliberate skew) is
// refused before it becomes ready, with the reason in the log and the
// status, and is never sent a request.
TEST(GatewayStartupTest, AWorkerOfAnotherProtocolVersionIsRefused) {
  setenv("SPILLWAY_MUTATIONS", "protocol-skew", 1);
  GatewayProcess gw(TestConfig(1));
  const bool started = gw.Start(std::chrono::seconds(30), /*wait_ready=*/false);
  unsetenv("SPILLWAY_MUTATIONS");
  ASSERT_TRUE(started) << gw.Output();
  json w;
  for (int i = 0; i < 500; ++i) {
    w = WorkerStatus(gw.port(), "chat");
    // Checked before it is ready (supervisor), not after: never seen ready.
    EXPECT_NE(w.value("state", ""), "ready") << w.dump();
    if (w.value("failed_starts", 0) >= 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GE(w.value("failed_starts", 0), 2) << w.dump();
  EXPECT_NE(w.value("last_exit", "").find("protocol version"), std::string::npos) << w.dump();
  auto r = Call(gw.port(), "POST", "/v1/chat/completions", Chat(4));
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_NE(r.body.find("different builds"), std::string::npos) << r.body;
  EXPECT_NE(gw.Output().find("different builds"), std::string::npos) << gw.Output();
}

TEST(GatewaySupervisorTest, KilledWorkerIsRestartedAndOtherServicesAreUnaffected) {
  GatewayProcess gw(TestConfig(2));
  ASSERT_TRUE(gw.Start()) << gw.Output();
  const uint16_t p = gw.port();
  const json before = WorkerStatus(p, "chat");
  const pid_t pid = before["pid"].get<pid_t>();
  ASSERT_GT(pid, 0);
  std::atomic<bool> done{false};
  std::atomic<int> embed_ok{0}, embed_bad{0};
  std::string first_bad;
  std::thread embedder([&] {
    while (!done) {
      auto r = http::Fetch("127.0.0.1", p, "POST", "/v1/embeddings", json{{"model", "embed"}, {"input", "x"}}.dump());
      const bool ok = r.ok() && r->status == 200;
      if (!ok && first_bad.empty()) first_bad = r.ok() ? r->body : r.status().ToString();
      (ok ? embed_ok : embed_bad)++;
    }
  });
  kill(pid, SIGKILL);
  json after;
  for (int i = 0; i < 500; ++i) {
    after = WorkerStatus(p, "chat");
    if (after["state"] == "ready" && after["pid"] != pid) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  done = true;
  embedder.join();
  EXPECT_EQ(after["state"], "ready");
  EXPECT_NE(after["pid"], pid);
  EXPECT_EQ(after["restarts"], 1);
  EXPECT_EQ(after["last_exit"], "signal 9");
  EXPECT_FALSE(after.contains("last_error")) << "its log's last line (its banner) is no reason for a kill from outside";
  EXPECT_GT(embed_ok.load(), 0);
  EXPECT_EQ(embed_bad.load(), 0) << first_bad;
  EXPECT_EQ(Call(p, "POST", "/v1/chat/completions", Chat(4)).status, 200);
  EXPECT_NE(Call(p, "GET", "/metrics").body.find("spillway_worker_restarts_total{worker=\"chat.0\"} 1"), std::string::npos);
  // (Logged once the gateway has taken it back, a moment after its status read ready.)
  for (int i = 0; i < 250 && gw.Output().find("worker chat.0 ready again after") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_NE(gw.Output().find("worker chat.0 ready again after"), std::string::npos) << "its restart's load was not logged";
}

TEST(GatewayQueueTest, CancelWhileQueuedLeavesTheRunningRequestAlone) {
  GatewayProcess gw(TestConfig(1));
  ASSERT_TRUE(gw.Start()) << gw.Output();
  const uint16_t p = gw.port();
  auto running = std::async(std::launch::async, [&] {
    return Call(p, "POST", "/v1/chat/completions", Chat(3500), {{"X-Request-Id", "q-running"}});
  });
  for (int i = 0; i < 500 && Body(Call(p, "GET", "/v1/requests/q-running")).value("state", "") != "running"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  auto queued = std::async(std::launch::async, [&] {
    return Call(p, "POST", "/v1/chat/completions", Chat(3500), {{"X-Request-Id", "q-waiting"}});
  });
  // The one slot is taken: the second request waits in the gateway.
  for (int i = 0; i < 500 && Call(p, "GET", "/v1/requests/q-waiting").status != 200; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  auto del = Call(p, "DELETE", "/v1/requests/q-waiting");
  EXPECT_EQ(del.status, 200) << del.body;
  EXPECT_EQ(Body(del)["cancel_requested"], true) << del.body;
  EXPECT_EQ(queued.get().status, 499);
  EXPECT_EQ(WaitTerminal(p, "q-waiting")["state"], "cancelled");
  auto first = running.get();
  EXPECT_EQ(first.status, 200) << first.body;
  EXPECT_EQ(Body(first)["usage"]["completion_tokens"], 3500);
}

TEST(GatewayCrashTest, Kill9WithQueuedAndRunningRequestsLosesNothing) {
  GatewayProcess gw(TestConfig(1));
  ASSERT_TRUE(gw.Start()) << gw.Output();
  const uint16_t p = gw.port();
  // One slot: one request runs, the others wait in the gateway. Each is named,
  // so the client knows its id before any answer.
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back("crash-" + std::to_string(i));
  ids.push_back("crash-stream");
  std::vector<std::thread> clients;
  for (int i = 0; i < 5; ++i) {
    clients.emplace_back([p, i, id = ids[i]] {
      (void)http::Fetch("127.0.0.1", p, "POST", "/v1/chat/completions", Chat(1500, false, "crash " + std::to_string(i)),
                        {{"X-Request-Id", id}}, std::chrono::seconds(60));
    });
  }
  clients.emplace_back([p] {
    (void)http::Fetch("127.0.0.1", p, "POST", "/v1/chat/completions", Chat(1500, true), {{"X-Request-Id", "crash-stream"}},
                      std::chrono::seconds(60));
  });
  // Wait until every request is journaled (acknowledged).
  for (int i = 0; i < 500; ++i) {
    int known = 0;
    for (const auto& id : ids) known += Call(p, "GET", "/v1/requests/" + id).status == 200;
    if (known == static_cast<int>(ids.size())) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  gw.Kill9();
  for (auto& c : clients) c.join();
  {
    SystemClock clock;
    auto j = journal::Journal::Open(gw.state_dir() + "/journal.db", {}, clock);
    ASSERT_TRUE(j.ok());
    for (const auto& id : ids) EXPECT_TRUE((*j)->Get(id).ok()) << id << " was acknowledged but is missing";
  }
  ASSERT_TRUE(gw.Start()) << gw.Output();
  for (const auto& id : ids) {
    json rec = WaitTerminal(gw.port(), id, 120);
    if (id == "crash-stream") {
      EXPECT_TRUE(rec["state"] == "failed_resumable" || rec["state"] == "completed") << rec.dump();
    } else {
      EXPECT_EQ(rec["state"], "completed") << rec.dump();
      EXPECT_EQ(rec["result"]["body"]["usage"]["completion_tokens"], 1500) << id;
    }
  }
}

}  // namespace
}  // namespace spillway::testing
