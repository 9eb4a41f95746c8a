// The gateway's hot functions in the order the linker should lay them out
// (lld's --symbol-ordering-file), from a callgrind dump of its I/O thread
// serving requests (gateway_instructions --keep; bench/hot_functions.sh runs
// both and writes cmake/hot-functions.txt).
//
// Why: between two requests the worker evicts the gateway's code from the
// core's caches, so each distinct line of code a request runs is a miss
// (docs/BENCHMARKS.md, sessions 48-51). Laid out together, in the order they
// call each other, the ~600 functions requests run share pages and lines
// with each other instead of with code that never runs, and the hardware's
// sequential prefetch fetches ahead along the way.
//
// The order: call-chain clustering (Ottoni and Maher, "Optimizing function
// placement for large-scale data-center applications", CGO 2017, as HHVM and
// BOLT do it): the calls taken most often first, each merging the callee's
// cluster after the caller's while the two together take at most a page
// (4 KiB);
// then clusters by instructions run per byte, densest first. Only functions
// of the gateway's own binary, named as the linker knows them (nm: the
// dump's names are demangled).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <filesystem>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

struct Profile {
  std::map<std::string, double> self;                       // instructions run in each function
  std::map<std::pair<std::string, std::string>, double> calls;  // caller, callee: times called
};

// A callgrind name as nm -C spells it: a recursion cycle's "'2" suffix off.
std::string Plain(std::string name) {
  if (auto q = name.rfind('\''); q != std::string::npos && q + 1 < name.size() &&
                                 name.find_first_not_of("0123456789", q + 1) == std::string::npos) {
    name.resize(q);
  }
  return name;
}

// The dump's functions of `object` (its path as the dump names it): their
// own instructions and their calls to each other. Cost lines are "0x<addr>
// <line> <count>" (--dump-instr=yes); the one after "calls=" is the call's
// inclusive cost, not the caller's own.
std::optional<Profile> ReadDump(const std::string& file, const std::string& object) {
  std::ifstream in(file);
  if (!in) return std::nullopt;
  Profile p;
  std::string line, ob, fn, cob, cfn;
  bool call_cost = false;
  double call_count = 0;
  while (std::getline(in, line)) {
    if (line.rfind("ob=", 0) == 0) {
      ob = line.substr(3);
    } else if (line.rfind("fn=", 0) == 0) {
      fn = Plain(line.substr(3));
    } else if (line.rfind("cob=", 0) == 0) {
      cob = line.substr(4);
    } else if (line.rfind("cfn=", 0) == 0) {
      cfn = Plain(line.substr(4));
    } else if (line.rfind("calls=", 0) == 0) {
      call_count = std::stod(line.substr(6));
      call_cost = true;
    } else if (line.rfind("0x", 0) == 0) {
      const size_t sp = line.rfind(' ');
      const double cost = sp == std::string::npos ? 0 : std::stod(line.substr(sp + 1));
      if (call_cost) {
        if (ob == object && (cob.empty() ? ob : cob) == object) p.calls[{fn, cfn}] += call_count;
        call_cost = false;
        cob.clear();
      } else if (ob == object) {
        p.self[fn] += cost;
      }
    }
  }
  return p;
}

// `bin`'s functions by demangled name: {mangled name, size}. The first of
// several at one address, and of several with one demangled name, is taken.
std::unordered_map<std::string, std::pair<std::string, uint64_t>> Symbols(const std::string& bin) {
  auto read = [&](const std::string& flags) {
    std::map<uint64_t, std::pair<std::string, uint64_t>> by_addr;  // address: {name, size}
    const std::string cmd = "nm -S --defined-only " + flags + " '" + bin + "' 2>/dev/null";
    std::unique_ptr<FILE, int (*)(FILE*)> p(::popen(cmd.c_str(), "r"), ::pclose);
    if (!p) return by_addr;
    std::string text;
    char buf[65536];
    while (size_t n = std::fread(buf, 1, sizeof buf, p.get())) text.append(buf, n);
    size_t at = 0;
    while (at < text.size()) {
      size_t end = text.find('\n', at);
      if (end == std::string::npos) end = text.size();
      const std::string l = text.substr(at, end - at);
      at = end + 1;
      // "<address> <size> <type> <name>": a function (t, T, w, W) with a size.
      char* rest = nullptr;
      const uint64_t addr = std::strtoull(l.c_str(), &rest, 16);
      if (!rest || *rest != ' ') continue;
      char* rest2 = nullptr;
      const uint64_t size = std::strtoull(rest + 1, &rest2, 16);
      if (!rest2 || rest2[0] != ' ' || rest2[1] == '\0' || !std::strchr("tTwW", rest2[1]) || rest2[2] != ' ') continue;
      by_addr.emplace(addr, std::make_pair(std::string(rest2 + 3), size));
    }
    return by_addr;
  };
  const auto mangled = read("");
  const auto demangled = read("-C");
  std::unordered_map<std::string, std::pair<std::string, uint64_t>> out;
  for (const auto& [addr, d] : demangled) {
    if (auto m = mangled.find(addr); m != mangled.end()) out.emplace(d.first, m->second);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Orders the gateway's hot functions for the linker (lld's --symbol-ordering-file) from a callgrind dump."};
  std::vector<std::string> dumps;
  std::string bin = "build/bin/spillway", out = "cmake/hot-functions.txt";
  uint64_t page = 4096;
  app.add_option("--dump", dumps, "callgrind dumps of the gateway's I/O threads serving requests")->required();
  app.add_option("--bin", bin, "the gateway's binary the dumps ran")->capture_default_str();
  app.add_option("-o,--out", out, "where the order goes")->capture_default_str();
  app.add_option("--cluster-bytes", page, "the most bytes one chain of calls is merged to")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  // (A dump names each object by its absolute path, links resolved.)
  std::error_code ec;
  const auto resolved = std::filesystem::canonical(bin, ec);
  if (ec) {
    std::cerr << "hot_functions: " << bin << ": " << ec.message() << "\n";
    return 1;
  }
  bin = resolved.string();

  Profile all;
  for (const auto& d : dumps) {
    auto p = ReadDump(d, bin);
    if (!p) {
      std::cerr << "hot_functions: cannot read " << d << "\n";
      return 1;
    }
    for (const auto& [f, c] : p->self) all.self[f] += c;
    for (const auto& [e, n] : p->calls) all.calls[e] += n;
  }
  const auto symbols = Symbols(bin);
  if (symbols.empty()) {
    std::cerr << "hot_functions: no symbols read from " << bin << " (nm)\n";
    return 1;
  }
  // One cluster per function that ran and that the linker knows by name.
  std::map<std::string, size_t> of;              // function: its cluster
  std::vector<std::vector<std::string>> clusters;
  std::vector<uint64_t> bytes;
  std::vector<double> cost;
  size_t unnamed = 0;
  for (const auto& [f, c] : all.self) {
    auto s = symbols.find(f);
    if (c <= 0) continue;
    if (s == symbols.end()) {
      ++unnamed;
      continue;
    }
    of[f] = clusters.size();
    clusters.push_back({f});
    bytes.push_back(s->second.second);
    cost.push_back(c);
  }
  std::vector<std::pair<std::pair<std::string, std::string>, double>> calls(all.calls.begin(), all.calls.end());
  std::stable_sort(calls.begin(), calls.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  for (const auto& [edge, n] : calls) {
    auto a = of.find(edge.first), b = of.find(edge.second);
    if (a == of.end() || b == of.end()) continue;
    const size_t ca = a->second, cb = b->second;
    if (ca == cb || bytes[ca] + bytes[cb] > page) continue;
    for (const auto& f : clusters[cb]) of[f] = ca;
    clusters[ca].insert(clusters[ca].end(), clusters[cb].begin(), clusters[cb].end());
    clusters[cb].clear();
    bytes[ca] += bytes[cb];
    cost[ca] += cost[cb];
    bytes[cb] = 0;
    cost[cb] = 0;
  }
  std::vector<size_t> order;
  for (size_t i = 0; i < clusters.size(); ++i) {
    if (!clusters[i].empty()) order.push_back(i);
  }
  auto density = [&](size_t i) { return cost[i] / static_cast<double>(std::max<uint64_t>(bytes[i], 1)); };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return density(a) > density(b); });

  if (order.empty()) {  // (the list is left as it was: an empty one would undo the order)
    std::cerr << "hot_functions: no function of " << bin << " ran in the dumps: not the binary they profiled?\n";
    return 1;
  }
  std::ofstream o(out);
  if (!o) {
    std::cerr << "hot_functions: cannot write " << out << "\n";
    return 1;
  }
  o << "# The gateway's hot functions, in the order lld lays them out (--symbol-ordering-file).\n"
       "# Written by bench/hot_functions.sh from a callgrind profile of requests; names that are\n"
       "# no longer in the binary are skipped by the linker, so an old list only loses some gain.\n";
  size_t functions = 0;
  uint64_t total = 0;
  for (size_t i : order) {
    for (const auto& f : clusters[i]) {
      const auto& s = symbols.at(f);
      o << s.first << "\n";
      ++functions;
      total += s.second;
    }
  }
  std::printf("%zu functions, %llu bytes, in %zu clusters; %zu functions that ran had no symbol of the binary\n",
              functions, static_cast<unsigned long long>(total), order.size(), unnamed);
  return o ? 0 : 1;
}
