#include "memory/exact_plan.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace spillway::memory {
namespace {

namespace fs = std::filesystem;

TEST(ExactPlanTest, BuffersAreTheHostsOrTheAcceleratorsByName) {
  auto plan = ParseDryRun(R"({"placement":{},"buffers":[
      {"name":"CPU","model":100,"context":10,"compute":1},
      {"name":"CPU_Mapped","model":200,"context":0,"compute":0},
      {"name":"SIM0","model":1000,"context":300,"compute":40}]})");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->host.weights, 300u);
  EXPECT_EQ(plan->host.kv, 10u);
  EXPECT_EQ(plan->host.compute, 1u);
  EXPECT_EQ(plan->accelerator.weights, 1000u);
  EXPECT_EQ(plan->accelerator.kv, 300u);
  EXPECT_EQ(plan->accelerator.compute, 40u);
}

// CUDA's pinned host buffers (the CPU layers' weights when not mapped, the
// host's compute buffer) are RAM, not the GPU's: counted by the worker's flag.
TEST(ExactPlanTest, PinnedHostBuffersAreTheHosts) {
  auto plan = ParseDryRun(R"({"buffers":[
      {"name":"CUDA0","host":false,"model":1000,"context":300,"compute":40},
      {"name":"CUDA_Host","host":true,"model":500,"context":0,"compute":20}]})");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->accelerator.total(), 1340u);
  EXPECT_EQ(plan->host.weights, 500u);
  EXPECT_EQ(plan->host.compute, 20u);
}

TEST(ExactPlanTest, AReportThatIsNotAPlanIsAnError) {
  for (const char* bad : {"", "not json", "[]", R"({"buffers":{}})", R"({"buffers":[{"model":1,"context":1,"compute":1}]})",
                          R"({"buffers":[{"name":"CPU","model":-1,"context":1,"compute":1}]})",
                          R"({"buffers":[{"name":"CPU","model":1,"context":1}]})",
                          R"({"buffers":[{"name":"CPU","model":"1","context":1,"compute":1}]})"}) {
    auto plan = ParseDryRun(bad);
    EXPECT_FALSE(plan.ok()) << bad;
    if (!plan.ok()) {
      EXPECT_NE(plan.status().message().find("--dry-run"), std::string::npos) << plan.status().message();
    }
  }
}

class DryRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("spillway-exact-plan-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Script(const std::string& body) {
    const std::string path = (dir_ / "worker").string();
    std::ofstream(path) << "#!/bin/sh\n" << body;
    ::chmod(path.c_str(), 0755);
    return path;
  }
  fs::path dir_;
};

TEST_F(DryRunTest, TheDryRunIsThePlacementAsTheWorkerTakesIt) {
  const std::string args = (dir_ / "args").string();
  const std::string worker = Script("echo \"$@\" > " + args + "\n" +
                                    R"(echo '{"buffers":[{"name":"CUDA0","model":7,"context":8,"compute":9}]}')" + "\n");
  DryRunArgs a;
  a.model = "/models/m.gguf";
  a.device = "cuda:0";
  a.gpu_layers = -1;
  a.ctx = 8192;
  a.slots = 3;
  a.batch = 256;
  a.kv_unified = true;
  auto plan = RunDryRun(worker, a);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->accelerator.total(), 24u);
  std::stringstream given;
  given << std::ifstream(args).rdbuf();
  EXPECT_EQ(given.str(),
            "--model /models/m.gguf --device cuda:0 --gpu-layers -1 --ctx 8192 --slots 3 --batch 256 --kv-type f16 "
            "--dry-run --kv-unified\n");
}

// The worker's own reason, its fatal line, even after a long log (more than a
// pipe holds: the log does not stall it).
TEST_F(DryRunTest, AFailedDryRunSaysTheWorkersReason) {
  const std::string worker =
      Script("i=0; while [ $i -lt 3000 ]; do echo 'llama_model_loader: a long line of the loader log, 100 bytes or so' >&2; "
             "i=$((i+1)); done\n"
             R"(echo '{"fatal":true,"message":"unknown model architecture: lfm9","exit_code":3}' >&2)" "\nexit 3\n");
  DryRunArgs a;
  a.model = "/models/m.gguf";
  auto plan = RunDryRun(worker, a);
  ASSERT_FALSE(plan.ok());
  const std::string m = plan.status().message();
  EXPECT_NE(m.find("unknown model architecture: lfm9"), std::string::npos) << m;
  EXPECT_NE(m.find("exit 3"), std::string::npos) << m;
  EXPECT_NE(m.find("/models/m.gguf"), std::string::npos) << m;
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);  // (final: kept for the file)
  // No worker there: said so.
  auto missing = RunDryRun((dir_ / "none").string(), a);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("cannot run"), std::string::npos) << missing.status().message();
  EXPECT_EQ(missing.status().code(), StatusCode::kUnavailable);  // (may pass: asked again)
}

// A refusal that may pass (a device busy or full now, no reason given, a
// signal) is not final: the caller asks again rather than keep it.
TEST_F(DryRunTest, AFailureThatMayPassIsNotFinal) {
  DryRunArgs a;
  a.model = "/models/m.gguf";
  for (const char* body : {R"(echo '{"fatal":true,"code":"resource_exhausted","message":"no room on cuda:0"}' >&2; exit 3)",
                           "exit 3", "kill -9 $$"}) {
    auto plan = RunDryRun(Script(std::string(body) + "\n"), a);
    ASSERT_FALSE(plan.ok()) << body;
    EXPECT_EQ(plan.status().code(), StatusCode::kUnavailable) << body << ": " << plan.status().ToString();
  }
}

}  // namespace
}  // namespace spillway::memory
