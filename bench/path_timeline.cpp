// Benchmark: where a request's time goes inside the gateway, read from its
// own system calls. spillway serve, Debian's nginx (proxy_pass) and the bare
// Asio proxy (bare_proxy.cpp) run under libsyscall_clock.so
// (syscall_clock.cpp), in front of the same worker; one keep-alive client
// sends one-token completions through each, and straight to the worker, in
// alternating rounds (--against: two builds' gateways instead, each in front
// of its own worker). On the thread that serves the client, each request is
// cut at its system calls:
//   request phase: from the wake-up that brings the client's request (the
//     end of the epoll_wait before its read) to the start of the send to
//     the worker: reading, checking, admitting, the journal's accept;
//   answer phase: from the wake-up that brings the worker's answer to the
//     start of the send to the client: reading it, the journal's end,
//     writing the reply;
//   the two sends themselves, and the calls the thread makes a request.
// The two phases are the proxy's own time on the request's way; what the
// hop costs besides (wake-ups, the kernel's loopback) is the bare proxy's
// too. Unlike gateway_instructions' count this is time, with the caches as
// they are when a request arrives (cold: the worker ran in between).
// The way between the three, placed by the client's own clock beside the
// proxy's calls: the client's send to the proxy awake with it, the proxy's
// send to the worker to the proxy awake with the answer, the proxy's send to
// the client to the client's return, and how long the proxy stays awake
// after each of its sends: what the end-to-end time holds besides own time.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "api/http_client.h"
#include "bench_gateway.h"
#include "nginx_proxy.h"
#include "syscall_clock.h"
#include "worker_secret.h"

using namespace spillway::bench;
namespace fs = std::filesystem;

namespace {

bool Is(const ClockEvent& e, ClockKind k) { return e.kind == static_cast<int32_t>(k); }

// One request as the proxy's serving thread saw it, in microseconds.
struct Cut {
  double request = 0, answer = 0, send_worker = 0, send_client = 0;
  int calls = 0;         // system calls between the two wake-ups' ends and the reply's send, waits not counted
  int on_way_writes = 0;  // file writes inside the two phases
  std::string calls_request, calls_answer;  // the phases' calls in order, e.g. "r:c poll w:f s:w"
  std::vector<std::pair<int, double>> marks;  // an experimental build's marks: id, us since its phase's wake-up
  // At FULL: the answer phase's last file write (the end's record) to the
  // start of the fdatasync that covers it (on the log's own thread), the
  // sync itself, and its end to the serving thread's next wake-up; -1: none.
  double to_sync = -1, sync = -1, from_sync = -1;
  // Times (CLOCK_MONOTONIC, ns) that place the request among the client's
  // and the worker's: the wake-up with the request, the end of the send to
  // the worker, the wake-up with its answer, the end of the send to the
  // client, and the start of the serving thread's first sleep after each
  // send (0: none before the next request).
  int64_t wake1_ns = 0, sent_worker_ns = 0, wake2_ns = 0, sent_client_ns = 0, slept_after_worker_ns = 0,
          slept_after_client_ns = 0;
};

// A call as "kind:whose": r(ecv) s(end) w(rite to a file) poll wait; c(lient) w(orker) f(ile or other).
std::string Name(const ClockEvent& e, int client, int worker) {
  static const char* kinds[] = {"s", "r", "w", "poll", "wait"};
  if (Is(e, ClockKind::kMark)) return "m" + std::to_string(e.fd);
  if (Is(e, ClockKind::kSync)) return "sync";
  const char* kind = e.kind >= 0 && e.kind < 5 ? kinds[e.kind] : "?";
  if (Is(e, ClockKind::kPoll) || Is(e, ClockKind::kWait)) return kind;
  return std::string(kind) + ":" + (e.fd == client ? "c" : e.fd == worker ? "w" : "f") + (e.result < 0 ? "-" : "");
}

std::vector<ClockEvent> ReadDump(const std::string& path) {
  std::vector<ClockEvent> ev;
  std::ifstream in(path, std::ios::binary);
  ClockEvent e{};
  while (in.read(reinterpret_cast<char*>(&e), sizeof e)) ev.push_back(e);
  return ev;
}

// Each request of the serving thread (the one that sent most), cut at its calls.
std::vector<Cut> CutRequests(const std::vector<ClockEvent>& all) {
  std::map<int32_t, int> sends;
  for (const auto& e : all) sends[e.tid] += Is(e, ClockKind::kSend);
  if (sends.empty()) return {};
  const int32_t tid = std::max_element(sends.begin(), sends.end(), [](auto& a, auto& b) { return a.second < b.second; })->first;
  std::vector<ClockEvent> ev;
  for (const auto& e : all) {
    if (e.tid == tid) ev.push_back(e);
  }
  std::sort(ev.begin(), ev.end(), [](auto& a, auto& b) { return a.start_ns < b.start_ns; });
  std::vector<ClockEvent> syncs;  // any thread's (the commit log syncs on a thread of its own)
  for (const auto& e : all) {
    if (Is(e, ClockKind::kSync)) syncs.push_back(e);
  }
  std::sort(syncs.begin(), syncs.end(), [](auto& a, auto& b) { return a.start_ns < b.start_ns; });
  // The two descriptors it sends to most: the client's and the worker's.
  // The client's reads are its requests, shorter than the worker's answers
  // (a one-token completion's JSON).
  std::map<int, int> sent_to;
  std::map<int, std::vector<double>> read_sizes;
  for (const auto& e : ev) {
    if (Is(e, ClockKind::kSend)) ++sent_to[e.fd];
    if (Is(e, ClockKind::kRecv) && e.result > 0) read_sizes[e.fd].push_back(e.result);
  }
  std::vector<std::pair<int, int>> by_sends;
  for (auto& [fd, count] : sent_to) by_sends.emplace_back(count, fd);
  std::sort(by_sends.rbegin(), by_sends.rend());
  if (by_sends.size() < 2) return {};
  int client = by_sends[0].second, worker = by_sends[1].second;
  if (Pct(read_sizes[client], .5) > Pct(read_sizes[worker], .5)) std::swap(client, worker);
  std::vector<Cut> out;
  int64_t last_wake = 0;
  size_t i = 0;
  const auto next = [&](auto pred) {
    for (; i < ev.size(); ++i) {
      // (Readiness a zero-timeout poll found is a wake-up too.)
      if (Is(ev[i], ClockKind::kWait) || (Is(ev[i], ClockKind::kPoll) && ev[i].result > 0)) last_wake = ev[i].end_ns;
      if (pred(ev[i])) return true;
    }
    return false;
  };
  while (true) {
    if (!next([&](const ClockEvent& e) { return Is(e, ClockKind::kRecv) && e.fd == client && e.result > 0; })) break;
    const int64_t wake1 = last_wake;
    const size_t first = i;
    if (!next([&](const ClockEvent& e) { return Is(e, ClockKind::kSend) && e.fd == worker; })) break;
    const ClockEvent sw = ev[i];
    int writes = 0;
    for (size_t k = first; k < i; ++k) writes += Is(ev[k], ClockKind::kFileWrite);
    if (!next([&](const ClockEvent& e) { return Is(e, ClockKind::kRecv) && e.fd == worker && e.result > 0; })) break;
    const int64_t wake2 = std::max(last_wake, sw.end_ns);
    const size_t answer_read = i;
    if (!next([&](const ClockEvent& e) { return Is(e, ClockKind::kSend) && e.fd == client; })) break;
    const ClockEvent sc = ev[i];
    for (size_t k = answer_read; k < i; ++k) writes += Is(ev[k], ClockKind::kFileWrite);
    int calls = 0;
    for (size_t k = first; k <= i; ++k) calls += !Is(ev[k], ClockKind::kWait) && !Is(ev[k], ClockKind::kMark);
    ++i;
    // Calls after the reply's send, up to the next request's read (the
    // journal's writes left for after the answer, speculative reads).
    for (size_t k = i; k < ev.size() && !(Is(ev[k], ClockKind::kRecv) && ev[k].fd == client && ev[k].result > 0); ++k) {
      calls += !Is(ev[k], ClockKind::kWait) && !Is(ev[k], ClockKind::kMark);
    }
    Cut c{(sw.start_ns - wake1) / 1e3, (sc.start_ns - wake2) / 1e3, (sw.end_ns - sw.start_ns) / 1e3,
          (sc.end_ns - sc.start_ns) / 1e3, calls, writes, "", "", {}};
    c.wake1_ns = wake1;
    c.sent_worker_ns = sw.end_ns;
    c.wake2_ns = wake2;
    c.sent_client_ns = sc.end_ns;
    for (size_t k = first; k < answer_read; ++k) {
      if (Is(ev[k], ClockKind::kWait) && ev[k].start_ns >= sw.end_ns) {
        c.slept_after_worker_ns = ev[k].start_ns;
        break;
      }
    }
    for (size_t k = i; k < ev.size() && !(Is(ev[k], ClockKind::kRecv) && ev[k].fd == client && ev[k].result > 0); ++k) {
      if (Is(ev[k], ClockKind::kWait)) {
        c.slept_after_client_ns = ev[k].start_ns;
        break;
      }
    }
    // The answer phase's last file write, the sync that began after it, and
    // the serving thread's first wake-up after that sync.
    const ClockEvent* last_write = nullptr;
    for (size_t k = answer_read; k < i; ++k) {
      if (Is(ev[k], ClockKind::kFileWrite)) last_write = &ev[k];
    }
    if (last_write) {
      const auto sync = std::lower_bound(syncs.begin(), syncs.end(), last_write->end_ns,
                                         [](const ClockEvent& e, int64_t t) { return e.start_ns < t; });
      if (sync != syncs.end() && sync->end_ns <= sc.start_ns) {
        int64_t woke = -1;
        for (size_t k = answer_read; k < i; ++k) {
          if (Is(ev[k], ClockKind::kWait) && ev[k].end_ns >= sync->end_ns) {
            woke = ev[k].end_ns;
            break;
          }
        }
        c.to_sync = (sync->start_ns - last_write->end_ns) / 1e3;
        c.sync = (sync->end_ns - sync->start_ns) / 1e3;
        if (woke >= 0) c.from_sync = (woke - sync->end_ns) / 1e3;
      }
    }
    for (size_t k = first; ev[k].start_ns < sw.start_ns; ++k) c.calls_request += Name(ev[k], client, worker) + " ";
    for (size_t k = answer_read; ev[k].start_ns < sc.start_ns; ++k) c.calls_answer += Name(ev[k], client, worker) + " ";
    for (size_t k = first; k < i; ++k) {
      if (Is(ev[k], ClockKind::kMark)) {
        c.marks.emplace_back(ev[k].fd, (ev[k].start_ns - (k < answer_read ? wake1 : wake2)) / 1e3);
      }
    }
    out.push_back(std::move(c));
  }
  return out;
}

struct Summary {
  std::vector<double> request, answer, send_worker, send_client, calls, writes;
};

Summary Summarize(const std::vector<Cut>& cuts) {
  Summary s;
  for (const auto& c : cuts) {
    s.request.push_back(c.request);
    s.answer.push_back(c.answer);
    s.send_worker.push_back(c.send_worker);
    s.send_client.push_back(c.send_client);
    s.calls.push_back(c.calls);
    s.writes.push_back(c.on_way_writes);
  }
  return s;
}

double Mean(const std::vector<double>& v) {
  double t = 0;
  for (double x : v) t += x;
  return v.empty() ? 0 : t / static_cast<double>(v.size());
}

// The commonest call sequences of each phase, with how often each came.
void PrintSequences(const char* label, const std::vector<Cut>& cuts) {
  for (const bool request : {true, false}) {
    std::map<std::string, int> seen;
    for (const auto& c : cuts) ++seen[request ? c.calls_request : c.calls_answer];
    std::vector<std::pair<int, std::string>> top;
    for (auto& [k, v] : seen) top.emplace_back(v, k);
    std::sort(top.rbegin(), top.rend());
    std::printf("  %s, %s phase:", label, request ? "request" : "answer");
    for (size_t i = 0; i < top.size() && i < 3; ++i) {
      std::printf(" [%d%%] %s;", static_cast<int>(100.0 * top[i].first / cuts.size()), top[i].second.c_str());
    }
    std::printf("\n");
  }
}

// Each mark's p50 time since its phase's wake-up (marks only an experimental build makes).
void PrintMarks(const char* label, const std::vector<Cut>& cuts) {
  std::map<int, std::vector<double>> at;
  for (const auto& c : cuts) {
    for (const auto& [id, us] : c.marks) at[id].push_back(us);
  }
  for (const auto& [id, v] : at) {
    std::printf("  %s, mark %d: p50 %.1f us after its phase's wake-up (%zu)\n", label, id, Pct(v, .5), v.size());
  }
}

int64_t Ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// A request's way between the client, the proxy and the worker, p50s in
// microseconds: the client's send to the proxy awake with it; the proxy's send
// to the worker to the proxy awake with its answer (the worker's own time and
// both wake-ups); the proxy's send to the client to the client's return; and
// how long the proxy stays awake after each of its two sends (what a peer woken
// on its core waits for).
void PrintLegs(const char* label, const std::vector<Cut>& cuts, const std::vector<std::pair<int64_t, int64_t>>& spans) {
  std::vector<double> in, worker, out, after_w, after_c;
  for (const auto& c : cuts) {
    auto it = std::upper_bound(spans.begin(), spans.end(), c.wake1_ns,
                               [](int64_t t, const std::pair<int64_t, int64_t>& s) { return t < s.first; });
    if (it == spans.begin()) continue;
    --it;
    if (c.sent_client_ns > it->second) continue;  // (not within this request's span)
    in.push_back((c.wake1_ns - it->first) / 1e3);
    worker.push_back((c.wake2_ns - c.sent_worker_ns) / 1e3);
    out.push_back((it->second - c.sent_client_ns) / 1e3);
    if (c.slept_after_worker_ns) after_w.push_back((c.slept_after_worker_ns - c.sent_worker_ns) / 1e3);
    if (c.slept_after_client_ns) after_c.push_back((c.slept_after_client_ns - c.sent_client_ns) / 1e3);
  }
  std::printf("%-26s %7.1f | %7.1f | %7.1f | %9.1f %9.1f | %zu\n", label, Pct(in, .5), Pct(worker, .5), Pct(out, .5),
              Pct(after_w, .5), Pct(after_c, .5), in.size());
}

// Returns the own time it printed: the two phases' p50s together.
double PrintRow(const char* label, const Summary& s, double added_p50) {
  const double own = Pct(s.request, .5) + Pct(s.answer, .5);
  std::printf("%-26s %7.1f %7.1f | %7.1f %7.1f | %7.1f | %6.1f %6.1f | %5.1f %5.1f | %7.0f\n", label, Pct(s.request, .5),
              Pct(s.request, .9), Pct(s.answer, .5), Pct(s.answer, .9), own, Pct(s.send_worker, .5),
              Pct(s.send_client, .5), Mean(s.calls), Mean(s.writes), added_p50);
  return own;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Path timeline: a request's time inside spillway serve, nginx and a bare Asio proxy, from their system "
               "calls"};
  std::string bin = "build/bin", against, model = "build/models/tiny-chat.gguf", journal = "normal";
  int n = 1000;
  bool keep = false;
  app.add_option("--bin", bin);
  app.add_option("--against", against,
                 "another build's bin directory: its gateway runs beside the first (each in front of its own "
                 "worker) in the same rounds");
  app.add_option("--model", model);
  app.add_option("--journal", journal, "the gateways' journal: normal or full")->check(CLI::IsMember({"normal", "full"}));
  // (The library keeps 128k calls a thread between dumps: some 8000 requests.)
  app.add_option("-n", n, "requests through each proxy")->check(CLI::Range(10, 5000));
  app.add_flag("--keep", keep, "keep the recorded calls (their directory is printed)");
  CLI11_PARSE(app, argc, argv);

  const fs::path self = fs::read_symlink("/proc/self/exe");
  const std::string lib = (self.parent_path() / "libsyscall_clock.so").string();
  if (::access(lib.c_str(), R_OK) != 0) {
    std::fprintf(stderr, "%s is missing (cmake --build <build> --target syscall_clock)\n", lib.c_str());
    return 1;
  }
  const std::string out_dir = fs::temp_directory_path() / ("spillway-bench-timeline-" + std::to_string(getpid()));
  fs::create_directories(out_dir);
  const auto wrap = [&](const std::string& who) {
    return std::vector<std::string>{"/usr/bin/env", "LD_PRELOAD=" + lib, "SYSCALL_CLOCK_OUT=" + out_dir + "/" + who};
  };
  (void)WorkerSecret();  // before the gateways start: their workers take it from the environment

  // Every proxy measured, and the worker called directly (pid -1: nothing to cut).
  struct Side {
    std::string label, dump;  // dump: the file prefix its calls go to
    pid_t pid;
    uint16_t port;
    const std::string* body;
    spillway::http::HeaderList headers;
    std::vector<double> latency;
    std::vector<std::pair<int64_t, int64_t>> spans;  // each timed request's send start and answer's end, ns
    std::vector<Cut> cuts;
    size_t direct = 0;  // the side that calls this one's worker directly (what "added" is over)
  };
  const std::string direct_body = R"({"prompt":"x","max_tokens":1,"temperature":0})";
  const std::string gw_body = R"({"model":"chat","prompt":"x","max_tokens":1,"temperature":0})";
  std::vector<GatewayRun> runs;
  std::vector<Side> sides;
  pid_t bare_pid = -1;
  const auto stop_all = [&] {
    if (bare_pid > 0) {
      kill(bare_pid, SIGTERM);
      waitpid(bare_pid, nullptr, 0);
    }
    for (auto& r : runs) StopGateway(r);
    if (!keep) fs::remove_all(out_dir);
  };
  for (const std::string& b : {bin, against}) {
    if (b.empty()) continue;
    const std::string who = runs.empty() ? "gateway" : "against";
    runs.push_back(StartGateway(b, OneChatOnCpu(model, journal == "full"), "timeline-" + who, std::chrono::seconds(120),
                                wrap(who)));
    const uint16_t worker = runs.back().port ? WorkerPort(runs.back().port, "chat") : 0;
    if (!worker) {
      std::printf("the gateway of %s did not start; its directory is kept: %s\n", b.c_str(), runs.back().dir.c_str());
      StopGateway(runs.back(), /*keep_dir=*/true);
      runs.pop_back();
      stop_all();
      return 1;
    }
    sides.push_back({who + "'s worker, directly", "", -1, worker, &direct_body, WorkerAuth(), {}, {}, {}, sides.size()});
    sides.push_back({runs.size() == 1 ? "spillway serve" : "spillway serve, against", who, runs.back().pid,
                     runs.back().port, &gw_body, {}, {}, {}, {}, sides.size() - 1});
  }
  const uint16_t worker = sides.front().port;  // the first gateway's, which nginx and the bare proxy front too
  std::optional<NginxProxy> nginx;
  if (against.empty()) {  // (an A/B of two builds measures the two alone, as gateway_overhead does)
    nginx.emplace(worker, WorkerSecret(), wrap("nginx"));
    if (nginx->running()) {
      sides.push_back({"nginx proxy_pass", "nginx", nginx->pid(), nginx->port(), &direct_body, {}, {}, {}, {}, 0});
    } else {
      std::printf("nginx: %s; its row is skipped\n", nginx->why().c_str());
    }
    const auto [bare, bare_port] = StartBareProxy(worker, wrap("bare"));
    bare_pid = bare;
    if (bare_port == 0) {
      std::printf("the bare proxy did not start\n");
      stop_all();
      return 1;
    }
    sides.push_back({"bare Asio proxy", "bare", bare_pid, bare_port, &direct_body, WorkerAuth(), {}, {}, {}, 0});
  }
  std::vector<std::unique_ptr<spillway::http::Connection>> conns;
  for (auto& s : sides) conns.push_back(std::make_unique<spillway::http::Connection>("127.0.0.1", s.port));
  const auto round = [&](int count, bool timed) {
    int failed = 0;
    for (int i = 0; i < count; ++i) {
      for (size_t j = 0; j < sides.size(); ++j) {
        const size_t k = (i + j) % sides.size();
        const auto t0 = Clock::now();
        auto r = conns[k]->Send("POST", "/v1/completions", *sides[k].body, sides[k].headers);
        if (!r.ok() || r->status != 200) {
          ++failed;
        } else if (timed) {
          const auto t1 = Clock::now();
          sides[k].latency.push_back(Us(t0, t1));
          sides[k].spans.emplace_back(Ns(t0), Ns(t1));
        }
      }
    }
    return failed;
  };
  const auto dump_all = [&] {
    for (auto& s : sides) {
      if (s.pid > 0) kill(s.pid, DumpSignal());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  };
  round(200, false);  // warm-up
  dump_all();         // (dump 0: the warm-up's calls, not read)
  const int failed = round(n, true);
  dump_all();
  for (auto& s : sides) {
    if (s.pid > 0) s.cuts = CutRequests(ReadDump(out_dir + "/" + s.dump + "." + std::to_string(s.pid) + ".1"));
  }
  if (keep) std::printf("the calls are kept in %s\n", out_dir.c_str());
  nginx.reset();
  stop_all();
  if (failed) std::printf("%d requests failed\n", failed);
  for (const auto& s : sides) {
    if (s.pid > 0 && s.cuts.size() < static_cast<size_t>(n) / 2) {
      std::printf("too few requests found in the calls of %s (%zu of %d)\n", s.label.c_str(), s.cuts.size(), n);
      return 1;
    }
  }
  std::printf("one-token completions, loopback, keep-alive, journal %s; %d through each proxy, alternating; "
              "times in microseconds\n",
              journal.c_str(), n);
  std::printf("%-26s %7s %7s | %7s %7s | %7s | %6s %6s | %5s %5s | %7s\n", "", "request", "p90", "answer", "p90",
              "own p50", "send w", "send c", "calls", "pwr", "added");
  std::vector<double> own(sides.size(), 0);
  std::vector<size_t> proxies;
  for (size_t k = 0; k < sides.size(); ++k) {
    if (sides[k].pid <= 0) continue;
    proxies.push_back(k);
    own[k] = PrintRow(sides[k].label.c_str(), Summarize(sides[k].cuts),
                      Pct(sides[k].latency, .5) - Pct(sides[sides[k].direct].latency, .5));
  }
  for (size_t k : proxies) {
    std::vector<double> to, sync, from;
    for (const auto& c : sides[k].cuts) {
      if (c.sync < 0) continue;
      to.push_back(c.to_sync);
      sync.push_back(c.sync);
      if (c.from_sync >= 0) from.push_back(c.from_sync);
    }
    if (sync.size() < sides[k].cuts.size() / 2) continue;
    std::printf("%s, its answer phase's fdatasync (%zu of %zu requests), p50: end record written -> sync begins %.1f us "
                "(the log's thread woken), the sync %.1f us, sync done -> serving thread awake %.1f us\n",
                sides[k].label.c_str(), sync.size(), sides[k].cuts.size(), Pct(to, .5), Pct(sync, .5), Pct(from, .5));
  }
  for (size_t i = 1; i < proxies.size(); ++i) {
    const size_t a = proxies[0], b = proxies[i];
    std::printf("own time on the way, p50: %s %.0f us, %s %.0f us (%.2fx)\n", sides[a].label.c_str(), own[a],
                sides[b].label.c_str(), own[b], own[b] > 0 ? own[a] / own[b] : 0);
  }
  std::printf("request: wake-up with the client's request to the send to the worker; answer: wake-up with the "
              "worker's answer to the send to the client; own p50: their sum; send w/c: the sends' own p50; calls: "
              "system calls a request, waits not counted; pwr: file writes inside the two phases; added: the "
              "client's p50 over calling its worker directly (%.0f us) in the same rounds\n",
              Pct(sides[0].latency, .5));
  std::printf("each phase's calls, commonest first (r/s/w: read, send, file write; c/w/f: client, worker, file; - "
              "failed, e.g. EAGAIN; poll: epoll_wait that does not sleep; wait: one that sleeps; sync: fdatasync):\n");
  for (size_t k : proxies) PrintSequences(sides[k].label.c_str(), sides[k].cuts);
  for (size_t k : proxies) PrintMarks(sides[k].label.c_str(), sides[k].cuts);
  std::printf("the way between client, proxy and worker, p50s in microseconds (the worker called directly: %.1f us):\n",
              Pct(sides[0].latency, .5));
  std::printf("%-26s %7s | %7s | %7s | %9s %9s | %s\n", "", "in", "worker", "out", "awake w", "awake c", "matched");
  for (size_t k : proxies) PrintLegs(sides[k].label.c_str(), sides[k].cuts, sides[k].spans);
  std::printf("in: the client's send to the proxy awake with the request; worker: the send to the worker to the proxy "
              "awake with its answer; out: the send to the client to the client's return; awake w/c: how long the "
              "proxy stays awake after its send to the worker and to the client\n");
  return 0;
}
