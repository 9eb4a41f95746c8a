// Residency, eviction and windows on one simulated device too small for
// everything at once: a pinned interactive chat, an on-demand batch
// embedding service with a CPU fallback, and an on-demand interactive
// external server (the fake upstream, holding memory on the ledger).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>

#include "devices/sim_ledger.h"
#include "gateway_calls.h"
#include "gateway_process.h"
#include "scoped_sim_dir.h"
#include "whisper_server.h"
#include "worker_process.h"

namespace spillway::testing {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

std::string ChatService() {
  return "[[service]]\nname = \"chat\"\nmodel = \"" + ModelPath("tiny-chat") + "\"\n"
         "[[service.placement]]\ndevice = \"sim:0\"\ngpu_layers = 99\nctx = 1024\nslots = 2\nthreads = 1\nbatch = 64\n";
}

std::string Embed(const std::string& residency) {
  return "[[service]]\nname = \"embed\"\nmodel = \"" + ModelPath("tiny-embed") + "\"\n" + residency +
         "[[service.placement]]\ndevice = \"sim:0\"\ngpu_layers = 99\nctx = 512\nslots = 1\nthreads = 1\nbatch = 64\n"
         "[[service.placement]]\nrole = \"fallback\"\ndevice = \"cpu\"\nctx = 512\nslots = 1\nthreads = 1\n";
}

std::string Fake(const std::string& log, int mib) {
  std::ostringstream os;
  os << "[[service]]\nname = \"fake\"\nkind = \"external\"\n"
     << "command = \"" << EnvOr("FAKE_UPSTREAM") << " --port ${PORT} --log " << log << " --sim-device 0 --resident-mib "
     << mib << "\"\nroutes = { \"/v1/rerank\" = \"/v1/rerank\" }\ndevice = \"sim:0\"\nresident_mib = " << mib
     << "\nresidency = \"on_demand\"\nkeep_alive_s = 0\npriority = \"interactive\"\n";
  return os.str();
}

const std::string kDevice = "[[device]]\nname = \"sim:0\"\nheadroom_mib = 0\nheadroom_pct = 0\n";

json Residency(uint16_t port, const std::string& service) {
  const json s = Body(Call(port, "GET", "/v1/status"));
  for (const auto& r : s["residency"]["services"]) {
    if (r["service"] == service) return r;
  }
  return json::object();
}

json ServiceStatus(uint16_t port, const std::string& service) {
  const json s = Body(Call(port, "GET", "/v1/status"));
  for (const auto& svc : s["services"]) {
    if (svc["name"] == service) return svc;
  }
  return json::object();
}

json Events(uint16_t port) { return Body(Call(port, "GET", "/v1/status"))["residency"]["events"]; }

bool HasEvent(const json& events, const std::string& kind, const std::string& service) {
  for (const auto& e : events) {
    if (e.value("kind", "") == kind && e.value("service", "") == service) return true;
  }
  return false;
}

template <typename F>
bool WaitFor(F f, std::chrono::milliseconds limit = 15s) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (f()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return f();
}

int PlacementPid(uint16_t port, const std::string& service, size_t i = 0) {
  const json s = Body(Call(port, "GET", "/v1/status"));
  for (const auto& svc : s["services"]) {
    if (svc["name"] == service) return svc["placements"][i].value("pid", 0);
  }
  return 0;
}

int ChatPid(uint16_t port) { return PlacementPid(port, "chat"); }

// A thread's niceness (/proc/PID/task/TID/stat, field 19; TID = PID: the main thread's).
int NiceOf(int pid, int tid = 0) {
  std::istringstream in(ReadTextFile("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid ? tid : pid) + "/stat"));
  std::string field;
  // The command (field 2) is in parentheses and may hold spaces: skip past its ')'.
  std::getline(in, field, ')');
  for (int i = 3; i <= 19 && in >> field; ++i) {
  }
  return std::atoi(field.c_str());
}

class ResidencyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sim_ = std::make_unique<ScopedSimDir>("residency");
    dir_ = MakeScratchDir();
  }
  void TearDown() override { sim_.reset(); }
  std::unique_ptr<ScopedSimDir> sim_;
  std::string dir_;
};

TEST_F(ResidencyTest, AnInteractiveServiceEvictsIdleBatchWorkAndThePinnedOneStays) {
  // chat holds ~12 MiB there, embed ~67 MiB (its compute buffers: a whole context of outputs), fake 60 MiB.
  ASSERT_TRUE(devices::SimLedger::Create(0, 128ull << 20).ok());
  GatewayProcess g(kDevice + ChatService() + Embed("residency = \"on_demand\"\nkeep_alive_s = 0\npriority = \"batch\"\n") +
                   Fake(dir_ + "/fake.log", 60));
  ASSERT_TRUE(g.Start()) << g.Output();
  const int chat_pid = ChatPid(g.port());
  ASSERT_GT(chat_pid, 0);
  EXPECT_EQ(Residency(g.port(), "embed")["state"], "stopped") << "on_demand: nothing loaded before its first request";

  // The batch service loads on its first request, on the device.
  auto e = Call(g.port(), "POST", "/v1/embeddings", R"({"model":"embed","input":"hello"})");
  ASSERT_EQ(e.status, 200) << e.body;
  EXPECT_EQ(e.headers["x-spillway-placement"], "sim:0/99");
  EXPECT_EQ(Residency(g.port(), "embed")["state"], "ready");
  // Batch work yields the host's cores: its workers run at niceness 10, the interactive chat's at 0.
  const int own = NiceOf(getpid());  // the gateway's too (make test may run under nice)
  EXPECT_EQ(NiceOf(PlacementPid(g.port(), "embed", 0)), std::max(own, 10));
  // Every thread of it (a niceness set after the spawn would have missed those started before).
  const int embed_pid = PlacementPid(g.port(), "embed", 0);
  int threads = 0;
  for (const auto& t : std::filesystem::directory_iterator("/proc/" + std::to_string(embed_pid) + "/task")) {
    ++threads;
    EXPECT_EQ(NiceOf(embed_pid, std::atoi(t.path().filename().c_str())), std::max(own, 10)) << t.path();
  }
  EXPECT_GT(threads, 1);
  EXPECT_EQ(NiceOf(PlacementPid(g.port(), "embed", 1)), std::max(own, 10)) << "its CPU fallback too";
  EXPECT_EQ(NiceOf(chat_pid), own);

  // The interactive external server does not fit beside both: the idle batch service gives its room.
  auto f = Call(g.port(), "POST", "/v1/rerank", R"({"model":"fake","query":"q"})");
  ASSERT_EQ(f.status, 200) << f.body;
  const json events = Events(g.port());
  EXPECT_TRUE(HasEvent(events, "evict", "embed")) << events.dump(1);
  EXPECT_TRUE(HasEvent(events, "unload", "embed")) << events.dump(1);
  EXPECT_FALSE(HasEvent(events, "evict", "chat")) << "pinned: never";
  EXPECT_EQ(Residency(g.port(), "embed")["state"], "stopped");

  // The batch service cannot take the room back from interactive work: its
  // CPU fallback serves it meanwhile, announced as degraded.
  e = Call(g.port(), "POST", "/v1/embeddings", R"({"model":"embed","input":"hello again"})");
  ASSERT_EQ(e.status, 200) << e.body;
  EXPECT_EQ(e.headers["x-spillway-placement"], "cpu");
  EXPECT_FALSE(e.headers["x-spillway-degraded"].empty());
  EXPECT_TRUE(WaitFor([&] { return HasEvent(Events(g.port()), "room_refused", "embed"); }));
  // The pinned chat kept its worker throughout and still answers on the device.
  auto c = Call(g.port(), "POST", "/v1/chat/completions", testing::Chat(4));
  EXPECT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(c.headers["x-spillway-placement"], "sim:0/99");
  EXPECT_EQ(ChatPid(g.port()), chat_pid);

  // Accounting: what each service holds plus what processes Spillway does
  // not run hold (by pid and name) adds up to the device's used memory.
  pid_t holder = SpawnTool({"sim", "hold", "sim:0", "--mib", "3", "--seconds", "60"}, "spillway");
  json dev;
  ASSERT_TRUE(WaitFor([&] {
    const json status = Body(Call(g.port(), "GET", "/v1/status"));
    for (const auto& d : status["devices"]) {
      if (d["name"] == "sim:0") dev = d;
    }
    return dev.contains("other_processes") && !dev["other_processes"].empty();
  })) << dev.dump(1);
  uint64_t services = 0, others = 0;
  for (const auto& u : dev["services"]) services += u.value("held_bytes", uint64_t{0});
  for (const auto& o : dev["other_processes"]) {
    others += o["bytes"].get<uint64_t>();
    EXPECT_EQ(o["pid"], holder);
    EXPECT_EQ(o["name"], "spillway");
  }
  EXPECT_EQ(others, 3ull << 20);
  const double used = dev["used_bytes"].get<double>();
  EXPECT_NEAR(static_cast<double>(services + others), used, used * 0.01) << dev.dump(1);
  const std::string metrics = Call(g.port(), "GET", "/metrics").body;
  EXPECT_NE(metrics.find("spillway_service_device_bytes{device=\"sim:0\",service=\"fake\",key=\"fake.ext\"}"),
            std::string::npos) << metrics;
  EXPECT_NE(metrics.find("spillway_device_other_bytes{device=\"sim:0\"}"), std::string::npos);
  kill(holder, SIGTERM);
  waitpid(holder, nullptr, 0);
}

TEST_F(ResidencyTest, KeepAliveUnloadsAnIdlePlacementAndTheNextRequestLoadsItAgain) {
  ASSERT_TRUE(devices::SimLedger::Create(0, 256ull << 20).ok());
  GatewayProcess g(kDevice + ChatService() + Embed("residency = \"keep_alive\"\nkeep_alive_s = 3\n"));  // (3 s: its first request comes before, loaded too)
  ASSERT_TRUE(g.Start()) << g.Output();
  // keep_alive: loaded at start.
  ASSERT_TRUE(WaitFor([&] { return Residency(g.port(), "embed").value("state", "") == "ready"; })) << g.Output();
  auto e = Call(g.port(), "POST", "/v1/embeddings", R"({"model":"embed","input":"x"})");
  ASSERT_EQ(e.status, 200) << e.body;
  EXPECT_EQ(e.headers["x-spillway-placement"], "sim:0/99");
  // Idle past keep_alive_s: unloaded, and its memory is back on the device.
  ASSERT_TRUE(WaitFor([&] { return Residency(g.port(), "embed").value("state", "") == "stopped"; })) << g.Output();
  EXPECT_TRUE(HasEvent(Events(g.port()), "unload", "embed"));
  e = Call(g.port(), "POST", "/v1/embeddings", R"({"model":"embed","input":"x"})");
  ASSERT_EQ(e.status, 200) << e.body;
  const json r = Residency(g.port(), "embed");
  EXPECT_EQ(r["loads"], 2) << r.dump();
  EXPECT_GT(r["measured_load_s"].get<double>(), 0);
}

TEST_F(ResidencyTest, BatchWorkStaysOffTheAcceleratorOutsideItsWindow) {
  ASSERT_TRUE(devices::SimLedger::Create(0, 256ull << 20).ok());
  // A window that is not now (local time): three hours from now, for an hour.
  const std::time_t t = std::time(nullptr) + 3 * 3600;
  std::tm tm{};
  localtime_r(&t, &tm);
  char window[16];
  std::snprintf(window, sizeof window, "%02d:00-%02d:00", tm.tm_hour, (tm.tm_hour + 1) % 24);
  const std::string batch = std::string("residency = \"on_demand\"\npriority = \"batch\"\nwindows = [\"") + window + "\"]\n";
  {
    GatewayProcess g(kDevice + ChatService() + Embed(batch));
    ASSERT_TRUE(g.Start()) << g.Output();
    auto e = Call(g.port(), "POST", "/v1/embeddings", R"({"model":"embed","input":"x"})");
    ASSERT_EQ(e.status, 200) << e.body;
    EXPECT_EQ(e.headers["x-spillway-placement"], "cpu") << "outside its window: its CPU path";
    EXPECT_EQ(Residency(g.port(), "embed")["state"], "stopped");
    EXPECT_NE(Residency(g.port(), "embed")["held_back"].get<std::string>().find("window"), std::string::npos);
    // What a person sees: its fallback serves, and why (not "served by its primary").
    const json svc = ServiceStatus(g.port(), "embed");
    EXPECT_EQ(svc["state"], "degraded") << svc.dump();
    EXPECT_EQ(svc["serving"]["placement"], "cpu") << svc.dump();
    EXPECT_NE(svc["degraded"].get<std::string>().find("held back"), std::string::npos) << svc.dump();
    EXPECT_NE(svc["placements"][0]["held_back"].get<std::string>().find("window"), std::string::npos) << svc.dump();
  }
  {
    // outside_window = "wait", no CPU path: told when to come back.
    std::string only_gpu = "[[service]]\nname = \"embed\"\nmodel = \"" + ModelPath("tiny-embed") + "\"\n" + batch +
                           "outside_window = \"wait\"\n[[service.placement]]\ndevice = \"sim:0\"\ngpu_layers = 99\n"
                           "ctx = 512\nslots = 1\nthreads = 1\nbatch = 64\n";
    GatewayProcess g(kDevice + ChatService() + only_gpu);
    ASSERT_TRUE(g.Start()) << g.Output();
    auto e = Call(g.port(), "POST", "/v1/embeddings", R"({"model":"embed","input":"x"})");
    EXPECT_EQ(e.status, 503) << e.body;
    EXPECT_NE(e.body.find("window"), std::string::npos) << e.body;
    const int retry = std::atoi(e.headers["retry-after"].c_str());
    EXPECT_GT(retry, 3600 * 2 - 120) << "the window opens in two to three hours (its hour began up to 3 h from the test's start)";
    EXPECT_LE(retry, 3600 * 3);
  }
  {
    // Only once interactive work has been quiet for 2 s.
    GatewayProcess g(kDevice + ChatService() + Embed("residency = \"on_demand\"\npriority = \"batch\"\ninteractive_idle_s = 2\n"));
    ASSERT_TRUE(g.Start()) << g.Output();
    ASSERT_EQ(Call(g.port(), "POST", "/v1/chat/completions", testing::Chat(2)).status, 200);
    auto e = Call(g.port(), "POST", "/v1/embeddings", R"({"model":"embed","input":"x"})");
    EXPECT_EQ(e.headers["x-spillway-placement"], "cpu") << "interactive work just ran";
    std::this_thread::sleep_for(2500ms);
    e = Call(g.port(), "POST", "/v1/embeddings", R"({"model":"embed","input":"x"})");
    EXPECT_EQ(e.headers["x-spillway-placement"], "sim:0/99") << e.body;
  }
}

}  // namespace
}  // namespace spillway::testing
