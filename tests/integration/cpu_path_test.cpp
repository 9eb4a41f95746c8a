// The CPU path in the gateway: its own bounded line, its limits, its host-RAM
// budget, cancellation while waiting, SSE comments on long waits, and the
// readiness policies of the CPU replica (warm, mmap, on-demand). The
// accelerator placement is kept out by a simulated device too small for it
// (another workload holds the memory), so every request takes the CPU path.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "api/http_client.h"
#include "devices/sim_ledger.h"
#include "devices/telemetry.h"
#include "gateway_process.h"
#include "journal_check.h"
#include "scoped_sim_dir.h"
#include "worker_process.h"

namespace spillway::testing {
namespace {

using nlohmann::json;

// The CPU fallback of demo-chat generates ~500 tokens/s on one thread here: a
// request of 1800 tokens holds the line for a few seconds.
std::string Config(const std::string& cpu_path, const std::string& failover = "") {
  std::ostringstream os;
  os << "[[service]]\nname = \"chat\"\nmodel = \"" << ModelPath("demo-chat") << "\"\nmax_tokens = 4000\n"
     << "[service.failover]\nbreaker_failures = 1\nejection_s = 60\n" << failover
     << "[service.cpu_path]\n" << cpu_path
     << "[[service.placement]]\ndevice = \"sim:0\"\ngpu_layers = 99\nctx = 2048\nslots = 2\nthreads = 1\nbatch = 64\n"
     << "[[service.placement]]\nrole = \"fallback\"\ndevice = \"cpu\"\nctx = 16384\nslots = 4\nthreads = 1\nbatch = 64\n";
  return os.str();
}

class CpuPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sim_ = std::make_unique<ScopedSimDir>("cpupath");
    // 1 MiB: the accelerator placement is not admitted; the CPU path serves.
    ASSERT_TRUE(devices::SimLedger::Create(0, 1 << 20).ok());
  }
  void TearDown() override {
    if (gw_) {
      const JournalCheck j = CheckJournal(gw_->state_dir());
      EXPECT_TRUE(j.problems.empty()) << ::testing::PrintToString(j.problems);
    }
    gw_.reset();
    sim_.reset();
  }
  void StartGateway(const std::string& config) {
    gw_ = std::make_unique<GatewayProcess>(config);
    ASSERT_TRUE(gw_->Start()) << gw_->Output();
  }
  json Status() { return json::parse(http::Fetch("127.0.0.1", gw_->port(), "GET", "/v1/status")->body); }
  json CpuPath() { return Status()["services"][0]["cpu_path"]; }
  json Fallback() { return Status()["services"][0]["placements"][1]; }
  bool WaitFor(const std::function<bool()>& cond, int ms = 20000) {
    for (int i = 0; i < ms / 20; ++i) {
      if (cond()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  http::ClientResponse Post(const json& body, const std::string& id) {
    auto r = http::Fetch("127.0.0.1", gw_->port(), "POST", "/v1/completions", body.dump(), {{"X-Request-Id", id}},
                         std::chrono::seconds(120));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : http::ClientResponse{};
  }
  std::string State(const std::string& id) {
    return json::parse(http::Fetch("127.0.0.1", gw_->port(), "GET", "/v1/requests/" + id)->body).value("state", "");
  }

  std::unique_ptr<ScopedSimDir> sim_;
  std::unique_ptr<GatewayProcess> gw_;
};

json Long(int max_tokens) {
  return {{"model", "chat"}, {"prompt", "The CPU line"}, {"max_tokens", max_tokens}, {"ignore_eos", true}, {"seed", 1}};
}

TEST_F(CpuPathTest, ALineOfItsOwnWithLimitsCommentsCancellationAndA503WhenFull) {
  StartGateway(Config("max_queue = 2\nconcurrency = 1\nmax_tokens = 1800\nwait_comment_s = 0.2\n"));
  EXPECT_NE(Status()["services"][0]["degraded"].get<std::string>().find("not admitted"), std::string::npos);
  // R1 runs; asked for 3000 tokens, it gets the CPU path's 1800, and is told.
  http::ClientResponse r1;
  std::thread t1([&] { r1 = Post(Long(3000), "line-1"); });
  ASSERT_TRUE(WaitFor([&] { return CpuPath()["running"] == 1; }));
  // R2 (a stream) waits first in line; R3 second; the line is full for R4.
  std::atomic<bool> r4_answered{false}, cancelled{false};
  std::string r2_body;
  int r2_status = 0;
  std::thread t2([&] {
    json b = Long(20);
    b["stream"] = true;
    (void)http::StreamFetch(
        "127.0.0.1", gw_->port(), "POST", "/v1/completions", b.dump(), {{"X-Request-Id", "line-2"}},
        [&](const http::StreamHead& h) {
          r2_status = h.status;
          return true;
        },
        [&](std::string_view data) {
          r2_body.append(data);
          // Cancelled while it waits in the line, once R4 has been turned away.
          if (r4_answered && !cancelled && r2_body.find("waiting for the CPU path") != std::string::npos) {
            cancelled = true;
            auto d = http::Fetch("127.0.0.1", gw_->port(), "DELETE", "/v1/requests/line-2");
            EXPECT_TRUE(d.ok() && d->status == 200) << (d.ok() ? d->body : d.status().ToString());
          }
          return true;
        });
  });
  ASSERT_TRUE(WaitFor([&] { return CpuPath()["waiting"] == 1; }));
  http::ClientResponse r3;
  std::thread t3([&] { r3 = Post(Long(10), "line-3"); });
  ASSERT_TRUE(WaitFor([&] { return CpuPath()["waiting"] == 2; }));
  auto r4 = Post(Long(10), "line-4");
  EXPECT_EQ(r4.status, 503) << r4.body;
  EXPECT_FALSE(r4.Header("retry-after").empty());
  EXPECT_NE(r4.body.find("CPU path of 'chat' is full"), std::string::npos) << r4.body;
  r4_answered = true;
  t2.join();
  // The stream started early, heard why it waited, and ended cancelled.
  EXPECT_EQ(r2_status, 200);
  EXPECT_TRUE(cancelled);
  EXPECT_NE(r2_body.find(": spillway: waiting for the CPU path: position 1"), std::string::npos) << r2_body;
  EXPECT_NE(r2_body.find("cancelled"), std::string::npos) << r2_body;
  EXPECT_EQ(http::ParseSseData(r2_body).back(), "[DONE]");
  EXPECT_EQ(State("line-2"), "cancelled");
  t1.join();
  t3.join();
  ASSERT_EQ(r1.status, 200) << r1.body;
  EXPECT_EQ(r1.Header("x-spillway-placement"), "cpu");
  EXPECT_EQ(r1.Header("x-spillway-limits"), "max_tokens=1800 (CPU path)");
  const json b1 = json::parse(r1.body);
  EXPECT_EQ(b1["usage"]["completion_tokens"], 1800);
  EXPECT_EQ(b1["spillway"]["limits"], "max_tokens=1800 (CPU path)");
  EXPECT_EQ(r3.status, 200) << r3.body;
  EXPECT_GT(std::stoll("0" + r3.Header("x-spillway-queued-ms")), 500);  // it waited behind R1, and is told how long
  EXPECT_EQ(State("line-1"), "completed");
  EXPECT_EQ(State("line-3"), "completed");
  EXPECT_EQ(State("line-4"), "failed");
  // (Each answer's place in the line is given back once the answer has gone out.)
  EXPECT_TRUE(WaitFor([&] { return CpuPath()["running"] == 0; }));
  const json q = CpuPath();
  EXPECT_EQ(q["rejected_full"], 1);
  EXPECT_EQ(q["waiting"], 0);
  EXPECT_EQ(q["running"], 0);
  const std::string metrics = http::Fetch("127.0.0.1", gw_->port(), "GET", "/metrics")->body;
  EXPECT_NE(metrics.find("spillway_cpu_queue_oldest_age_seconds{service=\"chat\"}"), std::string::npos);
  EXPECT_NE(metrics.find("spillway_cpu_path_rejected_total{service=\"chat\",reason=\"queue_full\"} 1"), std::string::npos);
}

TEST_F(CpuPathTest, AFloodOfLongRequestsStaysUnderTheRamBudgetAndTheExcessGets503) {
  const int budget_mib = 160;
  StartGateway(Config("max_queue = 2\nconcurrency = 2\nram_budget_mib = " + std::to_string(budget_mib) + "\n"));
  ASSERT_TRUE(WaitFor([&] { return Fallback().contains("memory"); }));
  const json fallback = Fallback();
  const int pid = fallback["pid"].get<int>();
  // The CPU replica never loads an accelerator backend, even with a sim device on the host.
  ASSERT_FALSE(fallback["memory"]["devices"].empty()) << fallback.dump();
  for (const auto& d : fallback["memory"]["devices"]) EXPECT_EQ(d["name"], "CPU") << fallback.dump();
  std::atomic<bool> done{false};
  uint64_t rss_peak = 0;
  int running_peak = 0, waiting_peak = 0;
  std::thread sampler([&] {
    while (!done) {
      std::ifstream f("/proc/" + std::to_string(pid) + "/status");
      std::string line;
      while (std::getline(f, line)) {
        if (line.rfind("VmRSS:", 0) == 0) rss_peak = std::max<uint64_t>(rss_peak, std::stoull(line.substr(6)) * 1024);
      }
      const json q = CpuPath();
      running_peak = std::max(running_peak, q["running"].get<int>());
      waiting_peak = std::max(waiting_peak, q["waiting"].get<int>());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  std::vector<http::ClientResponse> out(10);
  std::vector<std::thread> clients;
  for (int i = 0; i < 10; ++i) {
    clients.emplace_back([&, i] { out[i] = Post(Long(1200), "flood-" + std::to_string(i)); });
  }
  for (auto& t : clients) t.join();
  done = true;
  sampler.join();
  int ok = 0, refused = 0;
  for (const auto& r : out) {
    if (r.status == 200) {
      ++ok;
      EXPECT_EQ(json::parse(r.body)["usage"]["completion_tokens"], 1200);
    } else {
      ++refused;
      EXPECT_EQ(r.status, 503) << r.body;
      EXPECT_FALSE(r.Header("retry-after").empty());
    }
  }
  // Two run and two wait at most; the other six are told to come back.
  EXPECT_GE(ok, 4);
  EXPECT_GE(refused, 1);
  EXPECT_EQ(ok + refused, 10);
  EXPECT_LE(running_peak, 2);
  EXPECT_LE(waiting_peak, 2);
  const uint64_t budget = uint64_t{budget_mib} << 20;
  EXPECT_GT(rss_peak, 0u);
  EXPECT_LE(rss_peak, budget) << "the CPU replica's resident set went past the budget";
  const json q = CpuPath();
  EXPECT_EQ(q["ram_budget_bytes"], budget);
  EXPECT_LE(q["ram_peak_bytes"].get<uint64_t>(), budget);
  EXPECT_GT(q["ram_peak_bytes"].get<uint64_t>(), 0u);
}

TEST_F(CpuPathTest, AReplicaBeyondTheRamBudgetIsNotLoadedAndRequestsGetAClear503) {
  gw_ = std::make_unique<GatewayProcess>(Config("ram_budget_mib = 16\n"));
  ASSERT_TRUE(gw_->Start(std::chrono::seconds(60), /*wait_ready=*/false)) << gw_->Output();
  const json fb = Fallback();
  EXPECT_FALSE(fb["admitted"].get<bool>());
  EXPECT_NE(fb["admission"].get<std::string>().find("RAM budget of 16 MiB"), std::string::npos) << fb.dump();
  const auto t0 = std::chrono::steady_clock::now();
  auto r = Post(Long(10), "over-budget");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));  // told at once, not left waiting
  EXPECT_EQ(r.status, 503) << r.body;
  // Until a restart with a larger budget: clients are told not to retry it.
  EXPECT_EQ(r.Header("x-should-retry"), "false") << r.body;
  EXPECT_TRUE(r.Header("retry-after").empty());
  EXPECT_EQ(State("over-budget"), "failed");
}

// The readiness policies: a replica that is not warm becomes ready when a
// request needs it, within its expected time, and gives its RAM back when idle.
TEST_F(CpuPathTest, AnOnDemandReplicaStartsForTheFirstRequestAndStopsWhenIdle) {
  gw_ = std::make_unique<GatewayProcess>(
      Config("", "readiness = \"on-demand\"\nidle_unload_s = 1\n"));
  ASSERT_TRUE(gw_->Start()) << gw_->Output();  // ready: the on-demand replica can be started
  json fb = Fallback();
  EXPECT_EQ(fb["state"], "stopped");
  EXPECT_EQ(fb["readiness"]["policy"], "on-demand");
  EXPECT_EQ(CpuPath()["ram_resident_bytes"], 0);
  auto r = Post(Long(8), "od-1");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Header("x-spillway-placement"), "cpu");
  // Its resident set, as the supervisor samples it (what the RAM budget
  // reads), is what procfs says of its process.
  uint64_t theirs = 0, ours = 0;
  EXPECT_TRUE(WaitFor([&] {
    const json w = Fallback();
    ours = w.value("rss_bytes", uint64_t{0});
    const int pid = w.value("pid", 0);
    const auto rss = devices::HostTelemetry().ProcessRss(pid);  // (read now, by the test)
    theirs = pid > 0 && rss.ok() ? *rss : 0;
    return ours > 0 && theirs > 0 && ours > theirs / 2 && ours < theirs * 2;
  }, 5000)) << "status rss_bytes " << ours << ", /proc says " << theirs;
  fb = Fallback();
  EXPECT_GT(fb["readiness"]["measured_start_s"].get<double>(), 0.0);
  // Idle for idle_unload_s: stopped again; the next request starts it again.
  ASSERT_TRUE(WaitFor([&] { return Fallback()["state"] == "stopped"; }, 10000)) << Fallback().dump();
  auto again = Post(Long(8), "od-2");
  EXPECT_EQ(again.status, 200) << again.body;
}

// An accelerator that is lost (its worker killed, and no room on its device
// to start again) does not keep a stopped on-demand CPU fallback stopped:
// the next request starts it and runs there. It waited for the start
// timeout and got a 503: the lost accelerator counted as "coming up", and
// with no worker up to count the prompt, nothing else started the fallback.
TEST_F(CpuPathTest, ALostAcceleratorStartsTheOnDemandFallbackForTheNextRequest) {
  ASSERT_TRUE(devices::SimLedger::Create(0, 4ull << 30).ok());  // room for the accelerator placement
  // (Ejected for 1 s: the accelerator's breaker half-opens long before the end.)
  std::string config = Config("", "readiness = \"on-demand\"\nidle_unload_s = 1\n");
  config.replace(config.find("ejection_s = 60"), 15, "ejection_s = 1");
  StartGateway(config);
  json gpu = Status()["services"][0]["placements"][0];
  ASSERT_TRUE(WaitFor([&] {
    gpu = Status()["services"][0]["placements"][0];
    return gpu.value("state", "") == "ready";
  })) << gpu.dump();
  ASSERT_EQ(Fallback()["state"], "stopped");
  // The device shrinks to nothing (another program took it): no restart fits.
  ASSERT_TRUE(devices::SimLedger::Create(0, 1 << 20).ok());
  ASSERT_EQ(::kill(gpu.value("pid", 0), SIGKILL), 0);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = Post(Long(8), "lost-1");
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Header("x-spillway-placement"), "cpu");
  EXPECT_LT(took, std::chrono::seconds(30)) << "it waited for a start timeout first";
  // Later, the fallback released when idle and the accelerator's breaker
  // half-open again (nothing failed since: it never had room to start),
  // the next request starts the fallback again: the accelerator held back
  // for want of room is no more "coming up" than a crashing one.
  ASSERT_TRUE(WaitFor([&] { return Fallback()["state"] == "stopped"; }, 15000)) << Fallback().dump();
  const auto t1 = std::chrono::steady_clock::now();
  auto again = Post(Long(8), "lost-2");
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(again.Header("x-spillway-placement"), "cpu");
  EXPECT_LT(std::chrono::steady_clock::now() - t1, std::chrono::seconds(30)) << "it waited for a start timeout first";
}

TEST_F(CpuPathTest, AnMmapReplicaCreatesItsContextForTheFirstRequestAndFreesItWhenIdle) {
  StartGateway(Config("", "readiness = \"mmap\"\nidle_unload_s = 1\n"));
  // Ready, and its own account (the supervisor's cached /info) known.
  ASSERT_TRUE(WaitFor([&] { return Fallback()["readiness"].contains("context_created"); }));
  json fb = Fallback();
  EXPECT_EQ(fb["readiness"]["policy"], "mmap");
  EXPECT_FALSE(fb["readiness"]["context_created"].get<bool>()) << fb.dump();
  auto r = Post(Long(8), "mm-1");
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_TRUE(WaitFor([&] { return Fallback()["readiness"]["context_created"].get<bool>(); }));
  fb = Fallback();
  EXPECT_TRUE(fb["readiness"]["context_created"].get<bool>());
  EXPECT_GT(fb["readiness"]["measured_context_s"].get<double>(), 0.0);
  ASSERT_TRUE(WaitFor([&] { return !Fallback()["readiness"]["context_created"].get<bool>(); }, 10000));
  EXPECT_EQ(Post(Long(8), "mm-2").status, 200);
}

TEST(CpuPathConfigTest, AutoReadinessPicksTheLightestPolicyWithinTheRecoveryBudget) {
  ScopedSimDir sim("cpupath-auto");
  ASSERT_TRUE(devices::SimLedger::Create(0, 1 << 20).ok());
  auto policy = [&](double budget_s) {
    std::ostringstream f;
    f << "readiness = \"auto\"\nrecovery_budget_s = " << budget_s << "\n";
    GatewayProcess gw(Config("", f.str()));
    EXPECT_TRUE(gw.Start(std::chrono::seconds(60), false)) << gw.Output();
    json s = json::parse(http::Fetch("127.0.0.1", gw.port(), "GET", "/v1/status")->body);
    return s["services"][0]["placements"][1]["readiness"];
  };
  // demo-chat: 12 MiB of weights (~0.33 s to load cold), a context of ~75 MiB (~0.06 s).
  EXPECT_EQ(policy(5)["policy"], "on-demand");
  EXPECT_EQ(policy(0.2)["policy"], "mmap");
  const json warm = policy(0.001);
  EXPECT_EQ(warm["policy"], "warm");
  EXPECT_NE(warm["reason"].get<std::string>().find("exceeds the recovery budget"), std::string::npos) << warm.dump();
}

}  // namespace
}  // namespace spillway::testing
