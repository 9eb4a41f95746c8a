// The dashboard's routes on a real gateway: the page (compiled in, served
// without a key, under the Host allow-list), GET /v1/events (a snapshot at
// once, incidents as they happen, the same key as the API, each caller's own
// requests only), /v1/status's live requests and device memory, and a lost
// device told as a degraded service with its fallback, limits and incidents.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <thread>

#include "api/http_client.h"
#include "devices/sim_ledger.h"
#include "gateway_calls.h"
#include "gateway_process.h"
#include "scoped_sim_dir.h"
#include "worker_process.h"

namespace spillway::testing {
namespace {

using nlohmann::json;

const http::HeaderList kA = {{"Authorization", "Bearer sk-a"}};
const http::HeaderList kB = {{"Authorization", "Bearer sk-b"}};
const http::HeaderList kOp = {{"Authorization", "Bearer sk-op"}};

// Reads GET /v1/events on a thread of its own until stopped.
class EventReader {
 public:
  EventReader(uint16_t port, http::HeaderList headers) {
    thread_ = std::thread([this, port, headers] {
      status_ = http::StreamFetch(
          "127.0.0.1", port, "GET", "/v1/events", "", headers,
          [this](const http::StreamHead& h) {
            code_ = h.status;
            return true;
          },
          [this](std::string_view d) {
            std::lock_guard<std::mutex> lk(mu_);
            text_.append(d);
            return !stop_;
          },
          std::chrono::seconds(10));
      done_ = true;
    });
  }
  ~EventReader() {
    stop_ = true;
    thread_.join();  // the next event (at most a keep-alive away) ends the read
  }
  std::string Text() {
    std::lock_guard<std::mutex> lk(mu_);
    return text_;
  }
  // Waits until the stream holds `what`.
  bool Saw(const std::string& what, int seconds = 20) {
    for (int i = 0; i < seconds * 50; ++i) {
      if (Text().find(what) != std::string::npos) return true;
      if (done_) return Text().find(what) != std::string::npos;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  // The data of the last event named `name`, once it has come whole (Saw
  // may have seen its first bytes only: a snapshot of 10 KiB comes in
  // several reads, and its half was parsed as not JSON).
  json Last(const std::string& name, int seconds = 5) {
    const std::string tag = "event: " + name + "\ndata: ";
    for (int i = 0;; ++i) {
      const std::string t = Text();
      const size_t at = t.rfind(tag);
      if (at == std::string::npos) return nullptr;
      const size_t end = t.find("\n\n", at);
      if (end != std::string::npos) return json::parse(t.substr(at + tag.size(), end - at - tag.size()), nullptr, false);
      if (done_ || i >= seconds * 50) return nullptr;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  int code() const { return code_; }

 private:
  std::thread thread_;
  std::mutex mu_;
  std::string text_;
  std::atomic<bool> stop_{false}, done_{false};
  std::atomic<int> code_{0};
  Status status_;
};

std::vector<std::string> Ids(const json& list) {
  std::vector<std::string> ids;
  for (const auto& r : list) ids.push_back(r.value("id", ""));
  return ids;
}

bool Has(const std::vector<std::string>& v, const std::string& s) { return std::find(v.begin(), v.end(), s) != v.end(); }

TEST(DashboardTest, ThePageIsCompiledInAndServedWithoutAKeyButItsDataNeedsOne) {
  GatewayProcess gw(TestConfig(1, "api_keys = [\"sk-a\"]\n"));
  ASSERT_TRUE(gw.Start()) << gw.Output();
  const uint16_t p = gw.port();
  for (const char* path : {"/", "/ui/", "/ui/index.html"}) {
    auto page = Call(p, "GET", path);
    EXPECT_EQ(page.status, 200) << path;
    EXPECT_EQ(page.Header("content-type"), "text/html; charset=utf-8");
    EXPECT_NE(page.body.find("<title>Spillway</title>"), std::string::npos);
    EXPECT_NE(page.Header("content-security-policy").find("script-src 'self'"), std::string::npos);
  }
  auto js = Call(p, "GET", "/ui/app.js");
  EXPECT_EQ(js.status, 200);
  EXPECT_EQ(js.Header("content-type"), "text/javascript; charset=utf-8");
  EXPECT_NE(js.body.find("/v1/events"), std::string::npos);
  EXPECT_EQ(Call(p, "GET", "/ui/style.css").status, 200);
  EXPECT_EQ(Call(p, "GET", "/ui/missing.js").status, 404);
  // The Host allow-list still applies (DNS rebinding).
  EXPECT_EQ(Call(p, "GET", "/", "", {{"Host", "evil.example"}}).status, 403);
  // Its data needs the key, in the header.
  EXPECT_EQ(Call(p, "GET", "/v1/events").status, 401);
  EXPECT_EQ(Call(p, "GET", "/v1/status").status, 401);
  EXPECT_EQ(Call(p, "GET", "/v1/requests").status, 401);
  EventReader events(p, kA);
  ASSERT_TRUE(events.Saw("event: snapshot")) << events.Text();
  EXPECT_EQ(events.code(), 200);
  EXPECT_EQ(events.Text().find("event: history"), events.Text().find("event:")) << "history comes first";
  const json snap = events.Last("snapshot");
  ASSERT_TRUE(snap.is_object()) << events.Text();
  ASSERT_EQ(snap["services"].size(), 2u);
  EXPECT_EQ(snap["services"][0]["name"], "chat");
  EXPECT_EQ(snap["services"][0]["state"], "ready");
  EXPECT_EQ(snap["services"][1]["name"], "embed");
  EXPECT_EQ(snap["devices"][0]["name"], "cpu");
  EXPECT_GT(snap["devices"][0]["total_bytes"].get<uint64_t>(), 0u);
  EXPECT_GT(snap["devices"][0]["services"][0]["weights_bytes"].get<uint64_t>(), 0u);
}

TEST(DashboardTest, EachCallerSeesItsOwnRequestsAndTheCancelAsAnIncident) {
  GatewayProcess gw(TestConfig(1, "api_keys = [\"sk-a\", \"sk-b\"]\noperator_keys = [\"sk-op\"]\n"));
  ASSERT_TRUE(gw.Start()) << gw.Output();
  const uint16_t p = gw.port();
  EventReader a_events(p, kA), b_events(p, kB);
  ASSERT_TRUE(a_events.Saw("event: snapshot"));
  ASSERT_TRUE(b_events.Saw("event: snapshot"));
  // One long request runs (one slot); a second waits behind it.
  auto post = [&](const std::string& id) {
    http::HeaderList h = kA;
    h.emplace_back("X-Request-Id", id);
    return std::thread([p, h] { (void)http::Fetch("127.0.0.1", p, "POST", "/v1/chat/completions", Chat(4000), h, std::chrono::seconds(120)); });
  };
  std::thread running = post("dash-running");
  json list;
  for (int i = 0; i < 500 && !Has(Ids(list), "dash-running"); ++i) {
    list = Body(Call(p, "GET", "/v1/requests", "", kA))["data"];
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::thread waiting = post("dash-waiting");
  json mine;
  for (int i = 0; i < 500; ++i) {
    mine = Body(Call(p, "GET", "/v1/requests", "", kA))["data"];
    if (Has(Ids(mine), "dash-waiting") && Has(Ids(mine), "dash-running")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(Has(Ids(mine), "dash-waiting")) << mine.dump();
  for (const auto& r : mine) {
    EXPECT_FALSE(r.contains("_client")) << "the owner stays inside the gateway";
    if (r["id"] == "dash-waiting") {
      EXPECT_EQ(r["phase"], "queued");
      EXPECT_EQ(r["position"], 1);
      EXPECT_EQ(r["service"], "chat");
    }
    if (r["id"] == "dash-running") {
      EXPECT_NE(r["phase"], "queued");
      EXPECT_EQ(r["placement"], "cpu");
      EXPECT_EQ(r["attempts"], 1);
    }
  }
  // Another key sees none of them; an operator sees both.
  EXPECT_TRUE(Body(Call(p, "GET", "/v1/requests", "", kB))["data"].empty());
  EXPECT_TRUE(Body(Call(p, "GET", "/v1/status", "", kB))["requests"].empty());
  EXPECT_TRUE(Has(Ids(Body(Call(p, "GET", "/v1/requests", "", kOp))["data"]), "dash-waiting"));
  ASSERT_TRUE(a_events.Saw("dash-waiting")) << "the stream lists the caller's requests";
  const json status = Body(Call(p, "GET", "/v1/status", "", kA));
  EXPECT_EQ(status["services"][0]["requests"]["queued"], 1);
  EXPECT_EQ(status["services"][0]["requests"]["running"], 1);
  // The page's Cancel: a DELETE from the gateway's own origin, with the key.
  http::HeaderList same_origin = kA;
  same_origin.emplace_back("Origin", "http://127.0.0.1:" + std::to_string(p));
  auto cancelled = Call(p, "DELETE", "/v1/requests/dash-waiting", "", same_origin);
  EXPECT_EQ(cancelled.status, 200) << cancelled.body;
  EXPECT_EQ(Body(cancelled)["state"], "cancelled");
  // Another origin is still refused.
  http::HeaderList foreign = kA;
  foreign.emplace_back("Origin", "http://127.0.0.1:1");
  EXPECT_EQ(Call(p, "DELETE", "/v1/requests/dash-running", "", foreign).status, 403);
  ASSERT_TRUE(a_events.Saw("event: incident")) << a_events.Text();
  const json incident = a_events.Last("incident");
  EXPECT_EQ(incident["kind"], "cancelled");
  EXPECT_EQ(incident["request_id"], "dash-waiting");
  EXPECT_EQ(incident["service"], "chat");
  // The next snapshots keep it with the caller's own id (they took it off:
  // the page's list lost the id the incident event had shown).
  json listed;
  for (int i = 0; i < 500 && listed.is_null(); ++i) {
    const json snap = a_events.Last("snapshot");
    if (snap.is_object() && snap.contains("incidents")) {
      for (const auto& inc : snap["incidents"]) {
        if (inc.value("kind", "") == "cancelled") listed = inc;
      }
    }
    if (listed.is_null()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_FALSE(listed.is_null()) << a_events.Text();
  EXPECT_EQ(listed.value("request_id", ""), "dash-waiting") << listed.dump();
  EXPECT_FALSE(listed.contains("_client"));
  // Key B hears of it without the id, which is not its own.
  ASSERT_TRUE(b_events.Saw("event: incident")) << b_events.Text();
  EXPECT_EQ(b_events.Text().find("dash-waiting"), std::string::npos);
  Call(p, "DELETE", "/v1/requests/dash-running", "", kA);
  running.join();
  waiting.join();
  EXPECT_EQ(WaitTerminal(p, "dash-running", 60, kA)["state"], "cancelled");
  // /v1/status keeps the recent incidents too.
  const json after = Body(Call(p, "GET", "/v1/status", "", kA));
  ASSERT_FALSE(after["incidents"].empty());
  EXPECT_EQ(after["incidents"].back()["kind"], "cancelled");
}

TEST(DashboardTest, ALostDeviceShowsTheFallbackItsLimitsAndTheIncidents) {
  ScopedSimDir sim("dashboard");
  ASSERT_TRUE(devices::SimLedger::Create(0, 256 << 20).ok());
  std::ostringstream os;
  os << "[[device]]\nname = \"sim:0\"\nheadroom_mib = 16\nheadroom_pct = 0\n"
     << "[[service]]\nname = \"chat\"\nmodel = \"" << ModelPath("tiny-chat") << "\"\n"
     << "[service.failover]\nbreaker_failures = 1\nejection_s = 600\nmax_ejection_s = 600\n"
     << "[service.cpu_path]\nmax_tokens = 512\n"
     << "[[service.placement]]\ndevice = \"sim:0\"\ngpu_layers = 99\nctx = 2048\nslots = 2\nthreads = 1\nbatch = 64\n"
     << "[[service.placement]]\nrole = \"fallback\"\ndevice = \"cpu\"\nmodel = \"" << ModelPath("tiny-chat-b")
     << "\"\ndifferent_model = true\nctx = 2048\nslots = 2\nthreads = 1\n"
     << "[[service]]\nname = \"embed\"\nmodel = \"" << ModelPath("tiny-embed") << "\"\n"
     << "[[service.placement]]\ndevice = \"cpu\"\nctx = 512\nslots = 1\nthreads = 1\n";
  GatewayProcess gw(os.str());
  ASSERT_TRUE(gw.Start()) << gw.Output();
  const uint16_t p = gw.port();
  // /readyz is ready once any placement serves (the CPU fallback may load
  // first): the primary on sim:0 is waited for, as a condition.
  json status = Body(Call(p, "GET", "/v1/status"));
  for (int i = 0; i < 1500 && status["services"][0]["state"] != "ready"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    status = Body(Call(p, "GET", "/v1/status"));
  }
  ASSERT_EQ(status["services"][0]["state"], "ready") << status.dump();
  json sim0;
  for (const auto& d : status["devices"]) {
    if (d["name"] == "sim:0") sim0 = d;
  }
  ASSERT_TRUE(sim0.is_object()) << status["devices"].dump();
  EXPECT_EQ(sim0["kind"], "sim");
  EXPECT_EQ(sim0["total_bytes"], 256 << 20);
  EXPECT_EQ(sim0["headroom_bytes"], 16 << 20);
  ASSERT_EQ(sim0["services"].size(), 1u);
  EXPECT_GT(sim0["services"][0]["weights_bytes"].get<uint64_t>(), 0u);
  EXPECT_GT(sim0["services"][0]["kv_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(sim0["other_bytes"], 0) << "nothing else holds the simulated device";
  EventReader events(p, {});
  ASSERT_TRUE(events.Saw("event: snapshot"));
  // The device is lost under a request: it moves to the fallback model.
  const uint16_t gpu = status["services"][0]["placements"][0]["port"].get<uint16_t>();
  ASSERT_EQ(http::Fetch("127.0.0.1", gpu, "POST", "/v1/worker/faults", json{{"faults", {"lose-at-token=2"}}}.dump(),
                        WorkerAuth())->status, 200);
  auto r = Call(p, "POST", "/v1/chat/completions", Chat(8), {{"X-Request-Id", "dash-lost"}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Header("x-spillway-placement"), "cpu");
  ASSERT_TRUE(events.Saw("\"kind\":\"failover\"")) << events.Text();
  ASSERT_TRUE(events.Saw("\"state\":\"degraded\"")) << events.Text();
  status = Body(Call(p, "GET", "/v1/status"));
  const json chat = status["services"][0];
  EXPECT_EQ(chat["state"], "degraded");
  EXPECT_EQ(chat["serving"]["placement"], "cpu");
  EXPECT_EQ(chat["serving"]["model"], "tiny-chat-b");
  EXPECT_EQ(chat["serving"]["different_model"], true);
  EXPECT_NE(chat["serving"]["limits"].get<std::string>().find("answers of up to 512 tokens"), std::string::npos)
      << chat["serving"].dump();
  EXPECT_NE(chat["serving"]["summary"].get<std::string>().find("tiny-chat-b"), std::string::npos);
  std::vector<std::string> kinds;
  for (const auto& i : status["incidents"]) kinds.push_back(i["kind"]);
  EXPECT_TRUE(Has(kinds, "failover")) << status["incidents"].dump();
  EXPECT_TRUE(Has(kinds, "breaker")) << status["incidents"].dump();
  EXPECT_TRUE(Has(kinds, "degraded")) << status["incidents"].dump();
  for (const auto& i : status["incidents"]) {
    if (i["kind"] == "failover") {
      EXPECT_EQ(i["request_id"], "dash-lost");
      EXPECT_NE(i["reason"].get<std::string>().find("moved from sim:0/99 to cpu"), std::string::npos) << i.dump();
    }
  }
  EXPECT_EQ(status["services"][1]["state"], "ready") << "the unrelated service is untouched";
}

// A service none of whose placements can work (--keep-going) is told as
// unavailable, and a device that cannot be observed says why instead of numbers.
TEST(DashboardTest, AServiceThatCannotServeIsUnavailableInWords) {
  GatewayProcess gw(TestConfig(1) + "[[service]]\nname = \"gpu\"\nmodel = \"" + ModelPath("tiny-chat") +
                    "\"\n[[service.placement]]\ndevice = \"cuda:7\"\ngpu_layers = 99\n");
  gw.SetExtraArgs({"--keep-going"});
  ASSERT_TRUE(gw.Start(std::chrono::seconds(60), /*wait_ready=*/false)) << gw.Output();
  json status;
  for (int i = 0; i < 500; ++i) {
    status = Body(Call(gw.port(), "GET", "/v1/status"));
    if (status["services"][0]["state"] == "ready") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(status["services"].size(), 3u);
  const json gpu = status["services"][2];
  EXPECT_EQ(gpu["state"], "unavailable") << gpu.dump();
  // Its one-line reason does not send its requests to a fallback it lacks.
  EXPECT_EQ(gpu["degraded"].get<std::string>().find("fallback"), std::string::npos) << gpu.dump();
  EXPECT_NE(gpu["serving"]["summary"].get<std::string>().find("503"), std::string::npos) << gpu.dump();
  json cuda;
  for (const auto& d : status["devices"]) {
    if (d["name"] == "cuda:7") cuda = d;
  }
  ASSERT_TRUE(cuda.is_object()) << status["devices"].dump();
  EXPECT_EQ(cuda["kind"], "cuda");
  EXPECT_FALSE(cuda.value("error", "").empty()) << cuda.dump();
  EXPECT_FALSE(cuda.contains("total_bytes"));
  EXPECT_EQ(status["services"][0]["state"], "ready");
}

// A model that takes a while to load (the slow-load fault stretches it to 4 s)
// shows how far it is, in bytes, in /v1/status, the event stream and the
// service's summary; once ready, the load is no longer reported.
TEST(DashboardTest, AModelLoadShowsItsProgressInBytes) {
  ::setenv("SPILLWAY_FAULTS", "slow-load=4", 1);  // the workers inherit it (and only they read it)
  GatewayProcess gw(TestConfig(1));
  const bool started = gw.Start(std::chrono::seconds(60), /*wait_ready=*/false);
  ::unsetenv("SPILLWAY_FAULTS");
  ASSERT_TRUE(started) << gw.Output();
  EventReader events(gw.port(), {});
  json partial;
  std::string summary;
  for (int i = 0; i < 400 && partial.is_null(); ++i) {
    const json status = Body(Call(gw.port(), "GET", "/v1/status"));
    for (const auto& p : status["services"][0]["placements"]) {
      if (!p.contains("load")) continue;
      const double f = p["load"]["fraction"].get<double>();
      if (f > 0 && f < 1) {
        partial = p["load"];
        summary = status["services"][0]["serving"].value("summary", "");
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_FALSE(partial.is_null()) << "no load progress seen while the model loaded";
  EXPECT_GT(partial["loaded_bytes"].get<uint64_t>(), 0u);
  EXPECT_LT(partial["loaded_bytes"].get<uint64_t>(), partial["total_bytes"].get<uint64_t>());
  EXPECT_EQ(partial["total_bytes"].get<uint64_t>(), std::filesystem::file_size(ModelPath("tiny-chat")));
  EXPECT_NE(summary.find("% loaded"), std::string::npos) << summary;
  EXPECT_TRUE(events.Saw("\"loaded_bytes\"")) << events.Text().substr(0, 2000);
  json status;
  for (int i = 0; i < 500; ++i) {
    status = Body(Call(gw.port(), "GET", "/v1/status"));
    if (status["services"][0]["state"] == "ready") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(status["services"][0]["state"], "ready") << status.dump();
  EXPECT_FALSE(status["services"][0]["placements"][0].contains("load"));
}

// The service's estimated wait is the board's (the one admission acts on):
// nothing on an idle, measured placement; more than nothing while its only
// slot runs a long answer.
TEST(DashboardTest, TheEstimatedWaitIsAdmissions) {
  GatewayProcess gw(TestConfig(1));
  ASSERT_TRUE(gw.Start()) << gw.Output();
  ASSERT_EQ(Call(gw.port(), "POST", "/v1/chat/completions", Chat(8)).status, 200);
  json status = Body(Call(gw.port(), "GET", "/v1/status"));
  EXPECT_EQ(status["services"][0]["serving"]["est_wait_s"], 0.0) << status["services"][0].dump();
  EXPECT_EQ(status["services"][0]["placements"][0]["est_wait_s"], 0.0);
  std::atomic<bool> done{false};
  std::thread long_answer([&] {
    (void)Call(gw.port(), "POST", "/v1/chat/completions", Chat(3500));  // (still running when asked, loaded too)
    done = true;
  });
  double busy_wait = 0;
  for (int i = 0; i < 500 && !done && busy_wait <= 0; ++i) {
    status = Body(Call(gw.port(), "GET", "/v1/status"));
    const json w = status["services"][0]["serving"]["est_wait_s"];
    if (w.is_number()) busy_wait = w.get<double>();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  long_answer.join();
  EXPECT_GT(busy_wait, 0) << "a new request waits for the only slot, yet the estimate said nothing";
}

}  // namespace
}  // namespace spillway::testing
