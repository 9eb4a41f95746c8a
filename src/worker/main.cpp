// spillway-worker: serves one model on one placement over loopback HTTP.
#include <CLI/CLI.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <ggml-backend.h>
#include <llama.h>

#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <thread>

#include "api/json_limits.h"
#include "api/http_server.h"
#include "common/names.h"
#include "common/private_files.h"
#include "common/secret.h"
#include "common/thread_name.h"
#include "worker/engine.h"
#include "worker/faults.h"
#include "worker/load_progress.h"
#include "worker/sim_control.h"
#include "worker/model.h"
#include "worker/worker_service.h"

namespace {

using namespace spillway;

// Exit codes a supervisor can act on.
constexpr int kExitUsage = 2;
constexpr int kExitLoad = 3;     // model could not be loaded (phase=load)
constexpr int kExitContext = 4;  // context could not be created (phase=kv/compute)
constexpr int kExitListen = 5;

// One JSON line on stderr describing why the worker stopped.
int Fatal(int code, const Status& st) {
  nlohmann::json j = {{"fatal", true}, {"code", StatusCodeName(st.code())}, {"message", st.message()},
                      {"phase", FailurePhaseName(st.phase())}, {"exit_code", code}};
  // (A message may quote a model path or a template's error in any bytes:
  // dump() would throw on invalid UTF-8, and the worker abort unexplained.)
  std::fprintf(stderr, "%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"spillway-worker: serves one GGUF model on one placement (device, GPU layers, context, slots)\n"
               "over loopback HTTP with OpenAI-compatible routes and Spillway's control routes."};
  std::string model_path, listen = "127.0.0.1:0", port_file, backend_dir;
  worker::Placement placement;
  int default_max_tokens = 256;
  size_t max_body = 8 << 20;
  bool no_mmap = false, verbose = false;
  app.add_option("--model", model_path, "GGUF model file")->required();
  app.add_option("--listen", listen, "HOST:PORT to listen on (loopback only; port 0 picks a free port)")
      ->capture_default_str();
  app.add_option("--port-file", port_file, "write the bound port to this file once listening");
  std::string load_progress_file;
  app.add_option("--load-progress-file", load_progress_file,
                 "rewrite \"LOADED_BYTES TOTAL_BYTES\" in this file as the model loads (the supervisor shows it)");
  app.add_option("--device", placement.device, "cpu, cuda:N or sim:N (simulated accelerator, see `spillway sim`)")
      ->capture_default_str();
  app.add_option("--gpu-layers", placement.gpu_layers, "layers to offload to --device (-1 = all)")
      ->check(CLI::Number)->check(CLI::Range(-1, 100000))->capture_default_str();
  app.add_option("--ctx", placement.ctx, "KV cache cells in all (ctx/slots per slot unless --kv-unified)")
      ->check(CLI::Number)->check(CLI::Range(16, 1 << 22))->capture_default_str();
  app.add_option("--slots", placement.slots, "concurrent requests")->check(CLI::Number)->check(CLI::Range(1, 256))->capture_default_str();
  app.add_option("--threads", placement.threads, "CPU threads (0 = all cores)")
      ->check(CLI::Number)->check(CLI::Range(0, 1024))->capture_default_str();
  app.add_option("--batch", placement.batch, "tokens per llama_decode")->check(CLI::Number)->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_flag("--no-mmap", no_mmap, "read the weights into memory instead of mapping the file");
  app.add_option("--default-max-tokens", default_max_tokens, "max_tokens when a request sets none")
      ->check(CLI::Number)->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--max-body", max_body, "largest accepted request body in bytes")->capture_default_str();
  app.add_option("--backend-dir", backend_dir, "directory with the ggml backend modules (default: next to this binary)");
  int nice = 0;
  app.add_option("--nice", nice,
                 "run at this CPU niceness (a batch service's workers: 10, background: 19), set before any thread "
                 "starts; never lowered below the niceness it was started with")
      ->check(CLI::Number)->check(CLI::Range(0, 19));
  std::vector<std::string> fault_specs;
  app.add_option("--fault", fault_specs,
                 "arm a fault on a sim device (repeatable; also $SPILLWAY_FAULTS): fail-next=load|kv|compute|reserve, "
                 "fail-after-bytes=N, kv-full, compute-error, compute-abort, hang=SECONDS, lose-at-token=K, lose-device, "
                 "slow-load=SECONDS (any device), clear");
  double progress_timeout_s = 10;
  app.add_option("--progress-timeout", progress_timeout_s,
                 "seconds without a finished decode step, with work waiting, after which /health reports \"stalled\"")
      ->check(CLI::Number)->check(CLI::Range(0.1, 86400.0))->capture_default_str();
  size_t json_max_depth = 64;
  app.add_option("--json-max-depth", json_max_depth, "deepest nesting of arrays and objects a request body may have")
      // (the gateway's bound and the levels a translation adds: config.h, WorkerJsonMaxDepth)
      ->check(CLI::Number)->check(CLI::Range(2, spillway::api::kMaxJsonDepth + spillway::api::kWorkerExtraJsonDepth))->capture_default_str();
  std::string kv_type = "f16";
  app.add_option("--kv-type", kv_type, "KV cache type")->check(CLI::IsMember({"f16", "q8_0", "f32"}))->capture_default_str();
  bool kv_unified = false;
  app.add_flag("--kv-unified", kv_unified,
               "one KV pool of --ctx cells shared by the slots, with flash attention (default: a stream of ctx/slots "
               "cells per slot, no flash attention: a request's tokens never depend on what runs beside it, which "
               "failover replay and continuation rely on)");
  bool no_prefix_reuse = false;
  app.add_flag("--no-prefix-reuse", no_prefix_reuse,
               "compute every prompt whole (default: a new request starts from what its slot's cache holds of its "
               "prompt, a chat's earlier turns; exact, since decoding is batch-invariant; never with --kv-unified "
               "or a recurrent or hybrid model)");
  size_t rendered_prompts = 8;
  app.add_option("--rendered-prompts", rendered_prompts,
                 "chat renderings (the template's prompt and its tokens) and completions' tokens kept for 30 s, so "
                 "that the gateway's count of a prompt and its run, or a retry of it, render and tokenize it once "
                 "(0: none kept)")
      ->check(CLI::Range(0, 1024))->capture_default_str();
  size_t kept_prompt_tokens = 4;
  app.add_option("--kept-prompt-tokens", kept_prompt_tokens,
                 "prompts whose text and tokens are kept, so that a chat's next turn, which sends the conversation "
                 "again, is tokenized only from its last special token (such as <|im_start|>) that both have in "
                 "common; exact: the rest is tokenized as before (0: every prompt tokenized whole; only SPM and BPE "
                 "vocabularies that add no end token)")
      ->check(CLI::Range(0, 1024))->capture_default_str();
  bool lazy_context = false;
  app.add_flag("--lazy-context", lazy_context,
               "create the context (KV cache, compute buffers) on the first request instead of at start "
               "(the \"mmap\" readiness policy: only the mapped weights are held while idle)");
  double context_idle_s = 0;
  app.add_option("--context-idle-s", context_idle_s,
                 "with --lazy-context: free the context after this many idle seconds (0 = keep it)")
      ->check(CLI::Number)->check(CLI::Range(0.0, 86400.0 * 30))->capture_default_str();
  bool dry_run = false;
  app.add_flag("--dry-run", dry_run,
               "print llama.cpp's exact buffer plan for this placement as JSON (no_alloc: nothing is allocated) and exit");
  int parent_pid = 0;
  app.add_option("--parent-pid", parent_pid,
                 "exit when this process dies (spillway serve does not pass it: its workers outlive a gateway "
                 "crash and are adopted by the restarted gateway; see --orphan-timeout)");
  double orphan_timeout_s = 0;
  app.add_option("--orphan-timeout", orphan_timeout_s,
                 "exit after this many seconds without an authenticated request, health checks included (a "
                 "supervising gateway checks every 0.5 s): a worker whose gateway crashed and was not restarted "
                 "frees its device; 0 = never (spillway serve passes its --worker-orphan-timeout, 180 s)")
      ->check(CLI::Number)->check(CLI::Range(0.0, 86400.0 * 365))->capture_default_str();
  app.add_flag("-v,--verbose", verbose, "log llama.cpp's info messages");
  bool no_auth = false;
  app.add_flag("--no-auth", no_auth,
               "serve without the worker secret: any local process may then generate text (internal fields and "
               "fault routes are refused). By default every request must carry Authorization: Bearer <secret>, "
               "the secret given in $SPILLWAY_WORKER_SECRET (the supervising gateway sets it)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  placement.mmap = !no_mmap;
  placement.dry_run = dry_run;
  ::umask(077);
  // Before any thread starts, so that all of them run at it (Linux's niceness is a thread's).
  errno = 0;
  if (const int own = getpriority(PRIO_PROCESS, 0); nice > 0 && (errno != 0 || nice > own)) {
    if (setpriority(PRIO_PROCESS, 0, nice) != 0) {
      std::fprintf(stderr, "spillway-worker: cannot set niceness %d: %s\n", nice, std::strerror(errno));
    }
  }
  // The secret is read once and leaves the environment its children would
  // inherit. (/proc/<pid>/environ keeps the start's copy: readable by this
  // user and root only, who can read the state directory's worker.secret anyway.)
  std::string secret;
  if (const char* s = std::getenv(kWorkerSecretEnv); s && *s) secret = s;
  ::unsetenv(kWorkerSecretEnv);
  if (secret.empty() && !no_auth && !dry_run) {
    return Fatal(kExitUsage, Status::InvalidArgument(std::string("no worker secret: set $") + kWorkerSecretEnv +
                                                     " (at least 16 characters; clients send Authorization: Bearer "
                                                     "<secret>) or pass --no-auth"));
  }
  if (!secret.empty() && secret.size() < 16) {
    return Fatal(kExitUsage, Status::InvalidArgument(std::string("$") + kWorkerSecretEnv + " must have at least 16 characters"));
  }
  if (parent_pid > 0) {
    // The kernel sends SIGTERM when the parent dies; if it is already gone, stop now.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent_pid) return Fatal(kExitUsage, Status::Unavailable("the parent process has exited"));
  }

  std::string host;
  uint16_t port = 0;
  if (!SplitHostPort(listen, &host, &port)) return Fatal(kExitUsage, Status::InvalidArgument("--listen must be HOST:PORT, its port 0 to 65535 (127.0.0.1:8480)"));
  if (!http::IsLoopbackAddress(host)) {
    return Fatal(kExitUsage, Status::InvalidArgument("--listen must be a loopback address: the worker has no "
                                                     "authentication; expose it through the gateway"));
  }
  if (backend_dir.empty()) {
    std::error_code ec;
    backend_dir = std::filesystem::canonical("/proc/self/exe", ec).parent_path().string();
  }

  worker::InstallLlamaLog(verbose ? GGML_LOG_LEVEL_INFO : GGML_LOG_LEVEL_WARN);
  if (Status st = worker::LoadBackends(backend_dir, placement.device); !st.ok()) return Fatal(kExitUsage, st);
  llama_backend_init();

  auto sim = worker::SimControl::Find();
  worker::FaultInjector faults(sim.get());
  if (const char* env = std::getenv("SPILLWAY_FAULTS"); env && *env) {
    if (Status st = faults.ArmAll(env); !st.ok()) return Fatal(kExitUsage, st);
  }
  for (const auto& f : fault_specs) {
    if (Status st = faults.Arm(f); !st.ok()) return Fatal(kExitUsage, st);
  }

  std::error_code size_ec;
  const uint64_t model_bytes = std::filesystem::file_size(model_path, size_ec);
  worker::LoadProgressFile load_progress(dry_run ? "" : load_progress_file, size_ec ? 0 : model_bytes,
                                         faults.TakeSlowLoadMs());
  auto model = worker::Model::Load(model_path, placement, [&](float f) { load_progress.Report(f); });
  // (A dry run allocates nothing: a load it fails is a refusal of the file or
  // placement, not a lack of memory, and its caller keeps it as final.)
  if (!model.ok()) return Fatal(kExitLoad, model.status());
  worker::EngineOptions eo;
  eo.slots = placement.slots;
  eo.ctx = placement.ctx;
  eo.batch = placement.batch;
  eo.threads = placement.threads;
  eo.embedding = (*model)->is_embedding();
  // llama.cpp pads an embedding batch to a multiple of the slots but not its
  // outputs, and its pooling then aborts the process: refused with the reason.
  if (eo.embedding && placement.slots > 1 && placement.ctx % placement.slots != 0) {
    return Fatal(kExitUsage, Status::InvalidArgument("an embedding model needs ctx (" + std::to_string(placement.ctx) +
                                                       ") to be a multiple of slots (" + std::to_string(placement.slots) +
                                                       ")"));
  }
  if (!eo.embedding && placement.batch < placement.slots) {  // (llama.cpp would abort at the first full step)
    return Fatal(kExitUsage, Status::InvalidArgument("--batch (" + std::to_string(placement.batch) +
                                                       ") is below --slots (" + std::to_string(placement.slots) +
                                                       "): each decode step carries a token of every slot"));
  }
  // llama.cpp refuses a quantized V cache without flash attention, which the
  // worker turns on only with a unified pool: its refusal read as the KV
  // cache not fitting (an allocation failure, at every start).
  if (!eo.embedding && kv_type == "q8_0" && !kv_unified) {
    return Fatal(kExitUsage, Status::InvalidArgument("--kv-type q8_0 needs --kv-unified: llama.cpp quantizes the V cache "
                                                       "only with flash attention, which the worker turns on only "
                                                       "for one pool shared by the slots"));
  }
  eo.kv_type = kv_type;
  eo.kv_unified = kv_unified;
  eo.prefix_reuse = !no_prefix_reuse;
  eo.faults = &faults;
  eo.sim = sim.get();
  eo.lazy_context = lazy_context;
  eo.context_idle_s = context_idle_s;
  if (dry_run) {
    auto plan = worker::DryRunBreakdown(**model, eo);
    if (!plan.ok()) return Fatal(kExitContext, Status::InvalidArgument(plan.status().message()));
    nlohmann::json buffers = nlohmann::json::array();
    for (const auto& b : *plan) {
      buffers.push_back({{"name", b.name}, {"host", b.host}, {"model", b.model}, {"context", b.context}, {"compute", b.compute}});
    }
    std::printf("%s\n", nlohmann::json{{"placement", placement.ToJson()}, {"buffers", buffers}}.dump().c_str());
    return 0;
  }
  worker::Engine engine(**model, eo);
  if (Status st = engine.Start(); !st.ok()) return Fatal(kExitContext, st);

  worker::ServiceOptions service_opts;
  service_opts.default_max_tokens = default_max_tokens;
  service_opts.progress_timeout_s = progress_timeout_s;
  service_opts.json_limits.max_depth = json_max_depth;
  service_opts.secret = secret;
  service_opts.rendered_prompts = rendered_prompts;
  service_opts.kept_prompt_tokens = kept_prompt_tokens;
  worker::WorkerService service(**model, engine, placement, service_opts, &faults);
  boost::asio::io_context ioc;
  http::ServerOptions so;
  so.max_body_bytes = max_body;
  so.max_body_memory_bytes = std::max<size_t>(4 * max_body, 64 << 20);
  so.max_connections = http::ConnectionCap(512, 64);
  http::Server server(ioc, so, [&service](http::Request req, std::shared_ptr<http::Exchange> ex) {
    service.Handle(std::move(req), std::move(ex));
  });
  if (Status st = server.Listen(host, port); !st.ok()) return Fatal(kExitListen, st);
  const uint16_t bound = server.port();
  if (!port_file.empty()) {
    if (Status st = WritePrivateFileAtomically(port_file, std::to_string(bound) + "\n"); !st.ok()) {
      return Fatal(kExitListen, st);
    }
  }
  std::printf("spillway-worker listening on http://%s:%u model=%s device=%s\n", host.c_str(), bound,
              (*model)->name().c_str(), placement.device.c_str());
  std::fflush(stdout);

  boost::asio::signal_set signals(ioc, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code&, int) {
    server.Stop();
    ioc.stop();
  });
  // The orphan rule: no gateway has called for --orphan-timeout seconds (it
  // crashed and no restarted one adopted this worker), so nobody ever will.
  boost::asio::steady_timer orphan_timer(ioc);
  const auto orphan_after = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(orphan_timeout_s));
  std::function<void()> watch_orphan = [&] {
    orphan_timer.expires_after(std::min<std::chrono::steady_clock::duration>(std::chrono::seconds(1), orphan_after / 4));
    orphan_timer.async_wait([&](const boost::system::error_code& ec) {
      if (ec) return;
      if (std::chrono::steady_clock::now() - service.last_caller() < orphan_after) return watch_orphan();
      nlohmann::json j = {{"orphan", true}, {"orphan_timeout_s", orphan_timeout_s},
                          {"message", "no request from a gateway within --orphan-timeout: exiting"}};
      std::fprintf(stderr, "%s\n", j.dump().c_str());
      server.Stop();
      ioc.stop();
    });
  };
  if (orphan_timeout_s > 0) watch_orphan();
  std::signal(SIGPIPE, SIG_IGN);
  std::vector<std::thread> io_threads;
  for (int i = 0; i < 1; ++i) io_threads.emplace_back([&ioc] {
    NameThisThread("sw-io");
    http::RunLogged(ioc, "spillway-worker");
  });
  http::RunLogged(ioc, "spillway-worker");
  for (auto& t : io_threads) t.join();
  service.Stop();
  engine.Stop();
  // Nothing runs any more. Freeing the model and its device buffers one by
  // one would only delay the exit that frees them all at once (the driver, or
  // the simulated device's ledger, reclaims a dead process's memory): a
  // worker that gives its room to another service is gone sooner.
  std::fflush(nullptr);
  std::_Exit(0);
}
