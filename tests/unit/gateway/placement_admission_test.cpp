#include "gateway/placement_admission.h"

#include <gtest/gtest.h>

#include <cstdlib>

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

}  // namespace
}  // namespace spillway::gateway
