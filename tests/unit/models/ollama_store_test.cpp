// Ollama's store read-only (models/ollama_store.h), the GGUF summaries
// (models/model_info.h), `ollama:` names in a config, and `spillway models` /
// `spillway plan` on them, over a store laid out with the generated models.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "config/config.h"
#include "models/model_info.h"
#include "models/ollama_store.h"
#include "ollama_store_layout.h"

namespace spillway::models {
namespace {

using nlohmann::json;
using spillway::testing::OllamaStoreLayout;

std::string Models() {
  const char* m = std::getenv("SPILLWAY_MODELS");
  return m ? m : "build/models";
}
std::string Bin() {
  const char* b = std::getenv("SPILLWAY_BIN");
  return b ? b : "build/bin";
}

// Runs a command; returns its exit code and stdout.
std::pair<int, std::string> RunCommand(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while (p && (n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int rc = p ? pclose(p) : -1;
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, out};
}

TEST(OllamaNameTest, NamesTagsAndNamesThatCouldLeaveTheStore) {
  auto n = ParseOllamaName("ollama:llama3.2:3b");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->repository, "llama3.2");
  EXPECT_EQ(n->tag, "3b");
  EXPECT_EQ(ParseOllamaName("ollama:qwen3")->tag, "latest");
  EXPECT_EQ(ParseOllamaName("ollama:user/model:q4")->repository, "user/model");
  EXPECT_EQ(ManifestPath("/s", *ParseOllamaName("ollama:tiny")), "/s/manifests/registry.ollama.ai/library/tiny/latest");
  EXPECT_EQ(ManifestPath("/s", *ParseOllamaName("ollama:me/tiny:x")), "/s/manifests/registry.ollama.ai/me/tiny/x");
  EXPECT_EQ(ManifestPath("/s", *ParseOllamaName("ollama:hf.co/org/repo:Q4_K_M")),
            "/s/manifests/hf.co/org/repo/Q4_K_M");
  for (const char* bad : {"ollama:", "ollama:../../etc/passwd", "ollama:a/../b", "ollama:a b", "ollama:x:",
                          "ollama:a/b/c/d", "ollama:/abs", "ollama:x:..", "ollama:x:a/b"}) {
    EXPECT_FALSE(ParseOllamaName(bad).ok()) << bad;
  }
  EXPECT_EQ(OllamaStoreRoot("/custom", "/home/u"), "/custom");
  EXPECT_EQ(OllamaStoreRoot(nullptr, "/home/u"), "/home/u/.ollama/models");
  EXPECT_EQ(OllamaStoreRoot("", "/home/u"), "/home/u/.ollama/models");
}

TEST(OllamaStoreTest, ResolvesAndListsWhatTheStoreHolds) {
  OllamaStoreLayout store("resolve");
  store.Add("registry.ollama.ai/library/tiny", "latest", Models() + "/tiny-chat.gguf");
  store.Add("registry.ollama.ai/me/embedder", "v1", Models() + "/tiny-embed.gguf");
  store.Write("registry.ollama.ai/library/broken", "latest", "{not json");
  const std::string root = store.root().string();
  auto blob = ResolveOllamaModel(root, *ParseOllamaName("ollama:tiny"));
  ASSERT_TRUE(blob.ok()) << blob.status().ToString();
  EXPECT_EQ(std::filesystem::path(*blob).parent_path(), store.root() / "blobs");
  EXPECT_EQ(std::filesystem::file_size(*blob), std::filesystem::file_size(Models() + "/tiny-chat.gguf"));
  EXPECT_EQ(*ResolveModelPath("ollama:tiny:latest", root), *blob);
  EXPECT_EQ(*ResolveModelPath("/a/file.gguf", root), "/a/file.gguf") << "paths are not the store's";

  const auto entries = *ListOllamaStore(root);
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].name.Display(), "broken:latest");
  EXPECT_FALSE(entries[0].error.ok());
  EXPECT_EQ(entries[1].name.Display(), "me/embedder:v1");
  EXPECT_TRUE(entries[1].error.ok()) << entries[1].error.ToString();
  EXPECT_EQ(entries[2].name.Display(), "tiny:latest");
  EXPECT_EQ(entries[2].blob, *blob);
  EXPECT_TRUE(ListOllamaStore((store.root() / "nowhere").string())->empty());
  // A tag that is a symlink to another tag is listed by its own name (it
  // was listed as a second copy of its target's).
  std::filesystem::create_symlink("latest", store.root() / "manifests/registry.ollama.ai/library/tiny/newest");
  const auto linked = *ListOllamaStore(root);
  ASSERT_EQ(linked.size(), 4u);
  EXPECT_EQ(linked[2].name.Display(), "tiny:latest");
  EXPECT_EQ(linked[3].name.Display(), "tiny:newest");
  EXPECT_EQ(linked[3].blob, *blob);
}

TEST(OllamaStoreTest, MissingAndCorruptManifestsAreErrorsNamingTheFile) {
  OllamaStoreLayout store("broken");
  const std::string root = store.root().string();
  auto err = [&](const std::string& name) {
    auto r = ResolveOllamaModel(root, *ParseOllamaName(name));
    EXPECT_FALSE(r.ok()) << name;
    return r.ok() ? Status::Ok() : r.status();
  };
  Status st = err("ollama:absent");
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find(root + "/manifests/registry.ollama.ai/library/absent/latest"), std::string::npos)
      << st.message();

  const auto m1 = store.Write("registry.ollama.ai/library/garbage", "latest", "{\"layers\": [");
  st = err("ollama:garbage");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find(m1.string()), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("not valid JSON"), std::string::npos);

  const auto m2 = store.Write("registry.ollama.ai/library/nomodel", "latest",
                              R"({"layers":[{"mediaType":"application/vnd.ollama.image.template","digest":"sha256:00"}]})");
  st = err("ollama:nomodel");
  EXPECT_NE(st.message().find(m2.string()), std::string::npos);
  EXPECT_NE(st.message().find("application/vnd.ollama.image.model"), std::string::npos) << st.message();

  const auto m3 = store.Write("registry.ollama.ai/library/baddigest", "latest",
                              R"({"layers":[{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:../../x"}]})");
  st = err("ollama:baddigest");
  EXPECT_NE(st.message().find(m3.string()), std::string::npos);
  EXPECT_NE(st.message().find("64 hex"), std::string::npos) << st.message();

  const std::string hex(64, 'a');
  const auto m4 = store.Write("registry.ollama.ai/library/noblob", "latest",
                              R"({"layers":[{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:)" + hex + R"("}]})");
  st = err("ollama:noblob");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << "the store holds its manifest: not a model missing from it";
  EXPECT_NE(st.message().find("ollama pull noblob:latest"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(root + "/blobs/sha256-" + hex), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(m4.string()), std::string::npos);

  // An interrupted download: the blob is shorter than the manifest says.
  const auto m5 = store.Add("registry.ollama.ai/library/short", "latest", Models() + "/tiny-chat.gguf");
  auto blob = ResolveOllamaModel(root, *ParseOllamaName("ollama:short"));
  ASSERT_TRUE(blob.ok());
  std::filesystem::resize_file(*blob, 100);
  st = err("ollama:short");
  EXPECT_NE(st.message().find("is 100 bytes"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(m5.string()), std::string::npos);
}

TEST(ModelInfoTest, SummariesOfTheGeneratedModels) {
  auto chat = SummarizeFile(Models() + "/tiny-chat.gguf");
  ASSERT_TRUE(chat.ok()) << chat.status().ToString();
  EXPECT_EQ(chat->architecture, "llama");
  EXPECT_FALSE(chat->quantization.empty());
  EXPECT_GT(chat->context_length, 0u);
  EXPECT_GT(chat->parameters, 0u);
  EXPECT_EQ(chat->size, std::filesystem::file_size(Models() + "/tiny-chat.gguf"));
  EXPECT_EQ(chat->template_family, "chatml");
  EXPECT_FALSE(chat->embedding);
  auto embed = SummarizeFile(Models() + "/tiny-embed.gguf");
  ASSERT_TRUE(embed.ok());
  EXPECT_TRUE(embed->embedding);
  auto missing = SummarizeFile("/nonexistent/x.gguf");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/x.gguf"), std::string::npos);
}

TEST(ModelInfoTest, TheSummaryCacheReadsAFileAgainOnlyWhenItChanged) {
  OllamaStoreLayout scratch("cache");
  const auto file = scratch.root() / "m.gguf";
  std::filesystem::copy_file(Models() + "/tiny-chat.gguf", file);
  SummaryCache cache;
  auto first = cache.Get(file.string());
  ASSERT_TRUE(first.ok());
  EXPECT_FALSE(first->embedding);
  EXPECT_EQ(cache.Get(file.string())->size, first->size);
  std::filesystem::copy_file(Models() + "/tiny-embed.gguf", file, std::filesystem::copy_options::overwrite_existing);
  auto changed = cache.Get(file.string());
  ASSERT_TRUE(changed.ok());
  EXPECT_TRUE(changed->embedding) << "another file at the same path is read again";
  std::filesystem::remove(file);
  EXPECT_FALSE(cache.Get(file.string()).ok()) << "a file gone is not served from the cache";
}

TEST(ModelInfoTest, TemplateFamiliesQuantizationNamesAndCounts) {
  EXPECT_EQ(ChatTemplateFamily(""), "none");
  EXPECT_EQ(ChatTemplateFamily("<|start_header_id|>user<|end_header_id|>"), "llama3");
  EXPECT_EQ(ChatTemplateFamily("<|im_start|>user"), "chatml");
  EXPECT_EQ(ChatTemplateFamily("<start_of_turn>user"), "gemma");
  EXPECT_EQ(ChatTemplateFamily("[INST] {{ m }} [/INST][TOOL_CALLS]"), "mistral");
  EXPECT_EQ(ChatTemplateFamily("<<SYS>>\n[INST]"), "llama2");
  EXPECT_EQ(ChatTemplateFamily("<|start|>assistant<|channel|>final"), "gpt-oss");
  EXPECT_EQ(ChatTemplateFamily("{{ x }}"), "other");
  EXPECT_EQ(FileTypeName(15), "Q4_K_M");
  EXPECT_EQ(FileTypeName(7), "Q8_0");
  EXPECT_EQ(FileTypeName(1), "F16");
  EXPECT_EQ(FileTypeName(5), "");
  EXPECT_EQ(FileTypeName(9999), "");
  EXPECT_EQ(HumanCount(8'030'000'000), "8.0B");
  EXPECT_EQ(HumanCount(494'030'000), "494.0M");
  EXPECT_EQ(HumanCount(999), "999");
}

// Ollama's capabilities by the chat template, on llama.cpp's real ones: a
// model that reasons must not be refused `think` (a 400 Ollama would not give).
TEST(ModelInfoTest, ThinkingAndToolsAreReadOffRealTemplates) {
  const char* src = std::getenv("LLAMA_SRC");
  if (!src || !*src) GTEST_SKIP() << "LLAMA_SRC is not set (the llama.cpp source, for its models/templates)";
  auto read = [&](const std::string& name) {
    std::ifstream f(std::string(src) + "/models/templates/" + name + ".jinja", std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    EXPECT_FALSE(ss.str().empty()) << name;
    return ss.str();
  };
  for (const char* t : {"openai-gpt-oss-120b", "Qwen-Qwen3-0.6B", "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
                        "mistralai-Ministral-3-14B-Reasoning-2512", "Apriel-1.6-15b-Thinker-fixed", "GLM-4.6",
                        "Kimi-K2-Thinking"}) {
    EXPECT_TRUE(TemplateThinks(read(t))) << t;
  }
  for (const char* t : {"Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct", "google-gemma-2-2b-it",
                        "microsoft-Phi-3.5-mini-instruct"}) {
    EXPECT_FALSE(TemplateThinks(read(t))) << t;
  }
  EXPECT_TRUE(TemplateTakesTools(read("Qwen-Qwen2.5-7B-Instruct")));
  EXPECT_TRUE(TemplateTakesTools(read("openai-gpt-oss-120b")));
  EXPECT_FALSE(TemplateTakesTools(read("google-gemma-2-2b-it")));
  // The demo model's (Qwen2.5's, tools and no reasoning), as /api/show says.
  auto demo = SummarizeFile(Models() + "/tiny-chat.gguf");
  ASSERT_TRUE(demo.ok()) << demo.status().ToString();
  EXPECT_TRUE(demo->tools);
  EXPECT_FALSE(demo->thinking);
  auto embed = SummarizeFile(Models() + "/tiny-embed.gguf");
  ASSERT_TRUE(embed.ok());
  EXPECT_FALSE(embed->tools || embed->thinking) << "an embedding model has neither";
}

// A store that cannot be read (a system install's, in the ollama user's
// home; here a directory that is a symlink loop, since tests run as root)
// says so: it was "not found: no manifest", and a listing of it was empty,
// "no models found; set OLLAMA_MODELS" where OLLAMA_MODELS was right.
TEST(OllamaStoreTest, AStoreThatCannotBeReadSaysSoAndIsNotEmpty) {
  OllamaStoreLayout store("unreadable");
  store.Add("registry.ollama.ai/library/tiny", "latest", Models() + "/tiny-chat.gguf");
  const std::filesystem::path library = store.root() / "manifests/registry.ollama.ai/library";
  std::filesystem::create_symlink("loop", library / "loop");
  const std::string root = store.root().string();
  auto r = ResolveOllamaModel(root, *ParseOllamaName("ollama:loop"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  EXPECT_NE(r.status().message().find("cannot read manifest"), std::string::npos) << r.status().message();
  EXPECT_EQ(r.status().message().find("readable by the user"), std::string::npos) << "not a permission: " << r.status().message();
  // A store its user may not read (here: root's, read as nobody, in a child): that, and what to do.
  std::filesystem::permissions(store.root(), std::filesystem::perms::owner_all);
  const pid_t child = fork();
  if (child == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
    auto denied = ResolveOllamaModel(root, *ParseOllamaName("ollama:tiny"));
    auto listed = ListOllamaStore(root);
    const bool said = !denied.ok() && denied.status().code() == StatusCode::kPermissionDenied &&
                      denied.status().message().find("readable by the user Spillway runs as") != std::string::npos &&
                      !listed.ok() && listed.status().code() == StatusCode::kPermissionDenied;
    _exit(said ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  std::filesystem::permissions(store.root(), std::filesystem::perms::owner_all | std::filesystem::perms::group_read |
                                                 std::filesystem::perms::group_exec | std::filesystem::perms::others_read |
                                                 std::filesystem::perms::others_exec);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  std::filesystem::rename(store.root() / "manifests", store.root() / "kept");
  std::filesystem::create_symlink("manifests", store.root() / "manifests");
  auto listed = ListOllamaStore(root);
  ASSERT_FALSE(listed.ok());
  EXPECT_EQ(listed.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(listed.status().message().find(root), std::string::npos) << listed.status().message();
  const auto [rc, out] = RunCommand(Bin() + "/spillway models --ollama-dir " + root + " 2>&1");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("cannot read Ollama's store"), std::string::npos) << out;
  EXPECT_EQ(out.find("no models found"), std::string::npos) << out;
}

TEST(OllamaConfigTest, AServicesOllamaModelIsItsBlobAndABrokenOneNamesConfigAndManifest) {
  OllamaStoreLayout store("config");
  store.Add("registry.ollama.ai/library/tiny", "latest", Models() + "/tiny-chat.gguf");
  const auto broken = store.Write("registry.ollama.ai/library/broken", "latest", "[]");
  setenv("OLLAMA_MODELS", store.root().c_str(), 1);
  const char* kConfig = R"(
[[service]]
name = "chat"
model = "ollama:tiny"
[[service.placement]]
device = "cpu"
)";
  auto cfg = config::ParseConfig(kConfig, "store.toml");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->services[0].model_name, "ollama:tiny");
  EXPECT_EQ(cfg->services[0].model, *ResolveOllamaModel(store.root().string(), *ParseOllamaName("tiny")));
  EXPECT_EQ(cfg->services[0].ModelLabel(0), "ollama:tiny");
  EXPECT_TRUE(config::Validate(*cfg).ok());
  std::string text = kConfig;
  text.replace(text.find("ollama:tiny"), 11, "ollama:broken");
  auto bad = config::ParseConfig(text, "store.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("store.toml"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find(broken.string()), std::string::npos) << bad.status().message();
  unsetenv("OLLAMA_MODELS");
}

// A config's `ollama_models` names the store: Spillway installed as a
// service runs as its own user, without the operator's $OLLAMA_MODELS, and
// a system install of Ollama keeps its store in the ollama user's home.
// `ollama:` names there could not be used at all. The key wins over the
// variable, and `spillway models --config` lists that store.
TEST(OllamaConfigTest, TheConfigsOllamaModelsIsTheStoreNamesAreLookedUpIn) {
  OllamaStoreLayout store("config-key"), other("config-env");
  store.Add("registry.ollama.ai/library/tiny", "latest", Models() + "/tiny-chat.gguf");
  setenv("OLLAMA_MODELS", other.root().c_str(), 1);  // a store without the model
  const std::string text = "ollama_models = \"" + store.root().string() + R"("
[[service]]
name = "chat"
model = "ollama:tiny"
[[service.placement]]
device = "cpu"
model = "ollama:tiny"
)";
  auto cfg = config::ParseConfig(text, "key.toml");
  unsetenv("OLLAMA_MODELS");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  const std::string blob = *ResolveOllamaModel(store.root().string(), *ParseOllamaName("tiny"));
  EXPECT_EQ(cfg->services[0].model, blob);
  EXPECT_EQ(cfg->services[0].placements[0].model, blob);
  EXPECT_EQ(cfg->ollama_models, store.root().string());
  // Without the key, the same names are looked up in $OLLAMA_MODELS, and the
  // error says where a store is looked up.
  setenv("OLLAMA_MODELS", other.root().c_str(), 1);
  auto missing = config::ParseConfig(text.substr(text.find('\n') + 1), "key.toml");
  unsetenv("OLLAMA_MODELS");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("Ollama's store here is " + other.root().string() + ", from $OLLAMA_MODELS"),
            std::string::npos)
      << missing.status().message();
  for (const char* bad : {"\"\"", "\"~/.ollama/models\"", "\"store\""}) {
    auto rejected = config::ParseConfig(std::string("ollama_models = ") + bad + "\n", "key.toml");
    ASSERT_FALSE(rejected.ok()) << bad;
    EXPECT_NE(rejected.status().message().find("key.toml:1: 'ollama_models' must be an absolute path"), std::string::npos)
        << rejected.status().message();
  }

  const std::string path = (store.root() / "key.toml").string();
  {
    std::ofstream f(path);
    f << text;
  }
  auto [rc, out] = RunCommand("OLLAMA_MODELS='" + other.root().string() + "' " + Bin() +
                              "/spillway models --json --config " + path);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("\"ollama:tiny:latest\""), std::string::npos) << "the config's store is listed: " << out;
}

// A file name that is not UTF-8 (a folder copied from an old Latin-1 disk)
// is listed with U+FFFD: the whole --json listing failed on it with
// "invalid UTF-8 byte at index 0", naming no file.
TEST(ModelsCommandTest, AFileNameThatIsNotUtf8IsListedNotFatal) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "models-latin1";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(Models() + "/tiny-chat.gguf", dir / "caf\xe9.gguf");
  auto [rc, out] = RunCommand(Bin() + "/spillway models --no-ollama --json '" + dir.string() + "'");
  EXPECT_EQ(rc, 0) << out;
  const json rows = json::parse(out, nullptr, false);
  ASSERT_TRUE(rows.is_array()) << out;
  ASSERT_EQ(rows.size(), 1u) << out;
  EXPECT_NE(rows[0]["name"].get<std::string>().find("caf\xEF\xBF\xBD.gguf"), std::string::npos) << out;
  std::filesystem::remove_all(dir);
}

// A model file whose shape cannot be estimated is named with the reason
// (an ollama: name's blob path said nothing of which file was wrong).
TEST(ModelsCommandTest, PlanNamesTheFileItCannotEstimate) {
  std::string b = "GGUF";
  auto put = [&](auto x) { b.append(reinterpret_cast<const char*>(&x), sizeof x); };
  auto str = [&](const std::string& t) {
    put(static_cast<uint64_t>(t.size()));
    b += t;
  };
  put(uint32_t{3});
  put(uint64_t{0});  // tensors
  put(uint64_t{4});  // keys
  str("general.architecture");
  put(uint32_t{8});
  str("llama");
  for (const auto& [k, v] : {std::pair<const char*, uint32_t>{"llama.block_count", 1}, {"llama.embedding_length", 8},
                             {"llama.attention.head_count", 16}}) {  // 8 / 16: heads of no size
    str(k);
    put(uint32_t{4});
    put(v);
  }
  const std::string path = ::testing::TempDir() + "/no-head-size.gguf";
  {
    std::ofstream f(path, std::ios::binary);
    f << b;
  }
  auto [rc, out] = RunCommand(Bin() + "/spillway plan --model " + path + " 2>&1");
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find(path), std::string::npos) << out;
  EXPECT_NE(out.find("no size"), std::string::npos) << out;
  std::remove(path.c_str());
}

TEST(ModelsCommandTest, ListsTheStoreAndFoldersAndPlanTakesTheNames) {
  OllamaStoreLayout store("cli");
  store.Add("registry.ollama.ai/library/tiny", "latest", Models() + "/tiny-chat.gguf");
  store.Write("registry.ollama.ai/library/broken", "latest", "nope");
  const std::string env = "OLLAMA_MODELS='" + store.root().string() + "' ";
  auto [rc, out] = RunCommand(env + Bin() + "/spillway models --json " + Models());
  EXPECT_EQ(rc, 1) << "a broken manifest is listed and makes the exit code 1";
  const json rows = json::parse(out, nullptr, false);
  ASSERT_TRUE(rows.is_array()) << out;
  bool saw_tiny = false, saw_broken = false, saw_file = false;
  for (const auto& r : rows) {
    if (r["name"] == "ollama:tiny:latest") {
      saw_tiny = true;
      EXPECT_EQ(r["architecture"], "llama");
      EXPECT_EQ(r["template_family"], "chatml");
      EXPECT_GT(r["context_length"].get<int>(), 0);
      EXPECT_FALSE(r["quantization"].get<std::string>().empty());
    }
    if (r["name"] == "ollama:broken:latest") saw_broken = r.contains("error");
    if (r["name"] == Models() + "/tiny-chat.gguf") saw_file = r["size"].get<uint64_t>() > 0;
  }
  EXPECT_TRUE(saw_tiny && saw_broken && saw_file) << out;
  auto [table_rc, table] = RunCommand(env + Bin() + "/spillway models --no-ollama " + Models() + "/tiny-chat.gguf");
  EXPECT_EQ(table_rc, 0) << table;
  EXPECT_NE(table.find("chatml"), std::string::npos) << table;

  auto [plan_rc, plan] = RunCommand(env + Bin() + "/spillway plan --model ollama:tiny:latest --json");
  ASSERT_EQ(plan_rc, 0) << plan;
  const json p = json::parse(plan, nullptr, false);
  EXPECT_EQ(p["model"], "ollama:tiny:latest") << plan;
  EXPECT_EQ(p["architecture"], "llama");
  auto [missing_rc, missing] = RunCommand(env + Bin() + "/spillway plan --model ollama:absent 2>&1");
  EXPECT_EQ(missing_rc, 2);
  EXPECT_NE(missing.find("manifests/registry.ollama.ai/library/absent/latest"), std::string::npos) << missing;
}

}  // namespace
}  // namespace spillway::models
