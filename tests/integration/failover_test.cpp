// Failover in the gateway on the simulated device: allocation failures and a
// lost device move the request to the CPU fallback under the same id, with
// the output the GPU path would have produced.
#include <gtest/gtest.h>

#include "scoped_sim_dir.h"
#include <nlohmann/json.hpp>

#include <atomic>
#include <filesystem>
#include <sstream>
#include <thread>

#include "api/http_client.h"
#include "devices/sim_ledger.h"
#include "gateway_process.h"
#include "journal_check.h"
#include "worker_process.h"

namespace spillway::testing {
namespace {

using nlohmann::json;

json Body(const http::ClientResponse& r) { return json::parse(r.body, nullptr, false); }

class FailoverTest : public ::testing::Test {
 public:  // the checks below are free functions shared with the mutation fixtures
  // Deliberate bugs switched on for this fixture's gateway and workers
  // (common/mutation.h); empty for the real thing.
  virtual std::string Mutations() const { return ""; }
  // The chat service's model (a test model of build/models).
  virtual std::string Model() const { return "tiny-chat"; }

  void SetUp() override {
    sim_ = std::make_unique<ScopedSimDir>("failover");
    ASSERT_TRUE(devices::SimLedger::Create(0, 256 << 20).ok());
    std::ostringstream os;
    os << "[[service]]\nname = \"chat\"\nmodel = \"" << ModelPath(Model()) << "\"\n"
       << "[service.failover]\nbreaker_failures = 1\nejection_s = 3\n"  // (3 s: its checks fit a loaded machine)
       << "[[service.placement]]\ndevice = \"sim:0\"\ngpu_layers = 99\nctx = 2048\nslots = 2\nthreads = 1\nbatch = 64\n"
       << "progress_timeout_s = 0.5\n"
       << "[[service.placement]]\nrole = \"fallback\"\ndevice = \"cpu\"\nctx = 2048\nslots = 2\nthreads = 1\nbatch = 64\n"
       // An unrelated service on the same host, which must keep serving throughout.
       << "[[service]]\nname = \"embed\"\nmodel = \"" << ModelPath("tiny-embed") << "\"\n"
       << "[[service.placement]]\ndevice = \"cpu\"\nctx = 512\nslots = 1\nthreads = 1\n";
    gw_ = std::make_unique<GatewayProcess>(os.str());
    if (!Mutations().empty()) setenv("SPILLWAY_MUTATIONS", Mutations().c_str(), 1);
    const bool started = gw_->Start();
    unsetenv("SPILLWAY_MUTATIONS");
    ASSERT_TRUE(started) << gw_->Output();
    WaitPlacements("ready");
  }
  void TearDown() override {
    // Invariant 1: every accepted request ended in exactly one terminal state.
    if (gw_) {
      const JournalCheck j = CheckJournal(gw_->state_dir());
      EXPECT_TRUE(j.problems.empty()) << ::testing::PrintToString(j.problems);
      EXPECT_FALSE(j.state.empty());
    }
    gw_.reset();
    sim_.reset();
  }
  json Placement(size_t i) { return Body(*http::Fetch("127.0.0.1", gw_->port(), "GET", "/v1/status"))["services"][0]["placements"][i]; }
  void WaitPlacements(const std::string& state) {
    for (int i = 0; i < 1000; ++i) {
      if (Placement(0)["state"] == state && Placement(1)["state"] == state) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  void ArmGpu(const std::string& fault) {
    const uint16_t port = Placement(0)["port"].get<uint16_t>();
    auto r = http::Fetch("127.0.0.1", port, "POST", "/v1/worker/faults", json{{"faults", {fault}}}.dump(), WorkerAuth());
    ASSERT_TRUE(r.ok() && r->status == 200) << (r.ok() ? r->body : r.status().ToString());
  }
  http::ClientResponse Post(const json& body, const std::string& id) {
    auto r = http::Fetch("127.0.0.1", gw_->port(), "POST", "/v1/completions", body.dump(), {{"X-Request-Id", id}},
                         std::chrono::seconds(60));
    EXPECT_TRUE(r.ok());
    return r.ok() ? *r : http::ClientResponse{};
  }
  json Request(const std::string& id) {
    return Body(*http::Fetch("127.0.0.1", gw_->port(), "GET", "/v1/requests/" + id));
  }

  std::unique_ptr<ScopedSimDir> sim_;
  std::unique_ptr<GatewayProcess> gw_;
};

const json kSeeded = {{"model", "chat"}, {"prompt", "The failover"}, {"max_tokens", 24}, {"temperature", 1.0},
                      {"top_k", 0}, {"top_p", 1.0}, {"min_p", 0}, {"seed", 777}, {"ignore_eos", true}};

TEST_F(FailoverTest, AllocationFailureBeforeGenerationCompletesOnTheCpuUnderTheSameId) {
  auto healthy = Post(kSeeded, "fo-healthy");
  ASSERT_EQ(healthy.status, 200) << healthy.body;
  ASSERT_EQ(healthy.Header("x-spillway-placement"), "sim:0/99");
  ArmGpu("compute-error");
  auto r = Post(kSeeded, "fo-alloc");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Header("x-request-id"), "fo-alloc");
  EXPECT_EQ(Body(r)["id"], "fo-alloc");
  EXPECT_EQ(r.Header("x-spillway-placement"), "cpu");
  EXPECT_NE(r.Header("x-spillway-degraded").find("fallback"), std::string::npos);
  EXPECT_EQ(r.Header("x-spillway-attempts"), "2");
  // Seeded sampling: the CPU produced exactly what the GPU path produces.
  EXPECT_EQ(Body(r)["choices"][0]["text"], Body(healthy)["choices"][0]["text"]);
  json rec = Request("fo-alloc");
  EXPECT_EQ(rec["state"], "completed");
  EXPECT_EQ(rec["attempts"], 2);  // one journaled retry
  EXPECT_EQ(rec["placement"], "cpu");
  // The breaker (1 failure) opened: the GPU placement is skipped until its ejection ends.
  EXPECT_EQ(Placement(0)["breaker"]["state"], "open");
  auto next = Post(kSeeded, "fo-next");
  EXPECT_EQ(next.Header("x-spillway-placement"), "cpu");
  EXPECT_EQ(next.Header("x-spillway-attempts"), "1");
  // Status says when the ejection ends; after it a probe goes to the GPU
  // again and closes the breaker.
  const json open = Placement(0)["breaker"];
  ASSERT_TRUE(open.contains("retry_in_ms")) << open.dump();
  EXPECT_LE(open["retry_in_ms"].get<int64_t>(), 3000);
  for (int i = 0; i < 1000 && Placement(0)["breaker"].value("retry_in_ms", int64_t{0}) > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(Placement(0)["breaker"].value("retry_in_ms", int64_t{0}), 0);
  auto probe = Post(kSeeded, "fo-probe");
  EXPECT_EQ(probe.Header("x-spillway-placement"), "sim:0/99") << probe.body;
  EXPECT_EQ(Placement(0)["breaker"]["state"], "closed");
  EXPECT_NE(http::Fetch("127.0.0.1", gw_->port(), "GET", "/metrics")->body.find("spillway_breaker_open"), std::string::npos);
}

std::string StreamText(const std::string& body) {
  std::string text;
  for (const auto& e : http::ParseSseData(body)) {
    json j = json::parse(e, nullptr, false);
    if (j.is_object() && j.contains("choices") && !j["choices"].empty()) text += j["choices"][0].value("text", "");
  }
  return text;
}

// The non-streamed text with the device lost at token 10 (replayed on the
// CPU) and without a fault; equal when the replay is faithful.
struct Replayed {
  std::string expected, got;
};
Replayed ReplayAfterLoss(FailoverTest& t, const std::string& id) {
  auto healthy = t.Post(kSeeded, id + "-healthy");
  EXPECT_EQ(healthy.status, 200) << healthy.body;
  t.ArmGpu("lose-at-token=10");
  auto r = t.Post(kSeeded, id);
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Header("x-spillway-placement"), "cpu");
  EXPECT_FALSE(Body(healthy)["choices"][0]["text"].get<std::string>().empty());
  return {Body(healthy)["choices"][0]["text"], Body(r)["choices"][0].value("text", "")};
}

TEST_F(FailoverTest, DeviceLostMidGenerationReplaysOnTheCpuWithTheSameOutput) {
  const Replayed r = ReplayAfterLoss(*this, "dl-lost");
  EXPECT_EQ(r.got, r.expected);
  EXPECT_EQ(Request("dl-lost")["attempts"], 2);
  // A lost device is out for every placement on it: the device's breaker opened too.
  // (/v1/status lists the host, "cpu", among the devices too, with no breaker.)
  const json devices = Body(*http::Fetch("127.0.0.1", gw_->port(), "GET", "/v1/status"))["devices"];
  ASSERT_EQ(devices.size(), 2u) << devices.dump();
  EXPECT_EQ(devices[0]["name"], "sim:0");
  EXPECT_EQ(devices[0]["breaker"]["state"], "open") << devices.dump();
  EXPECT_EQ(devices[1]["name"], "cpu");
  EXPECT_FALSE(devices[1].contains("breaker"));
  // The lost device's worker is replaced by the supervisor; the unrelated CPU path never stopped.
  json gpu;
  for (int i = 0; i < 500; ++i) {
    gpu = Placement(0);
    if (gpu["restarts"].get<int>() >= 1 && gpu["state"] == "ready") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GE(gpu["restarts"].get<int>(), 1) << gpu.dump();
  EXPECT_EQ(gpu["state"], "ready") << gpu.dump();
}

TEST_F(FailoverTest, AHungGpuWorkerIsDetectedReplacedAndItsRequestServedByTheCpu) {
  auto healthy = Post(kSeeded, "hang-healthy");
  ASSERT_EQ(healthy.status, 200) << healthy.body;
  const int pid = Placement(0)["pid"].get<int>();
  const json embed_before = Body(*http::Fetch("127.0.0.1", gw_->port(), "GET", "/v1/status"))["services"][1]["placements"][0];
  ArmGpu("hang=60");  // the decode loop stalls; /health still answers
  const auto t0 = std::chrono::steady_clock::now();
  // The unrelated service answers while the GPU worker hangs and is replaced.
  std::atomic<bool> hang_done{false};
  int embeds_ok = 0, embeds = 0;
  std::thread unrelated([&] {
    while (!hang_done) {
      auto e = http::Fetch("127.0.0.1", gw_->port(), "POST", "/v1/embeddings", json{{"model", "embed"}, {"input", "still here"}}.dump());
      ++embeds;
      embeds_ok += e.ok() && e->status == 200;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  auto r = Post(kSeeded, "hang-req");
  const auto took = std::chrono::steady_clock::now() - t0;
  // The breakers opened on the hung worker's failure. A stalled decode loop
  // is replaced as a lost device: the device's breaker keeps traffic on the
  // CPU for its ejection (the placement's own may be half-open by now, its
  // replacement ready), until a probe succeeds.
  EXPECT_NE(Placement(0)["breaker"]["state"], "closed");
  EXPECT_EQ(Placement(0)["device_breaker"]["state"], "open");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Header("x-spillway-placement"), "cpu");
  EXPECT_EQ(Body(r)["choices"][0]["text"], Body(healthy)["choices"][0]["text"]);
  EXPECT_LT(took, std::chrono::seconds(5));  // progress timeout 0.5 s + health period 1 s + the CPU's own run
  json gpu;
  for (int i = 0; i < 500; ++i) {
    gpu = Placement(0);
    if (gpu["pid"].get<int>() != pid && gpu["state"] == "ready") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_NE(gpu["pid"].get<int>(), pid) << gpu.dump();
  EXPECT_EQ(gpu["state"], "ready");
  hang_done = true;
  unrelated.join();
  EXPECT_GT(embeds, 0);
  EXPECT_EQ(embeds_ok, embeds);
  const json embed_after = Body(*http::Fetch("127.0.0.1", gw_->port(), "GET", "/v1/status"))["services"][1]["placements"][0];
  EXPECT_EQ(embed_after["pid"], embed_before["pid"]);  // untouched by the GPU worker's replacement
  // The restarted worker's readiness lets its placement's breaker probe at
  // once; a stalled decode loop also tripped the device's, which stays open
  // for its ejection (3 s). Then a probe goes to the restarted GPU worker.
  auto retry_in = [&](const char* which) {
    const json b = Placement(0)[which];
    return b.is_object() ? b.value("retry_in_ms", int64_t{0}) : int64_t{0};
  };
  for (int i = 0; i < 1000 && (retry_in("breaker") > 0 || retry_in("device_breaker") > 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto probe = Post(kSeeded, "hang-probe");
  EXPECT_EQ(probe.Header("x-spillway-placement"), "sim:0/99") << probe.body;
  EXPECT_EQ(Body(probe)["choices"][0]["text"], Body(healthy)["choices"][0]["text"]);
  EXPECT_EQ(Placement(0)["breaker"]["state"], "closed");
}


// A stream whose device is lost at token 10, continued on the CPU, against
// the same request answered without a fault, not streamed.
struct Continued {
  std::string expected, got;
  bool error_event = false;
};
Continued ContinueAfterLoss(FailoverTest& t, const std::string& id) {
  auto healthy = t.Post(kSeeded, id + "-healthy");
  EXPECT_EQ(healthy.status, 200) << healthy.body;
  json body = kSeeded;
  body["stream"] = true;
  t.ArmGpu("lose-at-token=10");
  auto r = t.Post(body, id);
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Header("x-spillway-placement"), "sim:0/99");  // where the stream started
  const bool error_event = r.body.find("\"error\"") != std::string::npos;
  if (!error_event) {  // (a continuation the CPU worker refused did not continue: it ends with a resumable error)
    EXPECT_NE(r.body.find(": spillway: continued on cpu"), std::string::npos) << r.body;
  } else {
    EXPECT_NE(r.body.find("checkpoint"), std::string::npos) << r.body;
  }
  EXPECT_FALSE(Body(healthy)["choices"][0]["text"].get<std::string>().empty());
  return {Body(healthy)["choices"][0]["text"], StreamText(r.body), error_event};
}

// The stream lost at token 10 was continued on the CPU, faithfully.
void ExpectContinuedOnTheCpu(FailoverTest& t, const std::string& id) {
  const Continued c = ContinueAfterLoss(t, id);
  EXPECT_FALSE(c.error_event);
  // Recomputed prompt + delivered tokens with the seeded sampler advanced: the
  // client's text is exactly the uninterrupted one (which a stream and a
  // non-streamed answer share).
  EXPECT_EQ(c.got, c.expected);
  json rec = t.Request(id);
  EXPECT_EQ(rec["state"], "completed");
  EXPECT_EQ(rec["attempts"], 2);
  EXPECT_EQ(rec["placement"], "cpu");
}

TEST_F(FailoverTest, DeviceLostMidStreamIsContinuedOnTheCpuWithTheSameTokens) { ExpectContinuedOnTheCpu(*this, "ms-lost"); }

TEST_F(FailoverTest, StreamFailingBeforeItsFirstTokenRunsOnTheFallback) {
  ArmGpu("fail-next=reserve");
  json body = kSeeded;
  body["stream"] = true;
  auto r = Post(body, "fo-stream");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Header("x-spillway-placement"), "cpu");
  auto events = http::ParseSseData(r.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(r.body.find("\"error\""), std::string::npos) << r.body;
  EXPECT_EQ(Request("fo-stream")["state"], "completed");
}

// An agent request: the model must call a tool (grammar-constrained, so even
// the random-weight model does). Once a tool call has reached the client, the
// agent may have run it: the stream is never replayed past it.
TEST_F(FailoverTest, AnAgentStreamIsNotReplayedPastADeliveredToolCall) {
  const json tools = json::array({{{"type", "function"},
                                   {"function", {{"name", "increment"},
                                                 {"parameters", {{"type", "object"}, {"properties", json::object()}}}}}}});
  json body = {{"model", "chat"}, {"messages", {{{"role", "user"}, {"content", "add one"}}}}, {"tools", tools},
               {"tool_choice", "required"}, {"parallel_tool_calls", false}, {"seed", 5}, {"max_tokens", 120}};
  auto chat = [&](const json& b, const std::string& id) {
    auto r = http::Fetch("127.0.0.1", gw_->port(), "POST", "/v1/chat/completions", b.dump(), {{"X-Request-Id", id}},
                         std::chrono::seconds(60));
    EXPECT_TRUE(r.ok());
    return r.ok() ? *r : http::ClientResponse{};
  };
  auto healthy = chat(body, "agent-healthy");
  ASSERT_EQ(healthy.status, 200) << healthy.body;
  const json hj = json::parse(healthy.body);
  ASSERT_EQ(hj["choices"][0]["finish_reason"], "tool_calls") << healthy.body;
  ASSERT_EQ(hj["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "increment");
  const int tokens = hj["usage"]["completion_tokens"].get<int>();
  // The device is lost right after the call's last token was sampled (and sent).
  ArmGpu("lose-at-token=" + std::to_string(tokens));
  body["stream"] = true;
  auto r = chat(body, "agent-lost");
  ASSERT_EQ(r.status, 200) << r.body;
  int calls = 0;
  json error;
  for (const auto& e : http::ParseSseData(r.body)) {
    json j = json::parse(e, nullptr, false);
    if (!j.is_object()) continue;
    if (j.contains("error")) error = j["error"];
    // A call is streamed as llama-server streams it: its first delta has the id, later ones pieces of arguments.
    if (j.contains("choices") && !j["choices"].empty() && j["choices"][0]["delta"].contains("tool_calls")) {
      for (const auto& d : j["choices"][0]["delta"]["tool_calls"]) calls += d.contains("id") ? 1 : 0;
    }
  }
  EXPECT_EQ(calls, 1) << r.body;  // delivered once, never generated again
  ASSERT_TRUE(error.is_object()) << r.body;
  EXPECT_EQ(error["request_id"], "agent-lost");
  EXPECT_TRUE(error["checkpoint"]["tool_calls_delivered"].get<bool>()) << error.dump();
  EXPECT_NE(error["message"].get<std::string>().find("not replayed past them"), std::string::npos);
  EXPECT_EQ(http::ParseSseData(r.body).back(), "[DONE]");
  json rec = Request("agent-lost");
  EXPECT_EQ(rec["state"], "failed_resumable");
  EXPECT_EQ(rec["attempts"], 1);  // no second attempt ran the model again
}

// fail_fast: "the accelerator or an error", never a silent spill, on failures too.
TEST(FailFastTest, AFailedGpuAttemptIsAnErrorNotASpill) {
  ScopedSimDir sim("failfast");
  ASSERT_TRUE(devices::SimLedger::Create(0, 256 << 20).ok());
  std::ostringstream os;
  os << "[[service]]\nname = \"chat\"\nmodel = \"" << ModelPath("tiny-chat") << "\"\n"
     << "[service.admission]\nfail_fast = true\n"
     << "[[service.placement]]\ndevice = \"sim:0\"\ngpu_layers = 99\nctx = 1024\nslots = 2\nthreads = 1\nbatch = 64\n"
     << "[[service.placement]]\nrole = \"fallback\"\ndevice = \"cpu\"\nctx = 1024\nslots = 2\nthreads = 1\nbatch = 64\n";
  GatewayProcess gw(os.str());
  ASSERT_TRUE(gw.Start()) << gw.Output();
  json gpu;
  for (int i = 0; i < 500; ++i) {
    gpu = json::parse(http::Fetch("127.0.0.1", gw.port(), "GET", "/v1/status")->body)["services"][0]["placements"][0];
    if (gpu["state"] == "ready") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(http::Fetch("127.0.0.1", gpu["port"].get<uint16_t>(), "POST", "/v1/worker/faults",
                          json{{"faults", {"compute-error"}}}.dump(), WorkerAuth())->status == 200);
  auto r = http::Fetch("127.0.0.1", gw.port(), "POST", "/v1/completions",
                       json{{"model", "chat"}, {"prompt", "x"}, {"max_tokens", 4}}.dump(), {{"X-Request-Id", "ff-1"}});
  ASSERT_TRUE(r.ok());
  EXPECT_GE(r->status, 500) << r->body;
  EXPECT_NE(r->Header("x-spillway-placement"), "cpu");
  const JournalCheck j = CheckJournal(gw.state_dir());
  EXPECT_TRUE(j.problems.empty()) << ::testing::PrintToString(j.problems);
  EXPECT_EQ(j.state.at("ff-1"), "failed");
  EXPECT_EQ(j.attempts.at("ff-1"), 1);
}

TEST(FallbackModelTest, AnUndeclaredDifferentModelIsRefusedADeclaredOneIsAnnounced) {
  auto config = [](bool declared) {
    std::ostringstream os;
    os << "[[service]]\nname = \"chat\"\nmodel = \"" << ModelPath("tiny-chat") << "\"\n"
       << "[service.admission]\nfail_fast = false\n"
       << "[[service.placement]]\ndevice = \"cpu\"\nctx = 256\nslots = 1\nthreads = 1\n"
       << "[[service.placement]]\nrole = \"fallback\"\nmodel = \"" << ModelPath("tiny-chat-b") << "\"\n"
       << (declared ? "different_model = true\n" : "") << "device = \"cpu\"\nctx = 4096\nslots = 1\nthreads = 1\n";
    return os.str();
  };
  GatewayProcess refused(config(false));
  EXPECT_FALSE(refused.Start(std::chrono::seconds(20)));
  EXPECT_NE(refused.Output().find("fingerprint differs"), std::string::npos) << refused.Output();
  GatewayProcess gw(config(true));
  ASSERT_TRUE(gw.Start()) << gw.Output();
  for (int i = 0; i < 500; ++i) {
    json s = json::parse(http::Fetch("127.0.0.1", gw.port(), "GET", "/v1/status")->body);
    if (s["services"][0]["placements"][1]["state"] == "ready") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // 600 prompt tokens never fit the primary's 256 cells: the declared fallback model serves, announced.
  json tokens = json::array();
  for (int i = 0; i < 600; ++i) tokens.push_back(100 + i);
  auto r = http::Fetch("127.0.0.1", gw.port(), "POST", "/v1/completions",
                       json{{"model", "chat"}, {"prompt", tokens}, {"max_tokens", 4}}.dump());
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->Header("x-spillway-fallback-model"), "tiny-chat-b");
  const json j = json::parse(r->body);
  EXPECT_EQ(j["model"], "tiny-chat-b");
  EXPECT_EQ(j["spillway"]["fallback_model"], "tiny-chat-b");
}

// The same failovers on a hybrid (LFM2's layout): its recurrent state is
// rebuilt on the CPU from the prompt and the delivered tokens, as a KV cache
// is, and the client's tokens are the uninterrupted ones.
class HybridFailoverTest : public FailoverTest {
  std::string Model() const override { return "tiny-hybrid"; }
};
TEST_F(HybridFailoverTest, DeviceLostMidStreamIsContinuedOnTheCpuWithTheSameTokens) {
  ExpectContinuedOnTheCpu(*this, "hy-ms-lost");
}
TEST_F(HybridFailoverTest, DeviceLostMidGenerationReplaysOnTheCpuWithTheSameOutput) {
  const Replayed r = ReplayAfterLoss(*this, "hy-lost");
  EXPECT_EQ(r.got, r.expected);
  EXPECT_EQ(Request("hy-lost")["attempts"], 2);
}

// Mutation checks: each fixture runs the gateway and its workers with one
// deliberate bug (common/mutation.h) in the code a check above guards, and
// asserts that the check now fails. A check that cannot fail proves nothing.
class ContinuationOneSamplerStepBehind : public FailoverTest {
  std::string Mutations() const override { return "resume-skip-advance"; }
};
TEST_F(ContinuationOneSamplerStepBehind, FailsTheMidStreamContinuationCheck) {
  const Continued c = ContinueAfterLoss(*this, "mut-resume");
  EXPECT_TRUE(c.error_event || c.got != c.expected) << "a continuation one sampler step behind passed as faithful";
}

// (The hybrid's own tokens depend on its state: the same check fails there too.)
class HybridContinuationOneSamplerStepBehind : public FailoverTest {
  std::string Mutations() const override { return "resume-skip-advance"; }
  std::string Model() const override { return "tiny-hybrid"; }
};
TEST_F(HybridContinuationOneSamplerStepBehind, FailsTheMidStreamContinuationCheck) {
  const Continued c = ContinueAfterLoss(*this, "hy-mut-resume");
  EXPECT_TRUE(c.error_event || c.got != c.expected) << "a continuation one sampler step behind passed as faithful";
}

class FallbackWithoutThePinnedSeed : public FailoverTest {
  std::string Mutations() const override { return "fallback-drop-seed"; }
};
TEST_F(FallbackWithoutThePinnedSeed, FailsTheReplayCheck) {
  const Replayed r = ReplayAfterLoss(*this, "mut-seed");
  EXPECT_NE(r.got, r.expected) << "a fallback that dropped the seed passed as faithful";
}

class StreamLosingOneChunk : public FailoverTest {
  std::string Mutations() const override { return "relay-drop-chunk"; }
};
TEST_F(StreamLosingOneChunk, FailsTheMidStreamContinuationCheck) {
  const Continued c = ContinueAfterLoss(*this, "mut-chunk");
  EXPECT_NE(c.got, c.expected) << "a stream that lost a chunk passed as complete";
}

}  // namespace
}  // namespace spillway::testing
