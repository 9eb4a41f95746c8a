#include "gateway/placement_admission.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "devices/sim_ledger.h"
#include "gateway/gateway.h"

namespace spillway::gateway {
namespace {

config::GatewayConfig OneService(int ctx) {
  const char* m = std::getenv("SPILLWAY_MODELS");
  config::GatewayConfig c;
  config::ServiceConfig s;
  s.name = "chat";
  s.model = std::string(m ? m : "build/models") + "/tiny-chat.gguf";
  config::PlacementConfig p;
  p.role = "primary";
  p.ctx = ctx;
  s.placements = {p};
  c.services = {s};
  return c;
}

// A model the metadata cannot size (the hybrid test model) is planned by
// the worker's dry run once per file and placement; a refusal the worker
// explained is kept too, one that may pass (a device full now) is asked again.
TEST(PlacementAdmissionTest, ADryRunPlanIsKeptAndAFailureThatMayPassIsAskedAgain) {
  namespace fs = std::filesystem;
  const char* m = std::getenv("SPILLWAY_MODELS");
  const fs::path dir = fs::temp_directory_path() / ("spillway-exact-memo-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string model = (dir / "hybrid.gguf").string();
  fs::copy_file(std::string(m ? m : "build/models") + "/tiny-hybrid.gguf", model, fs::copy_options::overwrite_existing);
  auto cfg = OneService(1024);
  cfg.services[0].model = model;
  auto worker = [&](const std::string& name, const std::string& body) {
    const std::string path = (dir / name).string();
    std::ofstream(path) << "#!/bin/sh\necho run >> " << path << ".runs\n" << body << "\n";
    fs::permissions(path, fs::perms::owner_all);
    return path;
  };
  auto runs = [&](const std::string& path) {
    std::ifstream in(path + ".runs");
    int n = 0;
    for (std::string line; std::getline(in, line);) ++n;
    return n;
  };
  const std::string plans = worker("plans", R"(echo '{"buffers":[{"name":"CPU","host":true,"model":7,"context":8,"compute":9}]}')");
  const std::string refuses = worker("refuses", R"(echo '{"fatal":true,"code":"invalid_argument","message":"no"}' >&2; exit 2)");
  const std::string busy = worker("busy", R"(echo '{"fatal":true,"code":"resource_exhausted","message":"full"}' >&2; exit 3)");
  for (int i = 0; i < 2; ++i) {
    auto planned = PredictPlacementBytes(cfg.services[0], 0, plans);
    ASSERT_TRUE(planned.ok()) << planned.status().ToString();
    EXPECT_EQ(*planned, 24u);
    EXPECT_FALSE(PredictPlacementBytes(cfg.services[0], 0, refuses).ok());
    EXPECT_FALSE(PredictPlacementBytes(cfg.services[0], 0, busy).ok());
  }
  EXPECT_EQ(runs(plans), 1);
  EXPECT_EQ(runs(refuses), 1);
  EXPECT_EQ(runs(busy), 2);
  // Without a worker: no estimate, and why.
  auto none = PredictPlacementBytes(cfg.services[0], 0, "");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("per layer"), std::string::npos) << none.status().message();
  fs::remove_all(dir);
}

TEST(PlacementAdmissionTest, HostPlacementFitsAndCalibrationIsKept) {
  auto cfg = OneService(2048);
  PlacementCalibration cal;
  auto all = AdmitPlacements(&cal, cfg);
  ASSERT_EQ(all.size(), 1u);
  const auto& a = all["chat.0"];
  EXPECT_TRUE(a.admitted) << a.reason;
  EXPECT_GT(a.predicted_bytes, 60u << 20);  // logits for a 512-token micro-batch dominate
  // A worker reported 10 % more than predicted: the next admission of this
  // (model, device) plans with what was observed.
  const uint64_t observed = a.predicted_bytes + a.predicted_bytes / 10;
  RecordObserved(cal, cfg, "chat.0", observed);
  auto again = AdmitPlacement(&cal, cfg, "chat.0");
  EXPECT_NEAR(static_cast<double>(again.predicted_bytes), static_cast<double>(observed), 16.0);
  // Owned, not global: another admitter has seen nothing.
  PlacementCalibration fresh;
  EXPECT_EQ(AdmitPlacement(&fresh, cfg, "chat.0").predicted_bytes, a.predicted_bytes);
}

// A service's warm CPU replicas load at start together: held to the CPU
// path's RAM budget together. Each was held to it alone, and two that
// together passed it both loaded (the line then refused every request).
TEST(PlacementAdmissionTest, WarmCpuReplicasAreHeldToTheBudgetTogether) {
  auto cfg = OneService(2048);
  auto& s = cfg.services[0];
  config::PlacementConfig fallback = s.placements[0];
  fallback.device = "cpu";
  fallback.role = "fallback";
  s.placements.push_back(fallback);  // chat.1 and chat.2: the CPU path's replicas
  s.placements.push_back(fallback);
  PlacementCalibration cal;
  const uint64_t one = AdmitPlacements(&cal, cfg)["chat.1"].predicted_bytes;
  ASSERT_GT(one, 0u);
  s.cpu_path.ram_budget_mib = static_cast<double>(one + one / 2) / (1 << 20);  // one fits, two do not
  s.failover.readiness = "warm";
  auto both = AdmitPlacements(&cal, cfg);
  EXPECT_TRUE(both["chat.1"].admitted) << both["chat.1"].reason;
  EXPECT_FALSE(both["chat.2"].admitted);
  EXPECT_NE(both["chat.2"].reason.find("other warm CPU replicas"), std::string::npos) << both["chat.2"].reason;
  // Replicas that load on demand are judged when they load, beside the loaded ones.
  s.failover.readiness = "on-demand";
  auto lazy = AdmitPlacements(&cal, cfg);
  EXPECT_TRUE(lazy["chat.1"].admitted && lazy["chat.2"].admitted) << lazy["chat.2"].reason;
}

TEST(PlacementAdmissionTest, AnUnreadableModelIsLeftToLlamaCpp) {
  auto cfg = OneService(512);
  cfg.services[0].model = "/nonexistent.gguf";
  auto a = AdmitPlacement(nullptr, cfg, "chat.0");
  EXPECT_TRUE(a.admitted);
  EXPECT_NE(a.reason.find("no estimate"), std::string::npos);
  EXPECT_EQ(AdmitPlacement(nullptr, cfg, "nope.3").reason, "unknown placement");
}

TEST(PlacementAdmissionTest, AModelFileReplacedInPlaceIsEstimatedAgain) {
  // Estimates are kept per model file and placement shape (a start gate asks often); a file replaced under the
  // same path (another model, the same name) must not keep the old estimate.
  const char* m = std::getenv("SPILLWAY_MODELS");
  const std::string dir = m ? m : "build/models";
  const std::string path = ::testing::TempDir() + "/spillway-estimate-" + std::to_string(getpid()) + ".gguf";
  std::filesystem::copy_file(dir + "/tiny-chat.gguf", path, std::filesystem::copy_options::overwrite_existing);
  auto cfg = OneService(512);
  cfg.services[0].model = path;
  const uint64_t first = AdmitPlacement(nullptr, cfg, "chat.0").predicted_bytes;
  EXPECT_EQ(AdmitPlacement(nullptr, cfg, "chat.0").predicted_bytes, first);
  std::filesystem::copy_file(dir + "/demo-embed.gguf", path, std::filesystem::copy_options::overwrite_existing);
  const uint64_t second = AdmitPlacement(nullptr, cfg, "chat.0").predicted_bytes;
  EXPECT_NE(second, first);
  cfg.services[0].placements[0].ctx = 1024;  // another shape of the same file
  EXPECT_NE(AdmitPlacement(nullptr, cfg, "chat.0").predicted_bytes, second);
  std::filesystem::remove(path);
}

// Restart admission counts what the workers starting on the device will
// hold: one whose prediction does not fit what is free is loading into all of
// it. It reserved nothing, so a second start was admitted into the same free
// memory (two workers restarting together after a device loss).
TEST(PlacementAdmissionTest, AStartingWorkerThatDoesNotFitHoldsWhatIsLeft) {
  constexpr int kDevice = 7;  // (a device of this test's own)
  auto cfg = OneService(4096);
  config::PlacementConfig small = cfg.services[0].placements[0];
  cfg.services[0].placements[0].device = "sim:" + std::to_string(kDevice);
  cfg.services[0].placements[0].gpu_layers = 99;
  small.device = cfg.services[0].placements[0].device;
  small.gpu_layers = 99;
  small.ctx = 256;
  small.role = "fallback";
  cfg.services[0].placements.push_back(small);
  ASSERT_TRUE(devices::SimLedger::Create(kDevice, 1ull << 30).ok());
  const uint64_t big = AdmitPlacement(nullptr, cfg, "chat.0").predicted_bytes;
  const uint64_t little = AdmitPlacement(nullptr, cfg, "chat.1").predicted_bytes;
  ASSERT_GT(big, little + (8u << 20)) << "the test needs two sizes apart";
  // The smallest device where chat.1 fits alone (chat.0 then does not).
  uint64_t capacity = little;
  for (; capacity < (1ull << 30); capacity += 1u << 20) {
    ASSERT_TRUE(devices::SimLedger::Create(kDevice, capacity).ok());
    if (AdmitPlacement(nullptr, cfg, "chat.1").admitted) break;
  }
  EXPECT_TRUE(AdmitPlacement(nullptr, cfg, "chat.1").admitted);
  EXPECT_FALSE(AdmitPlacement(nullptr, cfg, "chat.0").admitted);
  const PlacementAdmission beside = AdmitPlacement(nullptr, cfg, "chat.1", {"chat.0"});
  EXPECT_FALSE(beside.admitted) << "admitted into the memory chat.0 is loading into: " << beside.reason;
  (void)devices::SimLedger::Remove(kDevice);
}

// After a gateway restart, an adopted on-demand worker holds its memory: a
// second on-demand service that fits the device once that one unloads is
// admitted (the start gate makes room for it when it loads), not refused for
// good beside memory the gate may take back.
TEST(PlacementAdmissionTest, AnOnDemandPlacementFitsBesideAnAdoptedOneTheGateMayUnload) {
  constexpr int kDevice = 9;  // (a device of this test's own)
  auto cfg = OneService(1024);
  auto& chat = cfg.services[0];
  chat.residency.mode = "on_demand";
  chat.placements[0].device = "sim:" + std::to_string(kDevice);
  chat.placements[0].gpu_layers = 99;
  config::ServiceConfig other = chat;
  other.name = "other";
  cfg.services.push_back(other);
  ASSERT_TRUE(devices::SimLedger::Create(kDevice, 1ull << 30).ok());
  const uint64_t predicted = AdmitPlacement(nullptr, cfg, "other.0").predicted_bytes;
  ASSERT_GT(predicted, 0u);
  // The smallest device where one fits, plus half of one: never two at once.
  uint64_t capacity = predicted;
  for (; capacity < (1ull << 30); capacity += 1u << 20) {
    ASSERT_TRUE(devices::SimLedger::Create(kDevice, capacity).ok());
    if (AdmitPlacement(nullptr, cfg, "other.0").admitted) break;
  }
  capacity += predicted / 2;
  auto ledger = devices::SimLedger::Create(kDevice, capacity);
  ASSERT_TRUE(ledger.ok());
  ASSERT_TRUE((*ledger)->Reserve(devices::LedgerKind::kAlloc, "adopted chat.0", predicted));  // chat.0's worker, adopted
  auto start = AdmitPlacements(nullptr, cfg, {"chat.0"});
  EXPECT_TRUE(start["chat.0"].admitted) << start["chat.0"].reason;
  EXPECT_TRUE(start["other.0"].admitted) << "refused beside memory the start gate may unload: " << start["other.0"].reason;
  // Pinned, the adopted one is there for good: the other does not fit beside it.
  cfg.services[0].residency.mode = "pinned";
  start = AdmitPlacements(nullptr, cfg, {"chat.0"});
  EXPECT_FALSE(start["other.0"].admitted) << start["other.0"].reason;
  (void)devices::SimLedger::Remove(kDevice);
}

// A pinned external server Spillway starts loads at start beside the pinned
// placements, with no start gate of its own: a placement does not count on
// the memory it declares (the two loaded together past the device).
TEST(PlacementAdmissionTest, APinnedPlacementDoesNotCountOnAPinnedExternalsMemory) {
  constexpr int kDevice = 10;  // (a device of this test's own)
  auto cfg = OneService(1024);
  cfg.services[0].placements[0].device = "sim:" + std::to_string(kDevice);
  cfg.services[0].placements[0].gpu_layers = 99;
  ASSERT_TRUE(devices::SimLedger::Create(kDevice, 1ull << 30).ok());
  const uint64_t predicted = AdmitPlacement(nullptr, cfg, "chat.0").predicted_bytes;
  ASSERT_GT(predicted, 0u);
  uint64_t capacity = predicted;  // the smallest device where chat.0 fits
  for (; capacity < (1ull << 30); capacity += 1u << 20) {
    ASSERT_TRUE(devices::SimLedger::Create(kDevice, capacity).ok());
    if (AdmitPlacement(nullptr, cfg, "chat.0").admitted) break;
  }
  config::ExternalConfig whisper;
  whisper.name = "whisper";
  whisper.command = {"/bin/true"};
  whisper.device = cfg.services[0].placements[0].device;
  whisper.resident_mib = static_cast<double>(predicted >> 20) / 2;
  cfg.externals.push_back(whisper);
  auto start = AdmitPlacements(nullptr, cfg, {});
  EXPECT_FALSE(start["chat.0"].admitted) << "counted on the pinned external's memory: " << start["chat.0"].reason;
  // One that loads with its first request has the start gate: it holds nothing at start.
  cfg.externals[0].residency.mode = "on_demand";
  start = AdmitPlacements(nullptr, cfg, {});
  EXPECT_TRUE(start["chat.0"].admitted) << start["chat.0"].reason;
  (void)devices::SimLedger::Remove(kDevice);
}

}  // namespace
}  // namespace spillway::gateway
