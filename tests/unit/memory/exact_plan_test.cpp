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
  // No worker there: said so.
  auto missing = RunDryRun((dir_ / "none").string(), a);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("cannot run"), std::string::npos) << missing.status().message();
}

}  // namespace
}  // namespace spillway::memory
