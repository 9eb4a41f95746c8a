// Benchmark: the request journal's group commit.
//
// 64 client threads (--threads) each run requests through the journal as the
// gateway does (Accept, StartAttempt, Finish: three durable writes) on a real
// file in a temporary directory, for --seconds per configuration:
//   grouped          the journal as shipped (max_batch 256);
//   one per write    the same journal with grouping off (max_batch 1): one
//                    commit, and at FULL one fsync, per call, as before group
//                    commit;
//   logged           the gateway's own path for a request without an
//                    Idempotency-Key: AcceptAndStartAsync and FinishAsync,
//                    two commit-log records (journal.h), each awaited; the
//                    time counted runs until every row is committed (Flush);
//   raw SQLite       one thread, one INSERT per transaction: one fsync per
//                    request, the floor for "a request costs an fsync".
// Printed: accepted requests per second, commits, and the ratios (goal at
// FULL: grouped >= 10x one per write). It prints, it does not judge.
#include <CLI/CLI.hpp>
#include <sqlite3.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "journal/journal.h"

namespace fs = std::filesystem;
using spillway::journal::Journal;
using spillway::journal::JournalOptions;
using spillway::journal::RequestRecord;
using spillway::journal::State;
using Steady = std::chrono::steady_clock;

namespace {

struct Result {
  double per_s = 0;
  int64_t requests = 0, errors = 0, commits = 0, writes = 0, largest_batch = 0;
  double backlog_ms = 0;  // rows still to commit when the clients stopped (their time counts)
};

double Seconds(Steady::time_point a, Steady::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// One durable write of the asynchronous forms, awaited.
template <typename Start>
bool Await(Start start) {
  std::promise<bool> p;
  auto f = p.get_future();
  start([&p](const spillway::Status& st) { p.set_value(st.ok()); });
  return f.get();
}

Result RunJournal(const fs::path& dir, bool full, int max_batch, int threads, double seconds, bool logged = false) {
  fs::remove_all(dir);
  spillway::SystemClock clock;
  JournalOptions o;
  o.synchronous_full = full;
  o.max_batch = max_batch;
  auto j = Journal::Open((dir / "journal.db").string(), o, clock);
  if (!j.ok()) {
    std::fprintf(stderr, "journal_throughput: %s\n", j.status().ToString().c_str());
    return {};
  }
  Journal& journal = **j;
  const auto before = journal.stats();
  std::atomic<bool> go{false}, stop{false};
  std::atomic<int64_t> done{0}, errors{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      while (!go) std::this_thread::yield();
      for (int i = 0; !stop; ++i) {
        RequestRecord r;
        r.id = "req-" + std::to_string(t) + "-" + std::to_string(i);
        r.payload_hash = "h";
        r.service = r.endpoint = "chat";
        r.body = R"({"messages":[{"role":"user","content":"hello"}],"max_tokens":16})";
        bool ok;
        if (logged) {
          const std::string id = r.id;
          ok = Await([&](auto done) { journal.AcceptAndStartAsync(std::move(r), "gpu", "", done); }) &&
               Await([&](auto done) {
                 journal.FinishAsync(id, State::kCompleted, 200, "application/json", R"({"choices":[]})", "", done);
               });
        } else {
          ok = journal.Accept(r).ok() && journal.StartAttempt(r.id, "gpu").ok() &&
               journal.Finish(r.id, State::kCompleted, 200, "application/json", R"({"choices":[]})").ok();
        }
        ++(ok ? done : errors);
      }
    });
  }
  const auto t0 = Steady::now();
  go = true;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : pool) t.join();
  const auto stopped = Steady::now();
  journal.Flush();  // every row committed: a backlog of rows is not throughput
  const auto after = journal.stats();
  Result r;
  r.requests = done;
  r.errors = errors;
  r.per_s = static_cast<double>(done) / Seconds(t0, Steady::now());
  r.commits = after.commits - before.commits;
  r.writes = after.writes - before.writes;
  r.largest_batch = after.largest_batch;
  r.backlog_ms = Seconds(stopped, Steady::now()) * 1000;
  return r;
}

// One INSERT per transaction from one thread: each request one fsync (at FULL).
Result RunRaw(const fs::path& dir, bool full, double seconds) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  sqlite3* db = nullptr;
  Result r;
  if (sqlite3_open((dir / "raw.db").string().c_str(), &db) != SQLITE_OK) return r;
  const char* mode = full ? "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
                          : "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;";
  sqlite3_exec(db, mode, nullptr, nullptr, nullptr);
  sqlite3_exec(db, "CREATE TABLE requests(id TEXT PRIMARY KEY, body TEXT NOT NULL);", nullptr, nullptr, nullptr);
  sqlite3_stmt* ins = nullptr;
  sqlite3_prepare_v2(db, "INSERT INTO requests(id, body) VALUES(?1, ?2);", -1, &ins, nullptr);
  const auto t0 = Steady::now();
  const auto end = t0 + std::chrono::duration<double>(seconds);
  for (int64_t i = 0; Steady::now() < end; ++i) {
    const std::string id = "req-" + std::to_string(i);
    sqlite3_bind_text(ins, 1, id.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(ins, 2, "{}", -1, SQLITE_STATIC);
    ++(sqlite3_step(ins) == SQLITE_DONE ? r.requests : r.errors);
    sqlite3_reset(ins);
  }
  r.per_s = static_cast<double>(r.requests) / Seconds(t0, Steady::now());
  r.commits = r.requests;
  sqlite3_finalize(ins);
  sqlite3_close(db);
  return r;
}

void Print(const char* what, const Result& r) {
  std::printf("  %-34s %10.0f requests/s  (%lld requests, %lld errors, %lld commits", what, r.per_s,
              static_cast<long long>(r.requests), static_cast<long long>(r.errors), static_cast<long long>(r.commits));
  if (r.writes > 0 && r.commits > 0) {
    std::printf(", %.1f writes per commit, largest batch %lld", static_cast<double>(r.writes) / static_cast<double>(r.commits),
                static_cast<long long>(r.largest_batch));
  }
  if (r.backlog_ms >= 1) std::printf(", rows %.0f ms behind at the end", r.backlog_ms);
  std::printf(")\n");
}

double Ratio(const Result& a, const Result& b) { return b.per_s > 0 ? a.per_s / b.per_s : 0; }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Request journal throughput: group commit against one commit per write"};
  int threads = 64;
  double seconds = 3;
  std::string where = fs::temp_directory_path().string();
  app.add_option("--threads", threads, "client threads")->check(CLI::Range(1, 1024));
  app.add_option("--seconds", seconds, "seconds per configuration")->check(CLI::Range(0.1, 600.0));
  app.add_option("--dir", where, "where the journal files go (a real disk, not tmpfs)");
  bool logged_only = false;
  app.add_flag("--logged-only", logged_only, "only the gateway's path at FULL (for a profiler)");
  CLI11_PARSE(app, argc, argv);
  const fs::path dir = fs::path(where) / ("spillway-journal-bench-" + std::to_string(getpid()));

  std::printf("journal throughput: %d client threads, a request's durable writes each, %.1f s each, in %s\n",
              threads, seconds, dir.c_str());
  if (logged_only) {
    Print("logged (the gateway's path), FULL", RunJournal(dir, true, JournalOptions{}.max_batch, threads, seconds, true));
    fs::remove_all(dir);
    return 0;
  }
  for (const bool full : {true, false}) {
    std::printf("synchronous=%s\n", full ? "FULL" : "NORMAL");
    const Result grouped = RunJournal(dir, full, JournalOptions{}.max_batch, threads, seconds);
    const Result single = RunJournal(dir, full, 1, threads, seconds);
    const Result logged = RunJournal(dir, full, JournalOptions{}.max_batch, threads, seconds, /*logged=*/true);
    const Result raw = RunRaw(dir, full, seconds);
    Print("grouped (max_batch 256)", grouped);
    Print("one commit per write (max_batch 1)", single);
    Print("logged (the gateway's path)", logged);
    Print("raw SQLite, 1 INSERT per commit", raw);
    std::printf("  ratio grouped / one commit per write: %.1fx%s\n", Ratio(grouped, single), full ? "  (goal >= 10x)" : "");
    std::printf("  ratio logged / one commit per write: %.1fx%s\n", Ratio(logged, single), full ? "  (goal >= 10x)" : "");
    std::printf("  ratio grouped / raw one commit per request: %.1fx\n", Ratio(grouped, raw));
    std::printf("  ratio logged / raw one commit per request: %.1fx\n", Ratio(logged, raw));
  }
  fs::remove_all(dir);
  return 0;
}
