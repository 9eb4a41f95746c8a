// whisper-server on the simulated accelerator: libggml-sim-whisper.so, the
// sim backend compiled against whisper.cpp's ggml (0.15), loaded with
// GGML_BACKEND_PATH, accounting on the same ledger files as llama.cpp's
// workers (a private $SPILLWAY_SIM_DIR here).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "whisper_server.h"
#include "worker_process.h"

namespace spillway::testing {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

class WhisperSimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = WhisperServerMissing(); !why.empty()) GTEST_SKIP() << why;
    module_ = BinDir() + "/libggml-sim-whisper.so";
    ASSERT_TRUE(std::filesystem::exists(module_)) << module_ << " not built";
    dir_ = MakeScratchDir();
    const std::string sim_dir = dir_ + "/sim";
    ASSERT_EQ(::mkdir(sim_dir.c_str(), 0700), 0);
    ::setenv("SPILLWAY_SIM_DIR", sim_dir.c_str(), 1);  // this process's and its children's devices
    model_ = WriteWhisperModelFile(dir_ + "/tiny-whisper.bin");
  }
  void TearDown() override { ::unsetenv("SPILLWAY_SIM_DIR"); }

  void CreateSim0(int mib) {
    int code = -1;
    const std::string out =
        RunCommand(BinDir() + "/spillway sim create sim:0 --capacity-mib " + std::to_string(mib) + " 2>&1", &code);
    ASSERT_EQ(code, 0) << out;
  }
  // `spillway sim show sim:0 --json`: capacity, used, processes (reaping dead holders).
  json ShowSim0() {
    int code = -1;
    const std::string out = RunCommand(BinDir() + "/spillway sim show sim:0 --json", &code);
    EXPECT_EQ(code, 0) << out;
    const json j = json::parse(out, nullptr, false);
    return j.is_array() && !j.empty() ? j[0] : json();
  }

  std::string module_, dir_, model_;
};

TEST_F(WhisperSimTest, AllocatesOnTheDeviceAndTranscribesAsOnTheCpu) {
  std::string cpu_text;
  {
    WhisperServer cpu(model_, MakeScratchDir());
    ASSERT_TRUE(cpu.ready()) << cpu.Stderr();
    cpu_text = TranscriptText(cpu.Transcribe(WavBytes(440, 1)));
  }
  CreateSim0(64);
  {
    WhisperServer sim(model_, MakeScratchDir(), module_);
    ASSERT_TRUE(sim.ready()) << sim.Stderr();
    EXPECT_NE(sim.Stderr().find("using SIM0 backend"), std::string::npos) << sim.Stderr();
    const json dev = ShowSim0();
    // Weights (7.2 MB), the KV caches and the compute buffers, all held by whisper-server.
    EXPECT_GT(dev.value("used", 0), 7'000'000) << dev.dump();
    ASSERT_EQ(dev["processes"].size(), 1u) << dev.dump();
    EXPECT_EQ(dev["processes"][0].value("pid", 0), sim.pid());
    EXPECT_EQ(dev["processes"][0].value("bytes", 0), dev.value("used", 0));
    EXPECT_EQ(TranscriptText(sim.Transcribe(WavBytes(440, 1))), cpu_text) << "sim computes on the CPU";
  }
  EXPECT_EQ(ShowSim0().value("used", -1), 0) << "freed when whisper-server exits";
}

// Unlike llama.cpp (whose loads return NULL), whisper.cpp 1.9.1 does not
// check a failed device allocation: weights that do not fit end in
// GGML_ASSERT(buffer) (SIGABRT), compute buffers that do not fit in a
// SIGSEGV. The server dies at start either way, never listens, and the
// ledger frees what the dead process held.
TEST_F(WhisperSimTest, ADeviceTooSmallKillsTheServerAtStartAndFreesItsMemory) {
  for (int mib : {4, 10}) {  // 4: the weights do not fit; 10: they do, the compute buffers do not
    SCOPED_TRACE(std::to_string(mib) + " MiB");
    CreateSim0(mib);
    WhisperServer sim(model_, MakeScratchDir(), module_, 30s);
    EXPECT_FALSE(sim.ready());
    const auto code = sim.ExitCode(30s);
    ASSERT_TRUE(code.has_value()) << "whisper-server still runs on a device too small";
    EXPECT_NE(*code, 0);
    std::printf("sim:0 of %d MiB: whisper-server exit %d\n", mib, *code);
    EXPECT_NE(sim.Stderr().find("SIM0: out of memory"), std::string::npos) << sim.Stderr();
    EXPECT_EQ(ShowSim0().value("used", -1), 0);
  }
}

}  // namespace
}  // namespace spillway::testing
