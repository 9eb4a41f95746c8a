// Ollama's local model store, read-only: `ollama:NAME[:TAG]` names resolved
// to the GGUF blob Ollama already downloaded, without Ollama running.
//
//   root      $OLLAMA_MODELS, else ~/.ollama/models
//   manifest  root/manifests/registry.ollama.ai/library/NAME/TAG   (NAME without '/')
//             root/manifests/registry.ollama.ai/NS/NAME/TAG        (NS/NAME)
//             root/manifests/HOST/NS/NAME/TAG                      (HOST/NS/NAME)
//   layers    the manifest's "layers"; mediaType application/vnd.ollama.image.model is the GGUF
//   blob      root/blobs/sha256-HEX  (the layer's digest "sha256:HEX")
//
// Every error names the file at fault (the manifest, or the blob it points
// to). Nothing is written, nothing is downloaded, blobs are not hashed (they
// are gigabytes; their size is checked against the manifest's).
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace spillway::models {

inline constexpr const char* kOllamaPrefix = "ollama:";
inline constexpr const char* kOllamaModelLayer = "application/vnd.ollama.image.model";

struct OllamaName {
  std::string repository;  // "llama3.2", "user/model", "hf.co/org/repo"
  std::string tag = "latest";
  // How Ollama shows it: "llama3.2:3b", "user/model:latest".
  std::string Display() const { return repository + ":" + tag; }
};

bool IsOllamaName(const std::string& model);
// "ollama:NAME[:TAG]" (the prefix optional). kInvalidArgument for a name that
// is empty or could leave the store (empty parts, "..", characters outside
// [A-Za-z0-9._-]).
StatusOr<OllamaName> ParseOllamaName(const std::string& text);

// The store's root from the environment's values (either may be null).
std::string OllamaStoreRoot(const char* ollama_models_env, const char* home_env);
// OllamaStoreRoot of this process's environment.
std::string DefaultOllamaStoreRoot();

// The manifest file a name maps to (not checked).
std::string ManifestPath(const std::string& root, const OllamaName& name);

// The GGUF blob of `name`: kNotFound when the manifest is missing,
// kInvalidArgument when it is corrupt or its blob is missing or cut short,
// kPermissionDenied when the store may not be read, kUnavailable when it
// cannot be for another reason (each naming the file).
StatusOr<std::string> ResolveOllamaModel(const std::string& root, const OllamaName& name);

// What the store holds: every manifest under root/manifests, resolved (an
// entry whose manifest is broken carries its error instead of a blob).
struct OllamaStoreEntry {
  OllamaName name;
  std::string manifest;
  std::string blob;  // empty when `error` is set
  Status error;
};
// Empty when root holds no store; an error (as ResolveOllamaModel's) when it cannot be read.
StatusOr<std::vector<OllamaStoreEntry>> ListOllamaStore(const std::string& root);

// A service's `model` as configured -> the file to load: an ollama: name is
// resolved in `root`, a path is returned unchanged.
StatusOr<std::string> ResolveModelPath(const std::string& model, const std::string& root);

}  // namespace spillway::models
