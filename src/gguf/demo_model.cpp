#include "gguf/demo_model.h"

#include <ggml.h>
#include <gguf.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string_view>
#include <vector>

#include "gguf/random_weights.h"

namespace spillway {

// Qwen 2.5's template without its default system prompt: plain chats render
// as ChatML, and tools, tool calls and tool results in Qwen's (Hermes) format,
// which llama.cpp's chat layer recognizes.
const char* const kDemoChatTemplate = R"TMPL({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- elif messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)TMPL";

namespace {

struct GgufFree {
  void operator()(gguf_context* c) const { gguf_free(c); }
};
struct GgmlFree {
  void operator()(ggml_context* c) const { ggml_free(c); }
};
using GgufPtr = std::unique_ptr<gguf_context, GgufFree>;

StatusOr<ggml_type> ParseType(const std::string& t) {
  if (t == "f32") return GGML_TYPE_F32;
  if (t == "f16") return GGML_TYPE_F16;
  if (t == "q8_0") return GGML_TYPE_Q8_0;
  if (t == "q4_0") return GGML_TYPE_Q4_0;
  return Status::InvalidArgument("unknown weight type '" + t + "' (use f32, f16, q8_0 or q4_0)");
}

// llama_ftype values (llama.h) for general.file_type.
uint32_t FileTypeFor(ggml_type t) {
  switch (t) {
    case GGML_TYPE_F32: return 0;
    case GGML_TYPE_F16: return 1;
    case GGML_TYPE_Q4_0: return 2;
    case GGML_TYPE_Q8_0: return 7;
    default: return 0;
  }
}

struct TensorPlan {
  std::string name;
  int64_t ne0, ne1;  // ne1 == 1 for vectors
  ggml_type type;
  bool is_norm;
};

void AttentionTensors(const std::string& p, int64_t e, int64_t kv, ggml_type wtype, std::vector<TensorPlan>* t) {
  t->push_back({p + "attn_q.weight", e, e, wtype, false});
  t->push_back({p + "attn_k.weight", e, kv, wtype, false});
  t->push_back({p + "attn_v.weight", e, kv, wtype, false});
  t->push_back({p + "attn_output.weight", e, e, wtype, false});
}

constexpr float kQkNormGain = 2.0f;
constexpr uint32_t kShortConvCache = 3;  // lfm2: the convolution's width (LFM2's own)

// lfm2: the even layers are short convolutions (no attention, no KV cache).
bool IsConvLayer(const DemoModelSpec& s, uint32_t i) { return s.arch == "lfm2" && i % 2 == 0; }

std::vector<TensorPlan> PlanTensors(const DemoModelSpec& s, int64_t n_vocab, ggml_type wtype) {
  const int64_t e = s.n_embd, kv = int64_t(s.n_embd) / s.n_head * s.n_head_kv, ff = s.n_ff;
  const bool lfm2 = s.arch == "lfm2";
  std::vector<TensorPlan> t;
  t.push_back({"token_embd.weight", e, n_vocab, wtype, false});
  // (LFM2's output norm is named so in llama.cpp.)
  t.push_back({lfm2 ? "token_embd_norm.weight" : "output_norm.weight", e, 1, GGML_TYPE_F32, true});
  // Untied: with the output matrix equal to the token embeddings, the current
  // token's own logit towers over the rest and the model repeats it forever.
  // (An embedding model pools hidden states and never uses it.)
  if (!s.embedding) t.push_back({"output.weight", e, n_vocab, wtype, false});
  for (uint32_t i = 0; i < s.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    t.push_back({p + "attn_norm.weight", e, 1, GGML_TYPE_F32, true});
    if (IsConvLayer(s, i)) {
      // (The kernel stays f32, as in LFM2's files: 3 values a row fill no quantization block.)
      t.push_back({p + "shortconv.conv.weight", kShortConvCache, e, GGML_TYPE_F32, false});
      t.push_back({p + "shortconv.in_proj.weight", e, 3 * e, wtype, false});
      t.push_back({p + "shortconv.out_proj.weight", e, e, wtype, false});
    } else {
      if (lfm2) {
        t.push_back({p + "attn_q_norm.weight", e / s.n_head, 1, GGML_TYPE_F32, true});
        t.push_back({p + "attn_k_norm.weight", e / s.n_head, 1, GGML_TYPE_F32, true});
      }
      AttentionTensors(p, e, kv, wtype, &t);
    }
    t.push_back({p + "ffn_norm.weight", e, 1, GGML_TYPE_F32, true});
    t.push_back({p + "ffn_gate.weight", e, ff, wtype, false});
    t.push_back({p + "ffn_down.weight", ff, e, wtype, false});
    t.push_back({p + "ffn_up.weight", e, ff, wtype, false});
  }
  return t;
}

// Standard deviation of each matrix's entries. Chosen so that the model's
// behaviour is as sensitive as a real one's: every sub-layer's output is of
// the same order as the token embedding (so attention and the FFN move the
// residual stream), attention scores spread by ~2.5 (attention that picks
// positions rather than averaging them away), and logits spread by ~3 over
// the vocabulary (greedy is decided by the state; sampling at temperature
// 0.8 still has many candidates). Xavier-style: divided by sqrt(fan-in).
float StdFor(const DemoModelSpec& s, const std::string& name) {
  const float in_e = 1.0f / std::sqrt(static_cast<float>(s.n_embd));
  const float in_ff = 1.0f / std::sqrt(static_cast<float>(s.n_ff));
  auto ends = [&](std::string_view suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (name == "token_embd.weight") return 1.0f;
  if (ends("shortconv.conv.weight")) return 0.6f;  // (fan-in: its 3 taps)
  if (name == "output.weight") return 3.0f * in_e;
  if (ends("attn_q.weight") || ends("attn_k.weight")) return 1.6f * in_e;
  if (ends("attn_v.weight")) return 1.0f * in_e;
  if (ends("attn_output.weight")) return 1.5f * in_e;
  if (ends("ffn_down.weight")) return 1.0f * in_ff;
  return 1.0f * in_e;  // ffn_gate, ffn_up
}

// Uniform in [-a, a] (standard deviation a / sqrt(3)), from (seed, name).
void RandomFill(const DemoModelSpec& s, const std::string& name, std::vector<float>& f) {
  SplitMix64 rng{s.seed ^ HashName(name)};
  const float a = StdFor(s, name) * std::sqrt(3.0f);
  for (auto& x : f) x = rng.NextUnit() * a;
}

// Fills one tensor's bytes deterministically from (seed, tensor name).
std::vector<uint8_t> TensorBytes(const DemoModelSpec& s, const TensorPlan& tp) {
  const int64_t n = tp.ne0 * tp.ne1;
  std::vector<float> f(static_cast<size_t>(n));
  if (tp.is_norm) {
    // lfm2's q and k are normalized per head: their gain sets how sharply
    // attention picks positions (the llama layout's q and k weights do).
    const bool qk = tp.name.find("attn_q_norm") != std::string::npos || tp.name.find("attn_k_norm") != std::string::npos;
    for (auto& x : f) x = qk ? kQkNormGain : 1.0f;
    if (s.mutate_one_weight && tp.name == "blk.0.attn_norm.weight") f[0] = 1.5f;
  } else {
    RandomFill(s, tp.name, f);
    if (tp.name == "output.weight") {
      // Each token's output row leans away from its own embedding, so the
      // token just read scores low as the next one (real models rarely
      // repeat a token; random ones otherwise fall into runs of one token).
      std::vector<float> embd(f.size());
      RandomFill(s, "token_embd.weight", embd);
      // The self-logit is about -12 * cos(h, e_t): a few logit spreads.
      const float alpha = 12.0f / static_cast<float>(s.n_embd);
      for (size_t i = 0; i < f.size(); ++i) f[i] -= alpha * embd[i];
    }
  }
  std::vector<uint8_t> out(ggml_row_size(tp.type, tp.ne0) * static_cast<size_t>(tp.ne1));
  switch (tp.type) {
    case GGML_TYPE_F32:
      std::memcpy(out.data(), f.data(), out.size());
      break;
    case GGML_TYPE_F16:
      ggml_fp32_to_fp16_row(f.data(), reinterpret_cast<ggml_fp16_t*>(out.data()), n);
      break;
    default:
      ggml_quantize_chunk(tp.type, f.data(), out.data(), 0, tp.ne1, tp.ne0, nullptr);
      break;
  }
  return out;
}

}  // namespace

StatusOr<DemoModelSpec> DemoModelPreset(const std::string& name) {
  DemoModelSpec s;
  s.name = "spillway-" + name;
  if (name == "tiny") return s;
  if (name == "demo-chat") {
    s.n_layer = 4; s.n_embd = 256; s.n_head = 8; s.n_head_kv = 4; s.n_ff = 768;
    s.n_ctx_train = 4096; s.type = "q8_0"; s.seed = 7;
    return s;
  }
  if (name == "demo-embed") {
    s.n_layer = 2; s.n_embd = 128; s.n_head = 4; s.n_head_kv = 4; s.n_ff = 256;
    s.n_ctx_train = 512; s.type = "f16"; s.embedding = true; s.seed = 11;
    return s;
  }
  if (name == "bench") {  // ~300 MB f16
    s.n_layer = 12; s.n_embd = 1024; s.n_head = 16; s.n_head_kv = 4; s.n_ff = 4096;
    s.n_ctx_train = 8192; s.type = "f16"; s.seed = 3;
    return s;
  }
  if (name == "bench-large") {  // ~1.2 GB f16: decodes from DRAM, not cache
    s.n_layer = 16; s.n_embd = 2048; s.n_head = 16; s.n_head_kv = 8; s.n_ff = 5632;
    s.n_ctx_train = 8192; s.type = "f16"; s.seed = 5;
    return s;
  }
  return Status::InvalidArgument("unknown preset '" + name +
                                 "' (tiny, demo-chat, demo-embed, bench, bench-large)");
}

Status ValidateDemoModelSpec(const DemoModelSpec& s) {
  auto bad = [](const std::string& m) { return Status::InvalidArgument(m); };
  if (s.n_layer < 1 || s.n_layer > 256) return bad("layers must be in [1, 256]");
  if (s.n_embd < 32 || s.n_embd > 16384 || s.n_embd % 32) return bad("width must be a multiple of 32 in [32, 16384]");
  if (s.n_head < 1 || s.n_embd % s.n_head) return bad("heads must divide the width");
  if ((s.n_embd / s.n_head) % 2) return bad("head dimension (width/heads) must be even");
  if (s.n_head_kv < 1 || s.n_head % s.n_head_kv) return bad("kv heads must divide heads");
  if (s.n_ff < 32 || s.n_ff > 65536 || s.n_ff % 32) return bad("ffn width must be a multiple of 32 in [32, 65536]");
  if (s.n_ctx_train < 16 || s.n_ctx_train > (1u << 20)) return bad("context must be in [16, 1048576]");
  auto t = ParseType(s.type);
  if (!t.ok()) return t.status();
  if (s.vocab_path.empty()) return bad("a vocabulary file is required");
  if (s.arch != "llama" && s.arch != "lfm2") return bad("unknown architecture '" + s.arch + "' (use llama or lfm2)");
  if (s.arch == "lfm2" && s.embedding) return bad("an lfm2 model is not written as an embedding model");
  if (s.arch == "lfm2" && s.n_layer < 2) return bad("an lfm2 model needs 2 layers or more (a convolution and an attention one)");
  return Status::Ok();
}

Status WriteDemoModel(const DemoModelSpec& spec, const std::string& out_path) {
  SPILLWAY_RETURN_IF_ERROR(ValidateDemoModelSpec(spec));
  const ggml_type wtype = *ParseType(spec.type);

  gguf_init_params vp{/*no_alloc=*/true, /*ctx=*/nullptr};
  GgufPtr vocab(gguf_init_from_file(spec.vocab_path.c_str(), vp));
  if (!vocab) return Status::InvalidArgument("cannot read vocabulary GGUF " + spec.vocab_path);
  const int64_t tok_key = gguf_find_key(vocab.get(), "tokenizer.ggml.tokens");
  if (tok_key < 0) return Status::InvalidArgument(spec.vocab_path + " has no tokenizer.ggml.tokens");
  if (gguf_get_kv_type(vocab.get(), tok_key) != GGUF_TYPE_ARRAY || gguf_get_arr_type(vocab.get(), tok_key) != GGUF_TYPE_STRING) {
    return Status::InvalidArgument(spec.vocab_path + ": tokenizer.ggml.tokens is not an array of strings");
  }
  const int64_t n_vocab = static_cast<int64_t>(gguf_get_arr_n(vocab.get(), tok_key));

  GgufPtr out(gguf_init_empty());
  // Copy the tokenizer, drop everything else the vocabulary file carries.
  gguf_set_kv(out.get(), vocab.get());
  for (int64_t i = gguf_get_n_kv(out.get()) - 1; i >= 0; --i) {
    const std::string key = gguf_get_key(out.get(), i);
    if (key.rfind("tokenizer.", 0) != 0) gguf_remove_key(out.get(), key.c_str());
  }
  const std::string arch = spec.arch;
  auto key = [&](const char* k) { return arch + "." + k; };
  gguf_set_val_str(out.get(), "general.architecture", arch.c_str());
  gguf_set_val_str(out.get(), "general.name", spec.name.c_str());
  gguf_set_val_str(out.get(), "general.type", "model");
  gguf_set_val_u32(out.get(), "general.file_type", FileTypeFor(wtype));
  if (ggml_is_quantized(wtype)) gguf_set_val_u32(out.get(), "general.quantization_version", GGML_QNT_VERSION);
  gguf_set_val_u32(out.get(), key("vocab_size").c_str(), static_cast<uint32_t>(n_vocab));
  gguf_set_val_u32(out.get(), key("context_length").c_str(), spec.n_ctx_train);
  gguf_set_val_u32(out.get(), key("embedding_length").c_str(), spec.n_embd);
  gguf_set_val_u32(out.get(), key("block_count").c_str(), spec.n_layer);
  gguf_set_val_u32(out.get(), key("feed_forward_length").c_str(), spec.n_ff);
  gguf_set_val_u32(out.get(), key("attention.head_count").c_str(), spec.n_head);
  if (arch == "lfm2") {
    // Per layer: none for the convolution layers (llama.cpp's sign of a recurrent layer).
    std::vector<int32_t> kv(spec.n_layer);
    for (uint32_t i = 0; i < spec.n_layer; ++i) kv[i] = IsConvLayer(spec, i) ? 0 : static_cast<int32_t>(spec.n_head_kv);
    gguf_set_arr_data(out.get(), key("attention.head_count_kv").c_str(), GGUF_TYPE_INT32, kv.data(), kv.size());
    gguf_set_val_u32(out.get(), key("shortconv.l_cache").c_str(), kShortConvCache);
  } else {
    gguf_set_val_u32(out.get(), key("attention.head_count_kv").c_str(), spec.n_head_kv);
  }
  gguf_set_val_u32(out.get(), key("rope.dimension_count").c_str(), spec.n_embd / spec.n_head);
  gguf_set_val_f32(out.get(), key("rope.freq_base").c_str(), 10000.0f);
  gguf_set_val_f32(out.get(), key("attention.layer_norm_rms_epsilon").c_str(), 1e-5f);
  gguf_set_val_str(out.get(), "spillway.demo.note", "random weights: output is meaningless text");
  gguf_set_val_u64(out.get(), "spillway.demo.seed", spec.seed);
  if (spec.embedding) {
    // LLAMA_POOLING_TYPE_MEAN, _CLS, _LAST
    gguf_set_val_u32(out.get(), key("pooling_type").c_str(), spec.pooling == "cls" ? 2 : spec.pooling == "last" ? 3 : 1);
  } else {
    gguf_set_val_str(out.get(), "tokenizer.chat_template",
                     spec.chat_template.empty() ? kDemoChatTemplate : spec.chat_template.c_str());
  }

  const auto plan = PlanTensors(spec, n_vocab, wtype);
  ggml_init_params gp{ggml_tensor_overhead() * (plan.size() + 1), nullptr, /*no_alloc=*/true};
  std::unique_ptr<ggml_context, GgmlFree> meta(ggml_init(gp));
  for (const auto& tp : plan) {
    ggml_tensor* t = tp.ne1 == 1 ? ggml_new_tensor_1d(meta.get(), tp.type, tp.ne0)
                                 : ggml_new_tensor_2d(meta.get(), tp.type, tp.ne0, tp.ne1);
    ggml_set_name(t, tp.name.c_str());
    gguf_add_tensor(out.get(), t);
  }

  const std::string tmp = out_path + ".tmp";
  std::error_code ec;
  const auto parent = std::filesystem::path(out_path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (!gguf_write_to_file(out.get(), tmp.c_str(), /*only_meta=*/true)) {
    return Status::Internal("cannot write " + tmp);
  }
  const size_t align = GGUF_DEFAULT_ALIGNMENT;
  if (spec.weights_as_holes) {
    uint64_t data = 0;
    for (const auto& tp : plan) data += (ggml_row_size(tp.type, tp.ne0) * static_cast<size_t>(tp.ne1) + align - 1) / align * align;
    std::filesystem::resize_file(tmp, std::filesystem::file_size(tmp, ec) + data, ec);
    if (ec) return Status::Internal("cannot extend " + tmp + ": " + ec.message());
    std::filesystem::rename(tmp, out_path, ec);
    if (ec) return Status::Internal("cannot rename " + tmp + " to " + out_path + ": " + ec.message());
    return Status::Ok();
  }
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(tmp.c_str(), "ab"), &std::fclose);
  if (!f) return Status::Internal("cannot append to " + tmp);
  const std::vector<uint8_t> zeros(align, 0);
  for (const auto& tp : plan) {
    const auto bytes = TensorBytes(spec, tp);
    if (std::fwrite(bytes.data(), 1, bytes.size(), f.get()) != bytes.size()) {
      return Status::Internal("short write to " + tmp);
    }
    const size_t pad = (align - bytes.size() % align) % align;
    if (pad && std::fwrite(zeros.data(), 1, pad, f.get()) != pad) return Status::Internal("short write to " + tmp);
  }
  if (std::fflush(f.get()) != 0) return Status::Internal("flush failed on " + tmp);
  f.reset();
  std::filesystem::rename(tmp, out_path, ec);
  if (ec) return Status::Internal("cannot rename " + tmp + " to " + out_path + ": " + ec.message());
  return Status::Ok();
}

}  // namespace spillway
