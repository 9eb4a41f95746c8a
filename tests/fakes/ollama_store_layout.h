// An Ollama model store on disk, as Ollama lays it out, built from the
// generated test models: manifests/<registry>/<namespace>/<name>/<tag> and
// blobs/sha256-<hex>. Removed with the object.
#pragma once

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/hash.h"

namespace spillway::testing {

class OllamaStoreLayout {
 public:
  explicit OllamaStoreLayout(const std::string& name)
      : root_(std::filesystem::temp_directory_path() / ("spillway-ollama-" + name + "-" + std::to_string(getpid()))) {
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_ / "blobs");
  }
  ~OllamaStoreLayout() {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  OllamaStoreLayout(const OllamaStoreLayout&) = delete;
  OllamaStoreLayout& operator=(const OllamaStoreLayout&) = delete;

  // Adds `gguf` as the model layer of repository `repo_path`
  // ("registry.ollama.ai/library/tiny") and tag; returns the manifest's path.
  std::filesystem::path Add(const std::string& repo_path, const std::string& tag, const std::string& gguf) {
    const std::string hex = *Sha256File(gguf);
    const auto blob = root_ / "blobs" / ("sha256-" + hex);
    std::filesystem::copy_file(gguf, blob, std::filesystem::copy_options::overwrite_existing);
    const nlohmann::json manifest = {
        {"schemaVersion", 2},
        {"mediaType", "application/vnd.docker.distribution.manifest.v2+json"},
        {"config", {{"mediaType", "application/vnd.docker.container.image.v1+json"}, {"digest", "sha256:" + std::string(64, '0')}, {"size", 2}}},
        {"layers",
         {{{"mediaType", "application/vnd.ollama.image.template"}, {"digest", "sha256:" + std::string(64, '1')}, {"size", 10}},
          {{"mediaType", "application/vnd.ollama.image.model"},
           {"digest", "sha256:" + hex},
           {"size", std::filesystem::file_size(gguf)}}}}};
    return Write(repo_path, tag, manifest.dump());
  }
  // Writes a manifest's text as given (for broken ones).
  std::filesystem::path Write(const std::string& repo_path, const std::string& tag, const std::string& text) {
    const auto dir = root_ / "manifests" / repo_path;
    std::filesystem::create_directories(dir);
    std::ofstream(dir / tag) << text;
    return dir / tag;
  }
  const std::filesystem::path& root() const { return root_; }

 private:
  std::filesystem::path root_;
};

}  // namespace spillway::testing
