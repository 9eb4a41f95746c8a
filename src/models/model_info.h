// What a person (and an Ollama client) wants to know of a GGUF file without
// loading it: size, architecture, quantization, context length, parameters
// and the chat template's family, from its metadata (gguf/gguf_reader.h).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "gguf/gguf_reader.h"

namespace spillway::models {

struct ModelSummary {
  std::string path;
  uint64_t size = 0;              // bytes of the file
  int64_t modified_unix_s = 0;
  std::string architecture;       // general.architecture
  std::string quantization;       // "Q4_K_M", "F16"... (general.file_type, else the largest tensors' type)
  uint64_t context_length = 0;    // <arch>.context_length (0: not said)
  uint64_t parameters = 0;        // elements of all tensors
  std::string template_family;    // ChatTemplateFamily of tokenizer.chat_template
  bool embedding = false;         // a pooling type is set: an embedding model
  bool tools = false;             // its chat template takes tools (TemplateTakesTools)
  bool thinking = false;          // its chat template reasons (TemplateThinks)
};

// llama.cpp's llama_ftype names ("Q4_K_M"); "" for an unknown value.
std::string FileTypeName(uint64_t file_type);
// The chat template's family by its markers: "chatml", "llama3", "mistral",
// "gemma", "gpt-oss", "deepseek", "phi", "command-r", "granite", "zephyr",
// "llama2", "other"; "none" for an empty template.
std::string ChatTemplateFamily(const std::string& chat_template);
// Ollama's capabilities, read off a chat template by its markers (Ollama
// reads its own Go templates' variables; a GGUF carries jinja). Generous
// on purpose: a capability wrongly denied refuses a request Ollama takes.
bool TemplateTakesTools(const std::string& chat_template);
bool TemplateThinks(const std::string& chat_template);
// "1.2B", "494.0M", "35.1K": parameter counts as Ollama shows them.
std::string HumanCount(uint64_t n);

ModelSummary Summarize(const std::string& path, const gguf::Metadata& meta, int64_t modified_unix_s);
// Reads the file's metadata (not its weights); errors name the file.
StatusOr<ModelSummary> SummarizeFile(const std::string& path);

// SummarizeFile, remembered per path until the file's size or time changes
// (listings such as /api/tags are polled; a header can be megabytes).
// Thread-safe.
class SummaryCache {
 public:
  StatusOr<ModelSummary> Get(const std::string& path);
  // What Get last read of `path`, without reading the file (nullopt when
  // never read): for a request's thread, which must not read a header.
  std::optional<ModelSummary> Cached(const std::string& path);

 private:
  std::mutex mu_;
  std::map<std::string, ModelSummary> entries_;  // by path, while size and time match
};

// GGUF files (by extension, and Ollama blobs when given) under `dir`, sorted, at most `max_depth` folders deep.
std::vector<std::string> FindGgufFiles(const std::string& dir, int max_depth = 4);

}  // namespace spillway::models
