// `make install`'s tree on its own: `cmake --install` of this build into a
// scratch prefix, then the installed binaries run without the build tree or
// the llama.cpp cache (RUNPATHs, the libraries a worker maps), the installed
// gateway serves a request through the installed worker and speaks systemd's
// notification protocol, the unit passes `systemd-analyze verify`, DESTDIR
// stages without leaking into the unit, and bad prefixes are refused.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "gateway_calls.h"
#include "gateway_process.h"
#include "notify_listener.h"
#include "worker_process.h"

namespace spillway::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

bool Has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// `cmake --install` of this build (SPILLWAY_BUILD_DIR) with `env` before it.
std::string Install(const std::string& env, const std::string& prefix, int* rc) {
  return RunCommand(env + " '" + Env("CMAKE_COMMAND") + "' --install '" + Env("SPILLWAY_BUILD_DIR") + "' --prefix '" +
                        prefix + "' 2>&1",
                    rc);
}

// Every ELF file under `dir` (not links).
std::vector<std::string> ElfFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_symlink() || !e.is_regular_file()) continue;
    std::ifstream f(e.path(), std::ios::binary);
    char magic[4] = {};
    f.read(magic, 4);
    if (std::string(magic, 4) == "\x7f" "ELF") out.push_back(e.path().string());
  }
  return out;
}

// RUNPATH / RPATH entries of an ELF file, as readelf prints them.
std::vector<std::string> Runpaths(const std::string& file) {
  int rc = -1;
  const std::string out = RunCommand("readelf -d '" + file + "'", &rc);
  std::vector<std::string> paths;
  const std::regex re(R"(\((RUNPATH|RPATH)\)\s+Library r(un)?path: \[([^\]]*)\])");
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) paths.push_back((*it)[3]);
  return paths;
}

class InstallTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string(MakeScratchDir());
    prefix_ = new std::string(*root_ + "/prefix");
    install_log_ = new std::string(Install("", *prefix_, &install_rc_));
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*root_, ec);
    delete root_;
    delete prefix_;
    delete install_log_;
  }
  void SetUp() override { ASSERT_EQ(install_rc_, 0) << *install_log_; }

  static std::string* root_;
  static std::string* prefix_;
  static std::string* install_log_;
  static int install_rc_;
};
std::string* InstallTest::root_ = nullptr;
std::string* InstallTest::prefix_ = nullptr;
std::string* InstallTest::install_log_ = nullptr;
int InstallTest::install_rc_ = -1;

TEST_F(InstallTest, LaysOutTheTree) {
  const std::string& p = *prefix_;
  for (const std::string f :
       {"bin/spillway", "lib/spillway/spillway-worker", "lib/spillway/spillway-tie", "lib/spillway/libllama.so.0", "lib/spillway/libggml-base.so.0",
        "lib/spillway/libllama-common.so.0", "lib/spillway/libggml-cpu.so", "lib/spillway/libggml-sim.so",
        "lib/systemd/system/spillway.service", "lib/sysusers.d/spillway.conf", "share/spillway/models/demo-chat.gguf",
        "share/spillway/models/demo-embed.gguf", "share/spillway/spillway.example.toml", "share/doc/spillway/README.md"}) {
    EXPECT_TRUE(fs::exists(p + "/" + f)) << f << "\n" << *install_log_;
  }
  EXPECT_FALSE(fs::exists(p + "/bin/spillway-worker"));  // the worker lives with its libraries and modules
  EXPECT_FALSE(fs::exists(p + "/lib/spillway/libllama-server-impl.so"));  // llama-server's, not ours
  EXPECT_EQ(::access((p + "/bin/spillway").c_str(), X_OK), 0);
  EXPECT_EQ(::access((p + "/lib/spillway/spillway-worker").c_str(), X_OK), 0);
}

// Nothing installed names the build tree or the llama.cpp cache: every
// RUNPATH is $ORIGIN-relative, and the loader finds llama.cpp in the prefix.
TEST_F(InstallTest, NeedsNeitherTheBuildTreeNorTheLlamaCache) {
  const std::string build = fs::canonical(Env("SPILLWAY_BUILD_DIR")).string();
  const std::string llama = fs::path(Env("LLAMA_SRC")).parent_path().string();
  ASSERT_FALSE(build.empty());
  ASSERT_FALSE(llama.empty());
  std::vector<std::string> files = ElfFiles(*prefix_ + "/bin");
  for (const auto& f : ElfFiles(*prefix_ + "/lib/spillway")) files.push_back(f);
  ASSERT_GE(files.size(), 8u);
  for (const auto& f : files) {
    for (const auto& rp : Runpaths(f)) {
      EXPECT_FALSE(Has(rp, build)) << f << ": " << rp;
      EXPECT_FALSE(Has(rp, llama)) << f << ": " << rp;
      EXPECT_EQ(rp.rfind("$ORIGIN", 0), 0u) << f << ": " << rp;
    }
  }
  EXPECT_EQ(Runpaths(*prefix_ + "/bin/spillway"), std::vector<std::string>{"$ORIGIN/../lib/spillway"});
  EXPECT_EQ(Runpaths(*prefix_ + "/lib/spillway/spillway-worker"), std::vector<std::string>{"$ORIGIN"});
  for (const std::string bin : {"/bin/spillway", "/lib/spillway/spillway-worker"}) {
    int rc = -1;
    const std::string ldd = RunCommand("ldd '" + *prefix_ + bin + "'", &rc);
    EXPECT_EQ(rc, 0) << ldd;
    EXPECT_FALSE(Has(ldd, "not found")) << ldd;
    const std::regex re(R"((lib(llama|ggml)[^ ]*) => ([^ ]+))");
    int found = 0;
    for (std::sregex_iterator it(ldd.begin(), ldd.end(), re), end; it != end; ++it, ++found) {
      const std::string resolved = fs::path((*it)[3].str()).lexically_normal().string();
      EXPECT_EQ(resolved.rfind(*prefix_ + "/lib/spillway/", 0), 0u) << bin << ": " << (*it)[0];
    }
    EXPECT_GE(found, 1) << ldd;
  }
}

TEST_F(InstallTest, TheInstalledCliRuns) {
  int rc = -1;
  std::string out = RunCommand(*prefix_ + "/bin/spillway --version 2>&1", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(^spillway \d+\.\d+\.\d+)"))) << out;
  out = RunCommand(*prefix_ + "/bin/spillway --help 2>&1", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(Has(out, "init")) << out;
  // The built-in demo's models are found in share/spillway/models, the worker in lib/spillway.
  out = RunCommand(*prefix_ + "/bin/spillway serve --check 2>&1", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(Has(out, "the demo: ok (2 services")) << out;
}

// The installed gateway serves through the installed worker, which maps
// llama.cpp from the prefix; under a (stand-in) systemd it says READY=1 with
// its status once the workers are ready, pings the watchdog and says
// STOPPING=1 on SIGTERM.
TEST_F(InstallTest, TheInstalledGatewayServesAndNotifiesSystemd) {
  NotifyListener systemd;
  const std::string build_bin = BinDir();
  setenv("SPILLWAY_BIN", (*prefix_ + "/bin").c_str(), 1);
  setenv("NOTIFY_SOCKET", systemd.address().c_str(), 1);
  setenv("WATCHDOG_USEC", "400000", 1);
  GatewayProcess gw(TestConfig(1));
  const bool started = gw.Start();
  setenv("SPILLWAY_BIN", build_bin.c_str(), 1);
  unsetenv("NOTIFY_SOCKET");
  unsetenv("WATCHDOG_USEC");
  ASSERT_TRUE(started) << gw.Output();

  std::string seen;
  const auto ready = systemd.WaitFor("READY=1", milliseconds(30000), &seen);
  ASSERT_TRUE(ready) << seen << gw.Output();
  EXPECT_TRUE(Has(*ready, "STATUS=serving on 127.0.0.1:" + std::to_string(gw.port()) + "; 2 of 2 workers ready"))
      << *ready;
  EXPECT_TRUE(systemd.WaitFor("WATCHDOG=1", milliseconds(5000), &seen)) << seen;

  auto r = Call(gw.port(), "POST", "/v1/chat/completions", Chat(4));
  EXPECT_EQ(r.status, 200) << r.body;
  const auto status = Body(Call(gw.port(), "GET", "/v1/status"));
  const int pid = status["services"][0]["placements"][0]["pid"].get<int>();
  EXPECT_EQ(fs::read_symlink("/proc/" + std::to_string(pid) + "/exe").string(),
            *prefix_ + "/lib/spillway/spillway-worker");
  const std::string maps = ReadTextFile("/proc/" + std::to_string(pid) + "/maps");
  EXPECT_TRUE(Has(maps, *prefix_ + "/lib/spillway/libllama.so")) << maps;
  EXPECT_TRUE(Has(maps, *prefix_ + "/lib/spillway/libggml-cpu.so")) << maps;
  std::istringstream lines(maps);  // (the test's models are mapped from the build tree, rightly)
  for (std::string line; std::getline(lines, line);) {
    if (Has(line, ".so")) {
      EXPECT_FALSE(Has(line, Env("SPILLWAY_BUILD_DIR"))) << line;
    }
  }

  gw.Stop();
  EXPECT_TRUE(systemd.WaitFor("STOPPING=1", milliseconds(5000), &seen)) << seen << gw.Output();
}

// The unit as installed passes systemd's own checker with nothing to say,
// and the user file creates the user it runs as.
TEST_F(InstallTest, TheUnitVerifies) {
  const std::string unit = *prefix_ + "/lib/systemd/system/spillway.service";
  const std::string text = ReadTextFile(unit);
  EXPECT_TRUE(Has(text, "\nExecStart=" + *prefix_ + "/bin/spillway serve --config /etc/spillway/spillway.toml")) << text;
  EXPECT_FALSE(Has(text, "@PREFIX@")) << text;
  for (const std::string line : {"Type=notify", "NotifyAccess=main", "KillMode=process", "Restart=on-failure",
                                 "StateDirectory=spillway", "ProtectSystem=strict", "ProtectHome=read-only",
                                 "NoNewPrivileges=yes", "User=spillway", "WatchdogSec="}) {
    EXPECT_TRUE(Has(text, "\n" + line)) << line;
  }
  int rc = -1;
  if (RunCommand("command -v systemd-analyze", &rc).empty() || rc != 0) {
    GTEST_SKIP() << "systemd-analyze is not installed here: the unit is not verified";
  }
  const std::string out = RunCommand("systemd-analyze verify '" + unit + "' 2>&1", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, "") << "systemd-analyze verify said something about the unit";
  if (RunCommand("command -v systemd-sysusers", &rc).empty() || rc != 0) return;
  const std::string sysroot = *root_ + "/sysroot";
  fs::create_directories(sysroot + "/etc");
  const std::string users = RunCommand("systemd-sysusers --root='" + sysroot + "' '" + *prefix_ +
                                           "/lib/sysusers.d/spillway.conf' 2>&1", &rc);
  EXPECT_EQ(rc, 0) << users;
  EXPECT_TRUE(std::regex_search(ReadTextFile(sysroot + "/etc/passwd"), std::regex(R"((^|\n)spillway:x:\d+:\d+:[^:]*:/var/lib/spillway:)")))
      << ReadTextFile(sysroot + "/etc/passwd");
  EXPECT_TRUE(Has(ReadTextFile(sysroot + "/etc/group"), "\nrender:x:")) << ReadTextFile(sysroot + "/etc/group");
}

// DESTDIR stages the tree; what is installed names the prefix only.
TEST_F(InstallTest, DestdirStagesTheTree) {
  const std::string stage = *root_ + "/stage";
  int rc = -1;
  const std::string out = Install("DESTDIR='" + stage + "'", "/opt/spillway", &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_TRUE(fs::exists(stage + "/opt/spillway/bin/spillway"));
  const std::string unit = ReadTextFile(stage + "/opt/spillway/lib/systemd/system/spillway.service");
  EXPECT_TRUE(Has(unit, "\nExecStart=/opt/spillway/bin/spillway serve")) << unit;
  EXPECT_FALSE(Has(unit, stage)) << unit;
  for (const auto& f : ElfFiles(stage + "/opt/spillway/lib/spillway")) {
    for (const auto& rp : Runpaths(f)) EXPECT_EQ(rp, "$ORIGIN") << f;
  }
}

TEST_F(InstallTest, BadPrefixesAreRefused) {
  int rc = -1;
  const std::string spaced = *root_ + "/with space";
  std::string out = Install("", spaced, &rc);
  EXPECT_NE(rc, 0) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(holds a\s+space, quote, backslash)"))) << out;
  EXPECT_FALSE(fs::exists(spaced + "/bin/spillway"));
  // make install's own checks (scripts/install.sh), before cmake.
  const std::string script = Env("SPILLWAY_SOURCE_DIR") + "/scripts/install.sh";
  out = RunCommand("'" + script + "' '" + Env("SPILLWAY_BUILD_DIR") + "' relative/prefix '' 2>&1", &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_TRUE(Has(out, "make install: PREFIX must be an absolute path, not 'relative/prefix'")) << out;
  out = RunCommand("'" + script + "' '" + Env("SPILLWAY_BUILD_DIR") + "' '' '' 2>&1", &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_TRUE(Has(out, "PREFIX is empty")) << out;
  std::ofstream(*root_ + "/afile") << "x";
  out = RunCommand("'" + script + "' '" + Env("SPILLWAY_BUILD_DIR") + "' '" + *root_ + "/afile/prefix' '' 2>&1", &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_TRUE(Has(out, *root_ + "/afile is not a folder")) << out;
  out = RunCommand("'" + script + "' '" + *root_ + "/nobuild' /tmp/x '' 2>&1", &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_TRUE(Has(out, "no build in " + *root_ + "/nobuild")) << out;
}

}  // namespace
}  // namespace spillway::testing
