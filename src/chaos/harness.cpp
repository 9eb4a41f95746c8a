#include "chaos/harness.h"
#include "chaos/run.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "api/http_client.h"
#include "chaos/process.h"
#include "chaos/verdict.h"
#include "devices/sim_ledger.h"
#include "protocol/worker_protocol.h"

namespace spillway::chaos {

const char* TargetName(Target t) {
  switch (t) {
    case Target::kSpillway: return "spillway";
    case Target::kPlainProxy: return "plain-proxy";
    case Target::kLlamaServer: return "llama-server";
    case Target::kSwapAll: return "swap-all";
  }
  return "?";
}

int64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void SleepMs(int64_t ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

uint16_t FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  uint16_t port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

uint64_t RssOf(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// One scenario run against one target: its processes and what the clients share.
std::string Run::CompetingToml() const {
  // chat: interactive and pinned, with its CPU fallback; embed: batch, on
  // demand, a CPU fallback for when it is evicted; search: interactive, on
  // demand, unloaded after 1 s idle. The swap-all baseline: the same
  // placements, all on demand, no priorities, no CPU paths, one at a time.
  const bool swap = target_ == Target::kSwapAll;
  const std::string chat = o_.models_dir + "/demo-chat.gguf", embed = o_.models_dir + "/demo-embed.gguf";
  const std::string gpu = "[[service.placement]]\ndevice = \"" + o_.device + "\"\ngpu_layers = 99\nthreads = 1\nbatch = 64\n";
  std::ostringstream c;
  c << "[[device]]\nname = \"" << o_.device << "\"\nheadroom_mib = " << (Simulated() ? 4 : 512) << "\nheadroom_pct = 0\n"
    << (swap ? "exclusive = true\n" : "");
  c << "[[service]]\nname = \"chat\"\nmodel = \"" << chat << "\"\nmax_tokens = 512\n"
    << (swap ? "residency = \"on_demand\"\nkeep_alive_s = 0\n" : "residency = \"pinned\"\n") << gpu
    << "ctx = 2048\nslots = 4\n";
  if (!swap) c << "[[service.placement]]\nrole = \"fallback\"\ndevice = \"cpu\"\nctx = 8192\nslots = 2\nthreads = 1\nbatch = 64\n";
  for (const char* name : {"embed", "search"}) {
    const bool batch = std::string(name) == "embed";
    c << "[[service]]\nname = \"" << name << "\"\nmodel = \"" << embed << "\"\nresidency = \"on_demand\"\n"
      << "keep_alive_s = " << (batch || swap ? 0 : 1) << "\npriority = \"" << (batch && !swap ? "batch" : "interactive")
      << "\"\n" << gpu << "ctx = 512\nslots = 1\n";
    if (!swap) c << "[[service.placement]]\nrole = \"fallback\"\ndevice = \"cpu\"\nctx = 512\nslots = 1\nthreads = 1\n";
  }
  return c.str();
}

std::string Run::ConfigToml() const {
  if (s_.Competing()) return CompetingToml();
  const std::string chat = o_.models_dir + "/demo-chat.gguf", embed = o_.models_dir + "/demo-embed.gguf";
  std::ostringstream c;
  c << "[[device]]\nname = \"" << o_.device << "\"\nheadroom_mib = " << (Simulated() ? 4 : 512) << "\n";
  c << "[[service]]\nname = \"chat\"\nmodel = \"" << chat << "\"\nmax_tokens = 512\n";
  if (target_ == Target::kPlainProxy) c << "[service.admission]\nenabled = false\nfail_fast = true\n";
  c << "[service.failover]\nbreaker_failures = 2\nejection_s = 1\nmax_ejection_s = 4\n";
  c << "[service.cpu_path]\nmax_queue = 6\nconcurrency = 2\nwait_comment_s = 0.5\nram_budget_mib = 768\n";
  if (profile_ == "cpu") {
    c << "[[service.placement]]\ndevice = \"cpu\"\nctx = 16384\nslots = 4\nthreads = 1\nbatch = 64\n";
  } else {
    c << "[[service.placement]]\ndevice = \"" << o_.device << "\"\ngpu_layers = " << (profile_ == "split" ? 2 : 99)
      << "\nctx = 2048\nslots = 4\nthreads = 1\nbatch = 64\nprogress_timeout_s = 0.5\n";
  }
  if (target_ == Target::kSpillway && profile_.empty()) {
    c << "[[service.placement]]\nrole = \"fallback\"\ndevice = \"cpu\"\nctx = 8192\nslots = 2\nthreads = 1\nbatch = 64\n";
  }
  c << "[[service]]\nname = \"embed\"\nmodel = \"" << embed << "\"\n"
    << "[[service.placement]]\ndevice = \"cpu\"\nctx = 512\nslots = 1\nthreads = 1\n";
  return c.str();
}

bool Run::StartServer(int timeout_ms) {
  std::lock_guard<std::mutex> lk(server_mu_);
  port_ = 0;
  const auto deadline = Steady::now() + std::chrono::milliseconds(timeout_ms);
  if (target_ == Target::kLlamaServer) {
    const uint16_t port = FreePort();
    std::map<std::string, std::string> env = env_;
    if (Simulated()) env["GGML_BACKEND_PATH"] = o_.bin_dir + "/libggml-sim.so";
    const std::string dev = Simulated() ? "SIM0" : "CUDA" + o_.device.substr(o_.device.find(':') + 1);
    if (!server_.Spawn({o_.llama_server, "-m", o_.models_dir + "/demo-chat.gguf", "-ngl", "99", "--device", dev,
                        "--host", "127.0.0.1", "--port", std::to_string(port), "-c", "4096", "-np", "4", "-t", "1",
                        "-b", "64", "--no-webui"},
                       dir_ + "/llama-server.log", env)) {
      return false;
    }
    while (Steady::now() < deadline && server_.Alive()) {
      auto r = http::Fetch("127.0.0.1", port, "GET", "/health", "", {}, std::chrono::seconds(1));
      if (r.ok() && r->status == 200) {
        port_ = port;
        return true;
      }
      SleepMs(50);
    }
    return false;
  }
  const std::string port_file = dir_ + "/port";
  fs::remove(port_file);
  if (!server_.Spawn({o_.bin_dir + "/spillway", "serve", "--config", dir_ + "/config.toml", "--state-dir", dir_ + "/state",
                      "--listen", "127.0.0.1:0", "--port-file", port_file},
                     dir_ + "/gateway.log", env_)) {
    return false;
  }
  while (Steady::now() < deadline && server_.Alive()) {
    std::ifstream f(port_file);
    int p = 0;
    if (f >> p && p > 0) {
      auto r = http::Fetch("127.0.0.1", static_cast<uint16_t>(p), "GET", "/readyz", "", {}, std::chrono::seconds(1));
      if (r.ok() && r->status == 200) {
        port_ = static_cast<uint16_t>(p);
        break;
      }
    }
    SleepMs(30);
  }
  if (!port_) return false;
  // Every admitted placement up, so that each run starts from the same state.
  while (Steady::now() < deadline) {
    json s = Status();
    bool all = s.is_object();
    if (all) {
      for (const auto& svc : s["services"]) {
        for (const auto& p : svc["placements"]) {
          all &= !p.value("admitted", true) || p.value("on_demand", false) || p.value("state", "") == "ready";
        }
      }
    }
    if (all) return true;
    SleepMs(30);
  }
  return false;
}

void Run::MeterStalls() {
  constexpr int64_t kTickMs = 10;
  while (!stop_monitor_) {
    const int64_t before = SinceStart();
    SleepMs(kTickMs);
    const int64_t after = SinceStart();
    if (after - before - kTickMs >= kStallMs) {
      std::lock_guard<std::mutex> lk(mu_);
      stalls_.push_back({before + kTickMs, after});
    }
  }
}

void Run::Monitor() {
  while (!stop_monitor_) {
    Sample s;
    s.t_ms = SinceStart();
    if (Simulated()) {
      if (auto l = devices::SimLedger::Open(0); l.ok()) {
        const auto snap = (*l)->Snapshot();
        s.device_used_bytes = snap.used;
        s.device_capacity_bytes = snap.capacity;
      }
    } else if (device_telemetry_) {
      if (auto d = device_telemetry_->Read(); d.ok()) {
        s.device_used_bytes = d->total - d->free;
        s.device_capacity_bytes = d->total;
      }
    }
    if (target_ == Target::kLlamaServer) {
      std::unique_lock<std::mutex> lk(server_mu_, std::try_to_lock);
      if (lk.owns_lock()) {
        const bool alive = server_.Alive();
        s.primary_state = alive && port_ ? "ready" : "down";
        s.primary_breaker = "closed";
        if (alive) s.rss_bytes["llama-server"] = RssOf(server_.pid());
      } else {
        s.primary_state = "down";
      }
    } else {
      json st = Status();
      if (st.is_object()) {
        try {
          const auto& chat = st["services"][0];
          const auto& p0 = chat["placements"][0];
          s.primary_state = p0.value("state", "");
          s.primary_breaker = p0.contains("breaker") ? p0["breaker"].value("state", "") : "";
          s.primary_pid = p0.value("pid", 0);
          if (Simulated() && s.primary_pid > 0) s.primary_faults_fired = WorkerFaultsFired(p0.value("port", 0));
          if (chat.contains("cpu_path")) {
            const auto& q = chat["cpu_path"];
            s.cpu_queue_waiting = q.value("waiting", 0);
            s.cpu_queue_running = q.value("running", 0);
            s.cpu_queue_oldest_ms = q.value("oldest_wait_ms", int64_t{0});
            // (Its peak too: one between two samples was missed, and passed the budget check.)
            s.cpu_path_ram_bytes = std::max(q.value("ram_resident_bytes", uint64_t{0}) + q.value("ram_running_bytes", uint64_t{0}),
                                            q.value("ram_peak_bytes", uint64_t{0}));
            s.cpu_path_budget_bytes = q.value("ram_budget_bytes", uint64_t{0});
          }
          for (const auto& svc : st["services"]) {
            for (const auto& p : svc["placements"]) {
              if (p.value("pid", 0) > 0) s.rss_bytes[p.value("key", "")] = RssOf(p.value("pid", 0));
            }
          }
          // What the CPU path's budget covers, measured: the chat service's CPU placements' workers.
          if (chat.contains("cpu_path")) {
            for (const auto& p : chat["placements"]) {
              if (p.value("device", "") == "cpu" && p.value("pid", 0) > 0) s.cpu_path_rss_bytes += s.rss_bytes[p.value("key", "")];
            }
          }
          if (s_.Competing()) PollCompeting(st, s);
        } catch (...) {
        }
      } else {
        s.primary_state = "gateway down";
      }
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      samples_.push_back(std::move(s));
    }
    // llama-server has no supervisor: restart it as systemd would (Restart=always, RestartSec=1).
    if (target_ == Target::kLlamaServer && !stop_monitor_) {
      bool dead = false;
      {
        std::lock_guard<std::mutex> lk(server_mu_);
        dead = !server_.Alive();
      }
      if (dead) {
        SleepMs(1000);
        StartServer(30000);
      }
    }
    SleepMs(200);
  }
}

void Run::ReadJournal(RequestRecord& r) {
  if (target_ == Target::kLlamaServer) return;
  auto res = http::Fetch("127.0.0.1", port_.load(), "GET", "/v1/requests/" + r.id, "", {}, std::chrono::seconds(5));
  // (No answer at all: the verdict cannot tell an unknown outcome from a lost one.)
  r.journal_unanswered = !res.ok() || res->status >= 500;
  if (!res.ok() || res->status != 200) return;
  json j = json::parse(res->body, nullptr, false);
  if (!j.is_object()) return;
  r.journal_state = j.value("state", "");
  r.journal_error = j.value("error", json()).is_string() ? j["error"].get<std::string>() : "";
  r.attempts = j.value("attempts", 0);
  if (!j.value("placement", std::string()).empty()) r.placement = j.value("placement", std::string());
  if (j.contains("admission") && j["admission"].is_object()) r.decision = j["admission"].value("decision", "");
  r.attempt_placements.clear();
  if (j.contains("attempt_log")) {
    for (const auto& a : j["attempt_log"]) {
      r.attempt_placements.push_back(a.value("placement", ""));
      if (a.value("placement", "") == "cpu" && r.cpu_start_ms < 0) r.cpu_start_ms = a.value("started_ms", int64_t{0}) - t0_wall_;
    }
  }
}

void Run::Settle() {
  // Back to normal: holds released, faults that were armed but never fired
  // disarmed, the accelerator placement serving again (a probe request closes
  // a half-open breaker), or 45 s (a worker restarted many times waits out
  // a backoff of up to 30 s).
  for (auto& h : holds_) h->Stop(1000);
  if (target_ != Target::kLlamaServer) {
    const json p = Placement(0, 0);
    if (p.is_object() && p.value("port", 0) > 0) {
      (void)http::Fetch("127.0.0.1", p.value("port", uint16_t{0}), "POST", std::string(protocol::kFaultsPath),
                        json{{"faults", {"clear"}}}.dump(), WorkerAuth(), std::chrono::seconds(2));
    }
  }
  const auto deadline = Steady::now() + std::chrono::seconds(45);
  const json probe = {{"model", "chat"}, {"prompt", "probe"}, {"max_tokens", 2}};
  while (Steady::now() < deadline) {
    if (target_ == Target::kLlamaServer) {
      auto h = http::Fetch("127.0.0.1", port_.load(), "GET", "/health", "", {}, std::chrono::seconds(1));
      if (h.ok() && h->status == 200) return;
    } else {
      json p = Placement(0, 0);
      const std::string state = p.is_object() ? p.value("state", "") : "";
      if (state == "ready" && p["breaker"].value("state", "") == "closed") return;
      // A half-open breaker closes on a probe; an on-demand primary (the swap-all baseline's) loads for one.
      if (state == "ready" || (state == "stopped" && p.value("on_demand", false))) {
        (void)http::Fetch("127.0.0.1", port_.load(), "POST", "/v1/completions", probe.dump(), {}, std::chrono::seconds(10));
      }
    }
    SleepMs(200);
  }
}

void Run::CompareWithReference(std::vector<RequestRecord>& records) {
  // At most kMaxCompared of them: those a failover moved first, the rest
  // spread evenly over the run (the first 40 all came before most faults).
  constexpr size_t kMaxCompared = 40;
  std::vector<RequestRecord*> eligible;
  for (auto& r : records) {
    if (!r.deterministic || r.journal_state != "completed" || !r.first_error.empty() || r.cancelled_by_client) continue;
    eligible.push_back(&r);
  }
  // Those that moved (a retry, a continuation, served off the primary)
  // first: what a failover changed is what the comparison is for, and an
  // even spread over a long run missed the few around its faults.
  const std::string primary = PrimaryName();
  const auto rest_begin = std::stable_partition(eligible.begin(), eligible.end(), [&](const RequestRecord* r) {
    return r->attempts > 1 || (!r->placement.empty() && r->placement != primary);
  });
  const size_t moved = static_cast<size_t>(rest_begin - eligible.begin());
  std::vector<RequestRecord*> chosen(eligible.begin(), eligible.begin() + std::min(moved, kMaxCompared));
  const size_t rest = eligible.size() - moved, n = std::min(kMaxCompared - chosen.size(), rest);
  for (size_t k = 0; k < n; ++k) chosen.push_back(eligible[moved + k * rest / n]);
  for (RequestRecord* rp : chosen) {
    RequestRecord& r = *rp;
    PlannedRequest p;
    p.id = r.id;
    p.kind = r.kind;
    p.stream = false;
    // The planned request again: its body is a function of the plan only.
    for (const auto& q : plan_cache_) {
      if (q.id == r.id) p = q;
    }
    p.stream = false;
    json body = BodyFor(p);
    const std::string path = p.kind == "completion" ? "/v1/completions" : "/v1/chat/completions";
    auto res = http::Fetch("127.0.0.1", port_.load(), "POST", path, body.dump(), {{"X-Request-Id", r.id + "-ref"}},
                           std::chrono::seconds(60));
    // (Said, not skipped: a comparison that did not happen proved nothing.)
    if (!res.ok() || res->status != 200) {
      r.reference_error = res.ok() ? "HTTP " + std::to_string(res->status) + ": " + res->body.substr(0, 200)
                                   : res.status().message();
      continue;
    }
    // (Read without assuming its shape: a reference of another shape is said, it does not end the run.)
    const json j = json::parse(res->body, nullptr, false);
    const json* choices = j.is_object() && j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()
                              ? &j["choices"][0]
                              : nullptr;
    if (!choices || !choices->is_object()) {
      r.reference_error = "an answer without choices: " + res->body.substr(0, 200);
      continue;
    }
    const json& c = *choices;
    std::optional<std::string> ref;
    if (c.contains("text") && c["text"].is_string()) {
      ref = c["text"].get<std::string>();
    } else if (c.contains("message") && c["message"].is_object()) {
      const json& m = c["message"];
      ref = m.contains("content") && m["content"].is_string() ? m["content"].get<std::string>() : "";
    }
    if (ref) r.equivalent = *ref == r.output;
    else r.reference_error = "an answer without text: " + res->body.substr(0, 200);
  }
}

std::map<std::string, uint64_t> Run::ServiceDeviceBytes(const json& st) const {
  std::map<std::string, uint64_t> out;
  for (const auto& d : st.value("devices", json::array())) {
    if (d.value("name", "") != o_.device) continue;
    for (const auto& u : d.value("services", json::array())) out[u.value("service", "")] += u.value("held_bytes", uint64_t{0});
    uint64_t others = 0;
    for (const auto& o : d.value("other_processes", json::array())) others += o.value("bytes", uint64_t{0});
    if (others) out["other processes"] = others;
  }
  return out;
}

void Run::PollCompeting(const json& st, Sample& s) {
  try {
    s.service_device_bytes = ServiceDeviceBytes(st);
    const json events = st.value("residency", json::object()).value("events", json::array());
    std::lock_guard<std::mutex> lk(mu_);
    // Newest first there: taken oldest first, each once.
    for (auto it = events.rbegin(); it != events.rend(); ++it) {
      ResidencyEvent ev;
      ev.at_ms = it->value("at_ms", int64_t{0}) - t0_wall_;
      ev.kind = it->value("kind", "");
      ev.service = it->value("service", "");
      ev.key = it->value("key", "");
      ev.reason = it->value("reason", "");
      ev.for_service = it->value("for", "");
      if (ev.at_ms < 0) continue;  // while the run was being set up
      const bool seen = std::any_of(events_.begin(), events_.end(), [&](const ResidencyEvent& e) {
        return e.at_ms == ev.at_ms && e.kind == ev.kind && e.key == ev.key;
      });
      if (!seen) events_.push_back(ev);
    }
    std::stable_sort(events_.begin(), events_.end(),
                     [](const ResidencyEvent& a, const ResidencyEvent& b) { return a.at_ms < b.at_ms; });
  } catch (const std::exception&) {  // a status of a shape not expected: this sample goes without
  }
}

bool Run::SizeDeviceForCompetition(std::string* why) {
  // What a service's processes hold on the device now.
  auto held = [&](const std::string& service) {
    try {
      return ServiceDeviceBytes(Status())[service];
    } catch (const std::exception&) {  // a status of a shape not expected: not seen
      return uint64_t{0};
    }
  };
  auto call = [&](const std::string& path, const json& body) {
    auto r = http::Fetch("127.0.0.1", port_.load(), "POST", path, body.dump(), {}, std::chrono::seconds(60));
    return r.ok() && r->status == 200;
  };
  // Each loaded once (the swap-all baseline loads one at a time): chat, then embed.
  if (!call("/v1/completions", {{"model", "chat"}, {"prompt", "warm up"}, {"max_tokens", 2}})) {
    *why = "chat did not answer its first request";
    return false;
  }
  const uint64_t chat = held("chat");
  if (!call("/v1/embeddings", {{"model", "embed"}, {"input", "warm up"}})) {
    *why = "embed did not answer its first request";
    return false;
  }
  const uint64_t embed = held("embed");
  auto ledger = devices::SimLedger::Open(0);
  if (!chat || !embed || !ledger.ok()) {
    *why = "could not see what chat and embed hold on the simulated device";
    return false;
  }
  // Room for chat and one of embed and search (the same model and shape) with half of another to spare: never
  // all three. The simulated device shrinks to that, its entries kept (what is loaded now fits).
  const uint64_t usable = chat + embed + embed / 2, headroom = 4ull << 20;
  if (auto st = devices::SimLedger::Create(0, usable + headroom); !st.ok()) {
    *why = "cannot resize the simulated device: " + st.status().message();
    return false;
  }
  Log("competing_services: chat holds " + std::to_string(chat >> 20) + " MiB, embed and search " +
      std::to_string(embed >> 20) + " MiB each; the device has " + std::to_string((usable + headroom) >> 20) + " MiB");
  return true;
}

namespace {

// Recovery of each fault: from the fault to the first sample, after the
// accelerator placement was seen out of service, where it is ready with its
// breaker closed again (no visible disruption: recovered at once).
void Recoveries(std::vector<FaultEvent>& faults, const std::vector<Sample>& samples) {
  auto good = [](const Sample& s) { return s.primary_state == "ready" && s.primary_breaker == "closed"; };
  for (size_t i = 0; i < faults.size(); ++i) {
    auto& f = faults[i];
    const int64_t next = i + 1 < faults.size() ? faults[i + 1].at_ms : INT64_MAX;
    bool bad = false;
    for (const auto& s : samples) {
      if (s.t_ms < f.at_ms) continue;
      if (!good(s)) {
        bad = true;
      } else if (bad) {
        f.recovered_ms = s.t_ms;
        break;
      } else if (s.t_ms >= next) {
        break;
      }
    }
    if (!bad) f.recovered_ms = f.at_ms;
  }
}

}  // namespace

ScenarioResult Run::Go() {
  ScenarioResult out;
  out.name = profile_.empty() ? s_.name : profile_;
  out.description = s_.description;
  out.target = profile_.empty() ? TargetName(target_) : profile_;
  out.seed = o_.seed;
  if (target_ == Target::kLlamaServer) {
    std::error_code ec;
    if (o_.llama_server.empty() || !fs::exists(o_.llama_server, ec)) {
      out.skipped_reason = "no llama-server binary (pass --llama-server PATH)";
      return out;
    }
    if (!s_.llama_server_can_run) {
      out.skipped_reason = "llama-server cannot receive this scenario's faults (they are armed through spillway-worker's routes)";
      return out;
    }
  }
  if (s_.Competing() && (target_ == Target::kPlainProxy || target_ == Target::kLlamaServer)) {
    out.skipped_reason = "one model per process and no residency: the swap-all baseline stands for it here";
    return out;
  }
  if (target_ == Target::kSwapAll && !s_.Competing()) {
    out.skipped_reason = "the swap-all baseline runs competing_services only";
    return out;
  }
  if (s_.Competing() && !Simulated()) {
    out.skipped_reason = "sizes the device with a hold on the simulated one (sim:0 only)";
    out.verdict.failures.push_back(out.skipped_reason);
    return out;
  }
  const uint64_t capacity_mib = s_.Competing() ? 1024 : o_.sim_capacity_mib;
  if (!Simulated()) {
    // A real device: only faults that reach it from outside.
    for (const auto& k : s_.fault_kinds) {
      if (k != "kill-gpu-worker" && k != "kill-gateway" && k != "lose-at-token") {
        out.skipped_reason = "needs the simulated device's fault injection (" + k + "); on " + o_.device +
                             " only kill -9 of the GPU worker and of the gateway are injected";
        out.verdict.failures.push_back(out.skipped_reason);
        return out;
      }
    }
    auto t = devices::OpenDeviceTelemetry(o_.device);
    if (t.ok()) device_telemetry_ = std::move(*t);
  } else if (::spillway::Status st = devices::SimLedger::Create(0, capacity_mib << 20).status(); !st.ok()) {
    out.skipped_reason = "cannot create the simulated device: " + st.message();
    out.verdict.failures.push_back(out.skipped_reason);
    return out;
  }
  if (target_ != Target::kLlamaServer) std::ofstream(dir_ + "/config.toml") << ConfigToml();
  if (!StartServer()) {
    out.verdict.failures.push_back(Log("the " + out.target + " did not start; see " + dir_));
    return out;
  }
  if (std::string why; s_.Competing() && !SizeDeviceForCompetition(&why)) {
    out.verdict.failures.push_back(Log(out.target + " / " + out.name + ": " + why + "; see " + dir_));
    server_.Stop();
    return out;
  }
  const Schedule sched = MakeSchedule(s_, o_.seed, duration_ms_, profile_.empty() ? o_.faults : 0);
  for (const auto& r : sched.requests) {
    if (target_ == Target::kLlamaServer && (r.kind == "embedding" || r.kind == "agent")) continue;  // no such service there
    plan_cache_.push_back(r);
  }
  Log(out.target + " / " + out.name + ": " + std::to_string(plan_cache_.size()) + " requests, " +
      std::to_string(sched.faults.size()) + " faults");
  t0_ = Steady::now();
  t0_wall_ = WallMs();
  std::thread monitor([this] { Monitor(); });
  std::thread stall_meter([this] { MeterStalls(); });
  // Stopped and joined however this ends: an exception below (an answer of
  // an unexpected shape in CompareWithReference) with these two joinable was
  // std::terminate, not the chaos command's error message.
  struct StopMeters {
    Run* run;
    std::thread& monitor;
    std::thread& stall_meter;
    ~StopMeters() {
      run->stop_monitor_ = true;
      if (monitor.joinable()) monitor.join();
      if (stall_meter.joinable()) stall_meter.join();
    }
  } stop_meters{this, monitor, stall_meter};
  std::vector<RequestRecord> records(plan_cache_.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < s_.clients; ++c) {
    clients.emplace_back([&] {
      while (true) {
        const size_t i = next++;
        if (i >= plan_cache_.size()) return;
        const int64_t wait = plan_cache_[i].at_ms - SinceStart();
        if (wait > 0) SleepMs(wait);
        try {
          records[i] = Send(plan_cache_[i]);
        } catch (const std::exception& e) {  // an answer of a shape the harness did not expect: recorded, not fatal
          records[i].id = plan_cache_[i].id;
          records[i].scenario = s_.name;
          records[i].service = ServiceOf(plan_cache_[i].kind);
          records[i].kind = plan_cache_[i].kind;
          records[i].first_error = std::string("harness: ") + e.what();
          records[i].unreadable = true;
        }
      }
    });
  }
  // competing_services: the batch backlog, worked through by its own clients (closed loop) in each pressure slice.
  std::vector<RequestRecord> batch_records;
  std::atomic<int> batch_next{0};
  const std::vector<Window> pressure = PressureWindows(s_, duration_ms_);
  for (int c = 0; c < s_.batch_clients; ++c) {
    clients.emplace_back([&] {
      for (const Window& w : pressure) {
        if (SinceStart() < w.from_ms) SleepMs(w.from_ms - SinceStart());
        while (SinceStart() < w.to_ms) {
          const PlannedRequest p = BatchRequest(s_, o_.seed, batch_next++);
          RequestRecord r;
          try {
            r = Send(p);
          } catch (const std::exception& e) {
            r.id = p.id;
            r.scenario = s_.name;
            r.service = ServiceOf(p.kind);
            r.kind = p.kind;
            r.first_error = std::string("harness: ") + e.what();
          }
          {
            std::lock_guard<std::mutex> lk(mu_);
            batch_records.push_back(std::move(r));
          }
          SleepMs(s_.batch_think_ms);
        }
      }
    });
  }
  std::vector<FaultEvent> faults;
  std::thread injector([&] {
    for (const auto& f : sched.faults) {
      const int64_t wait = f.at_ms - SinceStart();
      if (wait > 0) SleepMs(wait);
      FaultEvent ev;
      ev.at_ms = SinceStart();
      try {
        Inject(f.kind, &ev);
      } catch (const std::exception& e) {
        ev.kind = f.kind + " (harness error: " + e.what() + ")";
        ev.injected = false;
      }
      std::lock_guard<std::mutex> lk(mu_);
      faults.push_back(ev);
    }
  });
  injector.join();
  for (auto& t : clients) t.join();
  for (auto& r : batch_records) records.push_back(std::move(r));
  out.duration_ms = std::max<int64_t>(SinceStart(), duration_ms_);
  Settle();
  // An accepted request (acknowledged, or journaled) may still be finishing:
  // give it time to reach a terminal state.
  const auto deadline = Steady::now() + std::chrono::seconds(15);
  for (auto& r : records) {
    ReadJournal(r);
    while (target_ != Target::kLlamaServer && (r.acknowledged || !r.journal_state.empty()) &&
           !IsTerminalState(r.journal_state) && Steady::now() < deadline) {
      SleepMs(100);
      ReadJournal(r);
    }
  }
  // Asked once more, the system settled: a row the journal had not synced
  // answers 404 until a later query (gateway_status.cpp), and one the
  // gateway did not answer, down meanwhile, is read now that it is up.
  for (auto& r : records) {
    if (target_ != Target::kLlamaServer && r.journal_state.empty()) ReadJournal(r);
  }
  CompareWithReference(records);
  Settle();
  SleepMs(300);  // one more sample of the settled system
  stop_monitor_ = true;
  monitor.join();
  stall_meter.join();
  out.requests = std::move(records);
  out.faults = std::move(faults);
  out.samples = samples_;
  out.events = events_;
  out.stalls = stalls_;
  Recoveries(out.faults, out.samples);
  MarkFired(out.faults, out.samples);
  VerdictOptions vo;
  vo.primary_placement = PrimaryName();
  vo.journal = target_ != Target::kLlamaServer;
  if (s_.Competing()) {
    vo.pressure_ms = pressure;
    if (target_ == Target::kSpillway) vo.pinned_service = "chat";
  }
  out.verdict = Judge(out, vo);
  if (s_.name == "routing_before_admission" && target_ == Target::kSpillway) {
    // Routed before admission: nothing tried the accelerator and failed first.
    for (const auto& r : out.requests) {
      // (One that failed there and was not moved fails by the general rule: failed after it started.)
      if (r.attempts > 1) out.verdict.failures.push_back("routed only after a failed attempt: " + r.id);
    }
    out.verdict.passed = out.verdict.failures.empty();
  }
  server_.Stop();
  for (auto& h : holds_) h->Stop(1000);
  return out;
}


ScenarioResult RunScenario(const Scenario& s, Target target, const HarnessOptions& opts) {
  Run run(s, target, opts);
  return run.Go();
}

ScenarioResult RunProfile(const std::string& profile, const HarnessOptions& opts) {
  static const Scenario traffic{"profile", "the same fault-free traffic on one placement", 3, 4, 0.5, 0, 0, 0, 0, 16, 48, {}, false};
  Run run(traffic, Target::kSpillway, opts, profile);
  return run.Go();
}

}  // namespace spillway::chaos
