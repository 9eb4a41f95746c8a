#include "devices/telemetry.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <filesystem>
#include <fstream>

#include "devices/sim_ledger.h"

namespace spillway::devices {
namespace {

namespace fs = std::filesystem;

class FakeTree : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("spillway-telemetry-" + std::to_string(getpid()));
    fs::create_directories(root_ / "proc/self");
    fs::create_directories(root_ / "proc/42");
    fs::create_directories(root_ / "cg/svc");
  }
  void TearDown() override { fs::remove_all(root_); }
  void Write(const fs::path& p, const std::string& text) { std::ofstream(root_ / p) << text; }
  HostTelemetry Host() { return HostTelemetry((root_ / "proc").string(), (root_ / "cg").string()); }
  fs::path root_;
};

TEST_F(FakeTree, HostReadsMeminfo) {
  Write("proc/meminfo", "MemTotal:       16000000 kB\nMemFree:  100 kB\nMemAvailable:    8000000 kB\n");
  auto r = Host().Read();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->total, 16000000ull * 1024);
  EXPECT_EQ(r->available, 8000000ull * 1024);
  EXPECT_FALSE(r->cgroup_limit.has_value());
  EXPECT_EQ(r->effective_available(), 8000000ull * 1024);
}

TEST_F(FakeTree, CgroupLimitCapsAvailableMemory) {
  Write("proc/meminfo", "MemTotal: 16000000 kB\nMemAvailable: 8000000 kB\n");
  Write("proc/self/cgroup", "0::/svc\n");
  Write("cg/svc/memory.max", "2147483648\n");
  Write("cg/svc/memory.current", "1073741824\n");
  auto r = Host().Read();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r->cgroup_limit, 2147483648ull);
  EXPECT_EQ(r->effective_available(), 1073741824ull);
  Write("cg/svc/memory.max", "max\n");
  EXPECT_FALSE(Host().Read()->cgroup_limit.has_value());
}

// Page cache the kernel reclaims (a model file read, logs) is not used
// memory: a limited group's memory.current grows up to its limit with it,
// and the room read as none (the CPU path refused for "host memory low").
// A parent's limit binds too.
TEST_F(FakeTree, CgroupRoomLeavesOutReclaimableCacheAndHonoursAParentsLimit) {
  Write("proc/meminfo", "MemTotal: 16000000 kB\nMemAvailable: 8000000 kB\n");
  Write("proc/self/cgroup", "0::/svc\n");
  Write("cg/svc/memory.max", "2147483648\n");
  Write("cg/svc/memory.current", "2147483648\n");
  Write("cg/svc/memory.stat", "anon 536870912\nfile 1610612736\ninactive_file 1073741824\nactive_file 536870912\n");
  auto r = Host().Read();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->effective_available(), 1073741824ull) << "the inactive cache counted as used";
  fs::create_directories(root_ / "cg/slice/svc");
  Write("proc/self/cgroup", "0::/slice/svc\n");
  Write("cg/slice/svc/memory.max", "max\n");
  Write("cg/slice/svc/memory.current", "100\n");
  Write("cg/slice/memory.max", "1073741824\n");
  Write("cg/slice/memory.current", "805306368\n");
  r = Host().Read();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->effective_available(), 268435456ull) << "the parent slice's limit was not seen";
  EXPECT_EQ(*r->cgroup_limit, 1073741824ull);
}

TEST_F(FakeTree, MissingOrMalformedFilesAreErrors) {
  EXPECT_EQ(Host().Read().status().code(), StatusCode::kUnavailable);
  Write("proc/meminfo", "MemTotal: lots\n");
  EXPECT_EQ(Host().Read().status().code(), StatusCode::kUnavailable);
}

TEST_F(FakeTree, ProcessRss) {
  Write("proc/42/status", "Name: worker\nVmRSS:     2048 kB\n");
  EXPECT_EQ(*Host().ProcessRss(42), 2048u * 1024);
  EXPECT_EQ(Host().ProcessRss(43).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Host().ProcessRss(-1).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(*Host().ProcessPss(42), 2048u * 1024) << "no smaps_rollup: its VmRSS";
  Write("proc/42/smaps_rollup", "00400000-7fff0000 ---p 00000000 00:00 0  [rollup]\nRss:  2048 kB\n"
                                "Pss:  1024 kB\nPss_Anon:  512 kB\n");
  EXPECT_EQ(*Host().ProcessPss(42), 1024u * 1024);
  EXPECT_EQ(Host().ProcessPss(43).status().code(), StatusCode::kNotFound);
}

// A server that forks (Ollama's runners, a Python server's workers): what
// its group holds counts each shared page once. Its members' VmRSS summed
// counted the copy-on-write pages of a fork twice.
TEST(HostTelemetryTest, AForkedCopyIsCountedOnceInItsGroup) {
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  constexpr size_t kBytes = 48u << 20;
  const pid_t leader = fork();
  if (leader == 0) {
    setpgid(0, 0);
    char* p = static_cast<char*>(std::malloc(kBytes));
    std::memset(p, 1, kBytes);  // resident, then shared with the copy
    if (fork() == 0) {
      pause();
      _exit(0);
    }
    (void)!write(ready[1], "x", 1);
    pause();
    _exit(0);
  }
  setpgid(leader, leader);
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // (the copy's own pages settle)
  HostTelemetry h;
  const auto group = h.GroupRss(leader);
  const auto leader_rss = h.ProcessRss(leader);
  kill(-leader, SIGKILL);
  waitpid(leader, nullptr, 0);
  close(ready[0]);
  close(ready[1]);
  ASSERT_TRUE(group.ok() && leader_rss.ok());
  EXPECT_GE(*group, kBytes * 9 / 10) << "the pages are there";
  EXPECT_LT(*group, *leader_rss * 3 / 2) << "counted once, not once per process: " << *group << " vs " << *leader_rss;
}

// cuda:N is the Nth GPU the workers' CUDA runtime sees: among
// CUDA_VISIBLE_DEVICES when it is set (NVML read GPU N of all of them:
// with CUDA_VISIBLE_DEVICES=1, cuda:0 is GPU 1, and admission read GPU 0).
TEST(CudaDeviceTest, CudaNIsTheNthVisibleDevice) {
  EXPECT_EQ(SelectCudaDevice(1, nullptr).nvml_index, 1u);
  EXPECT_EQ(SelectCudaDevice(1, "").nvml_index, 1u);
  EXPECT_EQ(SelectCudaDevice(0, "1").nvml_index, 1u);
  EXPECT_EQ(SelectCudaDevice(1, "2, 0").nvml_index, 0u);
  const auto uuid = SelectCudaDevice(0, "GPU-8f1e2c3a-0000-1111-2222-333344445555");
  EXPECT_FALSE(uuid.nvml_index);
  EXPECT_EQ(uuid.uuid, "GPU-8f1e2c3a-0000-1111-2222-333344445555");
  EXPECT_EQ(SelectCudaDevice(2, "0,1").error, "cuda:2 is not among CUDA_VISIBLE_DEVICES=0,1");
  EXPECT_FALSE(SelectCudaDevice(-1, nullptr).error.empty());
}

TEST(HostTelemetryTest, RealHostAndOwnRss) {
  HostTelemetry h;
  auto r = h.Read();
  ASSERT_TRUE(r.ok());
  EXPECT_GT(r->total, 0u);
  EXPECT_LE(r->available, r->total);
  EXPECT_GT(*h.ProcessRss(getpid()), 0u);
}

TEST_F(FakeTree, SimTelemetryReadsTheLedger) {
  setenv("SPILLWAY_SIM_DIR", root_.c_str(), 1);
  EXPECT_EQ(OpenDeviceTelemetry("sim:1").status().code(), StatusCode::kUnavailable);
  auto ledger = SimLedger::Create(1, 100 << 20);
  ASSERT_TRUE(ledger.ok());
  ASSERT_TRUE((*ledger)->Reserve(LedgerKind::kHold, "hold", 30 << 20));
  auto t = OpenDeviceTelemetry("sim:1");
  ASSERT_TRUE(t.ok());
  auto r = (*t)->Read();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->total, 100u << 20);
  EXPECT_EQ(r->free, 70u << 20);
  ASSERT_EQ(r->processes.size(), 1u);
  EXPECT_EQ(r->processes[0].pid, getpid());
  EXPECT_EQ(r->processes[0].label, "hold");
  // `sim remove` and `sim create` again: the kept reader reads the new
  // device (it read the old, unlinked file: its capacity and holders).
  ledger->reset();
  ASSERT_TRUE(SimLedger::Remove(1).ok());
  EXPECT_EQ((*t)->Read().status().code(), StatusCode::kUnavailable) << "a removed device read as present";
  auto again = SimLedger::Create(1, 200 << 20);
  ASSERT_TRUE(again.ok());
  r = (*t)->Read();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->total, 200u << 20);
  EXPECT_TRUE(r->processes.empty());
  unsetenv("SPILLWAY_SIM_DIR");
}

TEST(DeviceTelemetryTest, BadNamesAndAbsentNvmlAreCleanErrors) {
  EXPECT_EQ(OpenDeviceTelemetry("tpu:0").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenDeviceTelemetry("cuda").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenDeviceTelemetry("sim:x").status().code(), StatusCode::kInvalidArgument);
  auto cuda = OpenDeviceTelemetry("cuda:0");  // works on a GPU host, kUnavailable elsewhere
  if (!cuda.ok()) {
    EXPECT_EQ(cuda.status().code(), StatusCode::kUnavailable);
  } else {
    auto r = (*cuda)->Read();
    ASSERT_TRUE(r.ok());
    EXPECT_GT(r->total, 0u);
  }
}

}  // namespace
}  // namespace spillway::devices
