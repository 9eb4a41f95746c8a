// Property: for random shapes and placements, the metadata estimator is
// within 3 % of llama.cpp's own dry run on every device, and never under it
// by more than 1 % (an under-estimate packed onto a device is an OOM), for
// generative models and for embedding models (mean pooling, run as the worker
// runs them: one micro-batch of the whole context, every token an output).
//
// Each case writes a tiny llama model with a real 32k vocabulary (weights
// left as holes: a dry run never reads them), loads it with no_alloc on a
// simulated device through the worker's own loader and asks llama.cpp for its
// exact plan, in this process. Prints the error distribution per component.
// SPILLWAY_PROPERTY_SEED reproduces a run; SPILLWAY_PROPERTY_CASES and
// SPILLWAY_PROPERTY_EMBED_CASES size it.
// To study a miss: SPILLWAY_PROPERTY_DUMP=file appends every estimate to it as TSV,
// SPILLWAY_PROPERTY_ONLY=i runs case i alone (of each kind), SPILLWAY_PROPERTY_CASE="L E H
// HKV F type ctx slots ngl kv unified [embed]" runs that one shape, and
// SPILLWAY_PROPERTY_LOG=1 with GGML_SCHED_DEBUG=2 prints llama.cpp's graph.
#include <gtest/gtest.h>
#include <llama.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "devices/sim_ledger.h"
#include "gguf/demo_model.h"
#include "gguf/gguf_reader.h"
#include "memory/estimator.h"
#include "worker/engine.h"
#include "worker/model.h"

namespace spillway {
namespace {

namespace fs = std::filesystem;
using memory::DeviceBytes;

struct Case {
  DemoModelSpec model;
  int gpu_layers = 0, ctx = 0, slots = 1;
  std::string kv_type;
  bool kv_unified = false;
  std::string Describe() const {
    char b[256];
    std::snprintf(b, sizeof b, "L=%u E=%u H=%u/%u F=%u %s ctx=%d slots=%d ngl=%d kv=%s%s%s", model.n_layer, model.n_embd,
                  model.n_head, model.n_head_kv, model.n_ff, model.type.c_str(), ctx, slots, gpu_layers, kv_type.c_str(),
                  kv_unified ? " unified" : "", model.embedding ? " embed" : "");
    return b;
  }
};

// Shapes the worker accepts: a quantized KV cache needs flash attention
// (--kv-unified) and head dimensions of whole 32-value blocks.
Case RandomCase(std::mt19937_64& rng) {
  auto pick = [&](int lo, int hi) { return lo + static_cast<int>(rng() % static_cast<uint64_t>(hi - lo + 1)); };
  static const char* kTypes[] = {"f32", "f16", "q8_0", "q4_0"};
  static const char* kKv[] = {"f16", "q8_0", "f32"};
  Case c;
  c.kv_type = kKv[rng() % 3];
  c.kv_unified = c.kv_type == "q8_0" || rng() % 3 == 0;
  DemoModelSpec& s = c.model;
  s.n_layer = static_cast<uint32_t>(pick(1, 12));
  const uint32_t head_dim = c.kv_type == "q8_0" ? 32u << pick(0, 2) : 16u << pick(0, 3);
  s.n_head = static_cast<uint32_t>(pick(1, 16));
  while (s.n_head > 1 && s.n_head * head_dim > 1024) --s.n_head;
  if ((s.n_head * head_dim) % 32) ++s.n_head;
  s.n_embd = s.n_head * head_dim;
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= s.n_head; ++d) {
    if (s.n_head % d == 0) divisors.push_back(d);
  }
  s.n_head_kv = divisors[rng() % divisors.size()];
  s.n_ff = 32u * static_cast<uint32_t>(pick(static_cast<int>(s.n_embd / 32), static_cast<int>(4 * s.n_embd / 32)));
  s.type = kTypes[rng() % 4];
  s.weights_as_holes = true;
  c.ctx = 256 * pick(1, 32) - (rng() % 2 ? static_cast<int>(rng() % 200) : 0);
  c.slots = pick(1, 8);
  c.gpu_layers = pick(0, static_cast<int>(s.n_layer) + 1);
  return c;
}

// An embedding model (DemoModelSpec::embedding, as `spillway mkmodel
// --embedding` writes it: mean pooling, no output.weight). The worker runs it
// on one unified pool with the whole context as one micro-batch; that batch
// is whole sequences only when the slots divide the context.
Case RandomEmbeddingCase(std::mt19937_64& rng) {
  Case c = RandomCase(rng);
  c.model.embedding = true;
  c.kv_unified = true;
  c.ctx -= c.ctx % c.slots;
  return c;
}

struct Exact {
  DeviceBytes accelerator, host;
};

StatusOr<Exact> DryRun(const Case& c, const std::string& path) {
  worker::Placement p;
  p.device = "sim:0";
  p.gpu_layers = c.gpu_layers;
  p.ctx = c.ctx;
  p.slots = c.slots;
  p.mmap = false;
  p.dry_run = true;
  auto model = worker::Model::Load(path, p);
  if (!model.ok()) return model.status();
  worker::EngineOptions eo;
  eo.ctx = c.ctx;
  eo.slots = c.slots;
  eo.kv_type = c.kv_type;
  eo.kv_unified = c.kv_unified;
  eo.embedding = (*model)->is_embedding();  // as the worker decides (worker/main.cpp)
  auto plan = worker::DryRunBreakdown(**model, eo);
  if (!plan.ok()) return plan.status();
  Exact e;
  for (const auto& b : *plan) {
    DeviceBytes& d = b.host ? e.host : e.accelerator;
    d.weights += b.model;
    d.kv += b.context;
    d.compute += b.compute;
  }
  return e;
}

// Error of `est` against `exact`, as a fraction of the device's exact total.
double Err(uint64_t est, uint64_t exact, uint64_t total) {
  return total == 0 ? 0 : (static_cast<double>(est) - static_cast<double>(exact)) / static_cast<double>(total);
}

struct Spread {
  double over = 0, under = 0;
  void Add(double e) { over = std::max(over, e), under = std::min(under, e); }
};

class EstimatePropertyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/spillway-estimate-XXXXXX";
    dir_ = mkdtemp(tmpl);
    ::setenv("SPILLWAY_SIM_DIR", dir_.c_str(), 1);
    ASSERT_TRUE(devices::SimLedger::Create(0, uint64_t{1} << 46).ok());  // the capacity never limits a plan
    const char* bin = std::getenv("SPILLWAY_BIN");
    worker::InstallLlamaLog(std::getenv("SPILLWAY_PROPERTY_LOG") ? GGML_LOG_LEVEL_DEBUG : GGML_LOG_LEVEL_ERROR + 1);
    ASSERT_TRUE(worker::LoadBackends(bin ? bin : "build/bin", "sim:0").ok());
    llama_backend_init();
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  static std::string dir_;
};
std::string EstimatePropertyTest::dir_;

// Runs `cases` shapes from `make` against llama.cpp's dry run and asserts the
// goal on every device; prints the error spread per component.
void CheckCases(const std::string& dir, const char* kind, int cases, uint64_t seed, Case (*make)(std::mt19937_64&)) {
  const char* vocab = std::getenv("SPILLWAY_VOCAB");
  ASSERT_NE(vocab, nullptr) << "SPILLWAY_VOCAB names llama.cpp's ggml-vocab-llama-spm.gguf";
  std::printf("%s: seed %llu (SPILLWAY_PROPERTY_SEED), %d cases\n", kind, static_cast<unsigned long long>(seed), cases);
  std::mt19937_64 rng(seed);
  Spread total, weights, kv, compute;
  // Issue [10] item 8's goal: every device within [-1 %, +3 %]. The compute
  // buffers come from a replica of llama.cpp's graph, ggml's scheduler and
  // its allocator (memory/compute_graph.h, memory/graph_alloc.h), which
  // matches this dry run to the byte on this seed and others (the phase
  // model before it: [-10.3 %, +9.8 %]), so the test asserts the goal itself.
  constexpr double kGoalOver = 0.03, kGoalUnder = -0.01;
  int failures = 0, to_the_byte = 0;
  const std::string path = dir + "/model.gguf";
  const char* dump_path = std::getenv("SPILLWAY_PROPERTY_DUMP");  // a TSV of every estimate, for analysis
  FILE* dump = dump_path ? std::fopen(dump_path, "a") : nullptr;
  for (int i = 0; i < cases; ++i) {
    Case c = make(rng);
    if (const char* only = std::getenv("SPILLWAY_PROPERTY_ONLY"); only && std::atoi(only) != i) continue;
    if (const char* one = std::getenv("SPILLWAY_PROPERTY_CASE")) {  // "L E H HKV F type ctx slots ngl kv unified [embed]"
      char type[16], kvt[16], embed[16] = "";
      int u = 0;
      DemoModelSpec& m = c.model;
      if (std::sscanf(one, "%u %u %u %u %u %15s %d %d %d %15s %d %15s", &m.n_layer, &m.n_embd, &m.n_head, &m.n_head_kv,
                      &m.n_ff, type, &c.ctx, &c.slots, &c.gpu_layers, kvt, &u, embed) >= 11) {
        m.type = type, c.kv_type = kvt, c.kv_unified = u != 0;
        if (m.embedding != (std::string(embed) == "embed")) break;  // the other kind's test
      }
      if (i > 0) break;
    }
    c.model.vocab_path = vocab;
    ASSERT_TRUE(WriteDemoModel(c.model, path).ok());
    auto exact = DryRun(c, path);
    ASSERT_TRUE(exact.ok()) << c.Describe() << ": " << exact.status().ToString();
    auto meta = gguf::ReadGgufFile(path);
    ASSERT_TRUE(meta.ok());
    auto shape = memory::ShapeFromMetadata(*meta);
    ASSERT_TRUE(shape.ok());
    ASSERT_EQ(shape->embedding, c.model.embedding) << c.Describe();
    // What a caller asks for; for an embedding model the estimator itself
    // follows the worker's settings (memory::AsWorkerRuns).
    memory::PlacementSpec spec;
    spec.accelerator = true;
    spec.gpu_layers = c.gpu_layers;
    spec.ctx = static_cast<uint32_t>(c.ctx);
    spec.slots = static_cast<uint32_t>(c.slots);
    spec.kv_unified = c.kv_unified;
    spec.kv_k_x32 = spec.kv_v_x32 = c.kv_type == "q8_0" ? 34 : c.kv_type == "f32" ? 128 : 64;
    const auto est = memory::EstimatePlacement(*shape, spec);
    const std::pair<const DeviceBytes*, const DeviceBytes*> devices[] = {{&est.accelerator, &exact->accelerator},
                                                                         {&est.host, &exact->host}};
    for (const auto& [e, x] : devices) {
      const uint64_t t = x->total();
      if (dump) {
        std::fprintf(dump, "%s\t%s\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\n", c.Describe().c_str(),
                     e == &est.accelerator ? "acc" : "host", (unsigned long long)e->weights, (unsigned long long)x->weights,
                     (unsigned long long)e->kv, (unsigned long long)x->kv, (unsigned long long)e->compute,
                     (unsigned long long)x->compute, (unsigned long long)t);
      }
      weights.Add(Err(e->weights, x->weights, t));
      kv.Add(Err(e->kv, x->kv, t));
      compute.Add(Err(e->compute, x->compute, t));
      to_the_byte += e->compute == x->compute;
      const double err = Err(e->total(), t, t);
      total.Add(err);
      if ((err > kGoalOver || err < kGoalUnder) && failures++ < 20) {
        ADD_FAILURE() << c.Describe() << (e == &est.accelerator ? ": accelerator " : ": host ") << e->total() << " B est vs "
                      << t << " B exact (" << 100 * err << " %; compute " << e->compute << " vs " << x->compute << ")";
      }
    }
  }
  if (dump) std::fclose(dump);
  std::printf("error, share of the device's exact total   max over   max under\n");
  auto row = [](const char* name, const Spread& s) { std::printf("  %-40s %+8.2f%% %+9.2f%%\n", name, 100 * s.over, 100 * s.under); };
  row("weights", weights);
  row("KV cache", kv);
  row("compute buffers", compute);
  row("total per device", total);
  std::printf("%d of %d compute buffers estimated to the byte\n", to_the_byte, 2 * cases);
  EXPECT_EQ(failures, 0) << failures << " of " << 2 * cases << " device estimates outside the goal [-1 %, +3 %]";
}

uint64_t Seed() {
  const char* env = std::getenv("SPILLWAY_PROPERTY_SEED");
  return env ? std::strtoull(env, nullptr, 10) : 20240614;
}

int Cases(const char* env_name, int fallback) {
  const char* env = std::getenv(env_name);
  return env ? std::atoi(env) : fallback;
}

TEST_F(EstimatePropertyTest, WithinThreePercentAndNeverOneUnder) {
  CheckCases(dir_, "generative", Cases("SPILLWAY_PROPERTY_CASES", 200), Seed(), RandomCase);
}

// Their own stream of shapes, so that adding them left the generative cases as they were.
TEST_F(EstimatePropertyTest, EmbeddingModelsWithinThreePercentAndNeverOneUnder) {
  CheckCases(dir_, "embedding", Cases("SPILLWAY_PROPERTY_EMBED_CASES", 60), Seed() + 1, RandomEmbeddingCase);
}

}  // namespace
}  // namespace spillway
