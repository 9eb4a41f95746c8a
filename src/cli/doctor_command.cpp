#include "cli/doctor_command.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "cli/serve_config.h"
#include "devices/telemetry.h"
#include "gateway/gateway.h"
#include "gateway/gateway_internal.h"
#include "gateway/placement_admission.h"
#include "gateway/startup_check.h"
#include "upstream/supervisor.h"

namespace spillway::cli {

namespace fs = std::filesystem;

namespace {

struct DoctorArgs {
  std::string config_path, listen, state_dir, worker_bin;
};

enum class Verdict { kOk, kWarn, kFail };

class Report {
 public:
  void Line(Verdict v, const std::string& check, const std::string& what, const std::string& fix = "") {
    static const char* kNames[] = {"ok  ", "warn", "FAIL"};
    std::printf("%s  %-8s %s\n", kNames[static_cast<int>(v)], check.c_str(), what.c_str());
    if (v != Verdict::kOk && !fix.empty()) std::printf("                fix: %s\n", fix.c_str());
    counts_[static_cast<int>(v)]++;
  }
  int Finish() const {
    std::printf("\n%d ok, %d warnings, %d failures\n", counts_[0], counts_[1], counts_[2]);
    return counts_[2] > 0 ? 1 : 0;
  }

 private:
  int counts_[3] = {0, 0, 0};
};

std::string MiB(uint64_t bytes) { return std::to_string((bytes + (1 << 19)) >> 20) + " MiB"; }

void CheckWorkerBinary(const std::string& bin, Report& r) {
  if (::access(bin.c_str(), X_OK) == 0) return r.Line(Verdict::kOk, "worker", bin);
  r.Line(Verdict::kFail, "worker", bin + ": " + std::strerror(errno), "build it (make build) or pass --worker-bin");
}

void CheckModels(const config::GatewayConfig& cfg, Report& r) {
  std::set<std::string> seen;
  for (size_t si = 0; si < cfg.services.size(); ++si) {
    const auto& s = cfg.services[si];
    for (size_t pi = 0; pi < s.placements.size(); ++pi) {
      const std::string path = s.placements[pi].ModelOr(s.model);
      if (!seen.insert(path).second) continue;
      const std::string key = "service[" + std::to_string(si) + "]" +
                              (s.placements[pi].model.empty() ? "" : ".placement[" + std::to_string(pi) + "]") + ".model";
      const std::string problem = gateway::ModelFileProblem(path);
      std::error_code ec;
      const auto size = fs::file_size(path, ec);
      if (problem.empty()) {
        r.Line(Verdict::kOk, "model", "service '" + s.name + "': " + path + " (" + MiB(ec ? 0 : size) + ")");
      } else {
        r.Line(Verdict::kFail, "model", "service '" + s.name + "' (key " + key + "): " + problem,
               "point the key at a GGUF file this user can read");
      }
    }
  }
}

// Each placement's shape, as its worker will judge it at start (an
// embedding model's ctx a multiple of its slots). Said only when wrong.
void CheckPlacementShapes(const config::GatewayConfig& cfg, Report& r) {
  for (size_t si = 0; si < cfg.services.size(); ++si) {
    const auto& s = cfg.services[si];
    for (size_t pi = 0; pi < s.placements.size(); ++pi) {
      const std::string problem = gateway::PlacementShapeProblem(s, pi);
      if (problem.empty()) continue;
      const auto& p = s.placements[pi];
      const int ctx = std::max(p.slots, p.ctx / p.slots * p.slots);
      r.Line(Verdict::kFail, "shape",
             "service '" + s.name + "' placement " + std::to_string(pi) + " (" + p.Name() + ", key service[" +
                 std::to_string(si) + "].placement[" + std::to_string(pi) + "].ctx): " + problem,
             "set ctx to a multiple of slots (ctx = " + std::to_string(ctx) + ")");
    }
  }
}

void CheckDevices(const config::GatewayConfig& cfg, const std::string& backend_dir, Report& r) {
  // Each device, and whether a worker runs on it (needs spillway-worker's
  // backend module); an external server's device counts as serve counts it
  // (its memory is accounted there; its own binary drives it).
  std::map<std::string, bool> devices;
  for (const auto& s : cfg.services) {
    for (const auto& p : s.placements) devices[p.device] = true;
  }
  for (const auto& e : cfg.externals) devices.emplace(e.device, false);
  bool cuda = false;
  for (const auto& [d, needs_backend] : devices) {
    cuda |= d.rfind("cuda:", 0) == 0;
    if (d == "cpu") continue;
    const std::string problem = gateway::DeviceProblem(d, backend_dir, needs_backend);
    if (problem.empty()) {
      std::string what = d + " is there";
      if (auto t = devices::OpenDeviceTelemetry(d); t.ok()) {
        if (auto reading = (*t)->Read(); reading.ok()) {
          what += ": " + MiB(reading->free) + " free of " + MiB(reading->total);
        }
      }
      r.Line(Verdict::kOk, "device", what);
    } else {
      r.Line(Verdict::kFail, "device", problem,
             d.rfind("sim:", 0) == 0 ? "spillway sim create " + d + " --capacity-mib N" : "use a device this machine has, or device = \"cpu\"");
    }
  }
  if (!cuda) return;
  // NVML tells free memory and each process's share; without it admission is blind.
  if (void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL)) {
    dlclose(lib);
    r.Line(Verdict::kOk, "nvml", "libnvidia-ml.so.1 loads");
  } else {
    r.Line(Verdict::kFail, "nvml", "libnvidia-ml.so.1 cannot be loaded: device memory cannot be observed",
           "install the NVIDIA driver's NVML library (Debian: libnvidia-ml1)");
  }
}

// An external server Spillway starts: its program must be there to run (as serve --check says).
void CheckExternalCommands(const config::GatewayConfig& cfg, const std::string& worker, Report& r) {
  bool starts_one = false;
  for (const auto& e : cfg.externals) {
    if (e.command.empty()) continue;  // one that runs already: nothing to start
    starts_one = true;
    const std::string& program = e.command[0];
    if (program.find('/') == std::string::npos) {
      r.Line(Verdict::kOk, "external", "service '" + e.name + "': " + program + " is looked up on $PATH when started");
    } else if (::access(program.c_str(), X_OK) == 0) {
      r.Line(Verdict::kOk, "external", "service '" + e.name + "': " + program + " is executable");
    } else {
      r.Line(Verdict::kFail, "external", "service '" + e.name + "': command " + program + " is not an executable file",
             "point its command at the server's binary");
    }
  }
  // What ties them to the gateway with all they start (supervisor.cpp, Argv).
  if (!starts_one) return;
  const std::string tie = upstream::TieBeside(worker);
  if (!tie.empty() && ::access(tie.c_str(), X_OK) == 0) {
    r.Line(Verdict::kOk, "external", "the servers it starts end with the gateway, with all they start (" + tie + ")");
  } else {
    r.Line(Verdict::kWarn, "external",
           (tie.empty() ? "spillway-tie: the worker binary " + worker + " names no folder to look in"
                        : tie + ": " + std::strerror(errno)) +
               "; what an external server's command starts (a wrapper script's server) outlives a gateway killed "
               "with -9",
           "build it (make build) or install Spillway again");
  }
}

// Each placement's predicted memory against its device's capacity and free
// memory now, with headroom: what `spillway serve` would decide at start.
void CheckPlans(const config::GatewayConfig& cfg, Report& r) {
  const auto admissions = gateway::AdmitPlacements(nullptr, cfg);
  for (const auto& s : cfg.services) {
    for (size_t i = 0; i < s.placements.size(); ++i) {
      const auto& p = s.placements[i];
      auto it = admissions.find(gateway::WorkerKey(s, i));
      if (it == admissions.end()) continue;
      const auto& a = it->second;
      const std::string what = "service '" + s.name + "' on " + p.Name() + ": ";
      if (a.admitted && a.predicted_bytes == 0) {
        r.Line(Verdict::kWarn, "plan", what + a.reason, "check the model line above; `spillway plan --model FILE` explains");
      } else if (a.admitted) {
        r.Line(Verdict::kOk, "plan", what + a.reason);
      } else {
        r.Line(Verdict::kFail, "plan", what + ": " + a.reason,
               "lower ctx or slots, offload fewer layers (gpu_layers), or free the device; `spillway plan` shows the split");
      }
    }
  }
}

void CheckHostRam(const config::GatewayConfig& cfg, Report& r) {
  auto host = devices::HostTelemetry().Read();
  if (!host.ok()) return r.Line(Verdict::kWarn, "host-ram", host.status().message(), "run on Linux with /proc mounted");
  uint64_t budgets = 0;
  std::string by_default;  // services whose CPU path has the default budget (half of the host's memory each)
  for (const auto& s : cfg.services) {
    bool has_cpu_path = false;
    for (size_t i = 0; i < s.placements.size(); ++i) has_cpu_path |= s.OnCpuPath(i);
    if (!has_cpu_path) continue;
    budgets += gateway::CpuPathBudgetBytes(s);
    if (s.cpu_path.ram_budget_mib <= 0) by_default += (by_default.empty() ? "" : ", ") + s.name;
  }
  const uint64_t avail = host->effective_available();
  const std::string what = MiB(avail) + " available of " + MiB(host->total) +
                           (budgets ? ", CPU paths' budgets " + MiB(budgets) : ", no CPU fallback path");
  if (budgets > avail) {
    r.Line(Verdict::kWarn, "host-ram", what + ": the CPU paths may not get what they are allowed",
           by_default.empty()
               ? "lower [service.cpu_path] ram_budget_mib, or free host memory"
               : "set ram_budget_mib under [service.cpu_path] for " + by_default +
                     " (without it each service's CPU path may take half of the host's memory), or free host memory");
  } else {
    r.Line(Verdict::kOk, "host-ram", what);
  }
}

// Two busy services of one priority on a device that cannot hold both take
// turns (admission/eviction.h), but a turn comes only while the other's
// request still waits for its load, and that wait is bounded: a llama
// service's request by its start_timeout_s (the longest of its placements')
// and a minute, or its admission's max_delay_s if longer
// (request_admission.cpp); an external server's by its start_timeout_s and
// kExternalStartSlackMs (gateway_external.cpp). A fair_turn_s past the other's bound lets the
// busy one keep the device while the other's requests are refused, one
// after another. (Whether the two fit on the device together is not known
// here: the line says "if".)
void CheckTurns(const config::GatewayConfig& cfg, Report& r) {
  struct Member {
    std::string name, device, priority;
    double turn_s, wait_s;  // its fair_turn_s; how long its requests wait for a load
    std::string bound;      // what sets wait_s
  };
  std::vector<Member> members;
  auto add = [&](const std::string& name, const std::string& device, const config::ResidencyConfig& res,
                 double wait_s, const std::string& bound) {
    // A pinned service is never unloaded: it neither gives way nor waits for
    // a load. An exclusive device drains a busy service at once: no turns.
    if (device == "cpu" || device.empty() || res.mode == "pinned" || cfg.Device(device).exclusive) return;
    for (const auto& m : members) {
      if (m.name == name && m.device == device) return;
    }
    members.push_back({name, device, res.priority, res.fair_turn_s, wait_s, bound});
  };
  for (const auto& s : cfg.services) {
    double start_s = 0;
    for (const auto& p : s.placements) start_s = std::max(start_s, p.start_timeout_s);
    const double queue_s = gateway::kQueueWaitMs / 1000.0;
    const bool by_delay = s.admission.max_delay_s > start_s + queue_s;
    for (const auto& p : s.placements) {
      add(s.name, p.device, s.residency, by_delay ? s.admission.max_delay_s : start_s + queue_s,
          by_delay ? "its admission's max_delay_s" : "start_timeout_s and a minute");
    }
  }
  for (const auto& e : cfg.externals) {
    add(e.name, e.device, e.residency, e.start_timeout_s + gateway::kExternalStartSlackMs / 1000.0,
        "start_timeout_s and " + std::to_string(gateway::kExternalStartSlackMs / 1000) + " s");
  }
  bool shared = false, warned = false;
  auto seconds = [](double v) {
    char t[32];
    std::snprintf(t, sizeof t, "%g s", v);
    return std::string(t);
  };
  for (const auto& busy : members) {
    for (const auto& waiting : members) {
      if (busy.name == waiting.name || busy.device != waiting.device || busy.priority != waiting.priority) continue;
      shared = true;
      if (busy.turn_s <= 0 || busy.turn_s < waiting.wait_s) continue;
      warned = true;
      r.Line(Verdict::kWarn, "turns",
             "on " + busy.device + ", service '" + busy.name + "' serves turns of " + seconds(busy.turn_s) +
                 " (fair_turn_s), but a request of '" + waiting.name + "' waits at most " + seconds(waiting.wait_s) +
                 " for its load (" + waiting.bound + "): if the two do not fit there together, '" + waiting.name +
                 "' gets no turn while '" + busy.name + "' stays busy, its requests refused one after another",
             "lower fair_turn_s of '" + busy.name + "' well below " + seconds(waiting.wait_s) +
                 " (the drain and the load come after it), or raise start_timeout_s of '" + waiting.name + "'");
    }
  }
  if (shared && !warned) {
    r.Line(Verdict::kOk, "turns", "each turn on a shared device ends before the other services' requests stop waiting");
  }
}

void CheckStateDir(const std::string& dir, Report& r) {
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0) {
    // It will be created: its nearest existing parent must be writable.
    fs::path parent = fs::path(dir).parent_path();
    std::error_code ec;  // (one it may not look into is not writable either: said below, not thrown)
    while (!parent.empty() && !fs::exists(parent, ec)) parent = parent.parent_path();
    if (!parent.empty() && ::access(parent.c_str(), W_OK | X_OK) == 0) {
      return r.Line(Verdict::kOk, "state", dir + " does not exist yet; it will be created (mode 0700)");
    }
    return r.Line(Verdict::kFail, "state", dir + " cannot be created (" + parent.string() + " is not writable)",
                  "set state_dir or --state-dir to a directory this user owns");
  }
  if (!S_ISDIR(st.st_mode)) {
    return r.Line(Verdict::kFail, "state", dir + " is not a directory", "set state_dir to a directory");
  }
  if (st.st_uid != ::geteuid()) {
    return r.Line(Verdict::kFail, "state", dir + " belongs to another user (uid " + std::to_string(st.st_uid) + ")",
                  "chown it to this user or choose another state_dir");
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return r.Line(Verdict::kFail, "state", dir + " is not writable", "chmod 700 " + dir);
  }
  if ((st.st_mode & 077) != 0) {
    return r.Line(Verdict::kWarn, "state", dir + " is readable by others (journal and worker logs hold requests)",
                  "chmod 700 " + dir + " (spillway serve does this itself at start)");
  }
  r.Line(Verdict::kOk, "state", dir + " (private, writable)");
}

void CheckPort(const config::GatewayConfig& cfg, Report& r) {
  const std::string where = cfg.listen_host + ":" + std::to_string(cfg.listen_port);
  const int fd = ::socket(cfg.listen_host.find(':') == std::string::npos ? AF_INET : AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return r.Line(Verdict::kWarn, "port", "cannot open a socket: " + std::string(std::strerror(errno)));
  int err = 0;
  if (cfg.listen_host.find(':') == std::string::npos) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(cfg.listen_port);
    if (::inet_pton(AF_INET, cfg.listen_host == "localhost" ? "127.0.0.1" : cfg.listen_host.c_str(), &a.sin_addr) != 1) {
      ::close(fd);
      return r.Line(Verdict::kWarn, "port", where + ": not a numeric address; not checked");
    }
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) err = errno;
  } else {
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_port = htons(cfg.listen_port);
    if (::inet_pton(AF_INET6, cfg.listen_host.c_str(), &a.sin6_addr) != 1) {
      ::close(fd);
      return r.Line(Verdict::kWarn, "port", where + ": not a numeric address; not checked");
    }
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) err = errno;
  }
  ::close(fd);
  if (err == 0) return r.Line(Verdict::kOk, "port", where + " is free");
  r.Line(Verdict::kFail, "port", where + ": " + std::strerror(err),
         err == EADDRINUSE ? "stop what listens there (ss -ltnp) or choose another --listen"
                           : "choose an address this machine has, or a port above 1023");
}

void CheckFileLimit(const config::GatewayConfig& cfg, Report& r) {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  const uint64_t need = static_cast<uint64_t>(cfg.max_connections) + ReservedDescriptors(cfg);
  const uint64_t can = rl.rlim_max == RLIM_INFINITY ? UINT64_MAX : rl.rlim_max;  // serve raises soft to hard
  const std::string what = "file descriptors: soft " + std::to_string(rl.rlim_cur) + ", hard " +
                           (rl.rlim_max == RLIM_INFINITY ? std::string("unlimited") : std::to_string(rl.rlim_max)) +
                           ", wanted " + std::to_string(need);
  if (can >= need) return r.Line(Verdict::kOk, "fd-limit", what);
  r.Line(Verdict::kWarn, "fd-limit", what + ": max_connections will be lowered to fit",
         "raise the limit (ulimit -n, LimitNOFILE= in a systemd unit) or lower max_connections");
}

int Doctor(const DoctorArgs& a) {
  auto loaded = LoadServeConfig(a.config_path, a.listen, a.state_dir, /*validate=*/false);
  if (!loaded.ok()) {
    // (Nothing else can be checked without a config: the other checks need what it declares.)
    std::printf("FAIL  config   %s\n                fix: correct the file there (README, \"spillway serve\": every key), then run "
                "doctor again for the other checks\n",
                loaded.status().message().c_str());
    return 2;
  }
  config::GatewayConfig& cfg = *loaded;
  // (Its dry run plans the models the metadata cannot size, as serve's does.)
  cfg.worker_binary = a.worker_bin.empty() ? DefaultWorkerBinary() : a.worker_bin;
  Report r;
  // What the config points at is checked below, one line each, rather than
  // stopping at the first problem as serve does.
  if (Status st = config::Validate(cfg); !st.ok()) {
    r.Line(Verdict::kFail, "config", st.message(), "fix the file; the checks below say more");
  } else {
    r.Line(Verdict::kOk, "config", (a.config_path.empty() ? std::string("the built-in demo") : a.config_path) + ": " +
                                       std::to_string(cfg.services.size()) + " services");
  }
  if (const std::string note = UnreadConfigNote(a.config_path); !note.empty()) {
    r.Line(Verdict::kWarn, "config", note, "spillway doctor --config spillway.toml");
  }
  const std::string& worker = cfg.worker_binary;
  CheckWorkerBinary(worker, r);
  CheckModels(cfg, r);
  CheckPlacementShapes(cfg, r);
  CheckDevices(cfg, fs::path(worker).parent_path().string(), r);
  CheckExternalCommands(cfg, worker, r);
  CheckPlans(cfg, r);
  CheckHostRam(cfg, r);
  CheckTurns(cfg, r);
  CheckStateDir(cfg.state_dir, r);
  CheckPort(cfg, r);
  CheckFileLimit(cfg, r);
  return r.Finish();
}

}  // namespace

void AddDoctorCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<DoctorArgs>();
  CLI::App* cmd = app.add_subcommand(
      "doctor", "Check this machine for what a configuration needs: model files, devices and backends, NVML, each\n"
                "placement's memory plan against its device, host RAM for the CPU paths, services that take turns\n"
                "on a device (each turn within the other's wait), the state directory, the port, the file-descriptor\n"
                "limit. One line per check with a fix; exit status 1 when something would fail. Without --config it\n"
                "checks the built-in demo.");
  cmd->add_option("--config", args->config_path, "TOML configuration file");
  cmd->add_option("--listen", args->listen, "HOST:PORT (overrides the config)");
  cmd->add_option("--state-dir", args->state_dir, "state directory (overrides the config)");
  cmd->add_option("--worker-bin", args->worker_bin, "spillway-worker binary (default: next to spillway, else ../lib/spillway/ of an installed tree)");
  cmd->callback([args, exit_code] { *exit_code = Doctor(*args); });
}

}  // namespace spillway::cli
