// Admission in the gateway: real gateway, workers and simulated device.
#include <gtest/gtest.h>

#include "scoped_sim_dir.h"
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/wait.h>

#include <cmath>
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

http::ClientResponse Post(uint16_t port, const json& body) {
  auto r = http::Fetch("127.0.0.1", port, "POST", "/v1/completions", body.dump(), {}, std::chrono::seconds(120));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : http::ClientResponse{};
}

json Tokens(int n) {
  json a = json::array();
  for (int i = 0; i < n; ++i) a.push_back(100 + (i * 37) % 20000);
  return a;
}

// /readyz needs one ready placement per service; these tests want all of them.
void WaitAllReady(uint16_t port) {
  for (int i = 0; i < 1000; ++i) {
    json s = Body(*http::Fetch("127.0.0.1", port, "GET", "/v1/status"));
    bool all = true;
    // Ready, and what the worker says of itself (its memory) fetched by the supervisor.
    for (const auto& p : s["services"][0]["placements"]) {
      all &= !p["admitted"].get<bool>() || (p["state"] == "ready" && p.contains("memory"));
    }
    if (all) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

class AdmissionTest : public ::testing::Test {
 protected:
  void SetUp() override { sim_ = std::make_unique<ScopedSimDir>("admission"); dir_ = sim_->path(); }
  void TearDown() override { sim_.reset(); }
  std::unique_ptr<ScopedSimDir> sim_;
  std::string Config(const std::string& admission = "") {
    std::ostringstream os;
    os << "[[device]]\nname = \"sim:0\"\nheadroom_pct = 5\n"
       << "[[service]]\nname = \"chat\"\nmodel = \"" << ModelPath("tiny-chat") << "\"\n" << admission
       << "[[service.placement]]\ndevice = \"sim:0\"\ngpu_layers = 99\nctx = 1024\nslots = 2\nthreads = 1\nbatch = 64\n"
       << "[[service.placement]]\nrole = \"fallback\"\ndevice = \"cpu\"\nctx = 8192\nslots = 2\nthreads = 1\n";
    return os.str();
  }
  std::filesystem::path dir_;
};

TEST_F(AdmissionTest, LongPromptBeyondTheGpuPoolGoesToTheCpuPoolBeforeAnyAllocation) {
  ASSERT_TRUE(devices::SimLedger::Create(0, 256 << 20).ok());
  GatewayProcess gw(Config());
  ASSERT_TRUE(gw.Start()) << gw.Output();
  const uint16_t p = gw.port();
  WaitAllReady(p);
  auto small = Post(p, {{"model", "chat"}, {"prompt", Tokens(50)}, {"max_tokens", 20}, {"temperature", 0}});
  ASSERT_EQ(small.status, 200) << small.body;
  EXPECT_EQ(small.Header("x-spillway-placement"), "sim:0/99");
  EXPECT_EQ(small.Header("x-spillway-decision"), "admit");
  // Counted before it is sent (there are two placements to choose from), a
  // chat is rendered and tokenized once: its run takes its count's
  // rendering, though the gateway set the run's max_tokens and
  // spillway_fit_context (none asked). A member the gateway added to the
  // run alone (not one a template never reads) would make every run miss.
  const json chat = {{"model", "chat"}, {"messages", json::array({{{"role", "user"}, {"content", "Hello there."}}})}};
  auto chatted = http::Fetch("127.0.0.1", p, "POST", "/v1/chat/completions", chat.dump(), {}, std::chrono::seconds(60));
  ASSERT_TRUE(chatted.ok() && chatted->status == 200) << (chatted.ok() ? chatted->body : chatted.status().ToString());
  EXPECT_EQ(chatted->Header("x-spillway-placement"), "sim:0/99");
  json rendered;
  for (int i = 0; i < 300; ++i) {  // (the supervisor fetches the worker's info every second)
    rendered = Body(*http::Fetch("127.0.0.1", p, "GET", "/v1/status"))["services"][0]["placements"][0]["rendered_prompts"];
    if (rendered.is_object() && rendered["hits"].get<int>() > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(rendered["hits"], 1) << rendered.dump();
  EXPECT_EQ(rendered["misses"], 1) << rendered.dump();
  // Beside it, the worker's prompt tokens: its count tokenized the chat whole
  // (the tiny model's vocabulary holds ChatML's markers as plain text).
  const json kept = Body(*http::Fetch("127.0.0.1", p, "GET", "/v1/status"))["services"][0]["placements"][0]["prompt_tokens"];
  ASSERT_TRUE(kept.is_object()) << kept.dump();
  EXPECT_EQ(kept["on"], true) << kept.dump();
  EXPECT_EQ(kept["whole"], 1) << kept.dump();
  EXPECT_EQ(kept["continued"], 0) << kept.dump();
  // 800 prompt tokens + 50 can never fit the sim placement's 512 cells; the CPU pool holds 4096.
  auto big = Post(p, {{"model", "chat"}, {"prompt", Tokens(800)}, {"max_tokens", 50}, {"temperature", 0}});
  ASSERT_EQ(big.status, 200) << big.body;
  EXPECT_EQ(big.Header("x-spillway-placement"), "cpu");
  EXPECT_EQ(big.Header("x-spillway-decision"), "reroute");
  json rec = Body(*http::Fetch("127.0.0.1", p, "GET", "/v1/requests/" + big.Header("x-request-id")));
  EXPECT_EQ(rec["admission"]["decision"], "reroute");
  EXPECT_EQ(rec["admission"]["prompt_tokens"], 800);  // token ids are used as given
  EXPECT_NE(rec["admission"]["reason"].get<std::string>().find("exceed"), std::string::npos);
  // Never fits anywhere: 400 with the numbers, before any worker runs it.
  auto never = Post(p, {{"model", "chat"}, {"prompt", Tokens(3000)}, {"max_tokens", 2000}});
  EXPECT_EQ(never.status, 400) << never.body;
  EXPECT_NE(Body(never)["error"]["message"].get<std::string>().find("can never fit"), std::string::npos) << never.body;
  EXPECT_EQ(Body(never)["error"]["code"], "context_length_exceeded") << never.body;
  const std::string metrics = http::Fetch("127.0.0.1", p, "GET", "/metrics")->body;
  EXPECT_NE(metrics.find("spillway_admission_decisions_total{service=\"chat\",decision=\"reroute\"} 1"), std::string::npos)
      << metrics;
  // Invariant 1: each of them ended in exactly one terminal state, the rejected one too.
  const JournalCheck j = CheckJournal(gw.state_dir());
  EXPECT_TRUE(j.problems.empty()) << ::testing::PrintToString(j.problems);
  EXPECT_EQ(j.state.size(), 4u);
  for (const auto& [id, state] : j.state) EXPECT_TRUE(state == "completed" || state == "failed") << id << " " << state;
}

// A hybrid (LFM2's layout: short-convolution layers with a recurrent state
// beside attention layers, KV heads given per layer) is one the metadata
// cannot size: llama.cpp's own dry run plans each placement, and admission
// works from that plan as from an estimate. (It was refused at start before.)
TEST_F(AdmissionTest, AHybridModelIsPlannedByLlamaCppAndServedWithAdmission) {
  ASSERT_TRUE(devices::SimLedger::Create(0, 256 << 20).ok());
  std::ostringstream os;
  os << "[[device]]\nname = \"sim:0\"\nheadroom_pct = 5\n"
     << "[[service]]\nname = \"chat\"\nmodel = \"" << ModelPath("tiny-hybrid") << "\"\n"
     << "[[service.placement]]\ndevice = \"sim:0\"\ngpu_layers = 99\nctx = 1024\nslots = 2\nthreads = 1\nbatch = 64\n"
     << "[[service.placement]]\nrole = \"fallback\"\ndevice = \"cpu\"\nctx = 8192\nslots = 2\nthreads = 1\n";
  GatewayProcess gw(os.str());
  ASSERT_TRUE(gw.Start()) << gw.Output();
  const uint16_t p = gw.port();
  WaitAllReady(p);
  json status = Body(*http::Fetch("127.0.0.1", p, "GET", "/v1/status"));
  for (const auto& placement : status["services"][0]["placements"]) {
    ASSERT_TRUE(placement["admitted"].get<bool>()) << placement.dump();
    EXPECT_NE(placement["admission"].get<std::string>().find("MiB planned by llama.cpp's dry run"), std::string::npos)
        << placement.dump();
  }
  // The plan is what the worker then allocated on the device.
  const auto& gpu = status["services"][0]["placements"][0];
  ASSERT_TRUE(gpu.contains("estimate_error")) << gpu.dump();
  EXPECT_LT(std::abs(gpu["estimate_error"].get<double>()), 0.03) << gpu.dump();
  auto small = Post(p, {{"model", "chat"}, {"prompt", Tokens(50)}, {"max_tokens", 20}, {"temperature", 0}});
  ASSERT_EQ(small.status, 200) << small.body;
  EXPECT_EQ(small.Header("x-spillway-placement"), "sim:0/99");
  EXPECT_EQ(Body(small)["usage"]["completion_tokens"], 20) << small.body;
  // Its attention layers' KV pool bounds a request as any model's does.
  auto big = Post(p, {{"model", "chat"}, {"prompt", Tokens(800)}, {"max_tokens", 50}, {"temperature", 0}});
  ASSERT_EQ(big.status, 200) << big.body;
  EXPECT_EQ(big.Header("x-spillway-placement"), "cpu");
  EXPECT_EQ(big.Header("x-spillway-decision"), "reroute");
}

TEST_F(AdmissionTest, ACompetingHoldKeepsTheGpuPlacementFromStartingAndTheCpuServes) {
  ASSERT_TRUE(devices::SimLedger::Create(0, 96 << 20).ok());
  // Another program holds most of the device before Spillway starts.
  pid_t holder = SpawnTool({"sim", "hold", "sim:0", "--mib", "88", "--seconds", "120"}, "spillway");
  for (int i = 0; i < 200 && (*devices::SimLedger::Open(0))->Snapshot().used == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  GatewayProcess gw(Config());
  ASSERT_TRUE(gw.Start()) << gw.Output();
  EXPECT_NE(gw.Output().find("not started"), std::string::npos) << gw.Output();
  json status = Body(*http::Fetch("127.0.0.1", gw.port(), "GET", "/v1/status"));
  const auto& gpu = status["services"][0]["placements"][0];
  EXPECT_FALSE(gpu["admitted"].get<bool>()) << status.dump();
  EXPECT_NE(gpu["admission"].get<std::string>().find("MiB available"), std::string::npos) << gpu.dump();
  // No worker ever hit an allocation failure: requests go to the CPU.
  auto r = Post(gw.port(), {{"model", "chat"}, {"prompt", "hello"}, {"max_tokens", 8}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Header("x-spillway-placement"), "cpu");
  kill(holder, SIGKILL);
  waitpid(holder, nullptr, 0);
}

// A service none of whose placements could be admitted at start (the device
// too small for it) refuses each request at once with every placement's
// reason, and no Retry-After: only a change of config or device helps.
TEST_F(AdmissionTest, AServiceWithNoPlacementThatFitsSaysWhyAtOnce) {
  ASSERT_TRUE(devices::SimLedger::Create(0, 4 << 20).ok());
  std::ostringstream cfg;
  cfg << "[[device]]\nname = \"sim:0\"\nheadroom_pct = 5\n"
      << "[[service]]\nname = \"chat\"\nmodel = \"" << ModelPath("tiny-chat") << "\"\n"
      << "[[service.placement]]\ndevice = \"sim:0\"\ngpu_layers = 99\nctx = 1024\nslots = 2\nthreads = 1\n";
  GatewayProcess gw(cfg.str());
  ASSERT_TRUE(gw.Start(std::chrono::seconds(60), /*wait_ready=*/false)) << gw.Output();
  json status = Body(*http::Fetch("127.0.0.1", gw.port(), "GET", "/v1/status"));
  const auto& gpu = status["services"][0]["placements"][0];
  ASSERT_FALSE(gpu["admitted"].get<bool>()) << status.dump();
  const std::string reason = gpu["admission"].get<std::string>();
  ASSERT_FALSE(reason.empty()) << gpu.dump();
  auto r = Post(gw.port(), {{"model", "chat"}, {"prompt", "hello"}, {"max_tokens", 8}});
  EXPECT_EQ(r.status, 503) << r.body;
  const std::string message = Body(r)["error"]["message"].get<std::string>();
  EXPECT_NE(message.find("no placement of 'chat' could be started (" + gpu["placement"].get<std::string>() + ": " + reason +
                         "); fix it and restart the gateway"),
            std::string::npos)
      << message << "\n" << gpu.dump();
  EXPECT_EQ(r.Header("retry-after"), "") << r.body;
}

TEST_F(AdmissionTest, AKilledGpuWorkerIsNotRestartedIntoMemoryTakenMeanwhile) {
  ASSERT_TRUE(devices::SimLedger::Create(0, 96 << 20).ok());
  GatewayProcess gw(Config());
  ASSERT_TRUE(gw.Start()) << gw.Output();
  const uint16_t p = gw.port();
  WaitAllReady(p);
  json gpu = Body(*http::Fetch("127.0.0.1", p, "GET", "/v1/status"))["services"][0]["placements"][0];
  ASSERT_TRUE(gpu["admitted"].get<bool>());
  EXPECT_LT(std::abs(gpu["estimate_error"].get<double>()), 0.03) << gpu.dump();
  // The GPU worker dies; while it is down another program takes the memory.
  kill(gpu["pid"].get<pid_t>(), SIGKILL);
  for (int i = 0; i < 200 && (*devices::SimLedger::Open(0))->Snapshot().used > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // (Held here, at once: a spawned `spillway sim hold` could lose the race
  // with the worker's restart, 500 ms after its death.)
  auto ledger = devices::SimLedger::Open(0);
  ASSERT_TRUE(ledger.ok());
  ASSERT_TRUE((*ledger)->Reserve(devices::LedgerKind::kHold, "test", 88ull << 20));
  json w;
  for (int i = 0; i < 300; ++i) {
    w = Body(*http::Fetch("127.0.0.1", p, "GET", "/v1/status"))["services"][0]["placements"][0];
    if (w["last_exit"].get<std::string>().rfind("not admitted", 0) == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(w["last_exit"].get<std::string>().rfind("not admitted", 0), 0u) << w.dump();
  EXPECT_NE(w["state"], "ready");
  // Meanwhile the service answers from the CPU placement.
  auto r = Post(p, {{"model", "chat"}, {"prompt", "hi"}, {"max_tokens", 4}});
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Header("x-spillway-placement"), "cpu");
  // The memory comes back: the worker is admitted and restarted.
  (*ledger)->Release(devices::LedgerKind::kHold, "test", 88ull << 20);
  for (int i = 0; i < 500; ++i) {
    w = Body(*http::Fetch("127.0.0.1", p, "GET", "/v1/status"))["services"][0]["placements"][0];
    if (w["state"] == "ready") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(w["state"], "ready") << w.dump();
}

// Two workers restarting together (after a device loss, say) must not both
// count on the same free memory: a worker that is starting holds nothing on
// the device yet, so each restart reserves the predictions of the others.
TEST_F(AdmissionTest, TwoWorkersRestartingTogetherCannotOverCommitTheDevice) {
  const uint64_t capacity = 64ull << 20;
  ASSERT_TRUE(devices::SimLedger::Create(0, capacity).ok());
  std::ostringstream os;
  os << "[[device]]\nname = \"sim:0\"\nheadroom_pct = 5\n";
  for (const char* name : {"a", "b"}) {
    os << "[[service]]\nname = \"" << name << "\"\nmodel = \"" << ModelPath("tiny-chat") << "\"\n"
       << "[[service.placement]]\ndevice = \"sim:0\"\ngpu_layers = 99\nctx = 1024\nslots = 2\nthreads = 1\nbatch = 64\n";
  }
  GatewayProcess gw(os.str());
  ASSERT_TRUE(gw.Start()) << gw.Output();
  const uint16_t p = gw.port();
  auto placement = [&](int service) {
    return Body(*http::Fetch("127.0.0.1", p, "GET", "/v1/status"))["services"][service]["placements"][0];
  };
  json a = placement(0), b = placement(1);
  ASSERT_EQ(a["state"], "ready") << a.dump();
  ASSERT_EQ(b["state"], "ready") << b.dump();
  const uint64_t predicted = a["predicted_bytes"].get<uint64_t>();
  // Both die at once; while they are down another program takes memory, leaving
  // room for one of them (with the 5% headroom) but not for two.
  auto opened = devices::SimLedger::Open(0);
  ASSERT_TRUE(opened.ok());
  auto& ledger = *opened;
  kill(a["pid"].get<pid_t>(), SIGKILL);
  kill(b["pid"].get<pid_t>(), SIGKILL);
  for (int i = 0; i < 200 && ledger->Snapshot().used > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const uint64_t room = predicted + capacity / 20 + predicted / 2;
  ASSERT_TRUE(ledger->Reserve(devices::LedgerKind::kHold, "test", capacity - room));
  json first, second;
  for (int i = 0; i < 300; ++i) {
    a = placement(0);
    b = placement(1);
    const bool one_ready = (a["state"] == "ready") != (b["state"] == "ready");
    first = a["state"] == "ready" ? a : b;
    second = a["state"] == "ready" ? b : a;
    if (one_ready && second["last_exit"].get<std::string>().rfind("not admitted", 0) == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(first["state"], "ready") << first.dump();
  EXPECT_EQ(second["last_exit"].get<std::string>().rfind("not admitted", 0), 0u) << second.dump();
  // Neither start failed for want of memory: the second never started.
  EXPECT_EQ(first["failed_starts"], 0) << first.dump();
  EXPECT_EQ(second["failed_starts"], 0) << second.dump();
  EXPECT_EQ(second["restarts"], 1) << second.dump();  // the kill only
  ledger->Release(devices::LedgerKind::kHold, "test", capacity - room);
}

TEST_F(AdmissionTest, DeadlineAwareRoutingRefusesWhatTheCpuCannotFinishInTime) {
  ASSERT_TRUE(devices::SimLedger::Create(0, 256 << 20).ok());
  GatewayProcess gw(Config());
  ASSERT_TRUE(gw.Start()) << gw.Output();
  const uint16_t p = gw.port();
  WaitAllReady(p);
  // Measure the CPU placement once (a long prompt goes there).
  auto warm = Post(p, {{"model", "chat"}, {"prompt", Tokens(700)}, {"max_tokens", 40}, {"ignore_eos", true}});
  ASSERT_EQ(warm.status, 200) << warm.body;
  ASSERT_EQ(warm.Header("x-spillway-placement"), "cpu");
  // (Its throughput is noted once the answer has gone out: a few microseconds after, at most.)
  json cpu;
  for (int i = 0; i < 200; ++i) {
    cpu = Body(*http::Fetch("127.0.0.1", p, "GET", "/v1/status"))["services"][0]["placements"][1];
    if (cpu["throughput"]["generated_tokens_per_s"].get<double>() > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GT(cpu["throughput"]["generated_tokens_per_s"].get<double>(), 0) << cpu.dump();
  // 3000 tokens cannot be generated in 50 ms: a controlled capacity error, not a silent wait.
  auto r = http::Fetch("127.0.0.1", p, "POST", "/v1/completions",
                       json{{"model", "chat"}, {"prompt", Tokens(700)}, {"max_tokens", 3000}}.dump(),
                       {{"X-Request-Timeout", "0.05"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 503) << r->body;
  EXPECT_NE(r->body.find("beyond the request's deadline"), std::string::npos) << r->body;
  EXPECT_FALSE(r->Header("retry-after").empty());
  // The same deadline as a request field (for clients that cannot set headers).
  auto field = http::Fetch("127.0.0.1", p, "POST", "/v1/completions",
                           json{{"model", "chat"}, {"prompt", Tokens(700)}, {"max_tokens", 3000},
                                {"spillway_timeout_s", 0.05}}.dump());
  EXPECT_EQ(field->status, 503) << field->body;
  EXPECT_NE(field->body.find("beyond the request's deadline"), std::string::npos) << field->body;
  EXPECT_EQ(http::Fetch("127.0.0.1", p, "POST", "/v1/completions",
                        json{{"model", "chat"}, {"prompt", "x"}, {"spillway_timeout_s", "soon"}}.dump())->status, 400);
  // With time enough it runs.
  auto ok = http::Fetch("127.0.0.1", p, "POST", "/v1/completions",
                        json{{"model", "chat"}, {"prompt", Tokens(700)}, {"max_tokens", 8}}.dump(),
                        {{"X-Request-Timeout", "60"}});
  EXPECT_EQ(ok->status, 200) << ok->body;
}

TEST_F(AdmissionTest, ShrinkWhenTheServiceAllowsIt) {
  std::ostringstream os;
  os << "[[service]]\nname = \"chat\"\nmodel = \"" << ModelPath("tiny-chat") << "\"\n"
     << "[service.admission]\nallow_shrink = true\n"
     << "[[service.placement]]\ndevice = \"cpu\"\nctx = 1024\nslots = 2\nthreads = 1\n";  // 512 cells per slot
  GatewayProcess gw(os.str());
  ASSERT_TRUE(gw.Start()) << gw.Output();
  auto r = Post(gw.port(), {{"model", "chat"}, {"prompt", Tokens(100)}, {"max_tokens", 1000}, {"ignore_eos", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Header("x-spillway-decision"), "shrink");
  const json j = Body(r);
  EXPECT_EQ(j["spillway"]["max_tokens"], 512 - 100);
  EXPECT_EQ(j["usage"]["completion_tokens"], 512 - 100);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
}

}  // namespace
}  // namespace spillway::testing
