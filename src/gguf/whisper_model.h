// Writes deterministic whisper models with random weights in whisper.cpp's
// own file format (the legacy ggml one of its ggml-*.bin models: magic
// "ggml", hyperparameters, mel filters, vocabulary, then named tensors), for
// tests of a second kind of service (whisper-server) on machines that have
// no model weights.
//
// The tokenizer is a real one: Whisper's English (".en") models use GPT-2's
// byte-level BPE, read here from llama.cpp's models/ggml-vocab-gpt-2.gguf,
// and whisper.cpp derives its special tokens (end of text, start of
// transcript, timestamps, ...) from the vocabulary size (51864: English).
// The mel filters are the Slaney filter bank Whisper uses. Transcripts are
// meaningless words: the weights are random. Same spec -> byte-identical file.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace spillway {

struct WhisperModelSpec {
  std::string vocab_path;      // GPT-2 vocabulary GGUF (llama.cpp's models/ggml-vocab-gpt-2.gguf)
  uint32_t n_layer = 2;        // encoder and decoder layers each
  uint32_t n_state = 64;       // width of both (whisper.cpp requires them equal); heads divide it
  uint32_t n_head = 4;
  uint32_t n_text_ctx = 64;    // decoder positions (real models: 448)
  // Encoder positions, one per 20 ms of audio: 100 = 2 s windows (real
  // models: 1500, 30 s). Short, so that a short clip fills most of the
  // window and the transcript depends on it, not on the silence it is padded with.
  uint32_t n_audio_ctx = 100;
  std::string type = "f16";    // f16 | q8_0 | q4_0 (matrices; convolutions f16; biases, norms, positions f32)
  uint64_t seed = 42;
};

// English vocabulary size: the 50256 GPT-2 tokens in the file plus the
// special and timestamp tokens whisper.cpp adds.
inline constexpr int32_t kWhisperEnglishVocab = 51864;

Status ValidateWhisperModelSpec(const WhisperModelSpec& spec);

// Writes the model to `out_path` (via a temporary file renamed into place).
Status WriteWhisperModel(const WhisperModelSpec& spec, const std::string& out_path);

}  // namespace spillway
