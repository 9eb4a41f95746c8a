#include "gateway/placement_admission.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <unistd.h>

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

}  // namespace
}  // namespace spillway::gateway
