#include "models/model_info.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>

namespace spillway::models {

namespace fs = std::filesystem;

std::string FileTypeName(uint64_t t) {
  static const char* const kNames[] = {
      "F32",     "F16",    "Q4_0",   "Q4_1",   "",       "",       "",        "Q8_0",   "Q5_0",   "Q5_1",
      "Q2_K",    "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S",  "Q5_K_M", "Q6_K",   "IQ2_XXS",
      "IQ2_XS",  "Q2_K_S", "IQ3_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S",   "IQ3_M",  "IQ2_S",  "IQ2_M",
      "IQ4_XS",  "IQ1_M",  "BF16",   "",       "",       "",       "TQ1_0",   "TQ2_0",  "MXFP4_MOE"};
  return t < std::size(kNames) ? kNames[t] : "";
}

std::string ChatTemplateFamily(const std::string& t) {
  if (t.empty()) return "none";
  auto has = [&](const char* s) { return t.find(s) != std::string::npos; };
  // Most specific markers first (several families also use <|im_start|>-like tokens).
  if (has("<|channel|>") || has("<|start|>assistant")) return "gpt-oss";
  if (has("<|start_header_id|>")) return "llama3";
  if (has("<\xEF\xBD\x9C" "User\xEF\xBD\x9C>") || has("<|User|>")) return "deepseek";
  if (has("<start_of_turn>")) return "gemma";
  if (has("<|START_OF_TURN_TOKEN|>")) return "command-r";
  if (has("<|start_of_role|>")) return "granite";
  if (has("<|im_start|>")) return "chatml";
  if (has("[INST]") && (has("[AVAILABLE_TOOLS]") || has("[TOOL_CALLS]") || !has("<<SYS>>"))) return "mistral";
  if (has("<<SYS>>") || has("[INST]")) return "llama2";
  if (has("<|assistant|>") && has("<|end|>")) return "phi";
  if (has("<|assistant|>")) return "zephyr";
  return "other";
}

bool TemplateTakesTools(const std::string& t) { return t.find("tools") != std::string::npos; }

bool TemplateThinks(const std::string& t) {
  // <think> (DeepSeek-R1, Qwen3), enable_thinking (Qwen3, GLM), a reasoning
  // or thinking field of the history (gpt-oss, Magistral, Apriel), gpt-oss's channels.
  for (const char* marker : {"<think>", "enable_thinking", "reasoning", "thinking", "<|channel|>"}) {
    if (t.find(marker) != std::string::npos) return true;
  }
  return false;
}

std::string HumanCount(uint64_t n) {
  char buf[32];
  if (n >= 1'000'000'000) std::snprintf(buf, sizeof buf, "%.1fB", n / 1e9);
  else if (n >= 1'000'000) std::snprintf(buf, sizeof buf, "%.1fM", n / 1e6);
  else if (n >= 1'000) std::snprintf(buf, sizeof buf, "%.1fK", n / 1e3);
  else std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(n));
  return buf;
}

ModelSummary Summarize(const std::string& path, const gguf::Metadata& meta, int64_t modified_unix_s) {
  ModelSummary s;
  s.path = path;
  s.size = meta.file_size;
  s.modified_unix_s = modified_unix_s;
  s.architecture = meta.architecture();
  if (auto ft = meta.Uint("general.file_type")) s.quantization = FileTypeName(*ft);
  std::map<uint32_t, uint64_t> bytes_by_type;
  for (const auto& t : meta.tensors) {
    bytes_by_type[t.type] += t.bytes;
    uint64_t elements = 1;
    for (uint64_t d : t.dims) elements *= d;
    s.parameters += elements;
  }
  if (s.quantization.empty() && !bytes_by_type.empty()) {  // the type holding the most bytes
    const auto top = std::max_element(bytes_by_type.begin(), bytes_by_type.end(),
                                      [](const auto& a, const auto& b) { return a.second < b.second; });
    const gguf::TypeInfo* info = gguf::FindType(top->first);
    s.quantization = info ? info->name : "type " + std::to_string(top->first);
    for (auto& c : s.quantization) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  s.context_length = meta.ArchUint("context_length").value_or(0);
  const std::string tmpl = meta.String("tokenizer.chat_template").value_or("");
  s.template_family = ChatTemplateFamily(tmpl);
  s.embedding = meta.PoolsEmbeddings();
  s.tools = !s.embedding && TemplateTakesTools(tmpl);
  s.thinking = !s.embedding && TemplateThinks(tmpl);
  return s;
}

namespace {

// The file's modification time, unix seconds (0 and `ec` set when unknown).
int64_t ModifiedUnixSeconds(const std::string& path, std::error_code& ec) {
  const auto mtime = fs::last_write_time(path, ec);
  if (ec) return 0;
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::file_clock::to_sys(mtime).time_since_epoch())
      .count();
}

}  // namespace

StatusOr<ModelSummary> SummarizeFile(const std::string& path) {
  auto meta = gguf::ReadGgufFile(path);
  if (!meta.ok()) return meta.status();  // (it names the file)
  std::error_code ec;
  return Summarize(path, *meta, ModifiedUnixSeconds(path, ec));
}

StatusOr<ModelSummary> SummaryCache::Get(const std::string& path) {
  std::error_code size_ec, time_ec;
  const uint64_t size = fs::file_size(path, size_ec);
  const int64_t unix_s = ModifiedUnixSeconds(path, time_ec);
  const bool ec = size_ec || time_ec;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = entries_.find(path);
    if (!ec && it != entries_.end() && it->second.size == size && it->second.modified_unix_s == unix_s) return it->second;
  }
  auto s = SummarizeFile(path);  // (outside the lock: it reads the file)
  if (s.ok()) {
    std::lock_guard<std::mutex> lk(mu_);
    entries_[path] = *s;
  }
  return s;
}

std::optional<ModelSummary> SummaryCache::Cached(const std::string& path) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = entries_.find(path);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> FindGgufFiles(const std::string& dir, int max_depth) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec), end;
       !ec && it != end; it.increment(ec)) {
    if (it.depth() >= max_depth) it.disable_recursion_pending();
    if (it->is_regular_file(ec) && it->path().extension() == ".gguf") out.push_back(it->path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace spillway::models
