#include "gguf/whisper_model.h"

#include <ggml.h>
#include <gguf.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "gguf/random_weights.h"

namespace spillway {

namespace {

constexpr uint32_t kGgmlMagic = 0x67676d6c;  // "ggml", whisper.cpp's GGML_FILE_MAGIC
constexpr int32_t kMels = 80;                // every model but large-v3's 128
constexpr int32_t kFftBins = 201;            // 1 + WHISPER_N_FFT (400) / 2
constexpr int32_t kGpt2Tokens = 50256;       // GPT-2's tokens before <|endoftext|>

// A file writer that remembers its first failure (checked once, at the end).
class Out {
 public:
  explicit Out(const std::string& path) : f_(std::fopen(path.c_str(), "wb"), &std::fclose) {
    if (!f_) error_ = errno;
  }
  bool open() const { return f_ != nullptr; }
  void Bytes(const void* p, size_t n) {
    if (f_ && error_ == 0 && std::fwrite(p, 1, n, f_.get()) != n) error_ = errno ? errno : EIO;
  }
  void I32(int32_t v) { Bytes(&v, sizeof v); }  // the format is little-endian, as this machine
  // 0 on success, else an errno value.
  int Close() {
    if (f_ && std::fflush(f_.get()) != 0 && error_ == 0) error_ = errno;
    f_.reset();
    return error_;
  }

 private:
  std::unique_ptr<FILE, int (*)(FILE*)> f_;
  int error_ = 0;
};

// Whisper's mel filter bank (librosa.filters.mel(sr=16000, n_fft=400,
// n_mels=80): Slaney's mel scale and area normalization), row-major [mel][bin].
std::vector<float> MelFilters() {
  auto hz_to_mel = [](double f) {
    return f < 1000.0 ? f / (200.0 / 3.0) : 15.0 + std::log(f / 1000.0) / (std::log(6.4) / 27.0);
  };
  auto mel_to_hz = [](double m) {
    return m < 15.0 ? m * (200.0 / 3.0) : 1000.0 * std::exp((m - 15.0) * (std::log(6.4) / 27.0));
  };
  std::vector<double> hz(kMels + 2);
  const double top = hz_to_mel(8000.0);
  for (int i = 0; i < kMels + 2; ++i) hz[i] = mel_to_hz(top * i / (kMels + 1));
  std::vector<float> w(static_cast<size_t>(kMels) * kFftBins, 0.0f);
  for (int m = 0; m < kMels; ++m) {
    const double norm = 2.0 / (hz[m + 2] - hz[m]);
    for (int k = 0; k < kFftBins; ++k) {
      const double f = k * 16000.0 / 400.0;
      const double rise = (f - hz[m]) / (hz[m + 1] - hz[m]), fall = (hz[m + 2] - f) / (hz[m + 2] - hz[m + 1]);
      w[static_cast<size_t>(m) * kFftBins + k] = static_cast<float>(std::max(0.0, std::min(rise, fall)) * norm);
    }
  }
  return w;
}

// GPT-2's byte-level BPE writes each byte as a printable character
// (bytes_to_unicode); whisper.cpp's files hold the raw bytes.
std::string TokenBytes(const std::string& text) {
  static const std::vector<int> byte_of = [] {
    std::vector<int> m(512, -1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      m[printable ? b : 256 + extra++] = b;
    }
    return m;
  }();
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    int cp = c, len = 1;
    if (c >= 0xC0 && c < 0xE0 && i + 1 < text.size()) {
      cp = ((c & 0x1F) << 6) | (static_cast<unsigned char>(text[i + 1]) & 0x3F);
      len = 2;
    }
    out.push_back(static_cast<char>(cp < 512 && byte_of[cp] >= 0 ? byte_of[cp] : c));
    i += len;
  }
  return out;
}

StatusOr<std::vector<std::string>> ReadGpt2Vocab(const std::string& path) {
  gguf_init_params p{/*no_alloc=*/true, /*ctx=*/nullptr};
  std::unique_ptr<gguf_context, void (*)(gguf_context*)> v(gguf_init_from_file(path.c_str(), p), &gguf_free);
  if (!v) return Status::InvalidArgument("cannot read vocabulary GGUF " + path);
  const int64_t key = gguf_find_key(v.get(), "tokenizer.ggml.tokens");
  // An array of strings (ggml asserts the element type of what it is asked
  // for: an array of numbers under the key aborted the process).
  const bool strings = key >= 0 && gguf_get_kv_type(v.get(), key) == GGUF_TYPE_ARRAY &&
                       gguf_get_arr_type(v.get(), key) == GGUF_TYPE_STRING;
  const int64_t n = strings ? static_cast<int64_t>(gguf_get_arr_n(v.get(), key)) : 0;
  if (n <= kGpt2Tokens || std::string(gguf_get_arr_str(v.get(), key, kGpt2Tokens)) != "<|endoftext|>") {
    return Status::InvalidArgument(path + " is not GPT-2's vocabulary (token " + std::to_string(kGpt2Tokens) +
                                   " must be <|endoftext|>; use llama.cpp's models/ggml-vocab-gpt-2.gguf)");
  }
  std::vector<std::string> tokens(kGpt2Tokens);
  for (int32_t i = 0; i < kGpt2Tokens; ++i) tokens[i] = TokenBytes(gguf_get_arr_str(v.get(), key, i));
  return tokens;
}

// The matrices' type and whisper.cpp's ftype for it (ggml_ftype: 1 F16, 7 Q8_0,
// 2 Q4_0). No f32: whisper.cpp 1.9.1 then keeps the convolution kernels in
// f32 too, and its CPU im2col asserts F16 kernels, so such a model loads but
// aborts at its first transcription.
struct WeightType {
  ggml_type type;
  int32_t ftype;
};
StatusOr<WeightType> ParseWeightType(const std::string& t) {
  if (t == "f16") return WeightType{GGML_TYPE_F16, 1};
  if (t == "q8_0") return WeightType{GGML_TYPE_Q8_0, 7};
  if (t == "q4_0") return WeightType{GGML_TYPE_Q4_0, 2};
  if (t == "f32") {
    return Status::InvalidArgument("f32 is refused: whisper.cpp 1.9.1's CPU convolution needs F16 kernels, so an f32 "
                                   "whisper model loads but aborts at its first transcription (use f16, q8_0 or q4_0)");
  }
  return Status::InvalidArgument("unknown weight type '" + t + "' (a whisper model is f16, q8_0 or q4_0)");
}

struct TensorPlan {
  std::string name;
  std::vector<int32_t> ne;  // ggml order: ne[0] is the row length
  ggml_type type;
  float scale;              // uniform in [-scale, scale]; 0: a constant (norm gains 1, norm biases 0)
  float constant = 0.0f;
};

std::vector<TensorPlan> PlanTensors(const WhisperModelSpec& s, ggml_type wtype) {
  const int32_t d = static_cast<int32_t>(s.n_state), ff = 4 * d;
  const ggml_type ctype = GGML_TYPE_F16;  // convolutions, in every model but an f32 one
  const float in_d = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<TensorPlan> t;
  auto norm = [&](const std::string& p) {
    t.push_back({p + ".weight", {d}, GGML_TYPE_F32, 0.0f, 1.0f});
    t.push_back({p + ".bias", {d}, GGML_TYPE_F32, 0.0f, 0.0f});
  };
  // Xavier-scaled matrices (uniform a = sqrt(3) * std): each sub-layer moves the residual stream.
  auto linear = [&](const std::string& p, int32_t in, int32_t out, bool bias) {
    t.push_back({p + ".weight", {in, out}, wtype, std::sqrt(3.0f / static_cast<float>(in))});
    if (bias) t.push_back({p + ".bias", {out}, GGML_TYPE_F32, 0.02f});
  };
  auto block = [&](const std::string& p, bool cross) {
    for (const char* attn : cross ? std::vector<const char*>{"attn", "cross_attn"} : std::vector<const char*>{"attn"}) {
      norm(p + attn + "_ln");
      linear(p + attn + ".query", d, d, true);
      linear(p + attn + ".key", d, d, false);
      linear(p + attn + ".value", d, d, true);
      linear(p + attn + ".out", d, d, true);
    }
    norm(p + "mlp_ln");
    linear(p + "mlp.0", d, ff, true);
    linear(p + "mlp.2", ff, d, true);
  };
  t.push_back({"encoder.positional_embedding", {d, static_cast<int32_t>(s.n_audio_ctx)}, GGML_TYPE_F32, 0.5f});
  t.push_back({"encoder.conv1.weight", {3, kMels, d}, ctype, std::sqrt(3.0f / (3 * kMels))});
  t.push_back({"encoder.conv1.bias", {1, d}, GGML_TYPE_F32, 0.02f});
  t.push_back({"encoder.conv2.weight", {3, d, d}, ctype, std::sqrt(3.0f / static_cast<float>(3 * d))});
  t.push_back({"encoder.conv2.bias", {1, d}, GGML_TYPE_F32, 0.02f});
  for (uint32_t i = 0; i < s.n_layer; ++i) block("encoder.blocks." + std::to_string(i) + ".", false);
  norm("encoder.ln_post");
  t.push_back({"decoder.positional_embedding", {d, static_cast<int32_t>(s.n_text_ctx)}, GGML_TYPE_F32, 0.5f});
  // Tied: the logits are the final state times this matrix; spread by ~3 over the vocabulary.
  t.push_back({"decoder.token_embedding.weight", {d, kWhisperEnglishVocab}, wtype, 3.0f * std::sqrt(3.0f) * in_d});
  for (uint32_t i = 0; i < s.n_layer; ++i) block("decoder.blocks." + std::to_string(i) + ".", true);
  norm("decoder.ln");
  return t;
}

void WriteTensor(Out& out, const WhisperModelSpec& s, const TensorPlan& tp) {
  size_t n = 1;
  for (int32_t x : tp.ne) n *= static_cast<size_t>(x);
  std::vector<float> f(n, tp.constant);
  if (tp.scale > 0.0f) {
    SplitMix64 rng{s.seed ^ HashName(tp.name)};
    for (auto& x : f) x = rng.NextUnit() * tp.scale;
  }
  out.I32(static_cast<int32_t>(tp.ne.size()));
  out.I32(static_cast<int32_t>(tp.name.size()));
  out.I32(static_cast<int32_t>(tp.type));  // F32 0, F16 1, Q4_0 2, Q8_0 8 in every ggml
  for (int32_t x : tp.ne) out.I32(x);
  out.Bytes(tp.name.data(), tp.name.size());
  const int64_t row = tp.ne[0], rows = static_cast<int64_t>(n) / row;
  std::vector<uint8_t> bytes(ggml_row_size(tp.type, row) * static_cast<size_t>(rows));
  if (tp.type == GGML_TYPE_F32) {
    std::memcpy(bytes.data(), f.data(), bytes.size());
  } else if (tp.type == GGML_TYPE_F16) {
    ggml_fp32_to_fp16_row(f.data(), reinterpret_cast<ggml_fp16_t*>(bytes.data()), static_cast<int64_t>(n));
  } else {
    ggml_quantize_chunk(tp.type, f.data(), bytes.data(), 0, rows, row, nullptr);
  }
  out.Bytes(bytes.data(), bytes.size());
}

}  // namespace

Status ValidateWhisperModelSpec(const WhisperModelSpec& s) {
  auto bad = [](const std::string& m) { return Status::InvalidArgument(m); };
  if (s.n_layer < 1 || s.n_layer > 64) return bad("layers must be in [1, 64]");
  if (s.n_state < 16 || s.n_state > 4096 || s.n_state % 16) return bad("width must be a multiple of 16 in [16, 4096]");
  if (s.n_head < 1 || s.n_state % s.n_head) return bad("heads must divide the width");
  if ((s.n_state / s.n_head) % 2) return bad("head dimension (width/heads) must be even");
  if (s.n_text_ctx < 16 || s.n_text_ctx > 4096) return bad("context (decoder positions) must be in [16, 4096]");
  if (s.n_audio_ctx < 16 || s.n_audio_ctx > 1500) return bad("audio context must be in [16, 1500]");
  auto t = ParseWeightType(s.type);
  if (!t.ok()) return t.status();
  if (ggml_is_quantized(t->type) && s.n_state % 32) return bad("a quantized model's width must be a multiple of 32");
  if (s.vocab_path.empty()) return bad("a vocabulary file is required (llama.cpp's models/ggml-vocab-gpt-2.gguf)");
  return Status::Ok();
}

Status WriteWhisperModel(const WhisperModelSpec& spec, const std::string& out_path) {
  SPILLWAY_RETURN_IF_ERROR(ValidateWhisperModelSpec(spec));
  auto vocab = ReadGpt2Vocab(spec.vocab_path);
  if (!vocab.ok()) return vocab.status();
  const WeightType wt = *ParseWeightType(spec.type);
  // Quantized files carry the quantization version in the ftype, as whisper.cpp's quantize tool writes it.
  const int32_t ftype = wt.ftype + (ggml_is_quantized(wt.type) ? GGML_QNT_VERSION * GGML_QNT_VERSION_FACTOR : 0);

  std::error_code ec;
  const auto parent = std::filesystem::path(out_path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  const std::string tmp = out_path + ".tmp";
  Out out(tmp);
  if (!out.open()) return Status::Internal("cannot write " + tmp + ": " + std::strerror(errno));

  out.I32(static_cast<int32_t>(kGgmlMagic));
  const int32_t d = static_cast<int32_t>(spec.n_state), h = static_cast<int32_t>(spec.n_head);
  const int32_t l = static_cast<int32_t>(spec.n_layer);
  for (int32_t v : {kWhisperEnglishVocab, static_cast<int32_t>(spec.n_audio_ctx), d, h, l,
                    static_cast<int32_t>(spec.n_text_ctx), d, h, l, kMels, ftype}) {
    out.I32(v);  // n_vocab, audio ctx/state/head/layer, text ctx/state/head/layer, n_mels, ftype
  }
  const auto filters = MelFilters();
  out.I32(kMels);
  out.I32(kFftBins);
  out.Bytes(filters.data(), filters.size() * sizeof(float));
  out.I32(static_cast<int32_t>(vocab->size()));
  for (const auto& tok : *vocab) {
    out.I32(static_cast<int32_t>(tok.size()));
    out.Bytes(tok.data(), tok.size());
  }
  for (const auto& tp : PlanTensors(spec, wt.type)) WriteTensor(out, spec, tp);
  if (int err = out.Close(); err != 0) {
    std::filesystem::remove(tmp, ec);
    return Status::Internal("cannot write " + tmp + ": " + std::strerror(err));
  }
  std::filesystem::rename(tmp, out_path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return Status::Internal("cannot rename " + tmp + " to " + out_path + ": " + ec.message());
  }
  return Status::Ok();
}

}  // namespace spillway
