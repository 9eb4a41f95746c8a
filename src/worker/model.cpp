#include "worker/model.h"

#include <ggml-backend.h>
#include <llama.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <thread>

#include "common/hash.h"
#include "common/names.h"
#include "worker/prompt_tokens.h"
#include "worker/sim_control.h"

namespace spillway::worker {

using nlohmann::json;
namespace fs = std::filesystem;

json Placement::ToJson() const {
  return {{"device", device}, {"gpu_layers", gpu_layers}, {"ctx", ctx},   {"slots", slots},
          {"threads", threads}, {"batch", batch},         {"mmap", mmap}};
}

json Fingerprint::ToJson() const {
  return {{"id", id},
          {"model_sha256", model_sha256},
          {"tokenizer_sha256", tokenizer_sha256},
          {"chat_template_sha256", chat_template_sha256},
          {"quantization", quantization},
          {"sampler_defaults", sampler_defaults},
          {"stop_rules", stop_rules}};
}

namespace {

std::mutex g_log_mu;
std::string g_recent_errors;
int g_log_level = GGML_LOG_LEVEL_WARN;
// Per thread: a continuation line (GGML_LOG_LEVEL_CONT) belongs to its own
// thread's last line (the HTTP threads tokenize while the engine decodes; a
// shared one was a data race, and could file an error's rest as a warning).
thread_local ggml_log_level g_last_level = GGML_LOG_LEVEL_NONE;

void LlamaLog(ggml_log_level level, const char* text, void*) {
  const ggml_log_level effective = level == GGML_LOG_LEVEL_CONT ? g_last_level : level;
  if (level != GGML_LOG_LEVEL_CONT) g_last_level = level;
  if (effective >= g_log_level) std::fputs(text, stderr);
  if (effective == GGML_LOG_LEVEL_ERROR) {
    std::lock_guard<std::mutex> lk(g_log_mu);
    g_recent_errors += text;
    if (g_recent_errors.size() > 4096) g_recent_errors.erase(0, g_recent_errors.size() - 4096);
  }
}

}  // namespace

void InstallLlamaLog(int min_level) {
  g_log_level = min_level;
  llama_log_set(LlamaLog, nullptr);
}

std::string RecentLlamaErrors() {
  std::lock_guard<std::mutex> lk(g_log_mu);
  return g_recent_errors;
}

void ClearLlamaErrors() {
  std::lock_guard<std::mutex> lk(g_log_mu);
  g_recent_errors.clear();
}

namespace {

bool IsAccelerator(const std::string& device) { return device != "cpu"; }

Status LoadModule(const fs::path& dir, const std::string& stem) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string f = e.path().filename().string();
    if (f.rfind("lib" + stem, 0) == 0 && e.path().extension() == ".so") {
      if (ggml_backend_load(e.path().c_str()) != nullptr) return Status::Ok();
    }
  }
  return Status::NotFound("no loadable ggml backend '" + stem + "' in " + dir.string());
}

}  // namespace

Status LoadBackends(const std::string& dir, const std::string& device) {
  if (ggml_backend_reg_by_name("CPU") == nullptr) SPILLWAY_RETURN_IF_ERROR(LoadModule(dir, "ggml-cpu"));
  if (!IsAccelerator(device)) return Status::Ok();
  const auto name = ParseDeviceName(device);
  if (!name) return Status::InvalidArgument("bad device '" + device + "' (cpu, cuda:N or sim:N)");
  const std::string& kind = name->kind;
  if (kind == "cuda") {
    if (ggml_backend_reg_by_name("CUDA") == nullptr) SPILLWAY_RETURN_IF_ERROR(LoadModule(dir, "ggml-cuda"));
    return Status::Ok();
  }
  if (kind == "sim") {
    if (ggml_backend_reg_by_name("SIM") == nullptr) SPILLWAY_RETURN_IF_ERROR(LoadModule(dir, "ggml-sim"));
    return Status::Ok();
  }
  return Status::InvalidArgument("unknown device kind '" + kind + "' (cpu, cuda:N or sim:N)");
}

namespace {

StatusOr<std::vector<ggml_backend_dev_t>> DevicesFor(const std::string& device) {
  std::vector<ggml_backend_dev_t> out;
  if (!IsAccelerator(device)) return out;
  const auto name = ParseDeviceName(device);
  if (!name) return Status::InvalidArgument("bad device '" + device + "'");
  const std::string& kind = name->kind;
  const int index = name->index;
  if (kind == "sim") {
    // Devices are named after their ledger: SIM<N> is sim:N.
    if (ggml_backend_dev_t dev = ggml_backend_dev_by_name(("SIM" + std::to_string(index)).c_str())) {
      out.push_back(dev);
      return out;
    }
    return Status::Unavailable("simulated device '" + device + "' does not exist (create it with `spillway sim create " +
                               device + " --capacity-mib N`)");
  }
  std::string reg_name = kind == "cuda" ? "CUDA" : kind;
  ggml_backend_reg_t reg = ggml_backend_reg_by_name(reg_name.c_str());
  if (!reg) return Status::Unavailable("backend for '" + device + "' is not loaded");
  if (index >= static_cast<int>(ggml_backend_reg_dev_count(reg))) {
    return Status::Unavailable("device '" + device + "' does not exist");
  }
  out.push_back(ggml_backend_reg_dev_get(reg, index));
  return out;
}

// The first non-empty line of `text` (llama.cpp's cause; the lines after
// it say that the load failed), without its line break.
std::string FirstLine(const std::string& text) {
  const size_t start = text.find_first_not_of("\r\n ");
  if (start == std::string::npos) return "";
  const size_t end = text.find_first_of("\r\n", start);
  return text.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

std::string MetaString(const llama_model* m, const char* key) {
  char buf[512];
  int n = llama_model_meta_val_str(m, key, buf, sizeof buf);
  return n < 0 ? std::string() : std::string(buf, std::min<size_t>(n, sizeof buf - 1));
}

}  // namespace

Model::~Model() {
  if (model_) llama_model_free(model_);
}

StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& path, const Placement& placement,
                                             const std::function<void(float)>& on_progress) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return Status::NotFound("model file not found: " + path);
  auto devices = DevicesFor(placement.device);
  if (!devices.ok()) return devices.status();

  std::unique_ptr<Model> m(new Model());
  m->path_ = path;
  m->devices_ = *devices;
  std::vector<ggml_backend_dev_t> list = m->devices_;
  list.push_back(nullptr);  // an explicit list: a CPU placement offloads nowhere

  llama_model_params mp = llama_model_default_params();
  mp.devices = list.data();
  mp.n_gpu_layers = m->devices_.empty() ? 0 : placement.gpu_layers;
  mp.load_mode = placement.mmap && !placement.dry_run ? LLAMA_LOAD_MODE_MMAP : LLAMA_LOAD_MODE_NONE;
  mp.no_alloc = placement.dry_run;
  mp.split_mode = LLAMA_SPLIT_MODE_LAYER;
  // Told to the caller (the default callback prints progress dots on stderr).
  mp.progress_callback = [](float fraction, void* user) {
    const auto* f = static_cast<const std::function<void(float)>*>(user);
    if (*f) (*f)(fraction);
    return true;
  };
  mp.progress_callback_user_data = const_cast<std::function<void(float)>*>(&on_progress);
  auto sim = SimControl::Find();
  if (sim) sim->SetPhase(SPILLWAY_SIM_PHASE_LOAD);
  ClearLlamaErrors();  // (what llama.cpp reports from here on is this load's)
  m->model_ = llama_model_load_from_file(path.c_str(), mp);
  if (sim) sim->SetPhase(SPILLWAY_SIM_PHASE_NONE);
  if (!m->model_) {
    // llama.cpp returns the same NULL for an invalid file and for a failed
    // buffer allocation: its own error lines tell them apart ("unable to
    // allocate ... buffer"; "tensor 'token_embd.weight' not found").
    const std::string errors = RecentLlamaErrors();
    const std::string why = FirstLine(errors);
    std::string lower = errors;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const bool memory = lower.find("alloc") != std::string::npos || lower.find("out of memory") != std::string::npos;
    // (A dry run allocates nothing: the file itself is refused.)
    if (placement.dry_run || (!memory && !why.empty())) {
      return Status::InvalidArgument("llama.cpp could not open " + path + ": " +
                                     (why.empty() ? "an invalid GGUF, or an architecture or tensor layout this "
                                                    "llama.cpp does not run"
                                                  : why))
          .WithPhase(FailurePhase::kLoad);
    }
    return Status::ResourceExhausted("llama.cpp could not load " + path + " (the weights do not fit on " +
                                     placement.device + (why.empty() ? "" : ": " + why) + ")")
        .WithPhase(FailurePhase::kLoad);
  }
  m->vocab_ = llama_model_get_vocab(m->model_);
  m->name_ = MetaString(m->model_, "general.name");
  if (m->name_.empty()) m->name_ = fs::path(path).stem().string();
  const std::string arch = MetaString(m->model_, "general.architecture");
  // A pooling type other than none (0): an embedding model (models/model_info.cpp and the estimator agree).
  const std::string pooling = MetaString(m->model_, (arch + ".pooling_type").c_str());
  m->embedding_ = !pooling.empty() && pooling != "0";
  m->pooling_ = pooling.empty() ? 0 : std::atoi(pooling.c_str());
  if (const char* t = llama_model_chat_template(m->model_, nullptr)) m->chat_template_ = t;
  if (!m->embedding_ && !placement.dry_run) {
    auto chat = ChatTemplates::ForModel(m->model_);
    if (!chat.ok()) return chat.status();
    m->chat_ = std::move(*chat);
  }
  // (A dry run plans buffers: hashing a file of gigabytes would be most of its time.)
  if (!placement.dry_run) SPILLWAY_RETURN_IF_ERROR(m->ComputeFingerprint());
  return m;
}

int Model::n_ctx_train() const { return llama_model_n_ctx_train(model_); }
bool Model::rotary_positions() const { return llama_model_rope_type(model_) != LLAMA_ROPE_TYPE_NONE; }
int Model::n_embd() const { return llama_model_n_embd(model_); }
int Model::n_embd_out() const { return llama_model_n_embd_out(model_); }

int Model::pooling_type() const {
  switch (pooling_) {
    case LLAMA_POOLING_TYPE_MEAN:
    case LLAMA_POOLING_TYPE_CLS:
    case LLAMA_POOLING_TYPE_LAST: return pooling_;
    default: return LLAMA_POOLING_TYPE_MEAN;
  }
}

Status Model::ComputeFingerprint() {
  auto sha = Sha256File(path_);
  if (!sha.ok()) return sha.status();
  fingerprint_.model_sha256 = *sha;

  // The tokenizer as llama.cpp sees it: every token's text, score and
  // attributes, the special tokens and the BOS/EOS policy.
  std::string tok;
  const int n = llama_vocab_n_tokens(vocab_);
  tok.reserve(static_cast<size_t>(n) * 16);
  tok += std::to_string(llama_vocab_type(vocab_)) + "|" + std::to_string(n) + "|";
  for (int i = 0; i < n; ++i) {
    tok += llama_vocab_get_text(vocab_, i);
    tok += '\x1f' + std::to_string(llama_vocab_get_score(vocab_, i)) + '\x1f' +
           std::to_string(static_cast<int>(llama_vocab_get_attr(vocab_, i))) + '\x1e';
  }
  tok += std::to_string(llama_vocab_bos(vocab_)) + "|" + std::to_string(llama_vocab_eos(vocab_)) + "|" +
         std::to_string(llama_vocab_get_add_bos(vocab_));
  fingerprint_.tokenizer_sha256 = Sha256Hex(tok);
  fingerprint_.chat_template_sha256 = Sha256Hex(chat_template_);

  char desc[256];
  llama_model_desc(model_, desc, sizeof desc);
  fingerprint_.quantization = MetaString(model_, "general.file_type");
  fingerprint_.quantization = std::string(desc) + " (file_type " + fingerprint_.quantization + ")";
  fingerprint_.sampler_defaults = SamplingJson(sampler_defaults_, false);
  json eog = json::array();
  eog_tokens_.clear();
  for (int i = 0; i < n; ++i) {
    if (llama_vocab_is_eog(vocab_, i)) eog_tokens_.push_back(i);
  }
  for (int32_t t : eog_tokens_) eog.push_back(t);
  fingerprint_.stop_rules = {{"eog_tokens", eog}, {"stop_strings_from_request", true}};
  json all = fingerprint_.ToJson();
  all.erase("id");
  fingerprint_.id = Sha256Hex(all.dump());
  return Status::Ok();
}

bool Model::IsEndToken(int32_t token) const {
  return token != LLAMA_TOKEN_NULL && (token == llama_vocab_eos(vocab_) || token == llama_vocab_sep(vocab_));
}

StatusOr<std::vector<int32_t>> Model::Tokenize(const std::string& text, bool add_special) const {
  return TokenizeText(vocab_, text, add_special);
}

StatusOr<std::vector<int32_t>> Model::CheckTokens(std::vector<int32_t> tokens) const {
  const int32_t n = llama_vocab_n_tokens(vocab_);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= n) {
      return Status::InvalidArgument("prompt token " + std::to_string(i) + " (" + std::to_string(tokens[i]) +
                                     ") is outside the vocabulary of " + std::to_string(n));
    }
  }
  return tokens;
}

std::string Model::TokenPiece(int32_t token, bool special) const {
  char buf[256];
  int n = llama_token_to_piece(vocab_, token, buf, sizeof buf, 0, special);
  if (n >= 0) return std::string(buf, static_cast<size_t>(n));
  std::string big(static_cast<size_t>(-n), '\0');
  n = llama_token_to_piece(vocab_, token, big.data(), static_cast<int32_t>(big.size()), 0, special);
  return n < 0 ? std::string() : big.substr(0, static_cast<size_t>(n));
}

bool Model::IsEndOfGeneration(int32_t token) const { return llama_vocab_is_eog(vocab_, token); }

json Model::Describe() const {
  char desc[256];
  llama_model_desc(model_, desc, sizeof desc);
  return {{"path", path_},
          {"name", name_},
          {"description", desc},
          {"kind", embedding_ ? "embedding" : "chat"},
          {"size_bytes", llama_model_size(model_)},
          {"n_params", llama_model_n_params(model_)},
          {"n_layer", llama_model_n_layer(model_)},
          {"n_embd", llama_model_n_embd(model_)},
          {"pooling", !embedding_                                  ? "none"
                      : pooling_type() == LLAMA_POOLING_TYPE_CLS  ? "cls"
                      : pooling_type() == LLAMA_POOLING_TYPE_LAST ? "last"
                                                                  : "mean"},
          {"n_ctx_train", llama_model_n_ctx_train(model_)},
          {"n_vocab", llama_vocab_n_tokens(vocab_)}};
}

}  // namespace spillway::worker
