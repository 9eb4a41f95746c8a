// Benchmark: what the gateway adds to a request, against the worker called
// directly, in the same run over loopback. A small non-streaming completion
// (1 token) for latency, a streamed one for time to first token; once with the
// journal at synchronous=FULL (the default: fsync per commit) and once at
// NORMAL; plus the journal's own writes measured alone. Debian's nginx in
// front of the same worker, in the same rounds, is the yardstick for what a
// proxy hop costs; one fdatasync of the same disk, measured in the same run,
// is the floor of what FULL adds (a request's end is synced before its
// answer leaves). A p50 goal is met or missed only where the 90% interval
// of the measured difference (the rounds resampled in pairs) is wholly on
// one side of it; else the run cannot tell, and says so.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "api/http_client.h"
#include "bench_gateway.h"
#include "common/clock.h"
#include "journal/journal.h"
#include "nginx_proxy.h"
#include "worker_secret.h"

extern char** environ;

using nlohmann::json;
using namespace spillway::bench;
namespace fs = std::filesystem;

namespace {


// Where one side of the comparison sends its requests, and what it measured.
struct Side {
  Side(uint16_t p, std::string b, std::string sb, spillway::http::HeaderList h, pid_t proxy = -1, bool children = false)
      : port(p), body(std::move(b)), stream_body(std::move(sb)), headers(std::move(h)), pid(proxy), tree(children) {}
  uint16_t port;
  std::string body, stream_body;
  spillway::http::HeaderList headers;
  pid_t pid;  // the proxy in front of the worker (-1: none), whose CPU time is measured
  bool tree;  // with its children (nginx's worker)
  std::vector<double> latency, ttft;
  double cpu_ns = 0;  // the proxy's CPU time over the timed rounds
};

double Ttft(const Side& s) {
  const auto t0 = Clock::now();
  double first = -1;
  (void)spillway::http::StreamFetch(
      "127.0.0.1", s.port, "POST", "/v1/completions", s.stream_body, s.headers, [](const auto&) { return true; },
      [&](std::string_view) {
        if (first < 0) first = Us(t0, Clock::now());
        return true;
      });
  return first;
}

// Every side takes its turn in each round (the order rotating), so drift and
// the worker's own variance hit all of them alike.
void Interleave(std::vector<Side*> sides, int n) {
  std::vector<std::unique_ptr<spillway::http::Connection>> conns;
  for (auto* s : sides) conns.push_back(std::make_unique<spillway::http::Connection>("127.0.0.1", s->port));
  for (int i = 0; i < 20; ++i) {  // warm-up: connections, caches, the worker's first requests
    for (size_t k = 0; k < sides.size(); ++k) (void)conns[k]->Send("POST", "/v1/completions", sides[k]->body, sides[k]->headers);
  }
  std::vector<double> t(sides.size());
  std::vector<double> cpu0;
  for (auto* s : sides) cpu0.push_back(s->pid > 0 ? CpuNs(s->pid, s->tree) : 0);
  int failed = 0;
  std::string failure;
  for (int i = 0; i < n; ++i) {
    bool ok = true;
    for (size_t j = 0; j < sides.size(); ++j) {
      const size_t k = (i + j) % sides.size();
      const auto t0 = Clock::now();
      auto r = conns[k]->Send("POST", "/v1/completions", sides[k]->body, sides[k]->headers);
      t[k] = Us(t0, Clock::now());
      if (!r.ok() || r->status != 200) {
        ok = false;
        failure = "port " + std::to_string(sides[k]->port) + ": " + (r.ok() ? r->body : r.status().message());
      }
    }
    if (!ok) {  // a round counts for all sides or for none
      ++failed;
      continue;
    }
    for (size_t k = 0; k < sides.size(); ++k) sides[k]->latency.push_back(t[k]);
  }
  for (size_t k = 0; k < sides.size(); ++k) {
    if (sides[k]->pid > 0) sides[k]->cpu_ns = CpuNs(sides[k]->pid, sides[k]->tree) - cpu0[k];
  }
  if (failed) std::printf("%d of %d rounds failed, the last: %s\n", failed, n, failure.c_str());
  for (int i = 0; i < n / 4; ++i) {
    for (size_t j = 0; j < sides.size(); ++j) {
      Side& s = *sides[(i + j) % sides.size()];
      s.ttft.push_back(Ttft(s));
    }
  }
}

void PrintRow(const std::string& label, const Side& d, const Side& x, int n) {
  const auto p = [](const std::vector<double>& v, double q) { return Pct(v, q); };
  // The proxy's own CPU per request (the streams' share included): what
  // scheduling noise on a shared machine does not blur.
  const double cpu = x.cpu_ns / 1000.0 / (n + n / 4);
  std::printf("%-22s %9.0f %9.0f %9.0f %7.2fx | %9.0f %9.0f %9.0f | %9.0f %9.0f %9.0f | %7.0f\n", label.c_str(),
              p(d.latency, .5), p(x.latency, .5), p(x.latency, .5) - p(d.latency, .5), p(x.latency, .5) / p(d.latency, .5),
              p(d.latency, .99), p(x.latency, .99), p(x.latency, .99) - p(d.latency, .99), p(d.ttft, .5), p(x.ttft, .5),
              p(x.ttft, .5) - p(d.ttft, .5), cpu);
}

// How far a difference of two p50s measured in the same rounds may be from
// its value: the rounds resampled with replacement (each round's two
// latencies together, so that what drifts between rounds, the worker's own
// time above all, stays paired), the 5th and 95th percentiles of the
// resampled differences. The direct call's p50 moves by up to 100 us from
// run to run here, and nginx's "added" came out negative in some: a goal is
// met or missed only where the whole interval says so.
struct Interval {
  double lo = 0, hi = 0;
};

// The interval of a sum of p50s measured in the same rounds, each with its
// sign (+1 or -1): the rounds resampled together.
Interval P50SumInterval(const std::vector<const std::vector<double>*>& series, const std::vector<double>& signs,
                        int rounds = 1000) {
  size_t n = series.empty() ? 0 : series.front()->size();
  for (const auto* v : series) n = std::min(n, v->size());
  if (n == 0) return {};
  std::mt19937_64 rng(42);  // (repeatable: the same samples give the same interval)
  std::uniform_int_distribution<size_t> pick(0, n - 1);
  std::vector<double> sums, idx_values(n);
  std::vector<size_t> idx(n);
  const size_t mid = n / 2;  // (Pct's rank for p = 0.5)
  for (int r = 0; r < rounds; ++r) {
    for (auto& k : idx) k = pick(rng);
    double sum = 0;
    for (size_t j = 0; j < series.size(); ++j) {
      for (size_t i = 0; i < n; ++i) idx_values[i] = (*series[j])[idx[i]];
      std::nth_element(idx_values.begin(), idx_values.begin() + static_cast<std::ptrdiff_t>(mid), idx_values.end());
      sum += signs[j] * idx_values[mid];
    }
    sums.push_back(sum);
  }
  return {Pct(sums, .05), Pct(sums, .95)};
}

Interval P50DifferenceInterval(const std::vector<double>& x, const std::vector<double>& y) {
  return P50SumInterval({&x, &y}, {1, -1});
}

struct Added {
  double gateway_p50 = 0, nginx_p50 = 0;  // microseconds over the direct call (below 0 here too: the direct call's bias)
  bool nginx = false, bare = false;        // measured in these rounds
  Interval gateway_p50_range;               // P50DifferenceInterval of gateway_p50
  Interval over_nginx;                      // of the gateway's p50 less nginx's (nginx measured)
  Interval over_other;                      // an A/B: of this gateway's added p50 less the other's
  double gateway_p99 = 0;
  double gateway_cpu = 0, nginx_cpu = 0;   // microseconds of the proxy's CPU per request
  double bare_p50 = 0, bare_cpu = 0;       // the bare Asio proxy's
};

// A gateway under test: its process, its port and its own worker's.
struct UnderTest {
  std::string label;
  pid_t pid;
  uint16_t port, worker;
};

// What one gateway adds over its own worker called directly, in the same rounds.
struct Pair {
  Side direct, gw;
};

// The gateways (the build measured and, with --against, another build
// beside it: each in front of its own worker, every worker also called
// directly) and, for one gateway, nginx and the bare Asio proxy in front of
// its worker, all in the same rounds. Two gateways are measured without
// nginx and the bare proxy: a worker that serves more of each round than
// the other is warmer, and what its gateway adds looked larger by 50-120 us
// in an A/B of one build against itself. Returns what each gateway added,
// nginx and the bare proxy in the first one's figures.
std::vector<Added> Measure(const std::vector<UnderTest>& gateways, pid_t nginx_pid, uint16_t nginx_port, int n) {
  const uint16_t worker_port = gateways.front().worker;
  const bool ab = gateways.size() > 1;
  const auto [bare_pid, bare_port] = ab ? std::pair<pid_t, uint16_t>{-1, 0} : StartBareProxy(worker_port);
  const json direct_body = {{"prompt", "x"}, {"max_tokens", 1}, {"temperature", 0}};
  json gw_body = direct_body, stream_body = {{"prompt", "x"}, {"max_tokens", 4}, {"stream", true}};
  gw_body["model"] = "chat";
  const std::string direct_stream = stream_body.dump();
  stream_body["model"] = "chat";
  std::vector<std::unique_ptr<Pair>> pairs;
  std::vector<Side*> sides;
  for (const auto& u : gateways) {
    pairs.push_back(std::make_unique<Pair>(Pair{Side{u.worker, direct_body.dump(), direct_stream, spillway::bench::WorkerAuth()},
                                                Side{u.port, gw_body.dump(), stream_body.dump(), {}, u.pid}}));
    sides.push_back(&pairs.back()->direct);
    sides.push_back(&pairs.back()->gw);
  }
  const Side& direct = pairs.front()->direct;
  Side nginx{nginx_port, direct.body, direct.stream_body, {}, nginx_pid, true};  // nginx adds the worker's secret itself
  Side bare{bare_port, direct.body, direct.stream_body, spillway::bench::WorkerAuth(), bare_pid};  // (forwards the secret)
  if (nginx_port) sides.push_back(&nginx);
  if (bare_port) sides.push_back(&bare);
  Interleave(sides, n);
  std::vector<Added> out;
  for (size_t i = 0; i < gateways.size(); ++i) {
    const Pair& p = *pairs[i];
    PrintRow(gateways[i].label, p.direct, p.gw, n);
    Added a;
    a.gateway_p50 = Pct(p.gw.latency, .5) - Pct(p.direct.latency, .5);
    a.gateway_p50_range = P50DifferenceInterval(p.gw.latency, p.direct.latency);
    a.gateway_p99 = Pct(p.gw.latency, .99) - Pct(p.direct.latency, .99);
    a.gateway_cpu = p.gw.cpu_ns / 1000.0 / (n + n / 4);
    out.push_back(a);
  }
  if (ab) {  // (each gateway's added p50 over its own worker's, both in the same rounds)
    const Pair &x = *pairs.front(), &y = *pairs.back();
    out.front().over_other = P50SumInterval({&x.gw.latency, &x.direct.latency, &y.gw.latency, &y.direct.latency},
                                            {1, -1, -1, 1});
  }
  Added& a = out.front();
  if (nginx_port) {
    PrintRow("  nginx, same worker", direct, nginx, n);
    a.nginx = true;
    a.nginx_p50 = Pct(nginx.latency, .5) - Pct(direct.latency, .5);
    a.over_nginx = P50DifferenceInterval(pairs.front()->gw.latency, nginx.latency);
    a.nginx_cpu = nginx.cpu_ns / 1000.0 / (n + n / 4);
  }
  if (bare_port) {
    PrintRow("  bare Asio proxy", direct, bare, n);
    a.bare = true;
    a.bare_p50 = Pct(bare.latency, .5) - Pct(direct.latency, .5);
    a.bare_cpu = bare.cpu_ns / 1000.0 / (n + n / 4);
    kill(bare_pid, SIGKILL);
    waitpid(bare_pid, nullptr, 0);
  } else if (!ab) {
    std::printf("  (no bare_proxy beside this benchmark: its row is skipped)\n");
  }
  return out;
}

void JournalAlone(bool full, int n) {
  spillway::SystemClock clock;
  const std::string dir = fs::temp_directory_path() / ("spillway-bench-journal-" + std::to_string(getpid()));
  fs::remove_all(dir);
  spillway::journal::JournalOptions o;
  o.synchronous_full = full;
  auto j = spillway::journal::Journal::Open(dir + "/j.db", o, clock);
  std::vector<double> accept, start, finish;
  for (int i = 0; i < n; ++i) {
    spillway::journal::RequestRecord r;
    r.id = "r" + std::to_string(i);
    r.payload_hash = "h";
    r.service = "chat";
    r.endpoint = "completion";
    r.body = R"({"model":"chat","prompt":"x","max_tokens":1})";
    auto t0 = Clock::now();
    (void)(*j)->Accept(r);
    auto t1 = Clock::now();
    (void)(*j)->StartAttempt(r.id, "cpu");
    auto t2 = Clock::now();
    (void)(*j)->Finish(r.id, spillway::journal::State::kCompleted, 200, "application/json", std::string(600, 'x'));
    auto t3 = Clock::now();
    accept.push_back(Us(t0, t1));
    start.push_back(Us(t1, t2));
    finish.push_back(Us(t2, t3));
  }
  std::printf("journal synchronous=%-6s  accept p50 %7.0f us p99 %7.0f | attempt p50 %7.0f p99 %7.0f | finish p50 %7.0f p99 %7.0f\n",
              full ? "FULL" : "NORMAL", Pct(accept, .5), Pct(accept, .99), Pct(start, .5), Pct(start, .99),
              Pct(finish, .5), Pct(finish, .99));
  fs::remove_all(dir);
}

// The disk's own floor for a request at FULL, as the commit log writes it:
// into a preallocated, synced file (1 MiB of zeros, overwritten: no size to
// sync), a request's record (about 300 bytes, when it is sent to the
// worker) and its end's (about 700, with the answer), then fdatasync; timed
// from the end's write to the sync's return, one request every `gap_us`, in
// the directory the gateways' state lives in. (It was one 512-byte record a
// sync: half of what the log's own sync takes here, path_timeline --journal
// full.) Returns the p50 in microseconds (-1: could not measure).
double DiskSync(int n, int gap_us) {
  const std::string path = fs::temp_directory_path() / ("spillway-bench-sync-" + std::to_string(getpid()));
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  constexpr off_t kFile = 1 << 20;
  const std::string zeros(kFile, '\0'), accept(300, 'a'), end(700, 'e');
  bool ok = ::pwrite(fd, zeros.data(), zeros.size(), 0) == static_cast<ssize_t>(zeros.size()) && ::fsync(fd) == 0;
  off_t at = 0;
  std::vector<double> t;
  for (int i = 0; ok && i < n; ++i) {
    if (at + 1000 > kFile) at = 0;
    ok = ::pwrite(fd, accept.data(), accept.size(), at) == static_cast<ssize_t>(accept.size());
    at += static_cast<off_t>(accept.size());
    ::usleep(gap_us / 2);  // (the worker computes)
    const auto t0 = Clock::now();
    ok = ok && ::pwrite(fd, end.data(), end.size(), at) == static_cast<ssize_t>(end.size()) && ::fdatasync(fd) == 0;
    at += static_cast<off_t>(end.size());
    t.push_back(Us(t0, Clock::now()));
    ::usleep(gap_us / 2);
  }
  ::close(fd);
  fs::remove(path);
  if (!ok || t.empty()) return -1;
  std::printf("disk: a request's two records (300 and 700 bytes) into a preallocated file + fdatasync, one every %d "
              "us: p50 %.0f us p99 %.0f us\n",
              gap_us, Pct(t, .5), Pct(t, .99));
  return Pct(t, .5);
}

void Verdict(const char* what, double value, double target, const std::string& note) {
  std::printf("  %-24s %6.0f us  %-12s%s\n", what, value, value <= target ? "met" : "MISSED", note.c_str());
}

// Whether a measured interval is within `bound` (met, 1), beyond it (missed,
// -1), or on both sides (this run cannot tell, 0).
int Judged(Interval range, double bound) { return range.hi <= bound ? 1 : range.lo > bound ? -1 : 0; }

// A p50's goal, judged by its interval.
void Verdict(const char* what, double value, Interval range, double target, const std::string& note) {
  const int j = Judged(range, target);
  const char* said = j > 0 ? "met" : j < 0 ? "MISSED" : "inconclusive";
  char interval[64];
  std::snprintf(interval, sizeof interval, " (90%% interval %.0f..%.0f us)", range.lo, range.hi);
  std::printf("  %-24s %6.0f us  %-12s%s%s\n", what, value, said, interval, note.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Gateway overhead: latency added by spillway serve over calling the worker directly"};
  std::string bin = "build/bin", model = "build/models/tiny-chat.gguf";
  std::string against;
  int n = 400;
  app.add_option("--bin", bin)->capture_default_str();
  app.add_option("--against", against,
                 "another build's bin directory: its gateway runs beside the first, each in front of its own "
                 "worker, in the same rounds, and the difference of what they add is printed (an A/B of two builds "
                 "that the spread between runs would hide)");
  app.add_option("--model", model)->capture_default_str();
  app.add_option("-n", n, "requests per side")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  spillway::bench::WorkerSecret();  // the gateway's workers take it; the direct calls send it
  std::printf("non-streaming 1-token completion, loopback, keep-alive, interleaved; times in microseconds\n");
  std::printf("%-22s %9s %9s %9s %8s | %9s %9s %9s | %9s %9s %9s | %7s\n", "journal", "p50 dir", "p50 gw", "added", "ratio",
              "p99 dir", "p99 gw", "added", "ttft dir", "ttft gw", "added", "cpu/req");
  std::vector<std::pair<std::string, Added>> added;
  std::vector<std::pair<std::string, Added>> other;  // --against's, in the same rounds
  for (bool full : {true, false}) {
    const std::string mode = full ? "FULL" : "NORMAL", label = full ? "FULL (default)" : "NORMAL";
    std::vector<GatewayRun> runs = {StartGateway(bin, OneChatOnCpu(model, full), "overhead-" + mode)};
    if (!against.empty()) runs.push_back(StartGateway(against, OneChatOnCpu(model, full), "overhead-against-" + mode));
    std::vector<UnderTest> gateways;
    for (size_t i = 0; i < runs.size(); ++i) {
      const uint16_t worker = runs[i].port ? WorkerPort(runs[i].port, "chat") : 0;
      if (!worker) {
        std::printf("%s: the gateway did not start; its directory is kept: %s\n", i ? against.c_str() : bin.c_str(),
                    runs[i].dir.c_str());
        for (size_t j = 0; j < runs.size(); ++j) StopGateway(runs[j], /*keep_dir=*/j == i);
        return 1;
      }
      gateways.push_back({i ? label + ", against" : label, runs[i].pid, runs[i].port, worker});
    }
    {
      std::optional<NginxProxy> nginx;  // (left out of an A/B of two builds: Measure)
      if (gateways.size() == 1) {
        nginx.emplace(gateways.front().worker, spillway::bench::WorkerSecret());
        if (!nginx->running()) std::printf("nginx: %s; its rows are skipped\n", nginx->why().c_str());
      }
      const auto a = Measure(gateways, nginx ? nginx->pid() : -1, nginx ? nginx->port() : 0, n);
      added.emplace_back(mode, a.front());
      if (a.size() > 1) other.emplace_back(mode, a.back());
    }
    for (auto& r : runs) StopGateway(r);
  }
  // Two builds side by side: what --bin adds less what --against adds.
  for (size_t i = 0; i < other.size(); ++i) {
    const Added &a = added[i].second, &b = other[i].second;
    // (Not p99: a difference of two p99s is mostly the two workers' own tails.)
    std::printf("%s vs --against %s, journal %-6s: added p50 %.0f vs %.0f us (%+.0f; 90%% interval %+.0f..%+.0f), CPU a "
                "request %.0f vs %.0f us (%+.0f)\n",
                bin.c_str(), against.c_str(), added[i].first.c_str(), a.gateway_p50, b.gateway_p50,
                a.gateway_p50 - b.gateway_p50, a.over_other.lo, a.over_other.hi, a.gateway_cpu, b.gateway_cpu,
                a.gateway_cpu - b.gateway_cpu);
  }
  // The yardstick: what a plain reverse proxy adds to the same call.
  for (const auto& [mode, a] : added) {
    if (!a.nginx) continue;  // (measured, an "added" below 0 too: it was skipped as unmeasured)
    char ratio[48] = "n/a (nginx added nothing here)";
    if (a.nginx_p50 > 0) std::snprintf(ratio, sizeof ratio, "%.2fx", a.gateway_p50 / a.nginx_p50);
    // (By the two p50s through the proxies, rounds paired: the direct call's own spread drops out.)
    const int j = Judged(a.over_nginx, 0);
    const char* within = j > 0 ? "yes" : j < 0 ? "no (MISSED)" : "inconclusive";
    std::printf("vs nginx, journal %-6s: Spillway added p50 %.0f us, nginx %.0f us; Spillway/nginx %s; Spillway's p50 "
                "over nginx's %.0f..%.0f us (90%% interval); Spillway <= nginx: %s\n",
                mode.c_str(), a.gateway_p50, a.nginx_p50, ratio, a.over_nginx.lo, a.over_nginx.hi, within);
    std::printf("  CPU per request, journal %-6s: Spillway %.0f us, nginx %.0f us; Spillway/nginx %.2fx\n", mode.c_str(),
                a.gateway_cpu, a.nginx_cpu, a.nginx_cpu > 0 ? a.gateway_cpu / a.nginx_cpu : 0.0);
  }
  // The floor of a hop through one Asio loop, and what the gateway's own work adds above it.
  for (const auto& [mode, a] : added) {
    if (!a.bare) continue;
    std::printf("vs a bare Asio proxy, journal %-6s: it adds %.0f us p50 (CPU %.0f us a request); Spillway's own work "
                "%.0f us p50 (CPU %.0f us) above it\n",
                mode.c_str(), a.bare_p50, a.bare_cpu, a.gateway_p50 - a.bare_p50, a.gateway_cpu - a.bare_cpu);
  }
  JournalAlone(true, 200);
  JournalAlone(false, 200);
  const double sync_p50 = DiskSync(200, 1000);
  // Each target against what was measured, with the floor this machine sets.
  std::printf("targets (added over the direct call):\n");
  for (const auto& [mode, a] : added) {
    char note[160] = "";
    if (mode == "NORMAL") {
      if (a.nginx) std::snprintf(note, sizeof note, "  (nginx's own hop here: %.0f us)", a.nginx_p50);
      Verdict("NORMAL p50 <= 50 us:", a.gateway_p50, a.gateway_p50_range, 50, note);
      Verdict("NORMAL p99 <= 500 us:", a.gateway_p99, 500, "");
    } else {
      if (sync_p50 >= 0) {
        std::snprintf(note, sizeof note, "  (one fdatasync here: %.0f us, paid before the answer leaves; the rest: %.0f us)",
                      sync_p50, a.gateway_p50 - sync_p50);
      }
      Verdict("FULL p50 <= 100 us:", a.gateway_p50, a.gateway_p50_range, 100, note);
    }
  }
  return 0;
}
