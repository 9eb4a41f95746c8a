#include "cli/serve_command.h"

#include "cli/serve_config.h"
#include "cli/serve_notify.h"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>

#include "api/http_client.h"
#include "api/http_server.h"
#include "common/clock.h"
#include "common/private_files.h"
#include "common/thread_name.h"
#include "config/config.h"
#include "common/json_log.h"
#include "gateway/gateway.h"
#include "gateway/readiness.h"
#include "gateway/startup_check.h"
#include "gateway/placement_admission.h"
#include "journal/journal.h"
#include "protocol/worker_protocol.h"
#include "upstream/supervisor.h"

namespace spillway::cli {

namespace fs = std::filesystem;

namespace {

struct ServeArgs {
  std::string config_path, listen, state_dir, port_file, worker_bin;
  bool keep_going = false, check = false;
  double worker_orphan_timeout_s = 180;
  double shutdown_grace_s = -1;  // < 0: the config's
  std::string log_format = "text";
};

// One worker per placement, whether admitted or not (adoption is judged
// against every placement's spec before admission).
struct PlannedWorker {
  upstream::WorkerSpec spec;
  std::string service, placement;
};

std::vector<PlannedWorker> PlanWorkers(const config::GatewayConfig& cfg) {
  std::vector<PlannedWorker> out;
  for (const auto& s : cfg.services) {
    for (size_t i = 0; i < s.placements.size(); ++i) {
      const auto& p = s.placements[i];
      std::vector<std::string> args = {"--model", p.ModelOr(s.model), "--device", p.device,
                                       "--gpu-layers", std::to_string(p.gpu_layers), "--ctx", std::to_string(p.ctx),
                                       "--slots", std::to_string(p.slots), "--threads", std::to_string(p.threads),
                                       "--batch", std::to_string(p.batch), "--default-max-tokens",
                                       std::to_string(s.default_max_tokens), "--progress-timeout",
                                       std::to_string(p.progress_timeout_s), "--json-max-depth",
                                       std::to_string(cfg.WorkerJsonMaxDepth()), "--max-body",
                                       std::to_string(cfg.WorkerMaxBodyBytes())};
      if (!p.mmap) args.push_back("--no-mmap");
      if (p.kv_unified) args.push_back("--kv-unified");
      if (!p.prefix_reuse) args.push_back("--no-prefix-reuse");
      // The CPU fallback's readiness policy (gateway/readiness.h).
      const gateway::Readiness r = gateway::ResolveReadiness(s, i, cfg.worker_binary);
      if (r.policy == "mmap") {
        args.insert(args.end(), {"--lazy-context", "--context-idle-s", std::to_string(s.failover.idle_unload_s)});
      }
      upstream::WorkerSpec spec;
      spec.key = gateway::WorkerKey(s, i);
      spec.args = args;
      // An accelerator placement that is not pinned loads when needed (keep_alive: also at start).
      spec.on_demand = r.policy == "on-demand" || (p.device != "cpu" && s.residency.mode != "pinned");
      // keep_alive: loaded at start (Demand below) and after a crash.
      spec.restart_on_exit = spec.on_demand && p.device != "cpu" && s.residency.mode == "keep_alive";
      spec.start_timeout_ms = static_cast<int64_t>(p.start_timeout_s * 1000);
      spec.nice = s.residency.Niceness();
      out.push_back({spec, s.name, p.Name()});
    }
  }
  return out;
}

// The servers of the external services Spillway starts (residency pinned:
// at once; keep_alive: at once, stopped when idle; on_demand: with their
// first request). Never adopted: one left by a crashed gateway is stopped.
std::vector<upstream::WorkerSpec> ExternalSpecs(const config::GatewayConfig& cfg) {
  std::vector<upstream::WorkerSpec> out;
  for (const auto& e : cfg.externals) {
    if (!e.Started()) continue;
    upstream::WorkerSpec spec;
    spec.key = gateway::ExternalKey(e);
    for (std::string arg : e.command) {
      for (size_t at = arg.find("${MODEL}"); at != std::string::npos; at = arg.find("${MODEL}", at + e.model.size())) {
        arg.replace(at, 8, e.model);
      }
      spec.command.push_back(arg);
    }
    spec.on_demand = e.residency.mode != "pinned";
    spec.restart_on_exit = e.residency.mode == "keep_alive";
    spec.start_timeout_ms = static_cast<int64_t>(e.start_timeout_s * 1000);
    spec.health_path = e.health_path;
    spec.stop_signal = config::SignalNumber(e.stop_signal);
    spec.nice = e.residency.Niceness();
    out.push_back(std::move(spec));
  }
  return out;
}

// --check: what serve would refuse at start, without starting anything.
int Check(const ServeArgs& a) {
  auto loaded = LoadServeConfig(a.config_path, a.listen, a.state_dir);
  if (!loaded.ok()) {
    std::fprintf(stderr, "spillway serve: %s\n", loaded.status().message().c_str());
    return 2;
  }
  const std::string worker_bin = a.worker_bin.empty() ? DefaultWorkerBinary() : a.worker_bin;
  loaded->worker_binary = worker_bin;
  const std::string where = a.config_path.empty() ? "the demo" : a.config_path;
  for (const auto& w : loaded->Warnings()) std::fprintf(stderr, "spillway serve: %s: warning: %s\n", where.c_str(), w.c_str());
  if (const std::string note = UnreadConfigNote(a.config_path); !note.empty()) {
    std::fprintf(stderr, "spillway serve: warning: %s\n", note.c_str());
  }
  const auto problems = gateway::CheckStartup(*loaded, fs::path(worker_bin).parent_path().string());
  for (const auto& p : problems) {
    std::fprintf(stderr, "spillway serve: %s: %s: %s\n", where.c_str(), p.where.c_str(), p.reason.c_str());
  }
  bool worker_missing = ::access(worker_bin.c_str(), X_OK) != 0;
  if (worker_missing) std::fprintf(stderr, "spillway serve: no spillway-worker at %s (--worker-bin)\n", worker_bin.c_str());
  if (!problems.empty() || worker_missing) return 2;
  size_t placements = 0;
  for (const auto& s : loaded->services) placements += s.placements.size();
  // An external server Spillway starts: its program must be there to run.
  for (const auto& e : loaded->externals) {
    if (e.command.empty() || e.command[0].find('/') == std::string::npos) continue;  // found on $PATH when started
    if (::access(e.command[0].c_str(), X_OK) != 0) {
      std::fprintf(stderr, "spillway serve: %s: service '%s': command %s is not an executable file\n", where.c_str(),
                   e.name.c_str(), e.command[0].c_str());
      return 2;
    }
  }
  const size_t services = loaded->services.size() + loaded->externals.size();
  const std::string external =
      loaded->externals.empty() ? "" : ", " + std::to_string(loaded->externals.size()) + " of them external";
  std::printf("%s: ok (%zu service%s, %zu placement%s%s; `spillway doctor` checks memory, state directory and port)\n",
              where.c_str(), services, services == 1 ? "" : "s", placements, placements == 1 ? "" : "s",
              external.c_str());
  return 0;
}

int Serve(const ServeArgs& a) {
  // Everything the gateway writes (journal, logs, port files) is its user's only.
  ::umask(077);
  // --keep-going: a model file that is missing is a placement that cannot
  // work, not started (CheckStartup says why), as one that is not a GGUF.
  auto loaded = LoadServeConfig(a.config_path, a.listen, a.state_dir, /*validate=*/true, /*model_files=*/!a.keep_going);
  if (!loaded.ok()) {
    std::fprintf(stderr, "spillway serve: %s\n", loaded.status().message().c_str());
    return 2;
  }
  config::GatewayConfig cfg = std::move(*loaded);
  if (a.shutdown_grace_s >= 0) cfg.shutdown_grace_s = a.shutdown_grace_s;
  for (const auto& w : cfg.Warnings()) std::fprintf(stderr, "spillway serve: warning: %s\n", w.c_str());
  if (const std::string note = UnreadConfigNote(a.config_path); !note.empty()) {
    std::fprintf(stderr, "spillway serve: warning: %s\n", note.c_str());
  }

  if (Status st = EnsurePrivateDir(cfg.state_dir); !st.ok()) {
    std::fprintf(stderr, "spillway serve: %s\n", st.message().c_str());
    return 2;
  }

  SystemClock clock;
  const std::string worker_bin = a.worker_bin.empty() ? DefaultWorkerBinary() : a.worker_bin;
  cfg.worker_binary = worker_bin;  // (its dry run plans the models the metadata cannot size)
  upstream::Supervisor supervisor(worker_bin, cfg.state_dir, clock);
  // One gateway per state directory, claimed before the journal is recovered:
  // a second one would recover the first's open requests and adopt its workers.
  if (Status st = supervisor.Claim(); !st.ok()) {
    std::fprintf(stderr, "spillway serve: %s\n", st.message().c_str());
    return 2;
  }
  supervisor.SetOrphanTimeout(a.worker_orphan_timeout_s);
  journal::JournalOptions jo;
  jo.synchronous_full = cfg.journal.synchronous_full;
  jo.retention_ms = static_cast<int64_t>(cfg.journal.retention_hours * 3600 * 1000);
  jo.idempotency_ms = static_cast<int64_t>(cfg.journal.idempotency_hours * 3600 * 1000);
  auto journal = journal::Journal::Open(cfg.state_dir + "/journal.db", jo, clock);
  if (!journal.ok()) {
    std::fprintf(stderr, "spillway serve: %s\n", journal.status().message().c_str());
    return 1;
  }
  auto recovered = (*journal)->Recover();
  if (!recovered.ok()) {
    std::fprintf(stderr, "spillway serve: %s\n", recovered.status().message().c_str());
    return 1;
  }

  std::vector<PlannedWorker> planned = PlanWorkers(cfg);
  std::vector<upstream::WorkerSpec> specs;
  for (const auto& w : planned) specs.push_back(w.spec);
  // Placement-level admission: a placement whose predicted memory does not
  // fit its device (with headroom, against what the device reports free) is
  // not started. One whose worker survived the previous gateway is admitted
  // as it runs: the memory the device reports in use is its own.
  gateway::PlacementCalibration calibration;  // what workers really allocated, per (model, device)
  // (The earlier gateway's workers that will not be adopted are stopped
  // first: their memory is not counted against the placements that replace them.)
  std::vector<upstream::WorkerSpec> all = specs;
  for (auto& spec : ExternalSpecs(cfg)) all.push_back(std::move(spec));
  auto admissions = gateway::AdmitPlacements(&calibration, cfg, supervisor.StopUnadoptable(all));
  // What cannot work is refused now, not found out by the first request.
  const std::string where = a.config_path.empty() ? "the demo" : a.config_path;
  const auto problems = gateway::CheckStartup(cfg, fs::path(worker_bin).parent_path().string());
  for (const auto& p : problems) {
    std::fprintf(stderr, "spillway serve: %s: %s: %s\n", where.c_str(), p.where.c_str(), p.reason.c_str());
    auto& adm = admissions[p.worker_key];
    adm.admitted = false;
    adm.reason = "unavailable: " + p.reason;
  }
  if (!problems.empty() && !a.keep_going) {
    std::fprintf(stderr, "spillway serve: refusing to start (%zu problem%s above; --keep-going starts without the "
                         "placements concerned)\n", problems.size(), problems.size() == 1 ? "" : "s");
    return 2;
  }
  for (auto& w : planned) {
    const auto& adm = admissions[w.spec.key];
    if (!adm.admitted) {
      std::fprintf(stderr, "spillway serve: placement %s of service '%s' not started: %s\n", w.placement.c_str(),
                   w.service.c_str(), adm.reason.c_str());
      continue;
    }
    supervisor.Add(std::move(w.spec));
  }
  for (auto& spec : ExternalSpecs(cfg)) supervisor.Add(std::move(spec));
  gateway::Gateway gw(cfg, **journal, supervisor, clock, admissions);
  // Every start, restarts included, passes the gateway's start gate (start_gate.cpp).
  supervisor.SetStartGate([&gw, &calibration](const std::string& key) { return gw.StartGate(key, &calibration); });
  // io_threads event loops, one thread each (concurrency hint 1: no
  // thread hands a loop's work to another). `ioc` also runs the gateway's
  // own timers and signals; client connections go to each in turn. The
  // other loops outlive `ioc`: a pending accept on `ioc` holds a socket of
  // the loop it was meant for.
  std::vector<std::unique_ptr<boost::asio::io_context>> more_loops;
  for (int i = 1; i < cfg.io_threads; ++i) more_loops.push_back(std::make_unique<boost::asio::io_context>(1));
  boost::asio::io_context ioc(1);
  // systemd's Type=notify: READY, STATUS, the watchdog, STOPPING (no-ops outside systemd).
  ServeNotifications notifications(ioc, supervisor, ServiceNotifier::FromEnvironment());
  // Said while the models load, so a first `make run` never looks hung.
  auto first_ready = std::make_shared<std::set<std::string>>();
  auto ready_mu = std::make_shared<std::mutex>();
  supervisor.SetOnReady([&cfg, &supervisor, &gw, &calibration, &notifications, first_ready,
                         ready_mu](const std::string& key, uint16_t port) {
    if (const auto* e = gateway::ExternalOfKey(cfg, key)) {
      gw.WorkerReady(key);
      notifications.WorkerReady(key);
      for (const auto& w : supervisor.Snapshot()) {
        if (w.key == key) {
          std::printf("spillway: external service '%s' ready on port %u after %.1f s\n", e->name.c_str(), port,
                      static_cast<double>(w.last_start_ms) / 1000);
        }
      }
      std::fflush(stdout);
      return;
    }
    // Its /info, as the supervisor read it before making it ready (and
    // found it speaks this gateway's protocol; an adopted one's was checked
    // at adoption).
    std::shared_ptr<const std::string> info;
    for (const auto& w : supervisor.Snapshot()) {
      if (w.key == key) info = w.info;
    }
    const auto j = info ? nlohmann::json::parse(*info, nullptr, false) : nlohmann::json();
    const auto typed = protocol::WorkerInfo::FromJson(j);
    gw.WorkerReady(key);
    notifications.WorkerReady(key);
    {
      std::lock_guard<std::mutex> lk(*ready_mu);
      // Every load is logged (a restart's and each on-demand load's too);
      // the count of workers loaded only on the way to "every worker is ready".
      const bool first = first_ready->insert(key).second;
      size_t total = 0, on_demand = 0, loaded = 0;
      const auto workers = supervisor.Snapshot();
      for (const auto& w : workers) {
        (w.on_demand ? on_demand : total) += 1;
        loaded += !w.on_demand && first_ready->count(w.key);
      }
      for (const auto& w : workers) {
        if (w.key != key) continue;
        if (w.adopted && w.on_demand) {  // (not among the workers loaded at start: no count)
          std::printf("spillway: on-demand worker %s ready: adopted from the previous gateway, nothing reloaded\n",
                      key.c_str());
        } else if (w.adopted) {
          std::printf("spillway: worker %s ready: adopted from the previous gateway, nothing reloaded (%zu of %zu)\n",
                      key.c_str(), loaded, total);
        } else if (w.on_demand) {
          std::printf("spillway: on-demand worker %s ready after %.1f s\n", key.c_str(),
                      static_cast<double>(w.last_start_ms) / 1000);
        } else if (!first) {
          std::printf("spillway: worker %s ready again after %.1f s (restart %d: %s)\n", key.c_str(),
                      static_cast<double>(w.last_start_ms) / 1000, w.restarts, w.last_exit.c_str());
        } else {
          std::printf("spillway: worker %s ready after %.1f s (%zu of %zu loaded)\n", key.c_str(),
                      static_cast<double>(w.last_start_ms) / 1000, loaded, total);
        }
      }
      if (first && loaded == total && !supervisor.OnDemand(key)) {
        std::printf("spillway: every worker is ready%s\n",
                    on_demand ? " (on-demand replicas start with their first request)" : "");
      }
      std::fflush(stdout);
    }
    // Calibrate: what llama.cpp really allocated on the placement's device.
    if (!typed || !typed->context_created) return;  // unknown, or a lazy context: nothing to compare yet
    const bool on_host = j["placement"]["device"] == "cpu";
    uint64_t observed = 0;
    for (const auto& b : typed->buffers) {
      if (b.host == on_host) observed += b.total;
    }
    gateway::RecordObserved(calibration, cfg, key, observed);
  });
  // SIGINT/SIGTERM are taken over before the first worker starts: one that
  // arrives while the gateway starts is queued and handled (workers stopped)
  // once it serves, instead of killing it and orphaning its workers.
  boost::asio::signal_set signals(ioc, SIGINT, SIGTERM);
  supervisor.Start();
  // However this ends (an exception below too), the supervisor's thread is
  // stopped before what its callbacks use (the notifications, the I/O
  // context, the gateway) is destroyed. (Stop is idempotent.)
  struct StopSupervisor {
    upstream::Supervisor& s;
    ~StopSupervisor() { s.Stop(); }
  } stop_supervisor{supervisor};
  // keep_alive: loaded now, unloaded when idle.
  for (const auto& e : cfg.externals) {
    if (e.Started() && e.residency.mode == "keep_alive") supervisor.Demand(gateway::ExternalKey(e));
  }
  for (const auto& s : cfg.services) {
    for (size_t i = 0; i < s.placements.size(); ++i) {
      if (s.placements[i].device != "cpu" && s.residency.mode == "keep_alive") supervisor.Demand(gateway::WorkerKey(s, i));
    }
  }
  const size_t n_recovered = recovered->size();
  gw.Start(ioc.get_executor(), std::move(*recovered));  // before the first request can arrive
  http::ServerOptions so;
  so.max_body_bytes = cfg.max_body_bytes;
  so.max_body_memory_bytes = cfg.max_body_memory_bytes;
  so.max_connections = http::ConnectionCap(static_cast<size_t>(cfg.max_connections), ReservedDescriptors(cfg));
  so.one_thread_per_loop = true;  // ioc and more_loops: one thread each (above)
  so.check_head = [&gw](const http::RequestHead& head) { return gw.AccessRefusal(head); };
  std::vector<boost::asio::io_context*> loops = {&ioc};
  for (auto& l : more_loops) loops.push_back(l.get());
  http::Server server(
      ioc, so, [&gw](http::Request req, std::shared_ptr<http::Exchange> ex) { gw.Handle(std::move(req), std::move(ex)); },
      loops);
  if (Status st = server.Listen(cfg.listen_host, cfg.listen_port); !st.ok()) {
    std::fprintf(stderr, "spillway serve: %s\n", st.message().c_str());
    return 1;  // (the supervisor stops with stop_supervisor)
  }
  if (!a.port_file.empty()) {
    if (Status st = WritePrivateFileAtomically(a.port_file, std::to_string(server.port()) + "\n"); !st.ok()) {
      std::fprintf(stderr, "spillway serve: %s\n", st.message().c_str());
      return 1;
    }
  }
  std::printf("spillway serving on http://%s:%u (%zu services, state in %s, journal synchronous=%s, %zu recovered)\n",
              cfg.listen_host.c_str(), server.port(), cfg.services.size() + cfg.externals.size(), cfg.state_dir.c_str(),
              (*journal)->synchronous_mode().c_str(), n_recovered);
  {
    size_t starting = 0;
    for (const auto& w : supervisor.Snapshot()) starting += !w.on_demand && !w.adopted;
    if (const uint64_t adopted = supervisor.total_adopted()) {
      std::printf("spillway: %llu worker%s adopted from the previous gateway (no reload)\n",
                  static_cast<unsigned long long>(adopted), adopted == 1 ? "" : "s");
    }
    // (Every worker the supervisor has: adopted, loading, or started by a request, on demand.)
    if (supervisor.Snapshot().empty() && !cfg.services.empty() && cfg.externals.empty()) {
      std::printf("spillway: no worker can start (see the problems above, GET /readyz): requests get 503 with the "
                  "reason\n");
    } else {
      std::printf("spillway: loading %zu worker%s; requests wait for them meanwhile (GET /readyz, /v1/status)\n",
                  starting, starting == 1 ? "" : "s");
    }
  }
  std::fflush(stdout);
  notifications.Start(cfg.listen_host + ":" + std::to_string(server.port()));

  // Pruning of old journal rows, every ten minutes, on a thread of its own
  // (its deletes would hold up an event loop's connections meanwhile).
  if (auto p = (*journal)->Prune(); !p.ok()) std::fprintf(stderr, "spillway: %s\n", p.status().ToString().c_str());
  std::mutex prune_mu;
  std::condition_variable prune_cv;
  bool stopping = false;
  std::thread pruner([&] {
    NameThisThread("sw-prune");
    std::unique_lock<std::mutex> lk(prune_mu);
    while (!prune_cv.wait_for(lk, std::chrono::minutes(10), [&] { return stopping; })) {
      lk.unlock();
      if (auto p = (*journal)->Prune(); !p.ok()) std::fprintf(stderr, "spillway: %s\n", p.status().ToString().c_str());
      lk.lock();
    }
  });

  // A stop (SIGTERM, SIGINT) takes no new connection or request (503 and
  // Retry-After on a kept-alive one) and lets those under way finish for up
  // to shutdown_grace_s, as nginx's graceful quit and Envoy's drain do; a
  // second signal stops at once. Those still under way then are ended, each
  // client told why (Gateway::CutForStop), within kCutWait; what is left
  // after that (a request whose worker does not stop) is cut with its
  // connection and recovered by the next start as after a crash.
  constexpr auto kCutWait = std::chrono::seconds(2);
  bool draining = false;
  bool cut = false;
  auto stop = [&] {
    if (!draining) notifications.Stopping();
    server.Stop();
    ioc.stop();
    for (auto& l : more_loops) l->stop();
  };
  boost::asio::steady_timer drain_timer(ioc);
  std::chrono::steady_clock::time_point drain_until{};
  int quiet_ticks = 0;  // ticks in a row with no request under way and no answer unsent
  std::function<void()> drain_tick = [&] {
    const size_t left = gw.LiveRequests();
    // Twice in a row: an answer handed to another loop's connection may not
    // be queued there yet when its request ends.
    quiet_ticks = left == 0 && server.writing() == 0 ? quiet_ticks + 1 : 0;
    const auto now = std::chrono::steady_clock::now();
    if (quiet_ticks >= 2) return stop();
    if (now >= drain_until && !cut) {
      cut = true;
      const size_t n = gw.CutForStop();
      std::printf("spillway: shutdown_grace_s passed: ending the %zu request%s still under way (a stream resumable, "
                  "a request not streamed to run again at the next start)\n",
                  n, n == 1 ? "" : "s");
      std::fflush(stdout);
      drain_until = now + kCutWait;  // for their ends to be journaled and written
    } else if (now >= drain_until) {
      std::printf("spillway: stopping with %zu request%s still under way\n", left, left == 1 ? "" : "s");
      std::fflush(stdout);
      return stop();
    }
    drain_timer.expires_after(std::chrono::milliseconds(20));
    drain_timer.async_wait([&](const boost::system::error_code& ec) {
      if (!ec) drain_tick();
    });
  };
  std::function<void(const boost::system::error_code&, int)> on_signal = [&](const boost::system::error_code& ec, int) {
    if (ec) return;
    if (draining || cfg.shutdown_grace_s <= 0) return stop();
    draining = true;
    notifications.Stopping();
    server.Stop();
    gw.BeginStop();
    if (const size_t left = gw.LiveRequests()) {
      std::printf("spillway: stopping: %zu request%s under way may finish for up to %g s (a second signal stops at once)\n",
                  left, left == 1 ? "" : "s", cfg.shutdown_grace_s);
      std::fflush(stdout);
    }
    drain_until = std::chrono::steady_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(cfg.shutdown_grace_s * 1000));
    signals.async_wait(on_signal);
    drain_tick();
  };
  signals.async_wait(on_signal);
  std::signal(SIGPIPE, SIG_IGN);
  std::vector<std::thread> loop_threads;
  int rc = 0;
  try {
    for (auto& l : more_loops) {
      loop_threads.emplace_back([l = l.get()] {
        NameThisThread("sw-io");
        auto work = boost::asio::make_work_guard(*l);  // idle until stopped
        http::RunLogged(*l, "spillway");
      });
    }
  } catch (const std::system_error& e) {
    // (The process or user thread limit: stopped as SIGTERM stops it, not
    // ended by std::terminate with its threads running.)
    std::fprintf(stderr, "spillway serve: cannot start the event loops' threads (%zu of %zu): %s (ulimit -u?)\n",
                 loop_threads.size(), more_loops.size(), e.what());
    stop();
    rc = 1;
  }
  if (rc == 0) http::RunLogged(ioc, "spillway");
  for (auto& t : loop_threads) t.join();
  {
    std::lock_guard<std::mutex> lk(prune_mu);
    stopping = true;
  }
  prune_cv.notify_all();
  pruner.join();
  // The workers first: stopped, the supervisor no longer calls into the
  // gateway (its start gate, idle checks, readiness) while that shuts down.
  supervisor.Stop();
  gw.Shutdown();  // before the I/O context goes
  // (What ran is re-run by the next start, but not counted as cut by a crash.)
  if (Status st = (*journal)->AttemptsStopped(); !st.ok()) {
    std::fprintf(stderr, "spillway serve: could not record the stop: %s\n", st.message().c_str());
  }
  return rc;
}

}  // namespace

void AddServeCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "serve", "Run the gateway: OpenAI-compatible API and Ollama's API (/api/...), worker supervisor, durable request journal.\n"
               "Without --config it serves the built-in demo (services chat and embed) on 127.0.0.1:8480.");
  cmd->add_option("--config", args->config_path, "TOML configuration file");
  cmd->add_option("--listen", args->listen, "HOST:PORT (overrides the config; default 127.0.0.1:8480)");
  cmd->add_option("--state-dir", args->state_dir, "journal and worker logs (default: the config's state_dir, else $XDG_STATE_HOME/spillway, else ~/.local/state/spillway)");
  cmd->add_option("--port-file", args->port_file, "write the bound port here once listening");
  cmd->add_option("--worker-bin", args->worker_bin,
                  "spillway-worker binary (default: next to spillway, else ../lib/spillway/ of an installed tree)");
  cmd->add_flag("--check", args->check,
                "check the config and exit: its syntax and keys, every model file and device (what serve refuses "
                "at start); exit 0 when serve would start, 2 otherwise. Starts nothing");
  cmd->add_option("--worker-orphan-timeout", args->worker_orphan_timeout_s,
                  "seconds a worker lives on without hearing from a gateway (the gateway health-checks it every "
                  "0.5 s): workers outlive a crash of the gateway, to be adopted by the next one on the same state "
                  "directory; one that is never restarted frees its devices after this long (0 = never; else at "
                  "least 2, four health checks: less and workers would leave a living gateway)")
      ->check([](const std::string& v) -> std::string {
        char* end = nullptr;
        const double s = std::strtod(v.c_str(), &end);
        const bool ok = !v.empty() && *end == '\0' && (s == 0 || (s >= 2 && s <= 86400.0 * 365));
        return ok ? "" : "'" + v + "' must be 0 (never) or 2 to 31536000 seconds";
      })
      ->capture_default_str();
  cmd->add_option("--shutdown-grace", args->shutdown_grace_s,
                  "seconds the requests under way may finish after SIGTERM or SIGINT, no new one taken meanwhile; "
                  "those left then end, each client told why (overrides the config's shutdown_grace_s, default 10; "
                  "0: stop at once; a second signal stops at once)")
      ->check(CLI::Number)
      ->check(CLI::Range(0.0, 3600.0));
  cmd->add_flag("--keep-going", args->keep_going,
                "start even when a placement cannot work (a model file that is missing or not a readable GGUF, a device "
                "that does not exist): that placement is marked unavailable with the reason instead of "
                "refusing to start");
  cmd->add_option("--log-format", args->log_format,
                  "text, or json: one JSON object per line on stdout and stderr (common/json_log.h), and a line "
                  "per request transition with its id, service, placement, attempt and admission decision")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  cmd->callback([args, exit_code] {
    if (args->log_format == "json") {
      if (Status st = StartJsonLogs(); !st.ok()) {
        std::fprintf(stderr, "spillway serve: %s\n", st.message().c_str());
        *exit_code = 2;
        return;
      }
    }
    *exit_code = args->check ? Check(*args) : Serve(*args);
    StopJsonLogs();
  });
}

}  // namespace spillway::cli
