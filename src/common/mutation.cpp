#include "common/mutation.h"

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

namespace spillway {
namespace {

struct Mutations {
  std::set<std::string, std::less<>> names;
  Mutations() {
    const char* e = std::getenv("SPILLWAY_MUTATIONS");
    const std::string text = e ? e : "";
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
  const auto& names = Get().names;
  return names.find(name) != names.end();
}

}  // namespace spillway
