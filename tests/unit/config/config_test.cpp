#include "config/config.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <random>

#include <sys/stat.h>
#include <unistd.h>

namespace spillway::config {
namespace {

TEST(ConfigTest, ParsesAFullConfig) {
  auto c = ParseConfig(R"(
listen = "127.0.0.1:9000"
state_dir = "/tmp/sw"
api_keys = ["k1"]
max_queue = 10
[journal]
synchronous = "normal"
idempotency_hours = 2
[[service]]
name = "chat"
model = "/m/chat.gguf"
max_tokens = 1000
[[service.placement]]
device = "sim:0"
gpu_layers = 99
ctx = 8192
[[service.placement]]
device = "cpu"
prefix_reuse = false
)", "test.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->listen_port, 9000);
  EXPECT_TRUE(c->services[0].placements[0].prefix_reuse);  // (the default)
  EXPECT_FALSE(c->services[0].placements[1].prefix_reuse);
  EXPECT_EQ(c->api_keys.size(), 1u);
  EXPECT_FALSE(c->journal.synchronous_full);
  ASSERT_EQ(c->services.size(), 1u);
  ASSERT_EQ(c->services[0].placements.size(), 2u);
  EXPECT_EQ(c->services[0].placements[0].device, "sim:0");
  EXPECT_EQ(c->services[0].placements[0].Name(), "sim:0/99");
  EXPECT_EQ(c->services[0].placements[1].Name(), "cpu");
}

// What one request may hold (Ollama's context_length, the dashboard's limits):
// its slot's share of the pool, or the whole pool when the slots share it.
TEST(ConfigTest, AUnifiedPoolGivesOneRequestTheWholeContext) {
  PlacementConfig p;
  p.ctx = 8192;
  p.slots = 4;
  EXPECT_EQ(p.ContextPerRequest(), 2048);
  p.kv_unified = true;
  EXPECT_EQ(p.ContextPerRequest(), 8192);
}

struct Bad {
  const char* text;
  const char* fragment;
};

// A [[device]] that nothing is on is valid, and probably a typo elsewhere: said, not refused.
TEST(ConfigTest, ADeviceNothingIsOnIsAWarning) {
  const std::string svc = "[[service]]\nname = \"a\"\nmodel = \"m\"\n[[service.placement]]\ndevice = \"sim:1\"\n";
  auto used = ParseConfig("[[device]]\nname = \"sim:1\"\n" + svc, "t.toml");
  ASSERT_TRUE(used.ok()) << used.status().message();
  EXPECT_TRUE(used->Warnings().empty());
  auto unused = ParseConfig("[[device]]\nname = \"sim:0\"\nheadroom_mib = 512\n" + svc, "t.toml");
  ASSERT_TRUE(unused.ok()) << unused.status().message();
  ASSERT_EQ(unused->Warnings().size(), 1u);
  EXPECT_NE(unused->Warnings()[0].find("'sim:0' is the device of no placement"), std::string::npos) << unused->Warnings()[0];
}

TEST(ConfigTest, ErrorsNameFileLineAndKey) {
  const Bad cases[] = {
      {"listen = \"nope\"", "test.toml:1: 'listen'"},
      {"\n\nmax_queue = \"ten\"", "test.toml:3: 'max_queue' must be a number"},
      {"max_queue = 0", "'max_queue' must be between"},
      // Past 2^53 (no exact double): a range error, not an empty optional read.
      {"max_queue = 9223372036854775807", "'max_queue' must be between"},
      {"[[service]]\nname=\"a\"\nmodel=\"m\"\n[[service.placement]]\nslots = 9007199254740993",
       "'service[0].placement[0].slots' must be between"},
      {"allowed_hosts = [\"myhost:8480\"]", "'allowed_hosts' names hosts without a port"},
      {"allowed_hosts = [\"[::1]:8480\"]", "'allowed_hosts' names hosts without a port"},
      {"listne = \"x\"", "'listne' is not a known key"},
      {"[journal]\nsynchronous = \"sometimes\"", "test.toml:2: 'journal.synchronous'"},
      {"[[service]]\nname = \"a\"", "'service[0].model' is required"},
      {"[[service]]\nname=\"a\"\nmodel=\"m\"\n[[service.placement]]\ndevice = \"tpu:0\"", "test.toml:5: 'service[0].placement[0].device'"},
      {"[[service]]\nname=\"a\"\nmodel=\"m\"\n[[service.placement]]\nslots = 0", "'service[0].placement[0].slots' must be between"},
      {"[[service]]\nname=\"a\"\nmodel=\"m\"\nslot = 3", "test.toml:4: 'service[0].slot' is not a known key"},
      {"this is not toml", "test.toml:1:"},
      // Its bounds as written in a config (4194304, not 4.1943e+06).
      {"[[service]]\nname=\"a\"\nmodel=\"m\"\n[[service.placement]]\nctx = 5", "must be between 16 and 4194304"},
  };
  for (const auto& c : cases) {
    auto r = ParseConfig(c.text, "test.toml");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_NE(r.status().message().find(c.fragment), std::string::npos) << c.text << " -> " << r.status().message();
  }
}

TEST(ConfigTest, ValidateChecksFilesNamesAndRemoteBinds) {
  const std::string model = (std::filesystem::temp_directory_path() / "sw-config-model.gguf").string();
  { std::FILE* f = std::fopen(model.c_str(), "w"); std::fputs("x", f); std::fclose(f); }
  GatewayConfig c;
  ServiceConfig s;
  s.name = "chat";
  s.model = model;
  s.placements = {PlacementConfig{}};
  c.services = {s};
  EXPECT_TRUE(Validate(c).ok());
  c.services.push_back(s);
  EXPECT_NE(Validate(c).message().find("declared twice"), std::string::npos);
  c.services.pop_back();
  c.services[0].model = "/nonexistent.gguf";
  EXPECT_NE(Validate(c).message().find("not found"), std::string::npos);
  c.services[0].model = model;
  c.services[0].name = "bad name";
  EXPECT_FALSE(Validate(c).ok());
  c.services[0].name = "chat";
  c.listen_host = "0.0.0.0";
  EXPECT_NE(Validate(c).message().find("api_keys"), std::string::npos);
  c.api_keys = {"k"};
  EXPECT_TRUE(Validate(c).ok());
  c.api_keys.clear();
  c.allow_unauthenticated_remote = true;
  EXPECT_TRUE(Validate(c).ok());
  c.services.clear();
  EXPECT_FALSE(Validate(c).ok());
  std::filesystem::remove(model);
}

// toml++ 3.3 has undefined behaviour on some non-ASCII characters (found by
// the config fuzz target): they are refused before it runs; escapes work.
TEST(ConfigTest, CharactersTheTomlParserCannotReadSafelyAreRefused) {
  auto bad = ParseConfig("listen = \"127.0.0.1:1\"\n\xEF\xBB\xB7te = 4\n", "x.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("x.toml:2: character U+FEF7 cannot be read safely"), std::string::npos)
      << bad.status().message();
  // In a basic string it is escaped before the parser sees it: the same value.
  auto accented = ParseConfig("state_dir = \"/tmp/caf\xC3\xA9\"\n", "x.toml");  // U+00E9
  ASSERT_TRUE(accented.ok()) << accented.status().message();
  EXPECT_EQ(accented->state_dir, "/tmp/caf\xC3\xA9");
  auto ok = ParseConfig("\xEF\xBB\xBF# \xE4\xB8\xAD\nstate_dir = \"/tmp/caf\\u00e9-\xE4\xB8\xAD\"\n", "x.toml");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->state_dir, "/tmp/caf\xC3\xA9-\xE4\xB8\xAD");
  // New keys of issue 7.
  auto keys = ParseConfig("operator_keys = [\"op\"]\nmax_requests_per_key = 3\nmax_connections = 100\n"
                          "max_body_memory_bytes = 4096\njson_max_depth = 32\n", "k.toml");
  ASSERT_TRUE(keys.ok()) << keys.status().message();
  EXPECT_EQ(keys->operator_keys, std::vector<std::string>{"op"});
  EXPECT_EQ(keys->max_requests_per_key, 3);
  EXPECT_EQ(keys->max_connections, 100);
  EXPECT_EQ(keys->max_body_memory_bytes, 4096u);
  EXPECT_EQ(keys->json_max_depth, 32);
  EXPECT_FALSE(ParseConfig("json_max_depth = 1\n", "k.toml").ok());
  EXPECT_EQ(ParseConfig("", "k.toml")->io_threads, 2);
  EXPECT_EQ(ParseConfig("io_threads = 1\n", "k.toml")->io_threads, 1);
  for (const char* bad : {"io_threads = 0\n", "io_threads = 65\n", "io_threads = \"two\"\n"}) {
    auto r = ParseConfig(bad, "k.toml");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("io_threads"), std::string::npos) << r.status().message();
  }
}

// What a user writes with accents (a path, a note) reads as written: in
// comments and "basic strings" the characters toml++ cannot take are never
// shown to it; where nothing can stand for them, and for bytes that are not
// UTF-8, the error says what to do.
TEST(ConfigTest, AccentedTextReadsAsWritten) {
  const std::string text =
      "# mod\xC3\xA8les de Jos\xC3\xA9 \"quoted # still a comment\n"
      "state_dir = \"/srv/jos\xC3\xA9/\\\"x\\\" # not a comment \xC3\xA9\" # caf\xC3\xA9\n"
      "model_dirs = [\"\"\"\n/a/\xC3\xA9\"\"\"\"\", 'plain', \"\"\"b\"\"\"]  # \xC3\xBC\n";
  auto c = ParseConfig(text, "a.toml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->state_dir, "/srv/jos\xC3\xA9/\"x\" # not a comment \xC3\xA9");
  EXPECT_EQ(c->model_dirs, (std::vector<std::string>{"/a/\xC3\xA9\"\"", "plain", "b"}));
  auto literal = ParseConfig("\nstate_dir = '/srv/jos\xC3\xA9'\n", "a.toml");
  ASSERT_FALSE(literal.ok());
  EXPECT_NE(literal.status().message().find("a.toml:2: character U+00E9"), std::string::npos) << literal.status().message();
  EXPECT_NE(literal.status().message().find("\\u00E9"), std::string::npos) << literal.status().message();
  auto latin1 = ParseConfig("# \xC4pfel\n", "a.toml");  // "Äpfel" saved as Latin-1
  ASSERT_FALSE(latin1.ok());
  EXPECT_NE(latin1.status().message().find("a.toml:1: byte 0xC4 is not UTF-8"), std::string::npos)
      << latin1.status().message();
  EXPECT_FALSE(ParseConfig("# \xED\xA0\x80\n", "a.toml").ok());  // a surrogate
  EXPECT_FALSE(ParseConfig("# \xC0\xAF\n", "a.toml").ok());      // overlong
}

// Whatever the text, what reaches toml++ holds none of the characters it
// cannot read safely: random texts of quotes, escapes, comments and such
// characters, in every arrangement the lexer must follow.
TEST(ConfigTest, NoUnsafeCharacterEverReachesTheParser) {
  const std::vector<std::string> pieces = {"\"", "'", "#", "\\", "\n", "a", " = ", "[", "]", "\xC3\xA9", "\xE4\xB8\xAD",
                                           "\xEF\xBB\xB7", "\"\"\"", "'''", "\r\n", "\xC3"};
  std::mt19937 rng(7);
  int passed = 0;
  for (int round = 0; round < 20000; ++round) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 24);
    for (int i = 0; i < n; ++i) text += pieces[rng() % pieces.size()];
    auto safe = TomlSafeText(text, "r.toml");
    if (!safe.ok()) continue;
    ++passed;
    // U+00E9 (C3 A9) and U+FEF7 (EF BB B7) are unsafe; U+4E2D (E4 B8 AD) is not.
    ASSERT_EQ(safe->find("\xC3\xA9"), std::string::npos) << text;
    ASSERT_EQ(safe->find("\xEF\xBB\xB7"), std::string::npos) << text;
    (void)ParseConfig(text, "r.toml");  // and the parser takes it (the fuzz target runs it under the sanitizers)
  }
  EXPECT_GT(passed, 1000);
}

TEST(ConfigTest, ValuesThatCannotWorkAreRefusedWithTheirKey) {
  const std::string svc = "[[service]]\nname=\"a\"\nmodel=\"m\"\n";
  struct Case {
    std::string text;
    const char* fragment;
  };
  const Case cases[] = {
      {"[[device]]\nname = \"sim:0\"\nheadroom_pct = nan\n", "'device[0].headroom_pct' must be between"},
      {"[[device]]\nname = \"sim0\"\n", "test.toml:2: 'device[0].name' 'sim0' must be cpu, cuda:N or sim:N"},
      {"[[device]]\nname = \"sim:00\"\n", "'sim:00' must be cpu, cuda:N or sim:N (N without leading zeros"},
      {(svc + "[[service.placement]]\ndevice = \"cpu:0\"\n"), "'cpu:0' must be cpu, cuda:N or sim:N"},
      {(svc + "[service.cpu_path]\nconcurrency = 8\n[[service.placement]]\ndevice = \"sim:0\"\n[[service.placement]]\n"
              "device = \"cpu\"\nslots = 4\n"),
       "test.toml:5: 'service[0].cpu_path.concurrency' (8) exceeds the slots (4) of its CPU placement 1"},
      {"[[device]]\nname = \"sim:0\"\n[[device]]\nname = \"sim:0\"\n", "'device[1].name' 'sim:0' has a [[device]] table"},
      {"api_keys = [\"k\", \"\"]\n", "test.toml:1: 'api_keys' holds an empty key"},
      {"operator_keys = [\"\"]\n", "'operator_keys' holds an empty key"},
      {"[journal]\nretention_hours = 1\n", "'journal.retention_hours' (1) is shorter than journal.idempotency_hours (24)"},
      {"[journal]\nretention_hours = 48\nidempotency_hours = 72\n", "is shorter than journal.idempotency_hours (72)"},
      {(svc + "[[service.placement]]\nctx = 16\nslots = 17\n"), "'service[0].placement[0].slots' (17) exceeds ctx (16)"},
      {(svc + "[[service.placement]]\nbatch = 2\nslots = 4\n"), "test.toml:5: 'service[0].placement[0].batch' (2) is below slots (4)"},
      {(svc + "[[service.placement]]\nprogress_timeout_s = nan\n"), "progress_timeout_s' must be between"},
      {(svc + "[[service.placement]]\nprefix_reuse = \"yes\"\n"), "'service[0].placement[0].prefix_reuse'"},
      {(svc + "residency = \"on_demand\"\npriority = \"batch\"\nwindows = [\"02:00-02:00\"]\n"),
       "'02:00-02:00' must be \"HH:MM-HH:MM\""},
      {(svc + "residency = \"on_demand\"\npriority = \"batch\"\nwindows = [\"00:00-24:30\"]\n"),
       "'00:00-24:30' must be"},
      {(svc + "fair_turn_s = -1\n"), "'service[0].fair_turn_s' must be between 0 and 86400"},
      {(svc + "fair_turn_s = \"long\"\n"), "'service[0].fair_turn_s'"},
      {(svc + "fair_turn_s = 0.0001\n"), "'service[0].fair_turn_s' must be 0 (no turns) or at least 1 second"},
  };
  for (const auto& c : cases) {
    auto r = ParseConfig(c.text, "test.toml");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_NE(r.status().message().find(c.fragment), std::string::npos) << c.text << " -> " << r.status().message();
  }
  auto fine = ParseConfig(svc + "max_tokens = 128\nresidency = \"on_demand\"\npriority = \"batch\"\n"
                                "windows = [\"22:00-24:00\", \"23:00-01:00\", \"00:00-24:00\"]\n[journal]\nretention_hours = 24\n",
                          "test.toml");
  ASSERT_TRUE(fine.ok()) << fine.status().message();
  // An unset default_max_tokens (256) follows a lower cap instead of failing on a key nobody wrote.
  EXPECT_EQ(fine->services[0].default_max_tokens, 128);
  EXPECT_EQ(fine->services[0].residency.FairTurnMs(), 30000);
  auto turns = ParseConfig(svc + "fair_turn_s = 120\n", "test.toml");
  ASSERT_TRUE(turns.ok()) << turns.status().message();
  EXPECT_EQ(turns->services[0].residency.FairTurnMs(), 120000);
  auto capped = ParseConfig(svc + "max_tokens = 128\ndefault_max_tokens = 200\n", "test.toml");
  ASSERT_TRUE(capped.ok());
  const std::string model = (std::filesystem::temp_directory_path() / "sw-config-capped.gguf").string();
  { std::FILE* f = std::fopen(model.c_str(), "w"); std::fputs("x", f); std::fclose(f); }
  capped->services[0].model = model;
  EXPECT_NE(Validate(*capped).message().find("default_max_tokens (200) exceeds max_tokens (128)"), std::string::npos)
      << Validate(*capped).message();
  std::filesystem::remove(model);
  auto dir = LoadConfigFile(std::filesystem::temp_directory_path().string());
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find("is a directory"), std::string::npos) << dir.status().message();
}

// What is not a config file is refused at once by what it is: a FIFO's
// open waited for a writer forever; /dev/zero, or a model file given by
// mistake, was read whole (twice over) before any error.
TEST(ConfigTest, AFileThatIsNoConfigIsRefusedWithoutReadingIt) {
  const auto dir = std::filesystem::temp_directory_path() / ("sw-config-files-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string fifo = (dir / "fifo.toml").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string big = (dir / "model.gguf").string();
  { std::FILE* f = std::fopen(big.c_str(), "w"); std::fclose(f); }
  std::filesystem::resize_file(big, 5u << 20);  // sparse
  const std::pair<std::string, const char*> cases[] = {
      {fifo, "is not a regular file"},
      {"/dev/zero", "is not a regular file"},
      {big, "more than a config's 4 MiB"},
      {(dir / "absent.toml").string(), "cannot read config file"},
  };
  for (const auto& [path, fragment] : cases) {
    auto r = LoadConfigFile(path);
    ASSERT_FALSE(r.ok()) << path;
    EXPECT_NE(r.status().message().find(fragment), std::string::npos) << path << " -> " << r.status().message();
  }
  std::filesystem::remove_all(dir);
}

// A relative model path is the working directory's, held absolute: a
// gateway restarted from another directory read the same string as the same
// file (and adopted a worker serving the other one).
TEST(ConfigTest, RelativeModelPathsAreHeldAbsolute) {
  const auto file = std::filesystem::temp_directory_path() / ("sw-config-rel-" + std::to_string(::getpid()) + ".toml");
  { std::FILE* f = std::fopen(file.c_str(), "w");
    std::fputs("[[service]]\nname = \"a\"\nmodel = \"models/../x.gguf\"\n[[service.placement]]\nmodel = \"y.gguf\"\n"
               "[[service.placement]]\ndevice = \"cpu\"\nmodel = \"/abs/z.gguf\"\n", f);
    std::fclose(f); }
  auto cfg = LoadConfigFile(file.string());
  std::filesystem::remove(file);
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  const auto cwd = std::filesystem::current_path();
  EXPECT_EQ(cfg->services[0].model, (cwd / "x.gguf").string());
  EXPECT_EQ(cfg->services[0].placements[0].model, (cwd / "y.gguf").string());
  EXPECT_EQ(cfg->services[0].placements[1].model, "/abs/z.gguf");
}

TEST(ConfigTest, HostPort) {
  std::string h;
  uint16_t p = 0;
  EXPECT_TRUE(SplitHostPort("127.0.0.1:80", &h, &p));
  EXPECT_EQ(p, 80);
  EXPECT_TRUE(SplitHostPort("[::1]:8080", &h, &p));
  EXPECT_EQ(h, "::1");
  EXPECT_FALSE(SplitHostPort("host", &h, &p));
  EXPECT_FALSE(SplitHostPort("h:99999", &h, &p));
  EXPECT_FALSE(SplitHostPort("h:-1", &h, &p));
  EXPECT_FALSE(SplitHostPort(":80", &h, &p));
  // What the servers bind and dial: numeric addresses.
  EXPECT_TRUE(SplitHostPort("localhost:8480", &h, &p));
  EXPECT_EQ(h, "127.0.0.1");
}

}  // namespace
}  // namespace spillway::config

namespace spillway::config {
namespace {

TEST(ConfigTest, ExternalServices) {
  auto c = ParseConfig(R"(
[[service]]
name = "whisper"
kind = "external"
command = "whisper-server --port ${PORT} -m '${MODEL}' --host \"127.0.0.1\""
model = "/models/w.bin"
routes = { "/v1/audio/transcriptions" = "/inference" }
device = "sim:0"
resident_mib = 600
transient_mib = 200
residency = "on_demand"
keep_alive_s = 30
idempotent = true
concurrency = 2
max_queue = 8
stop_signal = "SIGINT"

[[service]]
name = "rerank"
kind = "external"
url = "http://localhost:9000/"
)", "t.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->externals.size(), 2u);
  EXPECT_TRUE(c->services.empty());
  const auto& w = c->externals[0];
  EXPECT_EQ(w.command, (std::vector<std::string>{"whisper-server", "--port", "${PORT}", "-m", "${MODEL}", "--host", "127.0.0.1"}));
  EXPECT_EQ(w.UpstreamPath("/v1/audio/transcriptions"), "/inference");
  EXPECT_EQ(w.UpstreamPath("/v1/chat/completions"), "") << "only the routes it declares";
  EXPECT_EQ(w.residency.mode, "on_demand");
  EXPECT_TRUE(w.Started());
  EXPECT_EQ(SignalNumber(w.stop_signal), 2);
  const auto& r = c->externals[1];
  EXPECT_EQ(r.UrlPort(), 9000);
  EXPECT_FALSE(r.Started());
  EXPECT_EQ(r.UpstreamPath("/v1/embeddings"), "/v1/embeddings") << "an OpenAI-compatible server by default";
  EXPECT_EQ(c->FindExternal("rerank"), &c->externals[1]);
  EXPECT_EQ(c->FindService("rerank"), nullptr);

  const char* ext = "[[service]]\nname = \"x\"\nkind = \"external\"\n";
  const std::pair<std::string, const char*> bad[] = {
      {std::string(ext), "needs either command"},
      {std::string(ext) + "url = \"http://127.0.0.1:1\"\ncommand = \"a ${PORT}\"", "not both"},
      {std::string(ext) + "url = \"http://example.com:80\"", "loopback"},
      {std::string(ext) + "url = \"http://127.0.0.1:99999\"", "loopback"},
      {std::string(ext) + "command = \"server --port 8080\"", "${PORT}"},
      {std::string(ext) + "command = \"server 'unclosed ${PORT}\"", "unclosed"},
      {std::string(ext) + "command = \"s ${PORT}\"\nroutes = { \"/v1/files\" = \"/f\" }", "not a route Spillway proxies"},
      {std::string(ext) + "command = \"s ${PORT}\"\nroutes = { \"/v1/rerank\" = \"rerank\" }", "upstream path"},
      {std::string(ext) + "command = \"s ${PORT}\"\nroutes = { \"/v1/rerank\" = \"/v1/x y\" }", "without spaces"},
      {std::string(ext) + "command = \"s ${PORT}\"\nroutes = { \"/v1/rerank\" = \"/x\\r\\nHost: evil\" }", "without spaces"},
      {std::string(ext) + "command = \"s ${PORT}\"\nresidency = \"sometimes\"", "'service[0].residency'"},
      {std::string(ext) + "url = \"http://127.0.0.1:1\"\nresidency = \"on_demand\"", "residency applies"},
      {std::string(ext) + "command = \"s ${PORT}\"\nstop_signal = \"SIGSTOP\"", "stop_signal"},
      {std::string(ext) + "command = \"s ${PORT}\"\nplacement = 3", "'service[0].placement' is not a known key"},
      {"[[service]]\nname = \"x\"\nkind = \"magic\"", "'service[0].kind'"},
  };
  for (const auto& [text, fragment] : bad) {
    auto b = ParseConfig(text, "t.toml");
    ASSERT_FALSE(b.ok()) << text;
    EXPECT_NE(b.status().message().find(fragment), std::string::npos) << text << " -> " << b.status().message();
  }
  // Names are one namespace; ${MODEL} needs a model that exists.
  auto dup = ParseConfig(std::string(ext) + "url = \"http://127.0.0.1:1\"\n" + ext + "url = \"http://127.0.0.1:2\"", "t.toml");
  ASSERT_TRUE(dup.ok());
  EXPECT_NE(Validate(*dup).message().find("declared twice"), std::string::npos);
  auto no_model = ParseConfig(std::string(ext) + "command = \"s ${PORT} ${MODEL}\"\nmodel = \"/nope.bin\"", "t.toml");
  ASSERT_TRUE(no_model.ok());
  EXPECT_NE(Validate(*no_model).message().find("/nope.bin not found"), std::string::npos);
}

}  // namespace
}  // namespace spillway::config
