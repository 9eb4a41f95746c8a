#include "models/ollama_store.h"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace spillway::models {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kDefaultRegistry = "registry.ollama.ai";
constexpr const char* kDefaultNamespace = "library";
constexpr uintmax_t kMaxManifestBytes = 1 << 20;

bool SafePart(const std::string& p) {
  if (p.empty() || p.size() > 128 || p == "." || p == "..") return false;
  for (char c : p) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) return false;
  }
  return true;
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  return parts;
}

// registry/namespace/name parts of a repository.
std::vector<std::string> RepositoryPath(const std::string& repository) {
  auto parts = Split(repository, '/');
  if (parts.size() == 1) return {kDefaultRegistry, kDefaultNamespace, parts[0]};
  if (parts.size() == 2) return {kDefaultRegistry, parts[0], parts[1]};
  return parts;
}

}  // namespace

bool IsOllamaName(const std::string& model) { return model.rfind(kOllamaPrefix, 0) == 0; }

StatusOr<OllamaName> ParseOllamaName(const std::string& text) {
  std::string s = IsOllamaName(text) ? text.substr(std::string(kOllamaPrefix).size()) : text;
  std::string shown = "'";  // (appended, not built with operator+: GCC 12 warns falsely about that form)
  shown.append(text, 0, 200).append("'");
  OllamaName n;
  // The tag follows the last ':' after the last '/'.
  const size_t slash = s.rfind('/');
  const size_t colon = s.rfind(':');
  if (colon != std::string::npos && (slash == std::string::npos || colon > slash)) {
    n.tag = s.substr(colon + 1);
    s = s.substr(0, colon);
  }
  n.repository = s;
  auto parts = Split(s, '/');
  if (parts.size() > 3) return Status::InvalidArgument("ollama model " + shown + " has more than 3 path parts");
  for (const auto& p : parts) {
    if (!SafePart(p)) {
      return Status::InvalidArgument("ollama model " + shown +
                                     " is not NAME[:TAG] with parts of [A-Za-z0-9._-] (e.g. ollama:llama3.2:3b)");
    }
  }
  if (!SafePart(n.tag)) return Status::InvalidArgument("ollama model " + shown + " has an invalid tag");
  return n;
}

std::string OllamaStoreRoot(const char* ollama_models_env, const char* home_env) {
  if (ollama_models_env && *ollama_models_env) return ollama_models_env;
  return std::string(home_env && *home_env ? home_env : "") + "/.ollama/models";
}

std::string DefaultOllamaStoreRoot() { return OllamaStoreRoot(std::getenv("OLLAMA_MODELS"), std::getenv("HOME")); }

std::string ManifestPath(const std::string& root, const OllamaName& name) {
  fs::path p = fs::path(root) / "manifests";
  for (const auto& part : RepositoryPath(name.repository)) p /= part;
  return (p / name.tag).string();
}

namespace {

// What `p` is (following links); `ec` set only when that cannot be told for
// another reason than its absence (permissions, a symlink loop).
fs::file_type TypeOf(const fs::path& p, std::error_code* ec) {
  const fs::file_status st = fs::status(p, *ec);
  if (st.type() == fs::file_type::not_found) ec->clear();
  return st.type();
}

// `what` (a manifest, a blob, the store) cannot be read: for want of
// permission (with what to do about it), or for another reason (a symbolic
// link loop, an I/O error), said as it is.
Status CannotRead(const std::string& what, const std::error_code& ec) {
  const std::string text = "cannot read " + what + ": " + ec.message();
  if (ec != std::errc::permission_denied) return Status::Unavailable(text);
  return Status::PermissionDenied(text +
                                  " (Ollama's store must be readable by the user Spillway runs as: a system install "
                                  "keeps it in the ollama user's home)");
}
std::error_code LastError() { return {errno, std::generic_category()}; }

StatusOr<std::string> BlobOfManifest(const std::string& root, const std::string& manifest, const std::string& shown) {
  std::error_code ec;
  if (const auto type = TypeOf(manifest, &ec); type != fs::file_type::regular) {
    // A store the user Spillway runs as cannot read (a system install's,
    // in the ollama user's home) is not a model that is missing.
    if (ec) return CannotRead("manifest " + manifest, ec);
    return Status::NotFound("ollama model '" + shown + "' not found: no manifest " + manifest);
  }
  const auto bytes = fs::file_size(manifest, ec);
  if (ec || bytes > kMaxManifestBytes) return Status::InvalidArgument("manifest " + manifest + " is not a manifest (too large)");
  std::ifstream in(manifest, std::ios::binary);
  if (!in.is_open()) return CannotRead("manifest " + manifest, LastError());  // (errno: the open's)
  std::stringstream text;
  text << in.rdbuf();
  if (!in && !in.eof()) return Status::InvalidArgument("manifest " + manifest + " cannot be read");
  const json j = json::parse(text.str(), nullptr, false);
  if (j.is_discarded()) return Status::InvalidArgument("manifest " + manifest + " is not valid JSON");
  if (!j.is_object()) return Status::InvalidArgument("manifest " + manifest + " is not a JSON object");
  auto layers = j.find("layers");
  if (layers == j.end() || !layers->is_array()) {
    return Status::InvalidArgument("manifest " + manifest + " has no \"layers\" array");
  }
  for (const auto& layer : *layers) {
    if (!layer.is_object() || layer.value("mediaType", json()) != kOllamaModelLayer) continue;
    const json digest = layer.value("digest", json());
    const std::string d = digest.is_string() ? digest.get<std::string>() : "";
    bool hex = d.size() == 7 + 64 && d.rfind("sha256:", 0) == 0;
    for (size_t i = 7; hex && i < d.size(); ++i) hex = std::isxdigit(static_cast<unsigned char>(d[i])) != 0;
    if (!hex) {
      return Status::InvalidArgument("manifest " + manifest + ": the model layer's digest '" + d.substr(0, 80) +
                                     "' is not sha256:<64 hex digits>");
    }
    const std::string blob = (fs::path(root) / "blobs" / ("sha256-" + d.substr(7))).string();
    if (TypeOf(blob, &ec) != fs::file_type::regular) {
      if (ec) return CannotRead("blob " + blob, ec);
      // (The store is the right one: it holds the manifest. Not "not found",
      // which has a config's error say to point ollama_models elsewhere.)
      return Status::InvalidArgument("blob " + blob + " (the model layer of manifest " + manifest +
                                     ") is missing: an interrupted or pruned pull? (`ollama pull " + shown + "`)");
    }
    if (auto size = layer.find("size"); size != layer.end() && size->is_number_unsigned()) {
      const auto actual = fs::file_size(blob, ec);
      if (!ec && actual != size->get<uint64_t>()) {
        return Status::InvalidArgument("blob " + blob + " is " + std::to_string(actual) + " bytes; manifest " + manifest +
                                       " says " + std::to_string(size->get<uint64_t>()) + " (an interrupted download?)");
      }
    }
    return blob;
  }
  return Status::InvalidArgument("manifest " + manifest + " has no layer of mediaType " + kOllamaModelLayer);
}

}  // namespace

StatusOr<std::string> ResolveOllamaModel(const std::string& root, const OllamaName& name) {
  return BlobOfManifest(root, ManifestPath(root, name), name.Display());
}

StatusOr<std::vector<OllamaStoreEntry>> ListOllamaStore(const std::string& root) {
  std::vector<OllamaStoreEntry> out;
  const fs::path base = fs::path(root) / "manifests";
  std::error_code ec;
  if (TypeOf(base, &ec) != fs::file_type::directory) {
    if (ec) return CannotRead("Ollama's store at " + root, ec);
    return out;  // (no store there)
  }
  // (The iterator skips what it may not read: the top it must.)
  if (::access(base.c_str(), R_OK | X_OK) != 0) {
    return CannotRead("Ollama's store at " + root, LastError());
  }
  for (fs::recursive_directory_iterator it(base, fs::directory_options::skip_permission_denied, ec), end;
       !ec && it != end; it.increment(ec)) {
    if (it.depth() > 3) {
      it.disable_recursion_pending();
      continue;
    }
    if (it.depth() != 3 || !it->is_regular_file(ec)) continue;
    // registry/namespace/name/tag
    // (Lexically: fs::relative follows a symlinked tag, "latest -> 8b",
    // which was listed as a second "8b" and "latest" lost.)
    const fs::path rel = it->path().lexically_relative(base);
    std::vector<std::string> parts;
    for (const auto& p : rel) parts.push_back(p.string());
    if (parts.size() != 4) continue;
    OllamaStoreEntry e;
    e.name.tag = parts[3];
    e.name.repository = parts[0] == kDefaultRegistry
                            ? (parts[1] == kDefaultNamespace ? parts[2] : parts[1] + "/" + parts[2])
                            : parts[0] + "/" + parts[1] + "/" + parts[2];
    e.manifest = it->path().string();
    auto blob = BlobOfManifest(root, e.manifest, e.name.Display());
    if (blob.ok()) e.blob = *blob;
    else e.error = blob.status();
    out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name.Display() < b.name.Display(); });
  return out;
}

StatusOr<std::string> ResolveModelPath(const std::string& model, const std::string& root) {
  if (!IsOllamaName(model)) return model;
  auto name = ParseOllamaName(model);
  if (!name.ok()) return name.status();
  return ResolveOllamaModel(root, *name);
}

}  // namespace spillway::models
