#include "config/config.h"

#include <toml++/toml.h>

#include "common/hash.h"
#include "common/names.h"
#include "common/proc_file.h"
#include "models/ollama_store.h"

#include <algorithm>
#include <csignal>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <filesystem>
#include <set>
#include <limits>
#include <sstream>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace spillway::config {

namespace {

std::string Where(const std::string& source, const toml::source_region& r, const std::string& key) {
  std::ostringstream os;
  os << source << ":" << r.begin.line << ": '" << key << "'";
  return os.str();
}


bool ValidServiceName(const std::string& name) {
  for (char ch : name) {
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.')) return false;
  }
  return !name.empty();
}

// toml++ 3.3 reaches __builtin_unreachable (undefined behaviour) when it asks
// whether U+00A1..U+0499, U+2C4E..U+3047 (but U+3000) or U+FB26..U+FEFE is
// whitespace, which it may do anywhere, strings included once a parse goes
// wrong (found by tests/fuzz/config_fuzz.cpp). So toml++ never sees them:
// the text it is given has them written as \uXXXX escapes in "basic
// strings" (the same value) and as spaces in comments (no meaning), which
// covers every accented letter of a path, a name or a note. Where neither
// can stand for them (a 'literal string', outside any string) they are
// refused, with the escape to write instead. Bytes that are not UTF-8 are
// refused as such (a TOML file is UTF-8 text).
bool TomlUnsafe(uint32_t cp) {
  return (cp >= 0xA1 && cp <= 0x499) || (cp >= 0x2C4E && cp <= 0x3047 && cp != 0x3000) || (cp >= 0xFB26 && cp <= 0xFEFE);
}

// The code point of the UTF-8 sequence at text[i] and its length in bytes;
// false when the bytes there are not UTF-8 (a stray continuation byte, a
// truncated or overlong sequence, a surrogate, past U+10FFFF).
bool DecodeUtf8(const std::string& text, size_t i, uint32_t* cp, size_t* len) {
  const auto b = static_cast<unsigned char>(text[i]);
  *len = b >= 0xF0 && b <= 0xF4 ? 4 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xC2 && b <= 0xDF ? 2 : 0;
  if (*len == 0 || i + *len > text.size()) return false;
  *cp = *len == 4 ? b & 0x07 : *len == 3 ? b & 0x0F : b & 0x1F;
  for (size_t k = 1; k < *len; ++k) {
    const auto c = static_cast<unsigned char>(text[i + k]);
    if ((c & 0xC0) != 0x80) return false;
    *cp = (*cp << 6) | (c & 0x3F);
  }
  const uint32_t least = *len == 4 ? 0x10000 : *len == 3 ? 0x800 : 0x80;
  return *cp >= least && *cp <= 0x10FFFF && !(*cp >= 0xD800 && *cp <= 0xDFFF);
}

}  // namespace

StatusOr<std::string> TomlSafeText(const std::string& text, const std::string& source) {
  enum class In { kCode, kComment, kBasic, kLiteral, kMultiBasic, kMultiLiteral };
  In in = In::kCode;
  bool escaped = false;  // the previous character of a basic string was a backslash
  int line = 1;
  std::string out;
  out.reserve(text.size());
  auto run = [&](size_t i, char q) {  // quotes in a row from i
    size_t n = 0;
    while (i + n < text.size() && text[i + n] == q) ++n;
    return n;
  };
  for (size_t i = 0; i < text.size();) {
    const char ch = text[i];
    const auto b = static_cast<unsigned char>(ch);
    if (b >= 0x80) {
      uint32_t cp = 0;
      size_t len = 0;
      if (!DecodeUtf8(text, i, &cp, &len)) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "%02X", static_cast<unsigned>(b));
        return Status::InvalidArgument(source + ":" + std::to_string(line) + ": byte 0x" + hex +
                                       " is not UTF-8 text (a TOML file is UTF-8; save it as UTF-8)");
      }
      if (!TomlUnsafe(cp)) {
        out.append(text, i, len);
      } else if (in == In::kComment) {
        out.append(len, ' ');
      } else {
        char hex[8];
        std::snprintf(hex, sizeof hex, "%04X", static_cast<unsigned>(cp));
        const bool basic = in == In::kBasic || in == In::kMultiBasic;
        if (!basic || escaped) {
          return Status::InvalidArgument(source + ":" + std::to_string(line) + ": character U+" + hex +
                                         " cannot be read safely by the TOML parser here; in a \"string\" write it as "
                                         "\\u" + hex);
        }
        out.append("\\u").append(hex);
      }
      escaped = false;
      i += len;
      continue;
    }
    if (ch == '\n') ++line;
    size_t take = 1;
    switch (in) {
      case In::kCode:
        if (ch == '#') {
          in = In::kComment;
        } else if (ch == '"') {
          take = run(i, '"') >= 3 ? 3 : 1;
          in = take == 3 ? In::kMultiBasic : In::kBasic;
        } else if (ch == '\'') {
          take = run(i, '\'') >= 3 ? 3 : 1;
          in = take == 3 ? In::kMultiLiteral : In::kLiteral;
        }
        break;
      case In::kComment:
        if (ch == '\n') in = In::kCode;
        break;
      case In::kBasic:
      case In::kMultiBasic:
        if (escaped) {
          escaped = false;
        } else if (ch == '\\') {
          escaped = true;
        } else if (ch == '"' && in == In::kBasic) {
          in = In::kCode;
        } else if (ch == '"') {
          take = std::min<size_t>(run(i, '"'), 5);  // up to two quotes of the text before the closing three
          if (take >= 3) in = In::kCode;
        } else if (ch == '\n' && in == In::kBasic) {
          in = In::kCode;  // unterminated: toml++ says so
        }
        break;
      case In::kLiteral:
        if (ch == '\'' || ch == '\n') in = In::kCode;
        break;
      case In::kMultiLiteral:
        if (ch == '\'') {
          take = std::min<size_t>(run(i, '\''), 5);
          if (take >= 3) in = In::kCode;
        }
        break;
    }
    out.append(text, i, take);
    i += take;
  }
  return out;
}

namespace {

class Reader {
 public:
  Reader(const std::string& source) : source_(source) {}

  // Rejects keys that are not in `known` (catches typos like "slot = 4").
  Status OnlyKnown(const toml::table& t, const std::string& prefix, std::initializer_list<const char*> known) {
    for (const auto& [k, v] : t) {
      bool ok = false;
      for (const char* name : known) ok |= k.str() == name;
      if (!ok) return Status::InvalidArgument(Where(source_, v.source(), prefix + std::string(k.str())) + " is not a known key");
    }
    return Status::Ok();
  }

  template <typename T>
  Status Get(const toml::table& t, const char* key, const std::string& prefix, T* out, double lo, double hi) {
    const toml::node* n = t.get(key);
    if (!n) return Status::Ok();
    const std::string name = prefix + key;
    if constexpr (std::is_same_v<T, bool>) {
      auto v = n->value<bool>();
      if (!n->is_boolean() || !v) return Status::InvalidArgument(Where(source_, n->source(), name) + " must be true or false");
      *out = *v;
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!n->is_string()) return Status::InvalidArgument(Where(source_, n->source(), name) + " must be a string");
      *out = *n->value<std::string>();
    } else {
      if (!n->is_number()) return Status::InvalidArgument(Where(source_, n->source(), name) + " must be a number");
      // (An integer past 2^53 has no exact double: toml++ gives none, and a
      // key's range is far below that anyway.)
      const auto as_double = n->value<double>();
      const double v = as_double ? *as_double : std::numeric_limits<double>::infinity();
      if (std::is_integral_v<T> && !n->is_integer()) {
        return Status::InvalidArgument(Where(source_, n->source(), name) + " must be an integer");
      }
      if (!(v >= lo && v <= hi)) {  // NaN too
        std::ostringstream os;
        os.precision(15);  // a bound as a config writes it: 4194304, not 4.1943e+06
        os << Where(source_, n->source(), name) << " must be between " << lo << " and " << hi;
        return Status::InvalidArgument(os.str());
      }
      *out = static_cast<T>(v);
    }
    return Status::Ok();
  }

  Status Strings(const toml::table& t, const char* key, std::vector<std::string>* out) {
    const toml::node* n = t.get(key);
    if (!n) return Status::Ok();
    const toml::array* a = n->as_array();
    if (!a) return Status::InvalidArgument(Where(source_, n->source(), key) + " must be an array of strings");
    out->clear();
    for (const auto& e : *a) {
      if (!e.is_string()) return Status::InvalidArgument(Where(source_, e.source(), key) + " must be an array of strings");
      out->push_back(*e.value<std::string>());
    }
    return Status::Ok();
  }

  const std::string& source() const { return source_; }
  // Where "ollama:" names are looked up: the config's `ollama_models`, else
  // $OLLAMA_MODELS, else ~/.ollama/models (of the user the gateway runs as).
  void set_ollama_store(std::string root) {
    ollama_store_ = std::move(root);
    ollama_store_from_ = "the config's ollama_models";
  }

  // "ollama:NAME[:TAG]" -> the blob in Ollama's store; `*name` keeps what was written.
  Status ResolveModel(const toml::node* node, const std::string& key, std::string* model, std::string* name) const {
    *name = *model;
    if (!node || !models::IsOllamaName(*model)) return Status::Ok();
    auto path = models::ResolveModelPath(*model, ollama_store_);
    if (!path.ok()) {
      // (Where the store came from, when the model is not in it: the config's
      // key, else $OLLAMA_MODELS, else the home of the user it runs as.)
      const std::string hint = path.status().code() != StatusCode::kNotFound ? ""
                               : " (Ollama's store here is " + ollama_store_ + ", from " + ollama_store_from_ +
                                     "; set ollama_models to the store Ollama uses)";
      return Status::InvalidArgument(Where(source_, node->source(), key) + ": " + path.status().message() + hint);
    }
    *model = *path;
    return Status::Ok();
  }

 private:
  std::string source_;
  std::string ollama_store_ = models::DefaultOllamaStoreRoot();
  std::string ollama_store_from_ = std::getenv("OLLAMA_MODELS") && *std::getenv("OLLAMA_MODELS")
                                       ? "$OLLAMA_MODELS"
                                       : "the home of the user Spillway runs as";
};

Status ReadPlacement(Reader& r, const toml::table& t, const std::string& prefix, PlacementConfig* p) {
  SPILLWAY_RETURN_IF_ERROR(
      r.OnlyKnown(t, prefix, {"role", "model", "different_model", "device", "gpu_layers", "ctx", "slots", "threads", "batch",
                              "mmap", "progress_timeout_s", "start_timeout_s", "kv_unified", "prefix_reuse"}));
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "model", prefix, &p->model, 0, 0));
  SPILLWAY_RETURN_IF_ERROR(r.ResolveModel(t.get("model"), prefix + "model", &p->model, &p->model_name));
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "different_model", prefix, &p->different_model, 0, 0));
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "progress_timeout_s", prefix, &p->progress_timeout_s, 0.1, 86400));
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "start_timeout_s", prefix, &p->start_timeout_s, 1, 86400));
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "role", prefix, &p->role, 0, 0));
  if (!p->role.empty() && p->role != "primary" && p->role != "hybrid" && p->role != "fallback") {
    return Status::InvalidArgument(Where(r.source(), t.get("role")->source(), prefix + "role") +
                                   " must be primary, hybrid or fallback");
  }
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "device", prefix, &p->device, 0, 0));
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "gpu_layers", prefix, &p->gpu_layers, -1, 100000));
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "ctx", prefix, &p->ctx, 16, 1 << 22));
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "slots", prefix, &p->slots, 1, 256));
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "threads", prefix, &p->threads, 0, 1024));
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "batch", prefix, &p->batch, 1, 1 << 16));
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "mmap", prefix, &p->mmap, 0, 0));
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "kv_unified", prefix, &p->kv_unified, 0, 0));
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "prefix_reuse", prefix, &p->prefix_reuse, 0, 0));
  // Each slot needs cells of its own: llama.cpp aborts the worker otherwise.
  if (p->slots > p->ctx) {
    const toml::node* n = t.get("slots") ? t.get("slots") : t.get("ctx");
    return Status::InvalidArgument(Where(r.source(), n ? n->source() : t.source(), prefix + "slots") + " (" +
                                   std::to_string(p->slots) + ") exceeds ctx (" + std::to_string(p->ctx) +
                                   "): ctx is shared among the slots, each needs cells of its own");
  }
  // Each decode step holds one token of every generating slot: llama.cpp aborts the worker on a smaller batch.
  if (p->batch < p->slots) {
    const toml::node* n = t.get("batch") ? t.get("batch") : t.get("slots");
    return Status::InvalidArgument(Where(r.source(), n ? n->source() : t.source(), prefix + "batch") + " (" +
                                   std::to_string(p->batch) + ") is below slots (" + std::to_string(p->slots) +
                                   "): each decode step carries a token of every slot");
  }
  if (!KnownDeviceName(p->device)) {
    const toml::node* n = t.get("device");
    return Status::InvalidArgument(Where(r.source(), n ? n->source() : t.source(), prefix + "device") + " '" +
                                   p->device + "' must be cpu, cuda:N or sim:N (N without leading zeros)");
  }
  return Status::Ok();
}

// "a b 'c d' \"e f\"" -> {a, b, c d, e f}: a command line without a shell.
StatusOr<std::vector<std::string>> SplitCommand(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  bool in_word = false;
  char quote = 0;
  for (char ch : line) {
    if (quote) {
      if (ch == quote) {
        quote = 0;
      } else {
        cur += ch;
      }
    } else if (ch == '\'' || ch == '"') {
      quote = ch;
      in_word = true;
    } else if (ch == ' ' || ch == '\t' || ch == '\n') {
      if (in_word) out.push_back(cur), cur.clear(), in_word = false;
    } else {
      cur += ch;
      in_word = true;
    }
  }
  if (quote) return Status::InvalidArgument(std::string("an unclosed ") + quote + " quote");
  if (in_word) out.push_back(cur);
  return out;
}

// "HH:MM-HH:MM" (may cross midnight; it may end at 24:00, not begin there),
// open for some time: one that begins where it ends is never open
// (admission::InWindow).
bool ValidWindow(const std::string& w) {
  int h1, m1, h2, m2;
  char tail;
  if (std::sscanf(w.c_str(), "%2d:%2d-%2d:%2d%c", &h1, &m1, &h2, &m2, &tail) != 4 || w.size() != 11) return false;
  const bool times = h1 >= 0 && h1 < 24 && m1 >= 0 && m1 < 60 && h2 >= 0 && m2 >= 0 && m2 < 60 &&
                     (h2 < 24 || (h2 == 24 && m2 == 0));
  return times && h1 * 60 + m1 != h2 * 60 + m2;  // (00:00-24:00 is all day)
}

Status ReadResidency(Reader& r, const toml::table& t, const std::string& prefix, ResidencyConfig* rc) {
  const std::string& source = r.source();
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "residency", prefix, &rc->mode, 0, 0));
  if (rc->mode != "pinned" && rc->mode != "keep_alive" && rc->mode != "on_demand") {
    return Status::InvalidArgument(Where(source, t.get("residency")->source(), prefix + "residency") +
                                   " must be \"pinned\", \"keep_alive\" or \"on_demand\"");
  }
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "keep_alive_s", prefix, &rc->keep_alive_s, 0, 86400 * 365));
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "priority", prefix, &rc->priority, 0, 0));
  if (rc->priority != "interactive" && rc->priority != "batch" && rc->priority != "background") {
    return Status::InvalidArgument(Where(source, t.get("priority")->source(), prefix + "priority") +
                                   " must be \"interactive\", \"batch\" or \"background\"");
  }
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "evict_cost", prefix, &rc->evict_cost, 0, 1e12));
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "fair_turn_s", prefix, &rc->fair_turn_s, 0, 86400));
  if (rc->fair_turn_s > 0 && rc->fair_turn_s < 1) {
    return Status::InvalidArgument(Where(source, t.get("fair_turn_s")->source(), prefix + "fair_turn_s") +
                                   " must be 0 (no turns) or at least 1 second");
  }
  SPILLWAY_RETURN_IF_ERROR(r.Strings(t, "windows", &rc->windows));
  for (const auto& w : rc->windows) {
    if (!ValidWindow(w)) {
      return Status::InvalidArgument(Where(source, t.get("windows")->source(), prefix + "windows") + ": '" + w +
                                     "' must be \"HH:MM-HH:MM\" (local time, open for some time: it may cross "
                                     "midnight and end at 24:00; leave windows out for all day)");
    }
  }
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "interactive_idle_s", prefix, &rc->interactive_idle_s, 0, 86400 * 365));
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "outside_window", prefix, &rc->outside_window, 0, 0));
  if (rc->outside_window != "cpu" && rc->outside_window != "wait") {
    return Status::InvalidArgument(Where(source, t.get("outside_window")->source(), prefix + "outside_window") +
                                   " must be \"cpu\" or \"wait\"");
  }
  if ((!rc->windows.empty() || rc->interactive_idle_s > 0) && rc->priority == "interactive") {
    return Status::InvalidArgument(Where(source, t.source(), prefix + "windows") +
                                   ": windows and interactive_idle_s are for batch or background services "
                                   "(interactive work is never held back)");
  }
  return Status::Ok();
}

Status ReadExternal(Reader& r, const toml::table& t, const std::string& prefix, ExternalConfig* e) {
  const std::string& source = r.source();
  SPILLWAY_RETURN_IF_ERROR(r.OnlyKnown(
      t, prefix, {"name", "kind", "url", "command", "model", "routes", "device", "resident_mib", "transient_mib",
                  "residency", "keep_alive_s", "priority", "evict_cost", "fair_turn_s", "windows", "interactive_idle_s", "outside_window",
                  "idempotent", "concurrency", "max_queue", "health_path", "stop_signal",
                  "start_timeout_s", "request_timeout_s"}));
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "name", prefix, &e->name, 0, 0));
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "url", prefix, &e->url, 0, 0));
  if (const toml::node* n = t.get("command")) {
    if (n->is_string()) {
      auto argv = SplitCommand(*n->value<std::string>());
      if (!argv.ok()) return Status::InvalidArgument(Where(source, n->source(), prefix + "command") + ": " + argv.status().message());
      e->command = *argv;
    } else if (const toml::array* a = n->as_array()) {
      for (const auto& x : *a) {
        if (!x.is_string()) return Status::InvalidArgument(Where(source, x.source(), prefix + "command") + " must hold strings");
        e->command.push_back(*x.value<std::string>());
      }
    } else {
      return Status::InvalidArgument(Where(source, n->source(), prefix + "command") + " must be a string or an array of strings");
    }
    if (e->command.empty()) return Status::InvalidArgument(Where(source, n->source(), prefix + "command") + " is empty");
  }
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "model", prefix, &e->model, 0, 0));
  if (const toml::node* n = t.get("routes")) {
    const toml::table* rt = n->as_table();
    if (!rt) return Status::InvalidArgument(Where(source, n->source(), prefix + "routes") + " must be a table of \"path\" = \"path\"");
    for (const auto& [k, v] : *rt) {
      const std::string from(k.str());
      const auto& known = ExternalRoutes();
      if (std::find(known.begin(), known.end(), from) == known.end()) {
        std::string list;
        for (const auto& x : known) list += (list.empty() ? "" : ", ") + x;
        return Status::InvalidArgument(Where(source, v.source(), prefix + "routes." + from) +
                                       " is not a route Spillway proxies (" + list + ")");
      }
      // A request target's characters (RFC 3986): a space or a control
      // character would make a malformed request line upstream.
      const auto bad_char = [](unsigned char c) { return c <= 0x20 || c >= 0x7f; };
      const std::string to = v.value<std::string>().value_or("");
      if (!v.is_string() || to.empty() || to.front() != '/' || std::any_of(to.begin(), to.end(), bad_char)) {
        return Status::InvalidArgument(Where(source, v.source(), prefix + "routes." + from) +
                                       " must be an upstream path (\"/...\", without spaces or control characters)");
      }
      e->routes.emplace_back(from, to);
    }
  }
  if (e->routes.empty()) {
    for (const char* p : {"/v1/chat/completions", "/v1/completions", "/v1/embeddings"}) e->routes.emplace_back(p, p);
  }
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "device", prefix, &e->device, 0, 0));
  if (!KnownDeviceName(e->device)) {
    return Status::InvalidArgument(Where(source, t.get("device") ? t.get("device")->source() : t.source(), prefix + "device") +
                                   " '" + e->device + "' must be cpu, cuda:N or sim:N (N without leading zeros)");
  }
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "resident_mib", prefix, &e->resident_mib, 0, 1 << 24));
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "transient_mib", prefix, &e->transient_mib, 0, 1 << 24));
  SPILLWAY_RETURN_IF_ERROR(ReadResidency(r, t, prefix, &e->residency));
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "idempotent", prefix, &e->idempotent, 0, 0));
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "concurrency", prefix, &e->concurrency, 1, 4096));
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "max_queue", prefix, &e->max_queue, 0, 1 << 20));
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "health_path", prefix, &e->health_path, 0, 0));
  if (e->health_path.empty() || e->health_path.front() != '/') {
    return Status::InvalidArgument(Where(source, t.get("health_path")->source(), prefix + "health_path") + " must start with /");
  }
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "stop_signal", prefix, &e->stop_signal, 0, 0));
  if (SignalNumber(e->stop_signal) == 0) {
    return Status::InvalidArgument(Where(source, t.get("stop_signal")->source(), prefix + "stop_signal") +
                                   " must be SIGTERM, SIGINT, SIGQUIT, SIGHUP, SIGUSR1, SIGUSR2 or SIGKILL");
  }
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "start_timeout_s", prefix, &e->start_timeout_s, 1, 86400));
  SPILLWAY_RETURN_IF_ERROR(r.Get(t, "request_timeout_s", prefix, &e->request_timeout_s, 0.1, 86400));
  if (e->name.empty()) return Status::InvalidArgument(Where(source, t.source(), prefix + "name") + " is required");
  const auto where = [&] { return source + ": service '" + e->name + "'"; };
  if (e->command.empty() == e->url.empty()) {
    return Status::InvalidArgument(where() + ": an external service needs either command (Spillway starts it) or url "
                                   "(it runs already), not both");
  }
  if (!e->url.empty() && e->UrlPort() == 0) {
    return Status::InvalidArgument(where() + ": url must be http://127.0.0.1:PORT, http://localhost:PORT or "
                                   "http://[::1]:PORT (a loopback server; Spillway does not proxy beyond the host)");
  }
  if (!e->command.empty()) {
    bool port = false;
    for (const auto& a : e->command) port |= a.find("${PORT}") != std::string::npos;
    if (!port) return Status::InvalidArgument(where() + ": command must take ${PORT} (Spillway chooses the port it listens on)");
  }
  if (e->command.empty() && t.get("residency")) {
    return Status::InvalidArgument(where() + ": residency applies to a server Spillway starts (command), not to a url");
  }
  return Status::Ok();
}

}  // namespace

int SignalNumber(const std::string& name) {
  static const std::pair<const char*, int> kSignals[] = {{"SIGTERM", SIGTERM}, {"SIGINT", SIGINT},   {"SIGQUIT", SIGQUIT},
                                                         {"SIGHUP", SIGHUP},   {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2},
                                                         {"SIGKILL", SIGKILL}};
  for (const auto& [n, v] : kSignals) {
    if (name == n) return v;
  }
  return 0;
}

const std::vector<std::string>& ExternalRoutes() {
  static const std::vector<std::string> kRoutes = {
      "/v1/chat/completions", "/v1/completions",       "/v1/embeddings",         "/v1/rerank",
      "/v1/audio/transcriptions", "/v1/audio/translations", "/v1/audio/speech", "/v1/images/generations"};
  return kRoutes;
}

std::string ExternalConfig::UpstreamPath(const std::string& gateway_path) const {
  for (const auto& [from, to] : routes) {
    if (from == gateway_path) return to;
  }
  return "";
}

uint16_t ExternalConfig::UrlPort() const {
  std::string rest;
  for (const char* prefix : {"http://127.0.0.1:", "http://localhost:", "http://[::1]:"}) {
    if (url.rfind(prefix, 0) == 0) rest = url.substr(std::strlen(prefix));
  }
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.empty() || rest.size() > 5 || rest.find_first_not_of("0123456789") != std::string::npos) return 0;
  const long port = std::strtol(rest.c_str(), nullptr, 10);
  return port > 0 && port < 65536 ? static_cast<uint16_t>(port) : 0;
}

const ExternalConfig* GatewayConfig::FindExternal(const std::string& name) const {
  for (const auto& e : externals) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

std::string PlacementConfig::Name() const {
  return device == "cpu" ? "cpu" : device + "/" + std::to_string(gpu_layers);
}

std::vector<std::string> GatewayConfig::Warnings() const {
  std::vector<std::string> out;
  for (const auto& d : devices) {
    bool used = false;
    for (const auto& s : services) {
      for (const auto& p : s.placements) used |= p.device == d.name;
    }
    for (const auto& e : externals) used |= e.device == d.name;
    if (!used) {
      out.push_back("[[device]] '" + d.name + "' is the device of no placement and no external service: its settings "
                    "apply to nothing (a placement's device written differently?)");
    }
  }
  return out;
}

DeviceConfig GatewayConfig::Device(const std::string& name) const {
  for (const auto& d : devices) {
    if (d.name == name) return d;
  }
  DeviceConfig d;
  d.name = name;
  return d;
}

const ServiceConfig* GatewayConfig::FindService(const std::string& name) const {
  for (const auto& s : services) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::string ServiceConfig::ModelLabel(size_t i) const {
  const PlacementConfig& p = placements[i];
  const std::string& configured = p.model.empty() ? model_name : p.model_name;
  if (models::IsOllamaName(configured)) return configured;
  return std::filesystem::path(p.ModelOr(model)).stem().string();
}

StatusOr<GatewayConfig> ParseConfig(const std::string& text, const std::string& source) {
  toml::table root;
  try {
    auto safe = TomlSafeText(text, source);
    if (!safe.ok()) return safe.status();
    root = toml::parse(*safe, source);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << source << ":" << e.source().begin.line << ": " << e.description();
    return Status::InvalidArgument(os.str());
  }
  GatewayConfig c;
  c.source = source;
  c.allowed_hosts = {"localhost", "127.0.0.1", "[::1]"};
  Reader r(source);
  SPILLWAY_RETURN_IF_ERROR(r.OnlyKnown(root, "", {"listen", "state_dir", "api_keys", "allow_unauthenticated_remote",
                                                  "allowed_hosts", "allowed_origins", "max_body_bytes", "max_queue",
                                                  "json_max_depth", "max_connections", "max_body_memory_bytes",
                                                  "max_requests_per_key", "operator_keys", "model_dirs", "ollama_models",
                                                  "io_threads", "shutdown_grace_s",
                                                  "journal", "service", "device"}));
  std::string listen;
  SPILLWAY_RETURN_IF_ERROR(r.Get(root, "listen", "", &listen, 0, 0));
  if (!listen.empty() && !SplitHostPort(listen, &c.listen_host, &c.listen_port)) {
    return Status::InvalidArgument(Where(source, root.get("listen")->source(), "listen") + " must be HOST:PORT, its port 0 to 65535 (127.0.0.1:8480)");
  }
  SPILLWAY_RETURN_IF_ERROR(r.Get(root, "state_dir", "", &c.state_dir, 0, 0));
  SPILLWAY_RETURN_IF_ERROR(r.Strings(root, "api_keys", &c.api_keys));
  SPILLWAY_RETURN_IF_ERROR(r.Get(root, "allow_unauthenticated_remote", "", &c.allow_unauthenticated_remote, 0, 0));
  SPILLWAY_RETURN_IF_ERROR(r.Strings(root, "allowed_hosts", &c.allowed_hosts));
  for (const auto& h : c.allowed_hosts) {
    // The Host header's port is not compared: "host:8480" could never match.
    const size_t colon = h.rfind(':');
    const bool bracketed = !h.empty() && h.front() == '[';
    const bool with_port = bracketed ? h.back() != ']'                                        // "[::1]:8480"
                                     : colon != std::string::npos && h.find(':') == colon;   // "host:8480" (not "::1")
    if (h.empty() || with_port) {
      return Status::InvalidArgument(Where(source, root.get("allowed_hosts")->source(), "allowed_hosts") +
                                     " names hosts without a port (\"" + h + "\" never matches a Host header)");
    }
  }
  SPILLWAY_RETURN_IF_ERROR(r.Strings(root, "allowed_origins", &c.allowed_origins));
  SPILLWAY_RETURN_IF_ERROR(r.Get(root, "max_body_bytes", "", &c.max_body_bytes, 1024, 1 << 30));
  SPILLWAY_RETURN_IF_ERROR(r.Get(root, "max_queue", "", &c.max_queue, 1, 1 << 20));
  SPILLWAY_RETURN_IF_ERROR(r.Get(root, "json_max_depth", "", &c.json_max_depth, 2, api::kMaxJsonDepth));
  SPILLWAY_RETURN_IF_ERROR(r.Get(root, "max_connections", "", &c.max_connections, 8, 1 << 20));
  SPILLWAY_RETURN_IF_ERROR(r.Get(root, "io_threads", "", &c.io_threads, 1, 64));
  SPILLWAY_RETURN_IF_ERROR(r.Get(root, "shutdown_grace_s", "", &c.shutdown_grace_s, 0, 3600));
  SPILLWAY_RETURN_IF_ERROR(r.Get(root, "max_body_memory_bytes", "", &c.max_body_memory_bytes, 1024, double(1ull << 40)));
  SPILLWAY_RETURN_IF_ERROR(r.Get(root, "max_requests_per_key", "", &c.max_requests_per_key, 1, 1 << 20));
  SPILLWAY_RETURN_IF_ERROR(r.Strings(root, "operator_keys", &c.operator_keys));
  for (const auto& [key, keys] : {std::pair<const char*, const std::vector<std::string>*>{"api_keys", &c.api_keys},
                                  {"operator_keys", &c.operator_keys}}) {
    if (std::find(keys->begin(), keys->end(), "") != keys->end()) {
      return Status::InvalidArgument(Where(source, root.get(key)->source(), key) +
                                     " holds an empty key, which no request can present");
    }
  }
  SPILLWAY_RETURN_IF_ERROR(r.Strings(root, "model_dirs", &c.model_dirs));
  SPILLWAY_RETURN_IF_ERROR(r.Get(root, "ollama_models", "", &c.ollama_models, 0, 0));
  if (root.get("ollama_models")) {
    if (c.ollama_models.empty() || c.ollama_models.front() != '/') {
      return Status::InvalidArgument(Where(source, root.get("ollama_models")->source(), "ollama_models") +
                                     " must be an absolute path to Ollama's store (e.g. /usr/share/ollama/.ollama/models;"
                                     " ~ is not expanded), or left out");
    }
    r.set_ollama_store(c.ollama_models);
  }
  if (const toml::node* j = root.get("journal")) {
    const toml::table* t = j->as_table();
    if (!t) return Status::InvalidArgument(Where(source, j->source(), "journal") + " must be a table");
    SPILLWAY_RETURN_IF_ERROR(r.OnlyKnown(*t, "journal.", {"synchronous", "retention_hours", "idempotency_hours"}));
    std::string sync = "full";
    SPILLWAY_RETURN_IF_ERROR(r.Get(*t, "synchronous", "journal.", &sync, 0, 0));
    if (sync != "full" && sync != "normal") {
      return Status::InvalidArgument(Where(source, t->get("synchronous")->source(), "journal.synchronous") +
                                     " must be \"full\" or \"normal\"");
    }
    c.journal.synchronous_full = sync == "full";
    SPILLWAY_RETURN_IF_ERROR(r.Get(*t, "retention_hours", "journal.", &c.journal.retention_hours, 0.001, 24 * 3650));
    SPILLWAY_RETURN_IF_ERROR(r.Get(*t, "idempotency_hours", "journal.", &c.journal.idempotency_hours, 0.001, 24 * 3650));
    // A request's row (its Idempotency-Key with it) goes retention_hours
    // after it began; the key must live its idempotency_hours after it ended.
    if (c.journal.retention_hours < c.journal.idempotency_hours) {
      std::ostringstream os;
      os << Where(source, (t->get("retention_hours") ? t->get("retention_hours") : t)->source(), "journal.retention_hours")
         << " (" << c.journal.retention_hours << ") is shorter than journal.idempotency_hours ("
         << c.journal.idempotency_hours << "): a request's row, its Idempotency-Key with it, would go before the key "
         << "expires, and a retry with the key would run the request again";
      return Status::InvalidArgument(os.str());
    }
  }
  if (const toml::node* d = root.get("device")) {
    const toml::array* arr = d->as_array();
    if (!arr) return Status::InvalidArgument(Where(source, d->source(), "device") + " must be [[device]] tables");
    size_t i = 0;
    for (const auto& node : *arr) {
      const std::string prefix = "device[" + std::to_string(i++) + "].";
      const toml::table* t = node.as_table();
      if (!t) return Status::InvalidArgument(Where(source, node.source(), prefix) + " must be a table");
      DeviceConfig dc;
      SPILLWAY_RETURN_IF_ERROR(r.OnlyKnown(*t, prefix, {"name", "headroom_mib", "headroom_pct", "exclusive"}));
      SPILLWAY_RETURN_IF_ERROR(r.Get(*t, "name", prefix, &dc.name, 0, 0));
      SPILLWAY_RETURN_IF_ERROR(r.Get(*t, "headroom_mib", prefix, &dc.headroom_mib, 0, 1e9));
      SPILLWAY_RETURN_IF_ERROR(r.Get(*t, "headroom_pct", prefix, &dc.headroom_pct, 0, 90));
      SPILLWAY_RETURN_IF_ERROR(r.Get(*t, "exclusive", prefix, &dc.exclusive, 0, 0));
      if (dc.name.empty()) return Status::InvalidArgument(Where(source, t->source(), prefix + "name") + " is required");
      if (!KnownDeviceName(dc.name)) {
        return Status::InvalidArgument(Where(source, t->get("name")->source(), prefix + "name") + " '" + dc.name +
                                       "' must be cpu, cuda:N or sim:N (N without leading zeros, as a placement's device is written)");
      }
      for (const auto& other : c.devices) {
        if (other.name == dc.name) {
          return Status::InvalidArgument(Where(source, t->get("name")->source(), prefix + "name") + " '" + dc.name +
                                         "' has a [[device]] table already");
        }
      }
      c.devices.push_back(dc);
    }
  }
  if (const toml::node* s = root.get("service")) {
    const toml::array* arr = s->as_array();
    if (!arr) return Status::InvalidArgument(Where(source, s->source(), "service") + " must be an array of tables ([[service]])");
    size_t i = 0;
    for (const auto& node : *arr) {
      const std::string prefix = "service[" + std::to_string(i++) + "].";
      const toml::table* t = node.as_table();
      if (!t) return Status::InvalidArgument(Where(source, node.source(), prefix) + " must be a table");
      std::string kind = "llama";
      SPILLWAY_RETURN_IF_ERROR(r.Get(*t, "kind", prefix, &kind, 0, 0));
      if (kind == "external") {
        ExternalConfig e;
        SPILLWAY_RETURN_IF_ERROR(ReadExternal(r, *t, prefix, &e));
        c.externals.push_back(std::move(e));
        continue;
      }
      if (kind != "llama") {
        return Status::InvalidArgument(Where(source, t->get("kind")->source(), prefix + "kind") +
                                       " must be \"llama\" (a GGUF model served by spillway-worker) or \"external\"");
      }
      ServiceConfig svc;
      SPILLWAY_RETURN_IF_ERROR(
          r.OnlyKnown(*t, prefix, {"name", "kind", "model", "max_tokens", "default_max_tokens", "max_queue", "placement", "admission",
                                   "failover", "cpu_path", "residency", "keep_alive_s", "priority", "evict_cost", "fair_turn_s",
                                   "windows", "interactive_idle_s", "outside_window"}));
      SPILLWAY_RETURN_IF_ERROR(ReadResidency(r, *t, prefix, &svc.residency));
      if (const toml::node* fn = t->get("failover")) {
        const toml::table* ft = fn->as_table();
        const std::string fp = prefix + "failover.";
        if (!ft) return Status::InvalidArgument(Where(source, fn->source(), fp) + " must be a table");
        SPILLWAY_RETURN_IF_ERROR(r.OnlyKnown(*ft, fp, {"breaker_failures", "ejection_s", "max_ejection_s", "probe_hold_s", "readiness",
                                                       "recovery_budget_s", "idle_unload_s"}));
        SPILLWAY_RETURN_IF_ERROR(r.Get(*ft, "breaker_failures", fp, &svc.failover.breaker_failures, 1, 1000));
        SPILLWAY_RETURN_IF_ERROR(r.Get(*ft, "ejection_s", fp, &svc.failover.ejection_s, 0.01, 86400));
        SPILLWAY_RETURN_IF_ERROR(r.Get(*ft, "max_ejection_s", fp, &svc.failover.max_ejection_s, 0.01, 86400));
        SPILLWAY_RETURN_IF_ERROR(r.Get(*ft, "probe_hold_s", fp, &svc.failover.probe_hold_s, 0.1, 60));
        SPILLWAY_RETURN_IF_ERROR(r.Get(*ft, "readiness", fp, &svc.failover.readiness, 0, 0));
        SPILLWAY_RETURN_IF_ERROR(r.Get(*ft, "recovery_budget_s", fp, &svc.failover.recovery_budget_s, 0, 3600));
        SPILLWAY_RETURN_IF_ERROR(r.Get(*ft, "idle_unload_s", fp, &svc.failover.idle_unload_s, 1, 86400 * 30));
        const auto& rd = svc.failover.readiness;
        if (rd != "warm" && rd != "mmap" && rd != "on-demand" && rd != "auto") {
          return Status::InvalidArgument(Where(source, ft->get("readiness")->source(), fp + "readiness") +
                                         " must be \"warm\", \"mmap\", \"on-demand\" or \"auto\"");
        }
      }
      if (const toml::node* cn = t->get("cpu_path")) {
        const toml::table* ct = cn->as_table();
        const std::string cp = prefix + "cpu_path.";
        if (!ct) return Status::InvalidArgument(Where(source, cn->source(), cp) + " must be a table");
        SPILLWAY_RETURN_IF_ERROR(r.OnlyKnown(*ct, cp, {"max_queue", "concurrency", "max_prompt_tokens", "max_tokens",
                                                       "ram_budget_mib", "host_headroom_mib", "wait_comment_s"}));
        auto& q = svc.cpu_path;
        SPILLWAY_RETURN_IF_ERROR(r.Get(*ct, "max_queue", cp, &q.max_queue, 0, 100000));
        SPILLWAY_RETURN_IF_ERROR(r.Get(*ct, "concurrency", cp, &q.concurrency, 1, 256));
        SPILLWAY_RETURN_IF_ERROR(r.Get(*ct, "max_prompt_tokens", cp, &q.max_prompt_tokens, 0, 1 << 24));
        SPILLWAY_RETURN_IF_ERROR(r.Get(*ct, "max_tokens", cp, &q.max_tokens, 0, 1 << 20));
        SPILLWAY_RETURN_IF_ERROR(r.Get(*ct, "ram_budget_mib", cp, &q.ram_budget_mib, 0, 1 << 30));
        SPILLWAY_RETURN_IF_ERROR(r.Get(*ct, "host_headroom_mib", cp, &q.host_headroom_mib, 0, 1 << 30));
        SPILLWAY_RETURN_IF_ERROR(r.Get(*ct, "wait_comment_s", cp, &q.wait_comment_s, 0.1, 3600));
      }
      if (const toml::node* an = t->get("admission")) {
        const toml::table* at = an->as_table();
        const std::string ap = prefix + "admission.";
        if (!at) return Status::InvalidArgument(Where(source, an->source(), ap) + " must be a table");
        SPILLWAY_RETURN_IF_ERROR(
            r.OnlyKnown(*at, ap, {"enabled", "reroute_on_pressure", "fail_fast", "allow_shrink", "max_delay_s", "pressure"}));
        SPILLWAY_RETURN_IF_ERROR(r.Get(*at, "enabled", ap, &svc.admission.enabled, 0, 0));
        auto& a = svc.admission;
        SPILLWAY_RETURN_IF_ERROR(r.Get(*at, "reroute_on_pressure", ap, &a.reroute_on_pressure, 0, 0));
        SPILLWAY_RETURN_IF_ERROR(r.Get(*at, "fail_fast", ap, &a.fail_fast, 0, 0));
        SPILLWAY_RETURN_IF_ERROR(r.Get(*at, "allow_shrink", ap, &a.allow_shrink, 0, 0));
        SPILLWAY_RETURN_IF_ERROR(r.Get(*at, "max_delay_s", ap, &a.max_delay_s, 0, 3600));
        SPILLWAY_RETURN_IF_ERROR(r.Get(*at, "pressure", ap, &a.pressure, 0.05, 1.0));
      }
      SPILLWAY_RETURN_IF_ERROR(r.Get(*t, "name", prefix, &svc.name, 0, 0));
      SPILLWAY_RETURN_IF_ERROR(r.Get(*t, "model", prefix, &svc.model, 0, 0));
      SPILLWAY_RETURN_IF_ERROR(r.Get(*t, "max_tokens", prefix, &svc.max_tokens, 1, 1 << 20));
      SPILLWAY_RETURN_IF_ERROR(r.Get(*t, "default_max_tokens", prefix, &svc.default_max_tokens, 1, 1 << 20));
      // Unset, the default is 256 or the cap, whichever is less.
      if (!t->get("default_max_tokens")) svc.default_max_tokens = std::min(svc.default_max_tokens, svc.max_tokens);
      SPILLWAY_RETURN_IF_ERROR(r.Get(*t, "max_queue", prefix, &svc.max_queue, 0, 1 << 20));
      if (svc.name.empty()) return Status::InvalidArgument(Where(source, t->source(), prefix + "name") + " is required");
      if (svc.model.empty()) return Status::InvalidArgument(Where(source, t->source(), prefix + "model") + " is required");
      SPILLWAY_RETURN_IF_ERROR(r.ResolveModel(t->get("model"), prefix + "model", &svc.model, &svc.model_name));
      if (const toml::node* p = t->get("placement")) {
        const toml::array* pa = p->as_array();
        if (!pa) return Status::InvalidArgument(Where(source, p->source(), prefix + "placement") + " must be [[service.placement]]");
        size_t k = 0;
        for (const auto& pn : *pa) {
          const std::string pp = prefix + "placement[" + std::to_string(k++) + "].";
          const toml::table* pt = pn.as_table();
          if (!pt) return Status::InvalidArgument(Where(source, pn.source(), pp) + " must be a table");
          PlacementConfig pc;
          SPILLWAY_RETURN_IF_ERROR(ReadPlacement(r, *pt, pp, &pc));
          svc.placements.push_back(pc);
        }
      }
      if (svc.placements.empty()) svc.placements.push_back(PlacementConfig{});
      for (size_t k = 0; k < svc.placements.size(); ++k) {
        auto& role = svc.placements[k].role;
        if (role.empty()) role = k == 0 ? "primary" : "fallback";
        if ((role == "primary") != (k == 0)) {
          return Status::InvalidArgument(source + ": service '" + svc.name +
                                         "': the first placement is the primary, and only the first");
        }
      }
      // Each request the CPU path lets run needs a slot of its replica:
      // those past the slots held a running place (and its RAM) with none.
      for (size_t k = 0; k < svc.placements.size(); ++k) {
        if (svc.OnCpuPath(k) && svc.cpu_path.concurrency > svc.placements[k].slots) {
          const toml::node* cn = t->get("cpu_path");
          const toml::node* n = cn && cn->as_table() ? cn->as_table()->get("concurrency") : nullptr;
          return Status::InvalidArgument(Where(source, n ? n->source() : t->source(), prefix + "cpu_path.concurrency") +
                                         " (" + std::to_string(svc.cpu_path.concurrency) + ") exceeds the slots (" +
                                         std::to_string(svc.placements[k].slots) + ") of its CPU placement " +
                                         std::to_string(k) + ": each running request needs a slot");
        }
      }
      c.services.push_back(std::move(svc));
    }
  }
  return c;
}

StatusOr<GatewayConfig> LoadConfigFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return Status::InvalidArgument("config file " + path + " is a directory (give the path of the .toml file)");
  }
  // Non-blocking: a FIFO's open waited for a writer forever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return Status::NotFound("cannot read config file " + path + ": " + std::strerror(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return Status::InvalidArgument("config file " + path + " is not a regular file");
  }
  // (/dev/zero or a model file given by mistake was read whole, twice over.)
  constexpr off_t kMaxConfigBytes = off_t{4} << 20;
  if (st.st_size > kMaxConfigBytes) {
    return Status::InvalidArgument("config file " + path + " is " + std::to_string(st.st_size) +
                                   " bytes, more than a config's 4 MiB: is it the .toml file?");
  }
  auto text = ReadAll(fd);
  if (!text) return Status::NotFound("cannot read config file " + path + ": " + std::strerror(errno));
  auto cfg = ParseConfig(*text, path);
  if (!cfg.ok()) return cfg;
  // A relative model path is the working directory's, held absolute from
  // here on: its errors say where it was looked for, and a worker's
  // fingerprint (its --model) is the file's, not a string another
  // directory's gateway read as the same (it adopted a worker serving the
  // other directory's file).
  auto absolute = [](std::string& model) {
    std::error_code ec;
    if (model.empty() || std::filesystem::path(model).is_absolute()) return;
    if (auto abs = std::filesystem::absolute(model, ec); !ec) model = abs.lexically_normal().string();
  };
  for (auto& svc : cfg->services) {
    absolute(svc.model);
    for (auto& p : svc.placements) absolute(p.model);
  }
  return cfg;
}

GatewayConfig DemoConfig(const std::string& models_dir) {
  GatewayConfig c;
  ServiceConfig chat;
  chat.name = "chat";
  chat.model = models_dir + "/demo-chat.gguf";
  PlacementConfig p;
  p.role = "primary";
  p.ctx = 8192;  // 2048 cells per slot
  p.slots = 4;
  chat.placements = {p};
  ServiceConfig embed;
  embed.name = "embed";
  embed.model = models_dir + "/demo-embed.gguf";
  PlacementConfig e;
  e.role = "primary";
  e.ctx = 512;
  e.slots = 2;
  embed.placements = {e};
  c.services = {chat, embed};
  return c;
}

Status Validate(const GatewayConfig& c, bool model_files) {
  if (c.services.empty() && c.externals.empty()) return Status::InvalidArgument(c.source + ": no [[service]] is declared");
  std::set<std::string> names;
  for (const auto& e : c.externals) {
    if (!names.insert(e.name).second) return Status::InvalidArgument(c.source + ": service '" + e.name + "' is declared twice");
    if (!ValidServiceName(e.name)) {
      return Status::InvalidArgument(c.source + ": service name '" + e.name + "' may hold only letters, digits, - _ .");
    }
    bool uses_model = false;
    for (const auto& a : e.command) uses_model |= a.find("${MODEL}") != std::string::npos;
    std::error_code ec;
    if (uses_model && !std::filesystem::exists(e.model, ec)) {
      return Status::InvalidArgument(c.source + ": service '" + e.name + "': model " +
                                     (e.model.empty() ? std::string("(none given)") : e.model) +
                                     " not found (its command takes ${MODEL})");
    }
  }
  for (const auto& s : c.services) {
    if (!names.insert(s.name).second) return Status::InvalidArgument(c.source + ": service '" + s.name + "' is declared twice");
    if (!ValidServiceName(s.name)) {
      return Status::InvalidArgument(c.source + ": service name '" + s.name + "' may hold only letters, digits, - _ .");
    }
    std::error_code ec;
    // (A folder given as the model was "not found", though it is there.)
    auto missing = [&](const std::string& path) {
      return std::filesystem::exists(path, ec) ? " is not a regular file (the model is a .gguf file)" : " not found";
    };
    if (model_files && !std::filesystem::is_regular_file(s.model, ec)) {
      return Status::InvalidArgument(c.source + ": service '" + s.name + "': model file " + s.model + missing(s.model) +
                                     " (serve --keep-going starts without it)");
    }
    for (const auto& p : s.placements) {
      if (p.model.empty() || p.model == s.model) continue;
      if (!std::filesystem::is_regular_file(p.model, ec) || !std::filesystem::is_regular_file(s.model, ec)) {
        // (--keep-going: a missing file is a placement that cannot work; its
        // fingerprint is checked once it is there.)
        if (!model_files) continue;
        return Status::InvalidArgument(c.source + ": service '" + s.name + "': placement model " + p.model +
                                       missing(p.model) + " (serve --keep-going starts without it)");
      }
      // A replica must be the same model (its fingerprint starts with the
      // file's hash); another model is allowed only when declared as such.
      if (!p.different_model) {
        auto a = Sha256File(s.model), b = Sha256File(p.model);
        if (!a.ok() || !b.ok() || *a != *b) {
          return Status::InvalidArgument(c.source + ": service '" + s.name + "': placement " + p.Name() + " uses " +
                                         p.model + ", whose fingerprint differs from " + s.model +
                                         "; declare different_model = true to serve it as an announced fallback model");
        }
      }
    }
    if (s.default_max_tokens > s.max_tokens) {
      return Status::InvalidArgument(c.source + ": service '" + s.name + "': default_max_tokens (" +
                                     std::to_string(s.default_max_tokens) + ") exceeds max_tokens (" +
                                     std::to_string(s.max_tokens) + ")");
    }
  }
  const bool loopback = c.listen_host == "127.0.0.1" || c.listen_host == "::1" || c.listen_host.rfind("127.", 0) == 0;
  if (!loopback && c.api_keys.empty() && c.operator_keys.empty() && !c.allow_unauthenticated_remote) {
    return Status::InvalidArgument(c.source + ": listening on " + c.listen_host +
                                   " (beyond loopback) needs api_keys (or $SPILLWAY_API_KEYS); set "
                                   "allow_unauthenticated_remote = true to override");
  }
  return Status::Ok();
}

}  // namespace spillway::config
