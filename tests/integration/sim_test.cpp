// Integration tests of the simulated accelerator: real workers on sim:N,
// real llama.cpp allocation failures, injected faults, competing holds.
#include <gtest/gtest.h>

#include "scoped_sim_dir.h"
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <unistd.h>

#include <filesystem>
#include <future>
#include <thread>

#include "api/http_client.h"
#include "devices/sim_ledger.h"
#include "worker_process.h"

namespace spillway::testing {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;
constexpr uint64_t kMiB = 1 << 20;

json Body(const http::ClientResponse& r) { return json::parse(r.body, nullptr, false); }

http::ClientResponse Call(const WorkerProcess& w, const std::string& method, const std::string& path,
                          const json& body = nullptr) {
  auto r = http::Fetch("127.0.0.1", w.port(), method, path, body.is_null() ? "" : body.dump(), WorkerAuth());
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : http::ClientResponse{};
}

http::ClientResponse Complete(const WorkerProcess& w, int max_tokens = 12, const std::string& prompt = "The sim") {
  return Call(w, "POST", "/v1/completions",
              {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}});
}

std::string Text(const http::ClientResponse& r) { return Body(r)["choices"][0]["text"]; }

// Greedy continuations of a few prompts are byte-identical on both workers.
::testing::AssertionResult SameGreedyOutput(const WorkerProcess& a, const WorkerProcess& b) {
  for (const char* prompt : {"The sim", "Once upon a time", "def fib(n):"}) {
    const std::string ta = Text(Complete(a, 24, prompt)), tb = Text(Complete(b, 24, prompt));
    if (ta.empty()) return ::testing::AssertionFailure() << "no text for '" << prompt << "'";
    if (ta != tb) return ::testing::AssertionFailure() << "'" << prompt << "': '" << ta << "' vs '" << tb << "'";
  }
  return ::testing::AssertionSuccess();
}

class SimTest : public ::testing::Test {
 protected:
  void SetUp() override { sim_ = std::make_unique<ScopedSimDir>("simtest"); dir_ = sim_->path(); }
  void TearDown() override { sim_.reset(); }
  std::unique_ptr<ScopedSimDir> sim_;
  void MakeDevice(int index, uint64_t mib) { ASSERT_TRUE(devices::SimLedger::Create(index, mib * kMiB).ok()); }
  uint64_t Used(int index) { return (*devices::SimLedger::Open(index))->Snapshot().used; }

  std::filesystem::path dir_;
};

std::vector<std::string> SimArgs(const std::string& device, int gpu_layers, int ctx = 512,
                                 std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {"--device", device, "--gpu-layers", std::to_string(gpu_layers), "--ctx",
                                std::to_string(ctx), "--slots", "2", "--threads", "2", "--batch", "64"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

TEST_F(SimTest, WeightsOverCapacityFailToLoadWithPhaseLoad) {
  MakeDevice(0, 2);  // the tiny model's offloaded weights take ~4 MiB
  std::string err;
  std::vector<std::string> args = {"--model", ModelPath("tiny-chat"), "--listen", "127.0.0.1:0"};
  auto sim = SimArgs("sim:0", 99);
  args.insert(args.end(), sim.begin(), sim.end());
  EXPECT_EQ(RunWorkerToExit(args, &err), 3) << err;  // a clean exit, not a signal
  EXPECT_NE(err.find("\"phase\":\"load\""), std::string::npos) << err;
  EXPECT_NE(err.find("out of memory"), std::string::npos) << err;
  EXPECT_NE(err.find("\"code\":\"resource_exhausted\""), std::string::npos) << err;
  EXPECT_EQ(Used(0), 0u);  // nothing leaked
}

TEST_F(SimTest, FailAfterBytesFaultFailsTheLoad) {
  MakeDevice(0, 256);
  std::string err;
  std::vector<std::string> args = {"--model", ModelPath("tiny-chat"), "--listen", "127.0.0.1:0", "--fault",
                                   "fail-after-bytes=1000000"};
  auto sim = SimArgs("sim:0", 99);
  args.insert(args.end(), sim.begin(), sim.end());
  EXPECT_EQ(RunWorkerToExit(args, &err), 3) << err;
  EXPECT_NE(err.find("injected limit"), std::string::npos) << err;
  // fail-next=kv passes the load and fails the context.
  args = {"--model", ModelPath("tiny-chat"), "--listen", "127.0.0.1:0", "--fault", "fail-next=kv"};
  args.insert(args.end(), sim.begin(), sim.end());
  EXPECT_EQ(RunWorkerToExit(args, &err), 4) << err;
  EXPECT_NE(err.find("\"phase\":\"kv\""), std::string::npos) << err;
  EXPECT_EQ(Used(0), 0u);
}

TEST_F(SimTest, KvCacheOverCapacityFailsWithPhaseKv) {
  MakeDevice(0, 12);  // weights fit; 65536 cells of KV (16 MiB) do not
  std::string err;
  std::vector<std::string> args = {"--model", ModelPath("tiny-chat"), "--listen", "127.0.0.1:0"};
  auto sim = SimArgs("sim:0", 99, 65536);
  args.insert(args.end(), sim.begin(), sim.end());
  EXPECT_EQ(RunWorkerToExit(args, &err), 4) << err;
  EXPECT_NE(err.find("\"phase\":\"kv\""), std::string::npos) << err;
  EXPECT_EQ(Used(0), 0u);
}

TEST_F(SimTest, ComputeBuffersOverCapacityFailWithPhaseCompute) {
  MakeDevice(0, 8);  // weights and KV fit; the compute buffers (logits of a 64-token batch, 8 MiB) do not
  std::string err;
  std::vector<std::string> args = {"--model", ModelPath("tiny-chat"), "--listen", "127.0.0.1:0"};
  auto sim = SimArgs("sim:0", 99, 512);
  args.insert(args.end(), sim.begin(), sim.end());
  EXPECT_EQ(RunWorkerToExit(args, &err), 4) << err;
  EXPECT_NE(err.find("\"phase\":\"compute\""), std::string::npos) << err;
}

TEST_F(SimTest, PartialOffloadSplitsMemoryAndMatchesTheCpuOutput) {
  MakeDevice(0, 256);
  WorkerProcess cpu(ModelPath("tiny-chat"), {"--ctx", "512", "--slots", "2", "--threads", "2", "--batch", "64"});
  WorkerProcess part(ModelPath("tiny-chat"), SimArgs("sim:0", 1));
  WorkerProcess full(ModelPath("tiny-chat"), SimArgs("sim:0", 99));
  ASSERT_TRUE(cpu.running() && part.running() && full.running()) << part.Stderr() << full.Stderr();
  json info = Body(Call(part, "GET", "/v1/worker/info"));
  size_t sim_model = 0, cpu_model = 0;
  for (const auto& b : info["memory"]["buffers"]) {
    const std::string name = b["name"];
    if (name == "SIM0") sim_model += b["model"].get<size_t>();
    else if (b.value("host", false)) cpu_model += b["model"].get<size_t>();
    EXPECT_EQ(b.value("host", true), name != "SIM0") << b.dump();  // (the worker says which memory each is in)
  }
  EXPECT_GT(sim_model, 0u) << info["memory"].dump();
  EXPECT_GT(cpu_model, 0u) << info["memory"].dump();
  bool sim_listed = false;
  for (const auto& d : info["memory"]["devices"]) sim_listed |= d["name"] == "SIM0" && d["total"] == 256 * kMiB;
  EXPECT_TRUE(sim_listed) << info["memory"].dump();
  EXPECT_TRUE(SameGreedyOutput(cpu, part));
  EXPECT_TRUE(SameGreedyOutput(cpu, full));
  // Both sim workers draw from the one ledger.
  EXPECT_GT(Used(0), 2 * sim_model);
}

// Mutation check: a CPU replica whose model differs from the GPU's in one
// weight fails the equivalence check above, and its fingerprint differs.
TEST_F(SimTest, AReplicaDifferingByOneWeightFailsTheEquivalenceCheck) {
  MakeDevice(0, 256);
  WorkerProcess mutant(ModelPath("tiny-chat-mutant"), {"--ctx", "512", "--slots", "2", "--threads", "2", "--batch", "64"});
  WorkerProcess full(ModelPath("tiny-chat"), SimArgs("sim:0", 99));
  ASSERT_TRUE(mutant.running() && full.running()) << mutant.Stderr() << full.Stderr();
  EXPECT_FALSE(SameGreedyOutput(mutant, full));
  EXPECT_NE(Body(Call(mutant, "GET", "/v1/worker/info"))["fingerprint"]["id"],
            Body(Call(full, "GET", "/v1/worker/info"))["fingerprint"]["id"]);
}

TEST_F(SimTest, InjectedComputeFailuresFailOneRequestAndTheNextSucceeds) {
  MakeDevice(0, 256);
  WorkerProcess w(ModelPath("tiny-chat"), SimArgs("sim:0", 99));
  ASSERT_TRUE(w.running()) << w.Stderr();
  const std::string expected = Text(Complete(w));
  for (const char* fault : {"compute-error", "fail-next=compute", "fail-next=reserve"}) {
    auto armed = Call(w, "POST", "/v1/worker/faults", {{"faults", json::array({fault})}});
    ASSERT_EQ(armed.status, 200) << armed.body;
    auto failed = Complete(w);
    EXPECT_EQ(failed.status, 503) << fault << ": " << failed.body;
    EXPECT_EQ(Body(failed)["error"]["phase"], "compute") << fault << ": " << failed.body;
    auto next = Complete(w);
    ASSERT_EQ(next.status, 200) << fault << ": " << next.body;
    EXPECT_EQ(Text(next), expected) << fault;
    EXPECT_EQ(Call(w, "GET", "/health").status, 200);
  }
  json info = Body(Call(w, "GET", "/v1/worker/info"));
  // The failed re-reservation threw out of llama_decode; the context was rebuilt.
  EXPECT_GE(info["health"]["contexts_rebuilt"].get<int>(), 1);
  EXPECT_GE(info["faults"]["faults_fired"].get<int>(), 3);
  EXPECT_GE(info["faults"]["history"].size(), 3u);
}

// A full KV cache at run time (llama_decode's 1): the batch's requests fail
// with phase kv, the fault counts as fired, and the next request is served.
TEST_F(SimTest, AFullKvCacheFailsOneRequestWithPhaseKvAndTheNextSucceeds) {
  MakeDevice(0, 256);
  WorkerProcess w(ModelPath("tiny-chat"), SimArgs("sim:0", 99));
  ASSERT_TRUE(w.running()) << w.Stderr();
  const std::string expected = Text(Complete(w));
  const int64_t fired = Body(Call(w, "GET", "/v1/worker/info"))["faults"]["faults_fired"].get<int64_t>();
  ASSERT_EQ(Call(w, "POST", "/v1/worker/faults", {{"faults", json::array({"kv-full"})}}).status, 200);
  EXPECT_TRUE(Body(Call(w, "GET", "/v1/worker/info"))["faults"]["armed"]["kv_full"].get<bool>());
  auto failed = Complete(w);
  EXPECT_EQ(failed.status, 503) << failed.body;
  EXPECT_EQ(Body(failed)["error"]["phase"], "kv") << failed.body;
  auto next = Complete(w);
  ASSERT_EQ(next.status, 200) << next.body;
  EXPECT_EQ(Text(next), expected);
  const json info = Body(Call(w, "GET", "/v1/worker/info"));
  EXPECT_EQ(info["faults"]["faults_fired"].get<int64_t>(), fired + 1);
  EXPECT_FALSE(info["faults"]["armed"]["kv_full"].get<bool>());
}

// A decode that fails empties the cache: the prefixes the slots kept are
// forgotten with it (prefix reuse), and the same prompt is then computed
// whole and answers as before. Kept, they would place the next prompt after
// cells that are gone.
TEST_F(SimTest, AFailedDecodeForgetsTheCachedPromptPrefixes) {
  MakeDevice(0, 256);
  WorkerProcess w(ModelPath("tiny-chat"), SimArgs("sim:0", 99));
  ASSERT_TRUE(w.running()) << w.Stderr();
  const std::string prompt = "The sim device holds the cache of a conversation that goes on for a while";
  auto cached = [](const http::ClientResponse& r) {
    return Body(r)["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
  };
  const auto first = Complete(w, 8, prompt);
  ASSERT_EQ(first.status, 200) << first.body;
  const auto again = Complete(w, 8, prompt);
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(Text(again), Text(first));
  EXPECT_EQ(cached(again), Body(again)["usage"]["prompt_tokens"].get<int>() - 1);
  ASSERT_EQ(Call(w, "POST", "/v1/worker/faults", {{"faults", json::array({"kv-full"})}}).status, 200);
  EXPECT_EQ(Complete(w, 8, prompt + " and on").status, 503);
  const auto after = Complete(w, 8, prompt);
  ASSERT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(Text(after), Text(first));
  EXPECT_EQ(cached(after), 0);
}

TEST_F(SimTest, ComputeAbortKillsTheProcessLikeACudaPoolFailure) {
  MakeDevice(0, 256);
  WorkerProcess w(ModelPath("tiny-chat"), SimArgs("sim:0", 99, 512, {"--fault", "compute-abort"}));
  ASSERT_TRUE(w.running()) << w.Stderr();
  auto r = http::Fetch("127.0.0.1", w.port(), "POST", "/v1/completions", R"({"prompt":"x","max_tokens":4})", WorkerAuth());
  EXPECT_FALSE(r.ok() && r->status == 200);
  EXPECT_EQ(w.Wait(), -SIGABRT);
  EXPECT_NE(w.Stderr().find("injected fatal error"), std::string::npos);
  EXPECT_EQ(Used(0), 0u);  // the dead worker's device memory is reclaimed
}

TEST_F(SimTest, LostDeviceFailsFastAndHealthReportsIt) {
  MakeDevice(0, 256);
  setenv("SPILLWAY_FAULTS", "lose-at-token=3", 1);
  WorkerProcess w(ModelPath("tiny-chat"), SimArgs("sim:0", 99));
  unsetenv("SPILLWAY_FAULTS");
  ASSERT_TRUE(w.running()) << w.Stderr();
  auto during = Complete(w, 20);
  EXPECT_EQ(during.status, 503) << during.body;
  EXPECT_EQ(Body(during)["error"]["phase"], "device") << during.body;
  auto health = Call(w, "GET", "/health");
  EXPECT_EQ(health.status, 503);
  EXPECT_EQ(Body(health)["status"], "device_lost");
  const auto t0 = std::chrono::steady_clock::now();
  auto later = Complete(w, 4);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  EXPECT_EQ(later.status, 503);
  EXPECT_EQ(Body(later)["error"]["phase"], "device");
}

TEST_F(SimTest, HangStallsDecodeWhileHealthStillAnswers) {
  MakeDevice(0, 256);
  WorkerProcess w(ModelPath("tiny-chat"), SimArgs("sim:0", 99));
  ASSERT_TRUE(w.running()) << w.Stderr();
  ASSERT_EQ(Call(w, "POST", "/v1/worker/faults", {{"faults", {"hang=3"}}}).status, 200);
  const auto t0 = std::chrono::steady_clock::now();
  auto pending = std::async(std::launch::async, [&] { return Complete(w, 4); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto h0 = std::chrono::steady_clock::now();
  EXPECT_EQ(Call(w, "GET", "/health").status, 200);  // exactly why health needs token progress too
  EXPECT_LT(std::chrono::steady_clock::now() - h0, std::chrono::seconds(1)) << "waited for the hang";
  EXPECT_EQ(pending.get().status, 200);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(3000));
}

TEST_F(SimTest, CompetingHoldReducesFreeMemoryUntilKilled) {
  MakeDevice(0, 256);
  WorkerProcess w(ModelPath("tiny-chat"), SimArgs("sim:0", 99));
  ASSERT_TRUE(w.running()) << w.Stderr();
  auto sim_free = [&] {
    const json info = Body(Call(w, "GET", "/v1/worker/info"));  // a named object: the loop must not outlive it
    for (const auto& d : info["memory"]["devices"]) {
      if (d["name"] == "SIM0") return d["free"].get<uint64_t>();
    }
    return uint64_t{0};
  };
  const uint64_t before = sim_free();
  pid_t holder = SpawnTool({"sim", "hold", "sim:0", "--mib", "100", "--seconds", "60"}, "spillway");
  uint64_t during = before;
  for (int i = 0; i < 200 && during == before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    during = sim_free();
  }
  EXPECT_EQ(before - during, 100 * kMiB);
  kill(holder, SIGKILL);
  waitpid(holder, nullptr, 0);
  EXPECT_EQ(sim_free(), before);
  // A graceful holder releases too.
  holder = SpawnTool({"sim", "hold", "sim:0", "--mib", "50", "--seconds", "0.3"}, "spillway");
  waitpid(holder, nullptr, 0);
  EXPECT_EQ(sim_free(), before);
}

TEST_F(SimTest, HoldBeyondFreeMemoryIsRefusedAndWorkersCannotStart) {
  MakeDevice(0, 64);
  pid_t holder = SpawnTool({"sim", "hold", "sim:0", "--mib", "62", "--seconds", "60"}, "spillway");
  for (int i = 0; i < 200 && Used(0) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::string err;
  std::vector<std::string> args = {"--model", ModelPath("tiny-chat"), "--listen", "127.0.0.1:0"};
  auto sim = SimArgs("sim:0", 99);
  args.insert(args.end(), sim.begin(), sim.end());
  EXPECT_EQ(RunWorkerToExit(args, &err), 3) << err;
  kill(holder, SIGTERM);
  waitpid(holder, nullptr, 0);
  EXPECT_EQ(Used(0), 0u);
}

TEST_F(SimTest, LlamaCppsOwnBenchRunsOnTheLoadableSimBackend) {
  const char* bench = std::getenv("LLAMA_BENCH");
  ASSERT_NE(bench, nullptr) << "LLAMA_BENCH is set by ctest";
  MakeDevice(0, 256);
  const std::string cmd = "GGML_BACKEND_PATH=" + BinDir() + "/libggml-sim.so " + bench + " -m " + ModelPath("tiny-chat") +
                          " -ngl 99 -dev SIM0 -p 32 -n 8 -r 1 -o json 2>&1";
  int rc = 0;
  const std::string out = RunCommand(cmd, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("\"devices\": \"SIM0\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"avg_ts\""), std::string::npos) << out;
  EXPECT_EQ(Used(0), 0u);  // llama-bench released what it allocated on the device
}

// --exact runs the worker without a shell: a quote in the model's path is
// just a character (it broke the command, or ran another, when a shell read it).
TEST_F(SimTest, PlanExactTakesAnyModelPath) {
  MakeDevice(0, 96);
  const fs::path dir = fs::temp_directory_path() / ("sw-plan-it's $(x) " + std::to_string(getpid()));
  fs::create_directories(dir);
  const fs::path model = dir / "m'odel.gguf";
  fs::copy_file(ModelPath("tiny-chat"), model, fs::copy_options::overwrite_existing);
  std::string quoted = "'";
  for (char c : model.string()) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  quoted += "'";
  int rc = 0;
  const std::string out = RunCommand(BinDir() + "/spillway plan --model " + quoted +
                                         " --device sim:0 --ctx 1024 --gpu-layers 99 --exact --json 2>&1", &rc);
  fs::remove_all(dir);
  const json j = json::parse(out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << out;
  EXPECT_TRUE(j.contains("exact")) << j.value("exact_error", out);
}

// A model the metadata cannot size (a hybrid: short-convolution layers
// beside attention ones) is planned by llama.cpp's dry runs, said so, and
// fitted as any other: its plan is exactly what the worker's dry run reports.
TEST_F(SimTest, PlanAsksLlamaCppForAHybridModel) {
  MakeDevice(0, 96);
  int rc = 0;
  const std::string model = ModelPath("tiny-hybrid");
  json plan = json::parse(RunCommand(BinDir() + "/spillway plan --model " + model +
                                         " --device sim:0 --json --ctx 1024 --slots 2 --gpu-layers 99 2>&1",
                                     &rc),
                          nullptr, false);
  ASSERT_EQ(rc, 0) << plan.dump();
  ASSERT_TRUE(plan.is_object());
  EXPECT_NE(plan.value("planned_by", "").find("per layer"), std::string::npos) << plan.dump();
  EXPECT_TRUE(plan["fits"].get<bool>()) << plan.dump();
  EXPECT_EQ(plan["architecture"], "lfm2");
  EXPECT_GE(plan["max_ctx"].get<uint32_t>(), 1024u);
  EXPECT_LE(plan["max_ctx"].get<uint32_t>(), 2048u);  // (searched up to its training context)
  json dry = json::parse(RunCommand(BinDir() + "/spillway-worker --model " + model +
                                        " --device sim:0 --gpu-layers 99 --ctx 1024 --slots 2 --batch 512 --dry-run 2>/dev/null",
                                    &rc),
                         nullptr, false);
  ASSERT_EQ(rc, 0);
  uint64_t on_device = 0;
  for (const auto& b : dry["buffers"]) {
    if (!b["host"].get<bool>()) {
      on_device += b["model"].get<uint64_t>() + b["context"].get<uint64_t>() + b["compute"].get<uint64_t>();
    }
  }
  EXPECT_GT(on_device, 0u);
  EXPECT_EQ(plan["estimate"]["accelerator"]["total"].get<uint64_t>(), on_device) << plan.dump();
  // One llama.cpp cannot open (its architecture renamed to one it does not
  // know, the header still a hybrid's): the worker's own reason, exit 2.
  {
    std::ifstream in(model, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (size_t at = bytes.find("lfm2"); at != std::string::npos; at = bytes.find("lfm2", at + 4)) bytes[at + 3] = '9';
    std::ofstream((dir_ / "lfm9.gguf").string(), std::ios::binary) << bytes;
  }
  const std::string refused =
      RunCommand(BinDir() + "/spillway plan --model " + (dir_ / "lfm9.gguf").string() + " --ctx 1024 2>&1", &rc);
  EXPECT_EQ(rc, 2) << refused;
  EXPECT_NE(refused.find("llama.cpp cannot plan"), std::string::npos) << refused;
  EXPECT_NE(refused.find("could not open"), std::string::npos) << refused;
  // A whole config with it: counted on its device, not "no estimate".
  const std::string cfg = (dir_ / "hybrid.toml").string();
  std::ofstream(cfg) << "[[device]]\nname = \"sim:0\"\nheadroom_mib = 0\nheadroom_pct = 0\n"
                     << "[[service]]\nname = \"chat\"\nmodel = \"" << model << "\"\nresidency = \"pinned\"\n"
                     << "[[service.placement]]\ndevice = \"sim:0\"\ngpu_layers = 99\nctx = 1024\nslots = 2\n";
  json whole = json::parse(RunCommand(BinDir() + "/spillway plan --json --config " + cfg, &rc), nullptr, false);
  EXPECT_EQ(rc, 0) << whole.dump();
  EXPECT_EQ(whole.dump().find("no estimate"), std::string::npos) << whole.dump();
  EXPECT_NE(whole.dump().find(std::to_string(on_device)), std::string::npos) << whole.dump();
}

TEST_F(SimTest, PlanMatchesLlamaCppsDryRunAndPicksALayerSplit) {
  MakeDevice(0, 96);
  int rc = 0;
  const std::string base = BinDir() + "/spillway plan --model " + ModelPath("demo-chat") + " --device sim:0 --json";
  // Everything on the device: weights 11.5 + KV 32 + compute 63 MiB > 96 MiB - 5 %.
  json all = json::parse(RunCommand(base + " --ctx 16384 --slots 8 --gpu-layers 99 --exact 2>/dev/null", &rc), nullptr, false);
  ASSERT_EQ(rc, 0);
  ASSERT_TRUE(all.is_object());
  EXPECT_FALSE(all["fits"].get<bool>());
  EXPECT_LT(std::abs(all["estimate_error"]["accelerator_total"].get<double>()), 0.03) << all.dump();
  EXPECT_LT(std::abs(all["estimate_error"]["host_total"].get<double>()), 0.05) << all.dump();
  // auto picks the most layers that fit; a smaller context fits whole.
  json autoj = json::parse(RunCommand(base + " --ctx 16384 --gpu-layers auto", &rc), nullptr, false);
  EXPECT_TRUE(autoj["fits"].get<bool>()) << autoj.dump();
  EXPECT_LT(autoj["gpu_layers"].get<int>(), 5);
  json small = json::parse(RunCommand(base + " --ctx 2048 --gpu-layers 99", &rc), nullptr, false);
  EXPECT_TRUE(small["fits"].get<bool>()) << small.dump();
  EXPECT_GE(small["max_ctx"].get<uint32_t>(), 2048u);
  EXPECT_LT(small["max_ctx"].get<uint32_t>(), 16384u);
  // A competing hold shrinks what fits.
  pid_t holder = SpawnTool({"sim", "hold", "sim:0", "--mib", "40", "--seconds", "60"}, "spillway");
  for (int i = 0; i < 200 && Used(0) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  json held = json::parse(RunCommand(base + " --ctx 2048 --gpu-layers 99", &rc), nullptr, false);
  EXPECT_FALSE(held["fits"].get<bool>()) << held.dump();
  kill(holder, SIGKILL);
  waitpid(holder, nullptr, 0);
  // A device whose memory cannot be read (sim:9 has no ledger): the estimate, no fit check, exit 3.
  const std::string none = RunCommand(BinDir() + "/spillway plan --model " + ModelPath("demo-chat") + " --device sim:9", &rc);
  EXPECT_EQ(rc, 3) << none;
  EXPECT_NE(none.find("no fit check"), std::string::npos) << none;
  json unknown = json::parse(RunCommand(BinDir() + "/spillway plan --json --model " + ModelPath("demo-chat") +
                                        " --device sim:9 2>/dev/null", &rc), nullptr, false);
  EXPECT_EQ(rc, 3);
  EXPECT_TRUE(unknown.is_object() && unknown["fits"].is_null()) << unknown.dump();
  // Bad input: a clear error, exit 2.
  RunCommand(BinDir() + "/spillway plan --model /nonexistent.gguf 2>&1", &rc);
  EXPECT_EQ(rc, 2);
  const std::string junk = (dir_ / "junk.gguf").string();
  { std::ofstream(junk) << "GGUF garbage"; }
  std::string err = RunCommand(BinDir() + "/spillway plan --model " + junk + " 2>&1", &rc);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(err.find("GGUF"), std::string::npos) << err;
}

TEST_F(SimTest, BadDevicesAndFaultsAreClearErrors) {
  std::string err;
  EXPECT_EQ(RunWorkerToExit({"--model", ModelPath("tiny-chat"), "--device", "sim:7"}, &err), 3);
  EXPECT_NE(err.find("spillway sim create"), std::string::npos) << err;
  EXPECT_EQ(RunWorkerToExit({"--model", ModelPath("tiny-chat"), "--fault", "compute-error"}, &err), 2);
  EXPECT_NE(err.find("sim device"), std::string::npos) << err;
  MakeDevice(0, 256);
  EXPECT_EQ(RunWorkerToExit({"--model", ModelPath("tiny-chat"), "--device", "sim:0", "--fault", "boom"}, &err), 2);
  WorkerProcess w(ModelPath("tiny-chat"), SimArgs("sim:0", 99));
  ASSERT_TRUE(w.running());
  EXPECT_EQ(Call(w, "POST", "/v1/worker/faults", {{"faults", {"explode"}}}).status, 400);
  EXPECT_EQ(Call(w, "POST", "/v1/worker/faults", {{"faults", "compute-error"}}).status, 400);
  EXPECT_EQ(Call(w, "POST", "/v1/worker/faults", {{"nothing", 1}}).status, 400);
  EXPECT_EQ(Complete(w).status, 200);
}

}  // namespace
}  // namespace spillway::testing
