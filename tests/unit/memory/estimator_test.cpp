#include "memory/estimator.h"

#include "memory/compute_model.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace spillway::memory {
namespace {

ModelShape Tiny(const char* file = "tiny-chat.gguf") {
  const char* m = std::getenv("SPILLWAY_MODELS");
  auto meta = gguf::ReadGgufFile(std::string(m ? m : "build/models") + "/" + file);
  EXPECT_TRUE(meta.ok()) << meta.status().ToString();
  auto s = ShapeFromMetadata(*meta);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return *s;
}

TEST(EstimatorTest, ShapeFromMetadata) {
  const auto s = Tiny();
  EXPECT_EQ(s.n_layer, 2u);
  EXPECT_EQ(s.n_embd, 64u);
  EXPECT_EQ(s.n_head_kv, 2u);
  EXPECT_EQ(s.head_dim_k, 16u);
  EXPECT_EQ(s.n_vocab, 32000u);
  EXPECT_EQ(s.n_ff, 128u);
  EXPECT_FALSE(s.tied_output);  // the demo writer's output matrix is its own
  EXPECT_EQ(s.output_bytes, 32000u * 64 * 2 + 64 * 4);  // and output_norm
  EXPECT_EQ(s.token_embd_bytes, 32000u * 64 * 2);
  EXPECT_EQ(s.layer_bytes[0], 74240u);  // the demo writer's layer, f16 matrices and f32 norms
  EXPECT_FALSE(s.embedding);
}

TEST(EstimatorTest, EmbeddingModelsRunAsTheWorkerRunsThem) {
  const auto s = Tiny("tiny-embed.gguf");
  EXPECT_TRUE(s.embedding);  // llama.pooling_type is set
  EXPECT_TRUE(s.tied_output);
  PlacementSpec p;
  p.accelerator = true;
  p.gpu_layers = -1;
  p.ctx = 512;
  p.batch = 64;
  const PlacementSpec run = AsWorkerRuns(s, p);
  EXPECT_TRUE(run.kv_unified);
  EXPECT_EQ(run.batch, 512u);  // the whole context in one micro-batch
  EXPECT_EQ(run.ubatch, 512u);
  EXPECT_EQ(AsWorkerRuns(Tiny(), p).batch, 64u);  // a generative model runs as asked
  // Every token is an output and llama.cpp still builds the logits: 512 rows.
  EXPECT_GE(EstimatePlacement(s, p).accelerator.compute, uint64_t{s.n_vocab} * 512 * 4);
}

TEST(EstimatorTest, LlamaCppPlacementRule) {
  const auto s = Tiny();
  PlacementSpec p;
  p.ctx = 512;
  auto cpu = EstimatePlacement(s, p);
  EXPECT_EQ(cpu.accelerator.total(), 0u);
  EXPECT_EQ(cpu.host.kv, 512u * 2 * (32 + 32) * 2);
  p.accelerator = true;
  p.gpu_layers = 1;  // only the output layer
  auto one = EstimatePlacement(s, p);
  EXPECT_EQ(one.layers_on_accelerator, 0);
  EXPECT_TRUE(one.output_on_accelerator);
  EXPECT_EQ(one.accelerator.kv, 0u);
  EXPECT_EQ(one.accelerator.weights, s.output_bytes);  // untied: the output matrix alone
  p.gpu_layers = 2;
  EXPECT_EQ(EstimatePlacement(s, p).layers_on_accelerator, 1);
  p.gpu_layers = -1;
  auto all = EstimatePlacement(s, p);
  EXPECT_EQ(all.layers_on_accelerator, 2);
  EXPECT_EQ(all.host.weights, s.token_embd_bytes);  // the input embeddings stay on the host
  EXPECT_EQ(all.host.kv, 0u);
  p.gpu_layers = 1000;
  EXPECT_EQ(EstimatePlacement(s, p).accelerator.total(), all.accelerator.total());
}

TEST(EstimatorTest, KvScalesWithCellsAndType) {
  const auto s = Tiny();
  PlacementSpec p;
  EXPECT_EQ(KvBytesForCells(s, p, 1000), 1000u * 2 * 64 * 2);
  p.kv_k_x32 = p.kv_v_x32 = 34;  // q8_0
  EXPECT_EQ(KvBytesForCells(s, p, 1000), 1000u * 2 * 64 * 34 / 32);
  p.ctx = 300;  // padded to 512
  EXPECT_EQ(EstimatePlacement(s, p).ctx_padded, 512u);
}

TEST(EstimatorTest, KvCellsPadAsLlamaCppDoes) {
  PlacementSpec p;
  p.ctx = 2816;  // already a multiple of 256
  p.slots = 5;   // 563 cells a slot, padded to 768, times 5
  EXPECT_EQ(KvCells(p), 3840u);
  p.kv_unified = true;  // one pool: only the context is padded
  EXPECT_EQ(KvCells(p), 2816u);
  p.ctx = 200;
  EXPECT_EQ(KvCells(p), 256u);
}

TEST(EstimatorTest, HostLayersNeedTheirOwnAttentionScores) {
  // A partial offload runs attention on both devices: the host's compute
  // buffer holds a layer's scores as the accelerator's does.
  const auto s = Tiny();
  PlacementSpec p;
  p.accelerator = true;
  p.ctx = 8192;
  p.slots = 1;
  p.gpu_layers = 2;  // one layer and the output on the accelerator, one layer on the host
  const auto e = EstimatePlacement(s, p);
  const uint64_t scores = uint64_t{8192} * 512 * s.n_head * 4;
  EXPECT_GE(e.host.compute, scores);
  EXPECT_GE(e.accelerator.compute, scores);
  p.ctx = 200;  // llama.cpp caps the micro-batch at the context: 200 rows of logits
  EXPECT_LT(EstimatePlacement(s, p).accelerator.compute, uint64_t{s.n_vocab} * 256 * 4);
}

TEST(EstimatorTest, CalibrationCorrectsPerModelAndDevice) {
  Calibration c;
  DeviceBytes pred{100, 200, 300};
  EXPECT_EQ(c.Apply("m/sim", pred).compute, 300u);
  c.Observe("m/sim", pred, {100, 200, 330});
  EXPECT_EQ(c.Apply("m/sim", {100, 400, 600}).compute, 660u);
  EXPECT_EQ(c.Apply("m/sim", {100, 400, 600}).kv, 400u);
  EXPECT_EQ(c.Apply("other/sim", pred).compute, 300u);
}

TEST(EstimatorTest, IncompleteMetadataIsAnError) {
  gguf::Metadata m;
  EXPECT_FALSE(ShapeFromMetadata(m).ok());
  gguf::Value arch;
  arch.kind = gguf::Value::Kind::kString;
  arch.s = "llama";
  m.kv["general.architecture"] = arch;
  EXPECT_NE(ShapeFromMetadata(m).status().message().find("block_count"), std::string::npos);
}

// What the metadata cannot size goes to llama.cpp's dry run, with the reason:
// a recurrent state (Mamba, RWKV, LFM2, Kimi), layers that are not all
// attention, heads or widths per layer, a sliding window. A plain model is
// sized from its metadata, and a key of another architecture does not count.
TEST(EstimatorTest, WhatTheMetadataCannotSizeIsNamed) {
  auto model = [](const std::string& arch) {
    gguf::Metadata m;
    gguf::Value a;
    a.kind = gguf::Value::Kind::kString;
    a.s = arch;
    m.kv["general.architecture"] = a;
    gguf::Value u;
    u.kind = gguf::Value::Kind::kUint;
    u.u = 8;
    for (const char* k : {".block_count", ".embedding_length", ".attention.head_count"}) m.kv[arch + k] = u;
    return m;
  };
  auto with = [&](const std::string& arch, const std::string& key) {
    gguf::Metadata m = model(arch);
    gguf::Value u;
    u.kind = gguf::Value::Kind::kUint;
    u.u = 4;
    m.kv[key] = u;
    return ExactPlanReason(m);
  };
  EXPECT_EQ(ExactPlanReason(model("llama")), "");
  EXPECT_EQ(ExactPlanReason(model("qwen2")), "");
  EXPECT_EQ(with("llama", "mamba.ssm.state_size"), "");  // (another architecture's key)
  EXPECT_EQ(with("llama", "llama.rope.freq_base"), "");
  for (const char* key : {"mamba.ssm.state_size", "rwkv7.wkv.head_size", "lfm2.shortconv.l_cache", "kimi-linear.kda.head_dim"}) {
    const std::string arch = std::string(key).substr(0, std::string(key).find('.'));
    const std::string why = with(arch, key);
    EXPECT_NE(why.find("recurrent state"), std::string::npos) << key << ": " << why;
    EXPECT_NE(why.find(key), std::string::npos) << why;
  }
  EXPECT_NE(with("qwen3next", "qwen3next.full_attention_interval").find("not all of its layers"), std::string::npos);
  EXPECT_NE(with("gemma3", "gemma3.attention.sliding_window").find("sliding window"), std::string::npos);
  EXPECT_NE(with("deepseek2", "deepseek2.attention.kv_lora_rank").find("compressed latent"), std::string::npos);
  // Written as 0 for a model without a window (Phi-4's converter does): sized from its metadata.
  gguf::Metadata phi4 = model("phi3");
  gguf::Value zero;
  zero.kind = gguf::Value::Kind::kUint;
  zero.u = 0;
  phi4.kv["phi3.attention.sliding_window"] = zero;
  EXPECT_EQ(ExactPlanReason(phi4), "");
  gguf::Metadata per_layer = model("deci");
  gguf::Value arr;
  arr.kind = gguf::Value::Kind::kArray;
  arr.array_len = 8;
  per_layer.kv["deci.feed_forward_length"] = arr;
  EXPECT_NE(ExactPlanReason(per_layer).find("deci.feed_forward_length per layer"), std::string::npos);
  // The estimate itself refuses such a model with the same reason.
  const auto shape = ShapeFromMetadata(per_layer);
  ASSERT_FALSE(shape.ok());
  EXPECT_NE(shape.status().message().find("per layer"), std::string::npos) << shape.status().message();
  // The test model written as a hybrid is one of them.
  const char* dir = std::getenv("SPILLWAY_MODELS");
  auto hybrid = gguf::ReadGgufFile(std::string(dir ? dir : "build/models") + "/tiny-hybrid.gguf");
  ASSERT_TRUE(hybrid.ok()) << hybrid.status().ToString();
  EXPECT_NE(ExactPlanReason(*hybrid).find("lfm2.attention.head_count_kv per layer"), std::string::npos)
      << ExactPlanReason(*hybrid);
}

// A header of a few hundred bytes cannot make the estimate divide by a head
// of no size (it crashed or never ended), or build millions of layers (it
// took the gateway's memory at start): such values are refused, by name.
TEST(EstimatorTest, HostileShapesAreRefusedByName) {
  auto base = [] {
    gguf::Metadata m;
    gguf::Value arch;
    arch.kind = gguf::Value::Kind::kString;
    arch.s = "llama";
    m.kv["general.architecture"] = arch;
    for (const auto& [k, v] : {std::pair<const char*, uint64_t>{"llama.block_count", 1}, {"llama.embedding_length", 64},
                               {"llama.attention.head_count", 4}}) {
      gguf::Value u;
      u.kind = gguf::Value::Kind::kUint;
      u.u = v;
      m.kv[k] = u;
    }
    return m;
  };
  auto with = [&](const char* key, uint64_t value) {
    gguf::Metadata m = base();
    gguf::Value u;
    u.kind = gguf::Value::Kind::kUint;
    u.u = value;
    m.kv[key] = u;
    return ShapeFromMetadata(m);
  };
  ASSERT_TRUE(ShapeFromMetadata(base()).ok());
  const auto no_head_size = with("llama.attention.head_count", 128);  // 64 / 128 = 0 per head
  ASSERT_FALSE(no_head_size.ok());
  EXPECT_NE(no_head_size.status().message().find("no size"), std::string::npos) << no_head_size.status().message();
  const auto deep = with("llama.block_count", 1000000);
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.status().message().find("block_count = 1000000"), std::string::npos) << deep.status().message();
  EXPECT_FALSE(with("llama.attention.key_length", uint64_t{1} << 31).ok());
  EXPECT_FALSE(with("llama.feed_forward_length", uint64_t{1} << 40).ok());
  EXPECT_FALSE(with("llama.vocab_size", uint64_t{1} << 40).ok());
  // Each within its bound, their product a cell's KV width of 2^36 per
  // layer: the KV estimate wrapped in 64 bits (a tiny "model" that fits).
  gguf::Metadata wide = base();
  for (const auto& [k, v] : {std::pair<const char*, uint64_t>{"llama.attention.head_count", 1 << 20},
                             {"llama.attention.head_count_kv", 1 << 20}, {"llama.attention.key_length", 1 << 16},
                             {"llama.attention.value_length", 1 << 16}}) {
    wide.kv[k].kind = gguf::Value::Kind::kUint;
    wide.kv[k].u = v;
  }
  const auto wrapped = ShapeFromMetadata(wide);
  ASSERT_FALSE(wrapped.ok());
  EXPECT_NE(wrapped.status().message().find("head_count_kv x key/value_length"), std::string::npos)
      << wrapped.status().message();
  // Heads given per layer (a hybrid model): not estimated, and said so
  // (the first layer's count for every layer made its KV 40 times too large).
  gguf::Metadata hybrid = base();
  gguf::Value per_layer;
  per_layer.kind = gguf::Value::Kind::kArray;
  per_layer.array_len = 1;
  per_layer.numbers = {0};
  hybrid.kv["llama.attention.head_count_kv"] = per_layer;
  const auto h = ShapeFromMetadata(hybrid);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("per layer"), std::string::npos) << h.status().message();
  // More blocks than its tensors have.
  gguf::Metadata listed = base();
  listed.kv["llama.block_count"].u = 8;
  gguf::TensorInfo t;
  t.name = "blk.1.attn_q.weight";
  t.layer = 1;
  listed.tensors.push_back(t);
  const auto more = ShapeFromMetadata(listed);
  ASSERT_FALSE(more.ok());
  EXPECT_NE(more.status().message().find("2 blocks"), std::string::npos) << more.status().message();
  gguf::Value parts;
  parts.kind = gguf::Value::Kind::kUint;
  parts.u = 3;
  listed.kv["split.count"] = parts;  // the first part of a split file: the blocks of its own part only
  EXPECT_TRUE(ShapeFromMetadata(listed).ok());
  // What passes is estimated without crashing, however odd.
  auto odd = with("llama.attention.key_length", 3);
  ASSERT_TRUE(odd.ok());
  PlacementSpec spec;
  spec.ctx = 512;
  spec.slots = 1;
  EXPECT_GT(EstimatePlacement(*odd, spec).host.total(), 0u);
}

}  // namespace
}  // namespace spillway::memory
