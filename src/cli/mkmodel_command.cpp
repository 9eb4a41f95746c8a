#include "cli/mkmodel_command.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <memory>

#include "gguf/demo_model.h"
#include "gguf/whisper_model.h"

namespace spillway::cli {

namespace {

struct MkmodelArgs {
  std::string kind = "llama";
  std::string preset = "tiny";
  std::string out;
  std::string vocab;
  std::string chat_template_file;
  DemoModelSpec overrides;
  uint32_t audio_ctx = 0;
  bool set_layers = false, set_embd = false, set_heads = false, set_kv = false, set_ff = false, set_ctx = false,
       set_type = false, set_seed = false, embedding = false;
};

// The options that only shape a llama model.
constexpr const char* kLlamaOnly[] = {"--preset", "--kv-heads", "--ffn", "--embedding", "--pooling", "--chat-template",
                                      "--mutate-one-weight", "--arch"};

// --kind whisper: a whisper.cpp model with the options that apply to it.
int WriteWhisper(const MkmodelArgs& a, const CLI::App& cmd) {
  for (const char* opt : kLlamaOnly) {
    if (cmd.count(opt)) {
      std::fprintf(stderr, "spillway mkmodel: %s does not apply to --kind whisper\n", opt);
      return 2;
    }
  }
  WhisperModelSpec s;
  s.vocab_path = a.vocab;
  if (cmd.count("--layers")) s.n_layer = a.overrides.n_layer;
  if (cmd.count("--width")) s.n_state = a.overrides.n_embd;
  if (cmd.count("--heads")) s.n_head = a.overrides.n_head;
  if (cmd.count("--ctx")) s.n_text_ctx = a.overrides.n_ctx_train;
  if (cmd.count("--type")) s.type = a.overrides.type;
  if (cmd.count("--seed")) s.seed = a.overrides.seed;
  if (cmd.count("--audio-ctx")) s.n_audio_ctx = a.audio_ctx;
  Status st = WriteWhisperModel(s, a.out);
  if (!st.ok()) {
    std::fprintf(stderr, "spillway mkmodel: %s\n", st.message().c_str());
    return st.code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::error_code ec;
  const auto size = std::filesystem::file_size(a.out, ec);
  std::printf("wrote %s (whisper, English vocabulary, %u+%u layers, width %u, %s, %.1f MiB)\n", a.out.c_str(),
              s.n_layer, s.n_layer, s.n_state, s.type.c_str(), static_cast<double>(size) / (1 << 20));
  return 0;
}

}  // namespace

void AddMkmodelCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<MkmodelArgs>();
  CLI::App* cmd = app.add_subcommand(
      "mkmodel",
      "Write a deterministic model with random weights and a real tokenizer: a llama-architecture GGUF,\n"
      "or (--kind whisper) a whisper.cpp model for whisper-server, with an English (GPT-2) vocabulary.\n"
      "Its output is meaningless text; it exists so that every code path runs without real weights.");
  cmd->add_option("--kind", args->kind, "llama | whisper")->capture_default_str()->check(CLI::IsMember({"llama", "whisper"}));
  cmd->add_option("--preset", args->preset, "tiny | demo-chat | demo-embed | bench | bench-large")->capture_default_str();
  cmd->add_option("--out", args->out, "output path (.gguf; whisper: .bin)")->required();
  cmd->add_option("--vocab", args->vocab,
                  "vocabulary GGUF (llama.cpp's models/ggml-vocab-llama-spm.gguf; whisper: ggml-vocab-gpt-2.gguf)")
      ->required();
  cmd->add_option("--layers", args->overrides.n_layer, "override: layer count (whisper: encoder and decoder each, 2)");
  cmd->add_option("--width", args->overrides.n_embd, "override: embedding width (whisper: 64)");
  cmd->add_option("--heads", args->overrides.n_head, "override: attention heads (whisper: 4)");
  cmd->add_option("--kv-heads", args->overrides.n_head_kv, "override: KV heads");
  cmd->add_option("--ffn", args->overrides.n_ff, "override: feed-forward width");
  cmd->add_option("--ctx", args->overrides.n_ctx_train, "override: training context length (whisper: decoder's, 64)");
  cmd->add_option("--type", args->overrides.type, "override: f32 | f16 | q8_0 | q4_0 (whisper: f16 | q8_0 | q4_0)");
  cmd->add_option("--seed", args->overrides.seed, "override: weight seed");
  cmd->add_option("--audio-ctx", args->audio_ctx, "whisper only: encoder positions, 50 per second of audio (100)");
  cmd->add_option("--arch", args->overrides.arch,
                  "llama, or lfm2: a hybrid whose even layers are short convolutions with a recurrent state "
                  "instead of attention (LFM2's layout; its KV heads are given per layer)")
      ->capture_default_str()
      ->check(CLI::IsMember({"llama", "lfm2"}));
  cmd->add_flag("--embedding", args->embedding, "make an embedding model");
  cmd->add_option("--pooling", args->overrides.pooling, "with --embedding: how its vectors are pooled")
      ->capture_default_str()
      ->check(CLI::IsMember({"mean", "cls", "last"}));
  cmd->add_option("--chat-template", args->chat_template_file,
                  "jinja chat template file to write into the model (llama.cpp's models/templates/*.jinja; "
                  "default: Qwen 2.5's without its default system prompt)")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--mutate-one-weight", args->overrides.mutate_one_weight,
                "for tests: change one weight (layer 0's first attention-norm gain), as a corrupted copy would");
  cmd->callback([args, exit_code, cmd] {
    if (args->kind == "whisper") {
      *exit_code = WriteWhisper(*args, *cmd);
      return;
    }
    if (cmd->count("--audio-ctx")) {
      std::fprintf(stderr, "spillway mkmodel: --audio-ctx applies to --kind whisper only\n");
      *exit_code = 2;
      return;
    }
    auto spec = DemoModelPreset(args->preset);
    if (!spec.ok()) {
      std::fprintf(stderr, "spillway mkmodel: %s\n", spec.status().message().c_str());
      *exit_code = 2;
      return;
    }
    DemoModelSpec s = *spec;
    const auto& o = args->overrides;
    if (cmd->count("--layers")) s.n_layer = o.n_layer;
    if (cmd->count("--width")) s.n_embd = o.n_embd;
    if (cmd->count("--heads")) s.n_head = o.n_head;
    if (cmd->count("--kv-heads")) s.n_head_kv = o.n_head_kv;
    if (cmd->count("--ffn")) s.n_ff = o.n_ff;
    if (cmd->count("--ctx")) s.n_ctx_train = o.n_ctx_train;
    if (cmd->count("--type")) s.type = o.type;
    if (cmd->count("--seed")) s.seed = o.seed;
    s.arch = o.arch;
    if (args->embedding) s.embedding = true;
    if (cmd->count("--pooling") && !s.embedding) {
      std::fprintf(stderr, "spillway mkmodel: --pooling applies to --embedding models only\n");
      *exit_code = 2;
      return;
    }
    if (cmd->count("--pooling")) s.pooling = args->overrides.pooling;
    s.mutate_one_weight = args->overrides.mutate_one_weight;
    s.vocab_path = args->vocab;
    if (!args->chat_template_file.empty()) {
      std::ifstream in(args->chat_template_file, std::ios::binary);
      std::ostringstream text;
      text << in.rdbuf();
      if (!in || text.str().empty()) {
        std::fprintf(stderr, "spillway mkmodel: cannot read chat template %s\n", args->chat_template_file.c_str());
        *exit_code = 1;
        return;
      }
      s.chat_template = text.str();
    }
    Status st = WriteDemoModel(s, args->out);
    if (!st.ok()) {
      std::fprintf(stderr, "spillway mkmodel: %s\n", st.message().c_str());
      *exit_code = 1;
      return;
    }
    std::error_code ec;
    const auto size = std::filesystem::file_size(args->out, ec);
    std::printf("wrote %s (%s, %u layers, width %u, %s, %.1f MiB)\n", args->out.c_str(), s.name.c_str(), s.n_layer,
                s.n_embd, s.type.c_str(), static_cast<double>(size) / (1 << 20));
  });
}

}  // namespace spillway::cli
