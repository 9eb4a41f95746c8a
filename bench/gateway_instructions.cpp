// Benchmark: the CPU instructions a proxy spends on one request, counted by
// valgrind's callgrind, for spillway serve (journal at NORMAL and at FULL),
// Debian's nginx (proxy_pass, keep-alive upstream) and a bare Asio proxy,
// each in front of the same kind of worker (the worker not counted), in the
// same run. Counted instructions do not depend on the machine's scheduling,
// which blurs gateway_overhead's times and CPU times by about ±10 %: a change
// of a few per cent to the request path shows here, and the ratio to nginx is
// the same from run to run. (Instructions are not time: a syscall counts as
// one, and cache misses not at all. gateway_overhead says what a request
// waits.)
//
// Beside the instructions, the code a request runs through: the distinct
// 64-byte lines of machine code that ran (in the gateway, on its I/O threads),
// over the N requests, which take the same path each time. In the timed
// benchmarks the worker runs between two requests and evicts the proxy's
// code, so each of those lines is a cache miss a request; own time has
// followed this count more closely than the instructions (docs/BENCHMARKS.md,
// session 50), though code that is smaller but slower (-Os) is not faster.
// Unlike the instructions, no idle share is taken off: the lines of the I/O
// threads' own timers that ran meanwhile are counted too (a few dozen).
//
// Each side: a warm-up, then its counters zeroed, N sequential requests on one
// keep-alive connection, and a dump. In the gateway only the threads that
// work on requests count (kRequestThreads); what is still counted while idle
// is counted over as long with no requests and subtracted. --keep leaves the
// dumps for callgrind_annotate; --stream sends streamed 4-token completions
// (the relay's way) instead of one-token answers; --by-owner K lists the
// gateway's code lines by whose code they are (a class or namespace of its
// own binary, or a library), the K largest: where a cut would count.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "api/http_client.h"
#include "bench_gateway.h"
#include "nginx_proxy.h"
#include "worker_secret.h"

using nlohmann::json;
using namespace spillway::bench;
namespace fs = std::filesystem;

namespace {

std::string OnPath(const std::string& name) {
  std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  path += ":/usr/bin";
  size_t from = 0;
  while (from <= path.size()) {
    const size_t to = std::min(path.find(':', from), path.size());
    const std::string candidate = path.substr(from, to - from) + "/" + name;
    if (to > from && ::access(candidate.c_str(), X_OK) == 0) return candidate;
    from = to + 1;
  }
  return "";
}

// The gateway's threads that work on requests: the I/O threads, the
// journal's row thread and its commit log's sync thread (at FULL); not the
// event feed, the supervisor or the status refresher, whose work comes with
// time, not with requests.
// (Whole signatures: callgrind turns counting on and off at every entry and
// exit of a function whose name matches, and a pattern like *RunLogged*
// matches lambdas and templates inside it too, turning it off again.)
const std::vector<std::pair<std::string, std::string>> kRequestThreads = {
    {"spillway::http::RunLogged(boost::asio::io_context&, char const*)", "I/O threads"},
    {"spillway::journal::Journal::RunThread()", "journal rows"},
    {"spillway::journal::CommitLog::SyncThread()", "log syncs"}};

// One process counted under callgrind: its dumps are <out>.1, <out>.2, ...
struct Counted {
  explicit Counted(std::string what) : label(std::move(what)) {}
  std::string label;
  pid_t pid = -1;
  uint16_t port = 0;
  std::string out;
  std::string body;
  spillway::http::HeaderList headers;
  int dumps = 0;
  // The gateway's request threads, by a function each runs (its dumps are per thread): what each kind counted.
  std::vector<std::pair<std::string, std::string>> threads;  // {function name in the dump, label}
  // --by-owner: its program's path as dumps name it, and how many owners to list (0: none).
  std::string program;
  int by_owner = 0;
};

// `threads`: count only inside these functions (the threads they run), not
// the process's other threads, each thread in a dump of its own.
std::vector<std::string> Callgrind(const std::string& valgrind, const std::string& out,
                                   const std::vector<std::pair<std::string, std::string>>& threads = {}) {
  // (Each instruction's address, uncompressed, for the code lines; names uncompressed: a compressed one is
  // spelled out once, in whichever thread's dump comes first.)
  std::vector<std::string> args = {valgrind,         "-q", "--tool=callgrind", "--callgrind-out-file=" + out,
                                   "--dump-instr=yes", "--compress-pos=no", "--compress-strings=no"};
  if (!threads.empty()) args.insert(args.end(), {"--collect-atstart=no", "--separate-threads=yes"});
  for (const auto& [fn, label] : threads) args.push_back("--toggle-collect=" + fn);
  return args;
}

// callgrind_control's exit status says nothing (0 for a pid it did not
// find): its answer does, "OK." once the command was done.
bool Control(const std::string& tool, const char* flag, pid_t pid) {
  const std::string cmd = tool + " " + flag + " " + std::to_string(pid) + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return false;
  std::string out;
  char buf[512];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  ::pclose(p);
  const bool ok = out.find("OK.") != std::string::npos;
  if (!ok) std::printf("  callgrind_control %s %d: %s\n", flag, static_cast<int>(pid), out.c_str());
  return ok;
}

// What one dump counted: in all, and by the kind of thread (kRequestThreads'
// names) when the threads were dumped apart (--separate-threads).
using CodeLines = std::set<std::pair<std::string, uint64_t>>;  // {object file, address / 64}

struct Counts {
  double total = 0;
  std::map<std::string, double> by_thread;
  // The code that ran on the serving threads (all of a process's without `threads`; the gateway's I/O
  // threads).
  CodeLines code_lines;
  std::map<std::string, CodeLines> by_owner;  // the same lines by whose code they are (OwnerOf)
};

struct Dumped {
  double total = 0;
  std::string kind;  // which of `threads`' functions its thread ran; "" for none
  CodeLines code_lines;
  std::map<std::string, CodeLines> by_owner;
};

// Whose code a function of a dump is: a library's (its file's name), or in the
// program, its class or namespace without template arguments
// ("spillway::gateway::RequestLifecycle", "boost::beast::http", "std").
std::string OwnerOf(const std::string& object, const std::string& fn, const std::string& program) {
  if (object != program) return fs::path(object).filename().string();
  // The name: after the return type (the last space outside <>), up to the
  // parameters' '(' ("(anonymous namespace)" is a part of the name).
  size_t begin = 0, end = fn.size();
  int depth = 0;
  for (size_t i = 0; i < fn.size(); ++i) {
    const char ch = fn[i];
    if (ch == '<') {
      ++depth;
    } else if (ch == '>') {
      --depth;
    } else if (depth == 0 && ch == '(') {
      if (fn.compare(i, 21, "(anonymous namespace)") == 0) {
        i += 20;
        continue;
      }
      end = i;
      break;
    } else if (depth == 0 && ch == ' ') {
      begin = i + 1;
    }
  }
  std::string name;
  depth = 0;
  for (size_t i = begin; i < end; ++i) {  // (template arguments left out)
    if (fn[i] == '<') {
      ++depth;
    } else if (fn[i] == '>') {
      --depth;
    } else if (depth == 0) {
      name += fn[i];
    }
  }
  std::vector<std::string> parts;
  for (size_t at = 0;;) {
    const size_t next = name.find("::", at);
    parts.push_back(name.substr(at, next == std::string::npos ? std::string::npos : next - at));
    if (next == std::string::npos) break;
    at = next + 2;
  }
  if (parts.size() >= 3 && (parts[0] == "spillway" || parts[0] == "boost")) {
    return parts[0] + "::" + parts[1] + "::" + parts[2];
  }
  return parts[0];
}

// The instructions a dump file counted ("totals:" line), which of `threads`' functions its thread ran (the
// first whose name it holds), and the code lines its instructions are on. A cost line is "0x<address> <line>
// <count>"; the one after a "calls=" line is the call's inclusive cost at the call site, not code that ran
// there.
// `program`: the gateway's binary as the dump names it, for by_owner (empty: not kept).
std::optional<Dumped> ReadDump(const std::string& file, const std::vector<std::pair<std::string, std::string>>& threads,
                               const std::string& program) {
  for (int i = 0; i < 100; ++i) {  // the dump is written asynchronously
    std::ifstream f(file);
    std::string line, object, owner;
    Dumped d;
    bool total = false, call_cost = false;
    while (std::getline(f, line)) {
      if (line.rfind("0x", 0) == 0) {
        if (!std::exchange(call_cost, false)) {
          const std::pair<std::string, uint64_t> code{object, std::stoull(line, nullptr, 16) / 64};
          d.code_lines.insert(code);
          if (!program.empty()) d.by_owner[owner].insert(code);
        }
      } else if (line.rfind("calls=", 0) == 0) {
        call_cost = true;
      } else if (line.rfind("ob=", 0) == 0) {
        object = line.substr(3);
      } else if (line.rfind("totals:", 0) == 0) {
        d.total = std::stod(line.substr(7));
        total = true;
      } else if (line.rfind("fn=", 0) == 0) {
        if (!program.empty()) owner = OwnerOf(object, line.substr(3), program);
        for (const auto& [fn, label] : threads) {
          if (d.kind.empty() && line.find(fn) != std::string::npos) d.kind = fn;
        }
      }
    }
    if (total) return d;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return std::nullopt;
}

// Counts since the last zeroing, dumped now.
std::optional<Counts> Dump(const std::string& tool, Counted& c) {
  if (!Control(tool, "-d", c.pid)) return std::nullopt;
  const std::string name = fs::path(c.out).filename().string() + "." + std::to_string(++c.dumps);
  std::vector<std::string> files;
  for (int i = 0; i < 100 && files.empty(); ++i) {  // (written asynchronously)
    for (const auto& e : fs::directory_iterator(fs::path(c.out).parent_path())) {
      const std::string f = e.path().filename().string();
      if (f == name || f.rfind(name + "-", 0) == 0) files.push_back(e.path().string());
    }
    if (files.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (files.empty()) return std::nullopt;
  Counts out;
  for (const auto& f : files) {
    auto d = ReadDump(f, c.threads, c.by_owner > 0 ? c.program : "");
    if (!d) return std::nullopt;
    out.total += d->total;
    if (!d->kind.empty()) out.by_thread[d->kind] += d->total;
    // (The code a request runs through is the serving threads': kRequestThreads' first, the I/O threads.)
    if (c.threads.empty() || d->kind == c.threads.front().first) {
      out.code_lines.merge(d->code_lines);
      for (auto& [owner, lines] : d->by_owner) out.by_owner[owner].merge(lines);
    }
  }
  return out;
}

// What a side spent on a request: instructions, the idle share subtracted; the code lines its serving
// threads ran through (over all N requests: one path, taken N times).
struct PerRequestCounts {
  double instructions = 0;
  size_t code_lines = 0;
};

// nullopt (said why) when it could not be counted.
std::optional<PerRequestCounts> PerRequest(const std::string& tool, Counted& c, int n) {
  spillway::http::Connection conn("127.0.0.1", c.port);
  auto send = [&] {
    auto r = conn.Send("POST", "/v1/completions", c.body, c.headers);
    if (!r.ok() || r->status != 200) {
      std::printf("  %s: a request failed: %s\n", c.label.c_str(),
                  r.ok() ? r->body.c_str() : r.status().message().c_str());
      return false;
    }
    return true;
  };
  for (int i = 0; i < 50; ++i) {
    if (!send()) return std::nullopt;
  }
  if (!Control(tool, "-z", c.pid)) return std::nullopt;
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    if (!send()) return std::nullopt;
  }
  const double busy_s = Us(t0, Clock::now()) / 1e6;
  const auto busy = Dump(tool, c);
  // As long again with no requests: what the process does meanwhile anyway.
  if (!Control(tool, "-z", c.pid)) return std::nullopt;
  const auto i0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(busy_s));
  const double idle_s = Us(i0, Clock::now()) / 1e6;
  const auto idle = Dump(tool, c);
  if (!busy || !idle) {
    std::printf("  %s: callgrind's counts could not be read (%s.*)\n", c.label.c_str(), c.out.c_str());
    return std::nullopt;
  }
  const double idle_part = idle->total / idle_s * busy_s;
  std::printf("  %-34s %9.1fk instructions a request  (%d requests in %.1f s; idle work subtracted: %.1fk a request)\n",
              c.label.c_str(), (busy->total - idle_part) / n / 1000, n, busy_s, idle_part / n / 1000);
  if (!c.threads.empty()) {
    std::printf("  %-34s", "");
    for (const auto& [fn, label] : c.threads) {
      auto counted = [&](const Counts& k) {
        auto it = k.by_thread.find(fn);
        return it == k.by_thread.end() ? 0.0 : it->second;
      };
      std::printf(" %s %.1fk", label.c_str(), (counted(*busy) - counted(*idle) / idle_s * busy_s) / n / 1000);
    }
    std::printf("\n");
  }
  std::printf("  %-34s %9zu code lines run (%.0f KiB)%s\n", "", busy->code_lines.size(),
              busy->code_lines.size() * 64 / 1024.0, c.threads.empty() ? "" : ", the I/O threads");
  if (c.by_owner > 0) {
    // (A line shared by two owners' functions counts for each.)
    std::vector<std::pair<size_t, std::string>> owners;
    for (const auto& [owner, lines] : busy->by_owner) owners.emplace_back(lines.size(), owner);
    std::sort(owners.rbegin(), owners.rend());
    for (size_t i = 0; i < owners.size() && i < static_cast<size_t>(c.by_owner); ++i) {
      std::printf("  %-34s %9zu  %s\n", i == 0 ? "  code lines by owner:" : "", owners[i].first, owners[i].second.c_str());
    }
  }
  return PerRequestCounts{(busy->total - idle_part) / n, busy->code_lines.size()};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Gateway instructions: CPU instructions per request of spillway serve, nginx and a bare Asio proxy "
               "(valgrind's callgrind)"};
  std::string bin = "build/bin", model = "build/models/tiny-chat.gguf";
  int n = 500;
  bool keep = false, stream = false;
  app.add_option("--bin", bin)->capture_default_str();
  app.add_option("--model", model)->capture_default_str();
  app.add_option("-n", n, "requests per side")->capture_default_str()->check(CLI::Range(1, 1000000));
  app.add_flag("--keep", keep, "keep the callgrind dumps (their directory is printed)");
  app.add_flag("--stream", stream, "streamed completions of 4 tokens (the answer relayed as events) instead of one-token answers");
  int by_owner = 0;
  app.add_option("--by-owner", by_owner,
                 "list the gateway's code lines by whose code they are (its classes and namespaces, libraries): the K largest")
      ->check(CLI::Range(0, 1000));
  CLI11_PARSE(app, argc, argv);
  const std::string valgrind = OnPath("valgrind"), control = OnPath("callgrind_control");
  if (valgrind.empty() || control.empty()) {
    std::printf("valgrind is not installed (apt-get install valgrind): nothing counted\n");
    return 1;
  }
  WorkerSecret();  // the gateway's workers take it; the bare proxy's calls send it
  const fs::path dir = fs::temp_directory_path() / ("spillway-bench-instructions-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  json direct = {{"prompt", "x"}, {"max_tokens", stream ? 4 : 1}, {"temperature", 0}};
  if (stream) direct["stream"] = true;
  json gw_json = direct;
  gw_json["model"] = "chat";
  const std::string gw_body = gw_json.dump(), direct_body = direct.dump();
  std::printf("%s, loopback, keep-alive; each proxy in front of the same kind of worker, under callgrind\n",
              stream ? "streamed 4-token completion" : "non-streaming 1-token completion");
  std::optional<PerRequestCounts> normal, full, nginx, bare;
  for (bool is_full : {false, true}) {
    Counted gw(is_full ? "spillway serve, journal FULL" : "spillway serve, journal NORMAL");
    gw.out = (dir / (is_full ? "gateway-full" : "gateway-normal")).string();
    gw.body = gw_body;
    gw.threads = kRequestThreads;
    gw.by_owner = by_owner;
    std::error_code canonical_ec;
    gw.program = fs::canonical(fs::path(bin) / "spillway", canonical_ec).string();  // (as the dump names it)
    GatewayRun g = StartGateway(bin, OneChatOnCpu(model, is_full), is_full ? "instructions-full" : "instructions-normal",
                                std::chrono::seconds(300), Callgrind(valgrind, gw.out, kRequestThreads));
    const uint16_t worker = g.port ? WorkerPort(g.port, "chat") : 0;
    if (!worker) {
      StopGateway(g, /*keep_dir=*/true);  // (its log says why)
      break;  // what was counted so far is still printed
    }
    gw.pid = g.pid;
    gw.port = g.port;
    (is_full ? full : normal) = PerRequest(control, gw, n);
    if (!is_full) {
      // The yardsticks, in front of this gateway's worker (its secret added by nginx, sent to the bare proxy).
      Counted x("nginx proxy_pass");
      x.out = (dir / "nginx").string();
      x.body = direct_body;
      {
        NginxProxy proxy(worker, WorkerSecret(), Callgrind(valgrind, x.out));
        if (proxy.running()) {
          x.pid = proxy.pid();
          x.port = proxy.port();
          nginx = PerRequest(control, x, n);
        } else {
          std::printf("  nginx: %s; its row is skipped\n", proxy.why().c_str());
        }
      }
      Counted b("bare Asio proxy");
      b.out = (dir / "bare").string();
      b.body = direct_body;
      b.headers = WorkerAuth();
      const auto [pid, port] = StartBareProxy(worker, Callgrind(valgrind, b.out));
      if (pid > 0) {
        b.pid = pid;
        b.port = port;
        bare = PerRequest(control, b, n);
        kill(pid, SIGTERM);
        waitpid(pid, nullptr, 0);
      } else {
        std::printf("  bare Asio proxy: it did not start; its row is skipped\n");
      }
    }
    StopGateway(g);
  }
  if (normal && nginx && nginx->instructions > 0 && nginx->code_lines > 0) {
    std::printf("vs nginx: Spillway/nginx instructions a request: %.2fx at NORMAL", normal->instructions / nginx->instructions);
    if (full) std::printf(", %.2fx at FULL", full->instructions / nginx->instructions);
    std::printf("; code lines run: %.2fx at NORMAL", static_cast<double>(normal->code_lines) / nginx->code_lines);
    if (full) std::printf(", %.2fx at FULL", static_cast<double>(full->code_lines) / nginx->code_lines);
    std::printf("\n");
  }
  if (normal && bare) {
    std::printf("vs a bare Asio proxy: Spillway's own work above it: %.1fk instructions a request at NORMAL\n",
                (normal->instructions - bare->instructions) / 1000);
  }
  if (keep) {
    std::printf("callgrind dumps kept in %s (callgrind_annotate --inclusive=yes <file>)\n", dir.c_str());
  } else {
    fs::remove_all(dir);
  }
  return normal ? 0 : 1;
}
