#include "worker/grammar_bounds.h"

#include <cctype>
#include <cstdint>
#include <string>

namespace spillway::worker {

namespace {

bool Digit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }

// Skips GBNF's spaces and comments (as its parser does inside a rule).
size_t SkipSpace(std::string_view g, size_t i) {
  while (i < g.size()) {
    if (g[i] == '#') {
      while (i < g.size() && g[i] != '\n') ++i;
    } else if (g[i] == ' ' || g[i] == '\t' || g[i] == '\r' || g[i] == '\n') {
      ++i;
    } else {
      break;
    }
  }
  return i;
}

// A whole number at `i` (saturating: a bound past 2^64 is as large as any).
size_t Number(std::string_view g, size_t i, uint64_t* out) {
  uint64_t v = 0;
  while (i < g.size() && Digit(g[i])) {
    const uint64_t d = static_cast<uint64_t>(g[i] - '0');
    v = v > (UINT64_MAX - d) / 10 ? UINT64_MAX : v * 10 + d;
    ++i;
  }
  *out = v;
  return i;
}

}  // namespace

Status CheckRepetitionBounds(std::string_view g) {
  for (size_t i = 0; i < g.size(); ++i) {
    const char c = g[i];
    if (c == '"' || c == '[') {  // a literal or a character class: up to its unescaped end
      const char end = c == '"' ? '"' : ']';
      for (++i; i < g.size() && g[i] != end; ++i) {
        if (g[i] == '\\') ++i;
      }
      continue;
    }
    if (c == '#') {
      while (i < g.size() && g[i] != '\n') ++i;
      continue;
    }
    if (c != '{') continue;
    size_t j = SkipSpace(g, i + 1);
    if (j >= g.size() || !Digit(g[j])) continue;  // (llama.cpp refuses it as malformed)
    uint64_t lo = 0, hi = 0;
    j = SkipSpace(g, Number(g, j, &lo));
    if (j >= g.size() || g[j] != ',') continue;  // {m}: exactly m
    j = SkipSpace(g, j + 1);
    if (j >= g.size() || !Digit(g[j])) continue;  // {m,}: at least m
    j = SkipSpace(g, Number(g, j, &hi));
    if (hi < lo) {
      return Status::InvalidArgument(
          "the grammar built for this request repeats an item at least " + std::to_string(lo) + " and at most " +
          std::to_string(hi) +
          " times, which no text can match (a JSON schema's minLength above its maxLength, minItems above "
          "maxItems, or a pattern's {" + std::to_string(lo) + "," + std::to_string(hi) + "})");
    }
    i = j > i ? j - 1 : i;
  }
  return Status::Ok();
}

}  // namespace spillway::worker
