// `spillway init`: a config from the models and devices it finds, with plan's
// verdict in comments, that `spillway serve --check` accepts and a gateway
// serves; an existing file refused without --force; no models -> a commented
// config; every wrong input a clear error (exit 2).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "gateway_calls.h"
#include "gateway_process.h"
#include "ollama_store_layout.h"
#include "scoped_sim_dir.h"
#include "worker_process.h"

namespace spillway::testing {
namespace {

namespace fs = std::filesystem;

bool Has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

class InitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeScratchDir();
    models_ = dir_ + "/models";
    fs::create_directories(models_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  // The generated tiny models in a folder of their own, and one file that only looks like a model.
  void AddModels() {
    fs::copy_file(ModelPath("tiny-chat"), models_ + "/tiny-chat.gguf");
    fs::copy_file(ModelPath("tiny-embed"), models_ + "/tiny-embed.gguf");
    std::ofstream(models_ + "/notes.gguf") << "not a model\n";
  }
  std::string Spillway(const std::string& args, int* rc) { return RunCommand(BinDir() + "/spillway " + args + " 2>&1", rc); }

  std::string dir_, models_;
};

TEST_F(InitTest, WritesAConfigThatServeChecksAndServes) {
  AddModels();
  const std::string cfg = dir_ + "/spillway.toml";
  int rc = -1;
  std::string out = Spillway("init --models " + models_ + " --devices cpu -o " + cfg, &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_TRUE(Has(out, "wrote " + cfg)) << out;
  EXPECT_TRUE(Has(out, "spillway serve --config " + cfg)) << "how to start it: " << out;
  const std::string text = ReadTextFile(cfg);
  // plan's verdict for each placement, in comments at the top.
  EXPECT_TRUE(Has(text, "# spillway plan's verdict for each placement")) << text;
  EXPECT_TRUE(Has(text, "#   service 'chat' on cpu (primary, ctx 8192, 4 slots):")) << text;
  EXPECT_TRUE(Has(text, "#   service 'embed' on cpu (primary")) << text;
  EXPECT_TRUE(Has(text, "#     cpu: ")) << text;
  EXPECT_TRUE(Has(text, "-> FITS")) << text;
  EXPECT_TRUE(Has(text, "#   skipped " + models_ + "/notes.gguf")) << text;
  EXPECT_TRUE(Has(text, "name = \"chat\"\nmodel = \"" + models_ + "/tiny-chat.gguf\"")) << text;
  EXPECT_TRUE(Has(text, "name = \"embed\"\nmodel = \"" + models_ + "/tiny-embed.gguf\"")) << text;
  EXPECT_TRUE(Has(text, "model_dirs = [\"" + models_ + "\"]")) << text;

  out = Spillway("serve --check --config " + cfg, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(Has(out, "ok (2 services, 2 placements")) << out;
  // Where init wrote it, without --config: the demo runs, and says so.
  out = RunCommand("cd " + dir_ + " && " + BinDir() + "/spillway serve --check 2>&1", &rc);
  EXPECT_TRUE(Has(out, "./spillway.toml is not read")) << out;
  out = RunCommand("cd " + dir_ + " && " + BinDir() + "/spillway doctor 2>&1", &rc);
  EXPECT_TRUE(Has(out, "./spillway.toml is not read")) << out;

  GatewayProcess gw(text);
  ASSERT_TRUE(gw.Start()) << gw.Output();
  auto r = Call(gw.port(), "POST", "/v1/chat/completions", Chat(4));
  EXPECT_EQ(r.status, 200) << r.body;
  r = Call(gw.port(), "POST", "/v1/embeddings", R"({"model":"embed","input":"hello"})");
  EXPECT_EQ(r.status, 200) << r.body;
}

// On an accelerator (here the simulated one, found without --devices): the
// service goes there with every layer and a CPU fallback of the same file; a
// device too small for it leaves the model on the CPU, saying why.
TEST_F(InitTest, PlacesOnTheAcceleratorWithACpuFallback) {
  AddModels();
  ScopedSimDir sim("init-test");
  int rc = -1;
  std::string out = Spillway("sim create sim:0 --capacity-mib 4096", &rc);
  ASSERT_EQ(rc, 0) << out;
  out = Spillway("sim create sim:1 --capacity-mib 1", &rc);
  ASSERT_EQ(rc, 0) << out;
  const std::string cfg = dir_ + "/sim.toml";
  out = Spillway("init --models " + models_ + " -o " + cfg, &rc);
  ASSERT_EQ(rc, 0) << out;
  std::string text = ReadTextFile(cfg);
  EXPECT_TRUE(Has(text, "# Devices: sim:0, sim:1, cpu")) << text;
  EXPECT_TRUE(Has(text, "#   service 'chat' on sim:0 (primary, ctx 8192, 4 slots):")) << text;
  EXPECT_TRUE(Has(text, "#     sim:0: 4096.0 MiB")) << text;
  EXPECT_TRUE(Has(text, "layers offloaded)")) << text;
  EXPECT_TRUE(Has(text, "#   service 'chat' on cpu (fallback, ctx 2048, 1 slot):")) << text;
  EXPECT_TRUE(Has(text, "device = \"sim:0\"\ngpu_layers = ")) << text;
  EXPECT_TRUE(Has(text, "role = \"fallback\"\ndevice = \"cpu\"\nctx = 2048\nslots = 1")) << text;
  // Each CPU path gets a budget of its own (without one each may take half of
  // the host's memory, and doctor warned on init's own file for two services).
  EXPECT_TRUE(Has(text, "slots = 1\n[service.cpu_path]\nram_budget_mib = ")) << text;
  out = Spillway("serve --check --config " + cfg, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(Has(out, "ok (2 services, 4 placements")) << out;
  out = Spillway("doctor --config " + cfg, &rc);
  EXPECT_TRUE(Has(out, "ok    host-ram ")) << out;
  EXPECT_FALSE(Has(out, "set ram_budget_mib")) << out;

  out = Spillway("init --models " + models_ + " --devices sim:1 -o " + dir_ + "/small.toml", &rc);
  ASSERT_EQ(rc, 0) << out;
  text = ReadTextFile(dir_ + "/small.toml");
  EXPECT_TRUE(Has(text, "#   service 'chat': not placed on sim:1: ")) << text;
  EXPECT_TRUE(Has(text, "DOES NOT FIT")) << text;
  EXPECT_FALSE(Has(text, "device = \"sim:1\"")) << text;
  EXPECT_TRUE(Has(text, "#   service 'chat' on cpu (primary")) << text;
  out = Spillway("serve --check --config " + dir_ + "/small.toml", &rc);
  EXPECT_EQ(rc, 0) << out;
}

TEST_F(InitTest, NeverReplacesAFileWithoutForce) {
  AddModels();
  const std::string cfg = dir_ + "/spillway.toml";
  std::ofstream(cfg) << "# mine\n";
  int rc = -1;
  std::string out = Spillway("init --models " + models_ + " --devices cpu -o " + cfg, &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_TRUE(Has(out, "spillway init: " + cfg + " exists; --force replaces it")) << out;
  EXPECT_EQ(ReadTextFile(cfg), "# mine\n");
  out = Spillway("init --models " + models_ + " --devices cpu --force -o " + cfg, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(Has(ReadTextFile(cfg), "name = \"chat\"")) << ReadTextFile(cfg);
  EXPECT_EQ(fs::status(cfg).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::others_read);
  for (const auto& e : fs::directory_iterator(dir_)) EXPECT_FALSE(Has(e.path().string(), ".tmp-")) << e.path();
}

TEST_F(InitTest, WithoutModelsItWritesACommentedConfigThatSaysWhereToPutThem) {
  const std::string cfg = dir_ + "/empty.toml";
  int rc = -1;
  std::string out = Spillway("init --models " + models_ + " --devices cpu -o " + cfg, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(Has(out, "no GGUF model found")) << out;
  EXPECT_TRUE(Has(out, "Put GGUF files in " + models_)) << out;
  const std::string text = ReadTextFile(cfg);
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) EXPECT_TRUE(line.empty() || line[0] == '#') << line;
  EXPECT_TRUE(Has(text, "# model = \"" + models_ + "/MODEL.gguf\"")) << text;
  // It declares nothing to serve, and says so.
  out = Spillway("serve --check --config " + cfg, &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_TRUE(Has(out, "no [[service]] is declared")) << out;
}

// Ollama's store: its models by their blob (a service user need not share
// the store's owner's home), named in a comment.
TEST_F(InitTest, UsesOllamasStoreByBlobPath) {
  OllamaStoreLayout store("init");
  store.Add("registry.ollama.ai/library/tiny-chat", "latest", ModelPath("tiny-chat"));
  const std::string cfg = dir_ + "/ollama.toml";
  int rc = -1;
  std::string out = Spillway("init --models " + models_ + " --ollama --ollama-dir " + store.root().string() +
                                 " --devices cpu -o " + cfg, &rc);
  ASSERT_EQ(rc, 0) << out;
  const std::string text = ReadTextFile(cfg);
  EXPECT_TRUE(Has(text, "model = \"" + store.root().string() + "/blobs/sha256-")) << text;
  EXPECT_TRUE(Has(text, ", ollama:tiny-chat:latest\n")) << text;
  out = Spillway("serve --check --config " + cfg, &rc);
  EXPECT_EQ(rc, 0) << out;
}

TEST_F(InitTest, WrongInputsAreClearErrors) {
  AddModels();
  ScopedSimDir sim("init-bad");
  const std::string ok = " --models " + models_ + " -o " + dir_ + "/x.toml";
  struct Case {
    std::string args, says;
  } cases[] = {
      {"init --models " + models_ + " --devices gpu:0 -o " + dir_ + "/x.toml", "'gpu:0' is not cpu, cuda:N or sim:N"},
      {"init --models " + models_ + " --devices sim:7 -o " + dir_ + "/x.toml", "--devices sim:7: no simulated device"},
      {"init --models " + dir_ + "/nowhere -o " + dir_ + "/x.toml", "--models " + dir_ + "/nowhere: no such file or folder"},
      {"init --models " + models_ + " --devices cpu -o " + dir_ + "/no/such/dir/x.toml", "/no/such/dir (create it first)"},
      {"init --models " + models_ + " --devices cpu -o " + models_, models_ + " exists; --force replaces it"},
      {"init --models " + models_ + " --devices cpu --force -o " + models_, models_ + " is a folder"},
      {"init --bogus" + ok, "--bogus"},
  };
  for (const auto& c : cases) {
    int rc = -1;
    const std::string out = Spillway(c.args, &rc);
    EXPECT_EQ(rc, 2) << c.args << "\n" << out;
    EXPECT_TRUE(Has(out, c.says)) << c.args << "\n" << out;
    EXPECT_FALSE(fs::exists(dir_ + "/x.toml")) << c.args;
  }
  // - writes to stdout.
  int rc = -1;
  const std::string out = RunCommand(BinDir() + "/spillway init --models " + models_ + " --devices cpu -o -", &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_TRUE(Has(out, "name = \"chat\"")) << out;
}

// A folder with an accent in its name (models are often kept under a home
// folder named after a person): the config init writes loads and checks.
TEST_F(InitTest, AFolderWithAccentsGivesAConfigServeChecks) {
  const std::string accented = dir_ + "/mod\xC3\xA8les de Jos\xC3\xA9";
  fs::create_directories(accented);
  fs::copy_file(ModelPath("tiny-chat"), accented + "/tiny-chat.gguf");
  const std::string cfg = dir_ + "/accents.toml";
  int rc = -1;
  std::string out = Spillway("init --models '" + accented + "' --devices cpu -o " + cfg, &rc);
  ASSERT_EQ(rc, 0) << out;
  out = Spillway("serve --check --config " + cfg, &rc);
  EXPECT_EQ(rc, 0) << out;
}

// Names from a folder are not to be trusted: a GGUF whose key carries a
// newline (quoted by the reader's error) wrote a TOML line of its own into
// the config; a file name that is not UTF-8 made init fail for every model.
TEST_F(InitTest, AHostileFileOrNameNeitherWritesTheConfigNorStopsInit) {
  AddModels();
  {
    std::ofstream f(models_ + "/evil.gguf", std::ios::binary);
    const std::string key = "x\nallowed_hosts = [\"evil.example\"]\n#";
    auto u32 = [&](uint32_t v) { f.write(reinterpret_cast<const char*>(&v), 4); };
    auto u64 = [&](uint64_t v) { f.write(reinterpret_cast<const char*>(&v), 8); };
    f << "GGUF";
    u32(3);
    u64(0);  // tensors
    u64(1);  // keys
    u64(key.size());
    f << key;
    u32(99);  // no such value type: the reader's error quotes the key
  }
  fs::copy_file(ModelPath("tiny-chat"), models_ + "/mod\xE8le.gguf");  // Latin-1
  const std::string cfg = dir_ + "/hostile.toml";
  int rc = -1;
  std::string out = Spillway("init --models " + models_ + " --devices cpu -o " + cfg, &rc);
  ASSERT_EQ(rc, 0) << out;
  const std::string text = ReadTextFile(cfg);
  EXPECT_FALSE(Has(text, "\nallowed_hosts")) << text;
  EXPECT_TRUE(Has(text, "#   skipped " + models_ + "/evil.gguf")) << text;
  EXPECT_TRUE(Has(text, "its path is not UTF-8")) << text;
  EXPECT_TRUE(Has(text, "model = \"" + models_ + "/tiny-chat.gguf\"")) << text;
  out = Spillway("serve --check --config " + cfg, &rc);
  EXPECT_EQ(rc, 0) << out;
}

// What a worker would refuse or abort on, and a device an external server
// is accounted on that does not exist, are found by --check, not at start.
TEST_F(InitTest, ServeCheckFindsShapesAndDevicesThatCannotWork) {
  ScopedSimDir sim("check-shapes");
  const std::string cfg = dir_ + "/shapes.toml";
  std::ofstream(cfg) << "[[service]]\nname = \"embed\"\nmodel = \"" << ModelPath("tiny-embed") << "\"\n"
                     << "[[service.placement]]\ndevice = \"cpu\"\nctx = 1000\nslots = 3\n"
                     << "[[service]]\nname = \"ext\"\nkind = \"external\"\nurl = \"http://127.0.0.1:9\"\n"
                     << "device = \"sim:7\"\nresident_mib = 100\n";
  int rc = -1;
  const std::string out = Spillway("serve --check --config " + cfg, &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_TRUE(Has(out, "an embedding model needs ctx (1000) to be a multiple of slots (3)")) << out;
  EXPECT_TRUE(Has(out, "service 'ext' (external)")) << out;
  EXPECT_TRUE(Has(out, "no simulated device sim:7")) << out;
}

}  // namespace
}  // namespace spillway::testing
