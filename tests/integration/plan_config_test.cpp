// `spillway plan --config`: a whole config on simulated devices. Everything
// fits (exit 0); on-demand services that fit only by switching (exit 1), with
// the eviction order PlanEviction gives (lower priority, then cheaper,
// first); pinned services beyond the device (exit 2); a device that cannot
// be observed (exit 3); an invalid config (exit 2).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <vector>

#include "scoped_sim_dir.h"
#include "worker_process.h"

namespace spillway::testing {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr double kMiB = 1024.0 * 1024.0;

bool Has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A pinned chat model and an on-demand background embedding model on
// `device`, and three on-demand external servers there: a (interactive, 300
// MiB), b (batch, 200 MiB, evict_cost 5) and c (batch, 200 MiB, evict_cost 1).
std::string SwitchingConfig(const std::string& device) {
  std::string t = "[[device]]\nname = \"" + device + "\"\nheadroom_mib = 0\nheadroom_pct = 0\n";
  t += "[[service]]\nname = \"chat\"\nmodel = \"" + ModelPath("tiny-chat") + "\"\nresidency = \"pinned\"\n";
  t += "[[service.placement]]\ndevice = \"" + device + "\"\ngpu_layers = -1\nctx = 256\nslots = 1\n";
  t += "[[service]]\nname = \"embed\"\nmodel = \"" + ModelPath("tiny-embed") +
       "\"\nresidency = \"on_demand\"\npriority = \"background\"\n";
  t += "[[service.placement]]\ndevice = \"" + device + "\"\ngpu_layers = -1\nctx = 256\nslots = 1\n";
  auto external = [&](const std::string& name, const std::string& priority, int mib, const std::string& cost) {
    t += "[[service]]\nname = \"" + name + "\"\nkind = \"external\"\ncommand = \"server --port ${PORT}\"\n" +
         "routes = { \"/v1/audio/transcriptions\" = \"/inference\" }\ndevice = \"" + device +
         "\"\nresident_mib = " + std::to_string(mib) + "\nresidency = \"on_demand\"\npriority = \"" + priority + "\"\n" +
         cost;
  };
  external("a", "interactive", 300, "");
  external("b", "batch", 200, "evict_cost = 5\n");
  external("c", "batch", 200, "evict_cost = 1\n");
  return t;
}

class PlanConfigTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeScratchDir(); }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  std::string Spillway(const std::string& args, int* rc) { return RunCommand(BinDir() + "/spillway " + args + " 2>&1", rc); }
  json PlanJson(const std::string& cfg, int* rc) {
    const std::string out = RunCommand(BinDir() + "/spillway plan --json --config " + cfg, rc);
    json j = json::parse(out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << out;
    return j;
  }
  static const json* Service(const json& device, const std::string& key) {
    for (const auto& s : device["services"]) {
      if (s["key"] == key) return &s;
    }
    return nullptr;
  }

  ScopedSimDir sim_{"plan-config-test"};
  std::string dir_;
};

// One model's plan refuses what serve refuses at start: an embedding
// model's ctx that is not a multiple of its slots (it said FITS, exit 0).
TEST_F(PlanConfigTest, OneModelsPlanSaysAShapeServeRefusesCannotWork) {
  int rc = -1;
  std::string out = Spillway("plan --model " + ModelPath("tiny-embed") + " --device cpu --ctx 1000 --slots 3", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("this shape cannot work: an embedding model needs ctx (1000) to be a multiple of slots (3)"),
            std::string::npos) << out;
  out = Spillway("plan --model " + ModelPath("tiny-embed") + " --device cpu --ctx 1020 --slots 3", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out.find("cannot work"), std::string::npos) << out;
}

TEST_F(PlanConfigTest, EverythingFitsOnABigDeviceAndSwitchingOnASmallOne) {
  int rc = -1;
  std::string out = Spillway("sim create sim:0 --capacity-mib 4096", &rc);
  ASSERT_EQ(rc, 0) << out;

  // (a) Everything fits together: exit 0.
  const std::string big = Write("big.toml", SwitchingConfig("sim:0"));
  out = Spillway("plan --config " + big, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(Has(out, "sim:0: 4096.0 MiB, 4096.0 MiB free now; headroom 0.0 MiB -> budget 4096.0 MiB")) << out;
  EXPECT_TRUE(Has(out, "chat.0")) << out;
  EXPECT_TRUE(Has(out, "embed.0")) << out;
  EXPECT_TRUE(Has(out, "a.ext")) << out;
  EXPECT_TRUE(Has(out, "-> FIT\n")) << out;
  EXPECT_TRUE(Has(out, "verdict: all services fit together")) << out;
  json j = PlanJson(big, &rc);
  EXPECT_EQ(rc, 0);
  ASSERT_EQ(j["devices"].size(), 1u) << j.dump(2);
  const json& d0 = j["devices"][0];
  EXPECT_EQ(d0["all_fit"], true);
  const json* chat = Service(d0, "chat.0");
  const json* embed = Service(d0, "embed.0");
  ASSERT_TRUE(chat && embed) << d0.dump(2);
  EXPECT_EQ((*chat)["residency"], "pinned");
  EXPECT_EQ((*embed)["priority"], "background");
  EXPECT_EQ((*Service(d0, "b.ext"))["bytes"], 200ull << 20);
  const uint64_t chat_bytes = (*chat)["bytes"], embed_bytes = (*embed)["bytes"];
  ASSERT_GT(chat_bytes, 0u);
  ASSERT_LT(embed_bytes, uint64_t{40} << 20) << "the scenario below needs a small embedding model";

  // (b) A device with 450 MiB beside the pinned chat: a (300) and b + c
  // (400) do not fit together; embed fits beside either. Exit 1.
  const double cap_mib = std::ceil(chat_bytes / kMiB) + 450;
  out = Spillway("sim create sim:1 --capacity-mib " + std::to_string(cap_mib), &rc);
  ASSERT_EQ(rc, 0) << out;
  const std::string small = Write("small.toml", SwitchingConfig("sim:1"));
  out = Spillway("plan --config " + small, &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_TRUE(Has(out, "-> DO NOT FIT")) << out;
  EXPECT_TRUE(Has(out, "pinned alone: ")) << out;
  EXPECT_TRUE(Has(out, "largest sets that fit (with the pinned):")) << out;
  EXPECT_TRUE(Has(out, "    a.ext loads beside chat.0, b.ext, c.ext, embed.0:\n      evicts embed.0, c.ext, b.ext: needs 300 MiB, ")) << out;
  EXPECT_TRUE(Has(out, "    b.ext loads beside chat.0, a.ext, embed.0:\n      no room it may take (it waits or is refused): ")) << out;
  EXPECT_TRUE(Has(out, "verdict: the services fit only by switching")) << out;
  j = PlanJson(small, &rc);
  EXPECT_EQ(rc, 1);
  const json& d1 = j["devices"][0];
  EXPECT_EQ(d1["all_fit"], false);
  EXPECT_EQ(d1["pinned_fit"], true);
  EXPECT_EQ(d1["never_fit_beside_pinned"].size(), 0u) << d1.dump(2);
  // The maximal sets: {embed, b, c} and {embed, a}.
  std::vector<std::vector<std::string>> sets;
  for (const auto& s : d1["largest_sets"]) sets.push_back(s["services"].get<std::vector<std::string>>());
  EXPECT_EQ(sets, (std::vector<std::vector<std::string>>{{"embed.0", "b.ext", "c.ext"}, {"embed.0", "a.ext"}}))
      << d1.dump(2);
  std::map<std::string, json> ev;
  for (const auto& e : d1["evictions"]) ev[e["service"].get<std::string>()] = e;
  ASSERT_EQ(ev.size(), 4u) << d1.dump(2);  // every non-pinned holder
  // a (interactive) loading on a device full of b, c and embed: background
  // first, then the cheaper of the two batch servers.
  EXPECT_EQ(ev["a.ext"]["fits"], true);
  EXPECT_EQ(ev["a.ext"]["evict"].get<std::vector<std::string>>(), (std::vector<std::string>{"embed.0", "c.ext", "b.ext"})) << ev["a.ext"].dump();
  // b (batch) finds a (interactive) loaded: a never gives way to it.
  EXPECT_EQ(ev["b.ext"]["fits"], false) << ev["b.ext"].dump();
  EXPECT_EQ(ev["b.ext"]["evict"].size(), 0u);
  // embed fits beside whatever is loaded.
  EXPECT_EQ(ev["embed.0"]["fits"], true);
  EXPECT_EQ(ev["embed.0"]["evict"].size(), 0u) << ev["embed.0"].dump();
}

TEST_F(PlanConfigTest, TransientPeaksWindowsAndAnExclusiveDevice) {
  int rc = -1;
  std::string out = Spillway("sim create sim:3 --capacity-mib 4096", &rc);
  ASSERT_EQ(rc, 0) << out;
  std::string t = SwitchingConfig("sim:3");
  // a's requests each hold 100 MiB more while they run; embed only at night, once interactive work is quiet.
  t.replace(t.find("resident_mib = 300"), 18, "resident_mib = 300\ntransient_mib = 100");
  t.replace(t.find("priority = \"background\"\n"), 24,
            "priority = \"background\"\nwindows = [\"01:00-05:00\"]\ninteractive_idle_s = 60\n");
  const std::string cfg = Write("transient.toml", t);
  json j = PlanJson(cfg, &rc);
  EXPECT_EQ(rc, 0) << j.dump(2);
  const json& d = j["devices"][0];
  EXPECT_EQ((*Service(d, "a.ext"))["bytes"], 400ull << 20) << "resident + one request's transient peak";
  EXPECT_TRUE(Has((*Service(d, "a.ext"))["shape"], "+ transient_mib 100 (one request)"));
  EXPECT_TRUE(Has((*Service(d, "embed.0"))["shape"], "on the device only in 01:00-05:00, once interactive work is quiet for 60 s"))
      << (*Service(d, "embed.0")).dump();
  EXPECT_EQ(d["exclusive"], false);
  // The same on an exclusive device: the sum fits, but they are never loaded together; each load unloads the
  // others (never the pinned chat).
  t.replace(t.find("headroom_pct = 0\n"), 17, "headroom_pct = 0\nexclusive = true\n");
  const std::string excl = Write("exclusive.toml", t);
  out = Spillway("plan --config " + excl, &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_TRUE(Has(out, "exclusive: one service at a time here")) << out;
  EXPECT_TRUE(Has(out, "verdict: the services fit only by switching")) << out;
  EXPECT_TRUE(Has(out, "    a.ext loads beside chat.0, b.ext, c.ext, embed.0:\n      evicts b.ext, c.ext, embed.0: exclusive device"))
      << out;
  EXPECT_FALSE(Has(out, "evicts chat.0")) << out;
}

// A flag's number that is no number is said to be none (it was "not in range 16 to 4194304").
TEST_F(PlanConfigTest, ANumberFlagThatIsNoNumberSaysSo) {
  int rc = -1;
  const std::string out = Spillway("plan --model " + ModelPath("tiny-chat") + " --ctx abc", &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_TRUE(Has(out, "--ctx: Failed parsing abc as a")) << out;  // (CLI11: "... as a FLOAT")
  EXPECT_FALSE(Has(out, "not in range")) << out;
}

TEST_F(PlanConfigTest, PinnedServicesBeyondTheDeviceAreAnError) {
  int rc = -1;
  std::string out = Spillway("sim create sim:2 --capacity-mib 512", &rc);
  ASSERT_EQ(rc, 0) << out;
  const std::string cfg = Write(
      "pinned.toml", "[[service]]\nname = \"chat\"\nmodel = \"" + ModelPath("tiny-chat") +
                         "\"\n[[service.placement]]\ndevice = \"sim:2\"\ngpu_layers = -1\nctx = 256\nslots = 1\n"
                         "[[service]]\nname = \"big\"\nkind = \"external\"\ncommand = \"server --port ${PORT}\"\n"
                         "device = \"sim:2\"\nresident_mib = 600\n");
  out = Spillway("plan --config " + cfg, &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_TRUE(Has(out, "headroom 25.6 MiB -> budget 486.4 MiB")) << out;  // the default 5 %
  EXPECT_TRUE(Has(out, "pinned alone: ")) << out;
  EXPECT_TRUE(Has(out, "-> DO NOT FIT: sim:2 can never hold them all")) << out;
  EXPECT_TRUE(Has(out, "verdict: the pinned services do not fit: this config can never serve as written")) << out;
  json j = PlanJson(cfg, &rc);
  EXPECT_EQ(rc, 2);
  EXPECT_EQ(j["devices"][0]["pinned_fit"], false) << j.dump(2);
}

TEST_F(PlanConfigTest, UnobservableDevicesAndInvalidConfigs) {
  int rc = -1;
  // sim:7 has no ledger: its memory is unknown, no verdict (exit 3).
  const std::string unknown = Write("unknown.toml", "[[service]]\nname = \"chat\"\nmodel = \"" + ModelPath("tiny-chat") +
                                                        "\"\n[[service.placement]]\ndevice = \"sim:7\"\n");
  std::string out = Spillway("plan --config " + unknown, &rc);
  EXPECT_EQ(rc, 3) << out;
  EXPECT_TRUE(Has(out, "sim:7: memory unknown (")) << out;
  EXPECT_TRUE(Has(out, "verdict: device memory unknown: no verdict")) << out;

  const std::string missing = Write("missing.toml", "[[service]]\nname = \"chat\"\nmodel = \"" + dir_ + "/none.gguf\"\n");
  out = Spillway("plan --config " + missing, &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_TRUE(Has(out, "spillway plan: ")) << out;
  EXPECT_TRUE(Has(out, "none.gguf not found")) << out;

  out = Spillway("plan --config " + missing + " --model x.gguf", &rc);
  EXPECT_EQ(rc, 2) << out;
  out = Spillway("plan", &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_TRUE(Has(out, "--model or --config")) << out;
  // One model's flags with --config are refused, not ignored; a device or a
  // layer count that is not one is an error, not a plan.
  const std::string model = ModelPath("tiny-chat");
  // A model of no weights (its tensor count 0): nothing loads from it. It
  // was planned as fitting in 0 MiB, and its worker failed at every start.
  const std::string empty = dir_ + "/no-weights.gguf";
  {
    std::ifstream in(model, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    bytes.replace(8, 8, std::string(8, '\0'));
    std::ofstream(empty, std::ios::binary) << bytes;
  }
  const std::string no_weights = Write("no-weights.toml", "[[service]]\nname = \"chat\"\nmodel = \"" + empty + "\"\n");
  const std::pair<std::string, std::string> wrong[] = {
      {"plan --model " + empty, "holds no tensors"},
      {"serve --check --config " + no_weights, "holds no tensors"},
      {"plan --config " + missing + " --ctx 99999", "--config excludes --ctx"},
      {"plan --config " + missing + " --device cpu", "--config excludes --device"},
      {"plan --config " + missing + " --headroom-pct 80", "--config excludes --headroom-pct"},
      {"plan --model " + model + " --device gpu0", "'gpu0' is not cpu, sim:N or cuda:N"},
      {"plan --model " + model + " --gpu-layers 3x", "--gpu-layers must be a number"},
      {"plan --model " + model + " --gpu-layers -5", "--gpu-layers must be a number"},
      {"plan --model " + model + " --gpu-layers=-", "--gpu-layers must be a number"},
      {"plan --model " + model + " --headroom-mib nan", "--headroom-mib: must be a finite number"},
  };
  for (const auto& [args, says] : wrong) {
    out = Spillway(args, &rc);
    EXPECT_EQ(rc, 2) << args << "\n" << out;
    EXPECT_TRUE(Has(out, says)) << args << "\n" << out;
  }

  // Only cpu placements: nothing to plan, which fits.
  const std::string cpu = Write("cpu.toml", "[[service]]\nname = \"chat\"\nmodel = \"" + ModelPath("tiny-chat") + "\"\n");
  out = Spillway("plan --config " + cpu, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(Has(out, "nothing to plan")) << out;
}

}  // namespace
}  // namespace spillway::testing
