#include "common/mutation.h"

#include <cstdio>
#include <cstdlib>
#include <set>

namespace spillway {
namespace {

struct Mutations {
  std::string text;
  std::set<std::string, std::less<>> names;
  Mutations() {
    if (const char* e = std::getenv("SPILLWAY_MUTATIONS")) text = e;
    size_t start = 0;
    while (start <= text.size()) {
      size_t comma = text.find(',', start);
      if (comma == std::string::npos) comma = text.size();
      if (comma > start) names.insert(text.substr(start, comma - start));
      start = comma + 1;
    }
    if (!names.empty()) std::fprintf(stderr, "spillway: MUTATIONS ACTIVE (deliberate bugs for tests): %s\n", text.c_str());
  }
};

const Mutations& Get() {
  static const Mutations m;
  return m;
}

}  // namespace

bool MutationActive(std::string_view name) {
  const auto& m = Get();
  return !m.names.empty() && m.names.find(name) != m.names.end();
}

const std::string& ActiveMutations() { return Get().text; }

}  // namespace spillway
