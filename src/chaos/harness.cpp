#include "chaos/harness.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

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

namespace spillway::chaos {

namespace fs = std::filesystem;
using nlohmann::json;
using Steady = std::chrono::steady_clock;

const char* TargetName(Target t) {
  switch (t) {
    case Target::kSpillway: return "spillway";
    case Target::kPlainProxy: return "plain-proxy";
    case Target::kLlamaServer: return "llama-server";
  }
  return "?";
}

namespace {

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
class Run {
 public:
  Run(const Scenario& s, Target t, const HarnessOptions& o, std::string profile = "")
      : s_(s), target_(t), o_(o), profile_(std::move(profile)) {
    dir_ = o.work_dir + "/" + (profile_.empty() ? std::string(TargetName(t)) + "-" + s.name : "profile-" + profile_);
    fs::remove_all(dir_);
    fs::create_directories(dir_ + "/sim");
    env_ = {{"SPILLWAY_SIM_DIR", dir_ + "/sim"}};
    setenv("SPILLWAY_SIM_DIR", (dir_ + "/sim").c_str(), 1);  // this process reads the same device
  }
  ~Run() {
    for (auto& h : holds_) h->Stop(1000);
    server_.Stop();
    unsetenv("SPILLWAY_SIM_DIR");
  }

  ScenarioResult Go();

 private:
  std::string Log(const std::string& line) {
    if (o_.log) o_.log(line);
    return line;
  }
  std::string PrimaryName() const {
    if (profile_ == "cpu") return "cpu";
    return profile_ == "split" ? "sim:0/2" : "sim:0/99";
  }
  std::string ConfigToml() const;
  bool StartServer(int timeout_ms = 60000);
  json Status() const {
    auto r = http::Fetch("127.0.0.1", port_.load(), "GET", "/v1/status", "", {}, std::chrono::seconds(3));
    if (!r.ok() || r->status != 200) return json();
    return json::parse(r->body, nullptr, false);
  }
  json Placement(size_t service, size_t i) const {
    json s = Status();
    if (!s.is_object()) return json();
    try {
      return s["services"][service]["placements"][i];
    } catch (...) {
      return json();
    }
  }
  void Monitor();
  void Inject(const std::string& kind, FaultEvent* ev);
  RequestRecord Send(const PlannedRequest& p);
  json BodyFor(const PlannedRequest& p) const;
  void Settle();
  void ReadJournal(RequestRecord& r);
  void CompareWithReference(std::vector<RequestRecord>& records);
  void Hold(uint64_t mib, double seconds);
  int64_t SinceStart() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Steady::now() - t0_).count();
  }

  const Scenario& s_;
  const Target target_;
  const HarnessOptions& o_;
  const std::string profile_;
  std::string dir_;
  std::map<std::string, std::string> env_;
  Child server_;
  std::mutex server_mu_;            // restarts of the server
  std::atomic<uint16_t> port_{0};
  std::atomic<bool> stop_monitor_{false};
  std::vector<std::unique_ptr<Child>> holds_;
  std::mutex mu_;
  std::vector<Sample> samples_;
  std::vector<PlannedRequest> plan_cache_;
  Steady::time_point t0_ = Steady::now();
  int64_t t0_wall_ = WallMs();
};

std::string Run::ConfigToml() const {
  const std::string chat = o_.models_dir + "/demo-chat.gguf", embed = o_.models_dir + "/demo-embed.gguf";
  std::ostringstream c;
  c << "[[device]]\nname = \"sim:0\"\nheadroom_mib = 4\n";
  c << "[[service]]\nname = \"chat\"\nmodel = \"" << chat << "\"\nmax_tokens = 512\n";
  if (target_ == Target::kPlainProxy) c << "[service.admission]\nenabled = false\nfail_fast = true\n";
  c << "[service.failover]\nbreaker_failures = 2\nejection_s = 1\nmax_ejection_s = 4\n";
  c << "[service.cpu_path]\nmax_queue = 6\nconcurrency = 2\nwait_comment_s = 0.5\nram_budget_mib = 768\n";
  if (profile_ == "cpu") {
    c << "[[service.placement]]\ndevice = \"cpu\"\nctx = 8192\nslots = 4\nthreads = 1\nbatch = 64\n";
  } else {
    c << "[[service.placement]]\ndevice = \"sim:0\"\ngpu_layers = " << (profile_ == "split" ? 2 : 99)
      << "\nctx = 1024\nslots = 4\nthreads = 1\nbatch = 64\nprogress_timeout_s = 0.5\n";
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
    env["GGML_BACKEND_PATH"] = o_.bin_dir + "/libggml-sim.so";
    if (!server_.Spawn({o_.llama_server, "-m", o_.models_dir + "/demo-chat.gguf", "-ngl", "99", "--device", "SIM0",
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
        for (const auto& p : svc["placements"]) all &= !p.value("admitted", true) || p.value("state", "") == "ready";
      }
    }
    if (all) return true;
    SleepMs(30);
  }
  return false;
}

void Run::Hold(uint64_t mib, double seconds) {
  if (mib == 0) return;
  auto h = std::make_unique<Child>();
  std::ostringstream secs;
  secs << seconds;
  if (h->Spawn({o_.bin_dir + "/spillway", "sim", "hold", "sim:0", "--mib", std::to_string(mib), "--seconds", secs.str()},
               dir_ + "/holds.log", env_)) {
    holds_.push_back(std::move(h));
  }
  SleepMs(100);  // the hold is in the ledger
}

void Run::Inject(const std::string& kind, FaultEvent* ev) {
  ev->kind = kind;
  std::mt19937_64 rng(o_.seed ^ static_cast<uint64_t>(ev->at_ms));
  auto free_mib = [&]() -> uint64_t {
    auto l = devices::SimLedger::Open(0);
    return l.ok() ? (*l)->Snapshot().free() >> 20 : 0;
  };
  if (kind == "kill-gateway") {
    if (target_ == Target::kLlamaServer) {
      server_.Kill9();
    } else {
      server_.Kill9();
      SleepMs(200);
      if (!StartServer()) ev->kind += " (restart failed)";
    }
    return;
  }
  if (target_ == Target::kLlamaServer) {
    // llama-server has no fault routes: only what happens to it from outside.
    if (kind == "kill-gpu-worker" || kind == "lose-at-token") {
      ev->kind = "kill -9 llama-server";
      server_.Kill9();
    } else if (kind == "sim-hold") {
      const uint64_t mib = free_mib() > 4 ? free_mib() - 4 : 0;
      Hold(mib, 2.5);
      server_.Kill9();
      ev->kind = "sim hold " + std::to_string(mib) + " MiB + kill -9";
    }
    return;
  }
  json gpu = Placement(0, 0);
  for (int i = 0; i < 100 && gpu.value("state", "") != "ready"; ++i) {
    SleepMs(20);
    gpu = Placement(0, 0);
  }
  const uint16_t gpu_port = gpu.is_object() ? gpu.value("port", 0) : 0;
  const int gpu_pid = gpu.is_object() ? gpu.value("pid", 0) : 0;
  auto arm = [&](const std::string& spec) {
    auto r = http::Fetch("127.0.0.1", gpu_port, "POST", "/v1/worker/faults", json{{"faults", {spec}}}.dump(), {},
                         std::chrono::seconds(2));
    if (!r.ok() || r->status != 200) ev->kind += " (not armed: the GPU worker was not ready)";
  };
  auto kill_gpu = [&] {
    if (gpu_pid > 0) kill(gpu_pid, SIGKILL);
    else ev->kind += " (no GPU worker to kill)";
  };
  if (kind == "compute-error" || kind.rfind("fail-next=", 0) == 0) {
    arm(kind);
  } else if (kind == "hang") {
    arm("hang=3");
  } else if (kind == "lose-at-token") {
    const int k = 2 + static_cast<int>(rng() % 10);
    ev->kind = "lose-at-token=" + std::to_string(k);
    arm(ev->kind);
  } else if (kind == "lose-after-tool-call") {
    const int k = 20 + static_cast<int>(rng() % 40);
    ev->kind = "lose-at-token=" + std::to_string(k) + " (agent traffic)";
    arm("lose-at-token=" + std::to_string(k));
  } else if (kind == "kill-gpu-worker") {
    ev->kind = "kill -9 GPU worker";
    kill_gpu();
  } else if (kind == "sim-hold") {
    // Another program takes the free memory; the GPU worker crashes and may
    // not come back until the memory is released.
    const uint64_t mib = free_mib() > 4 ? free_mib() - 4 : 0;
    Hold(mib, 2.5);
    kill_gpu();
    ev->kind = "sim hold " + std::to_string(mib) + " MiB for 2.5 s + kill -9 GPU worker";
  } else if (kind == "memory-step") {
    // A quarter of what is free goes, until the end of the fault window.
    const uint64_t mib = free_mib() / 4;
    const double left_s = std::max(1.0, (o_.duration_ms * 0.8 - static_cast<double>(SinceStart())) / 1000.0);
    Hold(mib, left_s);
    kill_gpu();
    ev->kind = "memory step: hold " + std::to_string(mib) + " MiB + kill -9 GPU worker";
  } else if (kind == "gpu-out") {
    const uint64_t mib = free_mib() > 4 ? free_mib() - 4 : 0;
    Hold(mib, 3.0);
    kill_gpu();
    ev->kind = "accelerator out for 3 s (hold " + std::to_string(mib) + " MiB + kill -9 GPU worker)";
  } else {
    ev->kind = kind + " (unknown fault kind)";
  }
}

void Run::Monitor() {
  while (!stop_monitor_) {
    Sample s;
    s.t_ms = SinceStart();
    if (auto l = devices::SimLedger::Open(0); l.ok()) {
      const auto snap = (*l)->Snapshot();
      s.device_used_bytes = snap.used;
      s.device_capacity_bytes = snap.capacity;
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
          if (chat.contains("cpu_path")) {
            const auto& q = chat["cpu_path"];
            s.cpu_queue_waiting = q.value("waiting", 0);
            s.cpu_queue_running = q.value("running", 0);
            s.cpu_queue_oldest_ms = q.value("oldest_wait_ms", int64_t{0});
            s.cpu_path_ram_bytes = q.value("ram_resident_bytes", uint64_t{0}) + q.value("ram_running_bytes", uint64_t{0});
            s.cpu_path_budget_bytes = q.value("ram_budget_bytes", uint64_t{0});
          }
          for (const auto& svc : st["services"]) {
            for (const auto& p : svc["placements"]) {
              if (p.value("pid", 0) > 0) s.rss_bytes[p.value("key", "")] = RssOf(p.value("pid", 0));
            }
          }
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

json Run::BodyFor(const PlannedRequest& p) const {
  const std::string text = PromptText(p.seed ^ std::hash<std::string>{}(p.id), p.prompt_words);
  if (p.kind == "embedding") return {{"model", "embed"}, {"input", text}};
  json b = {{"model", "chat"}, {"max_tokens", p.max_tokens}, {"seed", p.seed}, {"temperature", 0.8}, {"stream", p.stream}};
  if (p.kind == "completion") {
    b["prompt"] = text;
  } else {
    b["messages"] = json::array({{{"role", "user"}, {"content", text}}});
  }
  if (p.kind == "agent") {
    b["tools"] = json::array({{{"type", "function"},
                               {"function", {{"name", "increment"},
                                             {"description", "adds one to the harness's counter"},
                                             {"parameters", {{"type", "object"}, {"properties", json::object()}}}}}}});
    b["tool_choice"] = "required";
  }
  return b;
}

RequestRecord Run::Send(const PlannedRequest& p) {
  RequestRecord r;
  r.id = p.id;
  r.scenario = s_.name;
  r.service = p.kind == "embedding" ? "embed" : "chat";
  r.kind = p.kind;
  r.stream = p.stream;
  r.deterministic = p.kind == "completion" || p.kind == "chat";
  r.sent_ms = SinceStart();
  const json body = BodyFor(p);
  const std::string path = p.kind == "embedding" ? "/v1/embeddings"
                           : p.kind == "completion" ? "/v1/completions"
                                                    : "/v1/chat/completions";
  const uint16_t port = port_.load();
  const auto t0 = Steady::now();
  auto ms_since = [&] { return std::chrono::duration_cast<std::chrono::milliseconds>(Steady::now() - t0).count(); };
  std::thread canceller;
  std::atomic<bool> finished{false};
  if (p.cancel_after_ms >= 0 && target_ != Target::kLlamaServer) {
    canceller = std::thread([&, port] {
      for (int64_t waited = 0; waited < p.cancel_after_ms && !finished; waited += 10) SleepMs(10);
      if (finished) return;
      auto d = http::Fetch("127.0.0.1", port, "DELETE", "/v1/requests/" + p.id, "", {}, std::chrono::seconds(5));
      if (d.ok() && d->status == 200) r.cancelled_by_client = true;
    });
  }
  int tools = 0;
  auto run_tools = [&](const json& calls) {
    for (const auto& c : calls) {
      if (c.contains("function") && c["function"].value("name", "") == "increment") ++tools;
    }
  };
  const http::HeaderList headers = {{"X-Request-Id", p.id}};
  if (!p.stream) {
    auto res = http::Fetch("127.0.0.1", port, "POST", path, body.dump(), headers, std::chrono::seconds(120));
    r.latency_ms = ms_since();
    if (!res.ok()) {
      r.first_error = res.status().message();
    } else {
      r.http_status = res->status;
      r.acknowledged = !res->Header("x-request-id").empty() || target_ == Target::kLlamaServer;
      r.placement = res->Header("x-spillway-placement");
      r.degraded_signal = !res->Header("x-spillway-degraded").empty() || !res->Header("x-spillway-fallback-model").empty();
      json j = json::parse(res->body, nullptr, false);
      r.connection_survived = !j.is_discarded();
      if (res->status != 200) {
        r.first_error = j.is_object() && j.contains("error") ? j["error"].value("message", res->body) : res->body;
      } else if (j.is_object() && j.contains("choices") && !j["choices"].empty()) {
        const auto& c = j["choices"][0];
        if (c.contains("text")) r.output = c.value("text", "");
        if (c.contains("message")) {
          const auto& m = c["message"];
          if (m.contains("content") && m["content"].is_string()) r.output = m["content"];
          if (m.contains("tool_calls") && m["tool_calls"].is_array()) {
            run_tools(m["tool_calls"]);
            r.output += m["tool_calls"].dump();
          }
        }
      } else if (j.is_object() && j.contains("data")) {
        r.output = "embedding[" + std::to_string(j["data"][0]["embedding"].size()) + "]";
      }
    }
  } else {
    std::string pending;
    bool done = false;
    auto st = http::StreamFetch(
        "127.0.0.1", port, "POST", path, body.dump(), headers,
        [&](const http::StreamHead& h) {
          r.http_status = h.status;
          auto id = h.headers.find("x-request-id");
          r.acknowledged = (id != h.headers.end() && !id->second.empty()) || (target_ == Target::kLlamaServer && h.status == 200);
          if (auto pl = h.headers.find("x-spillway-placement"); pl != h.headers.end()) r.placement = pl->second;
          r.degraded_signal |= h.headers.count("x-spillway-degraded") > 0 || h.headers.count("x-spillway-fallback-model") > 0;
          return true;
        },
        [&](std::string_view data) {
          pending.append(data);
          size_t pos;
          while ((pos = pending.find("\n\n")) != std::string::npos) {
            const std::string ev = pending.substr(0, pos);
            pending.erase(0, pos + 2);
            if (r.http_status != 200) {
              r.first_error += ev;
              continue;
            }
            if (ev.rfind(":", 0) == 0) {
              if (ev.find("spillway") != std::string::npos) r.degraded_signal = true;
              continue;
            }
            if (ev.rfind("data: ", 0) != 0) continue;
            const std::string payload = ev.substr(6);
            if (payload == "[DONE]") {
              done = true;
              continue;
            }
            json j = json::parse(payload, nullptr, false);
            if (!j.is_object()) continue;
            if (j.contains("error") && r.first_error.empty()) {
              r.first_error = j["error"].is_object() ? j["error"].value("message", payload) : payload;
            }
            if (j.contains("choices") && !j["choices"].empty()) {
              const auto& c = j["choices"][0];
              std::string piece;
              if (c.contains("text") && c["text"].is_string()) piece = c["text"];
              if (c.contains("delta")) {
                const auto& d = c["delta"];
                if (d.contains("content") && d["content"].is_string()) piece = d["content"];
                if (d.contains("tool_calls") && d["tool_calls"].is_array()) {
                  run_tools(d["tool_calls"]);
                  r.output += d["tool_calls"].dump();
                  if (r.ttft_ms < 0) r.ttft_ms = ms_since();
                }
              }
              if (!piece.empty() && r.ttft_ms < 0) r.ttft_ms = ms_since();
              r.output += piece;
            }
          }
          return true;
        },
        std::chrono::seconds(120));
    r.latency_ms = ms_since();
    r.connection_survived = st.ok() && done;
    if (!st.ok() && r.first_error.empty()) r.first_error = st.message();
    if (!done && r.first_error.empty() && r.http_status == 200) r.first_error = "the stream ended without [DONE]";
    if (r.http_status != 200 && r.http_status != 0) {
      json j = json::parse(r.first_error, nullptr, false);
      if (j.is_object() && j.contains("error")) r.first_error = j["error"].value("message", r.first_error);
    }
  }
  finished = true;
  if (canceller.joinable()) canceller.join();
  r.tool_executions = tools;
  return r;
}

void Run::ReadJournal(RequestRecord& r) {
  if (target_ == Target::kLlamaServer) return;
  auto res = http::Fetch("127.0.0.1", port_.load(), "GET", "/v1/requests/" + r.id, "", {}, std::chrono::seconds(5));
  if (!res.ok() || res->status != 200) return;
  json j = json::parse(res->body, nullptr, false);
  if (!j.is_object()) return;
  r.journal_state = j.value("state", "");
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
      (void)http::Fetch("127.0.0.1", p.value("port", uint16_t{0}), "POST", "/v1/worker/faults",
                        json{{"faults", {"clear"}}}.dump(), {}, std::chrono::seconds(2));
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
      if (p.is_object() && p.value("state", "") == "ready") {
        if (p["breaker"].value("state", "") == "closed") return;
        (void)http::Fetch("127.0.0.1", port_.load(), "POST", "/v1/completions", probe.dump(), {}, std::chrono::seconds(10));
      }
    }
    SleepMs(200);
  }
}

void Run::CompareWithReference(std::vector<RequestRecord>& records) {
  int compared = 0;
  for (auto& r : records) {
    if (!r.deterministic || r.journal_state != "completed" || !r.first_error.empty() || r.cancelled_by_client) continue;
    if (compared++ >= 40) break;
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
    if (!res.ok() || res->status != 200) continue;
    json j = json::parse(res->body, nullptr, false);
    if (!j.is_object() || !j.contains("choices")) continue;
    const auto& c = j["choices"][0];
    const std::string ref = c.contains("text") ? c.value("text", "")
                                               : (c["message"]["content"].is_string() ? c["message"]["content"].get<std::string>() : "");
    r.equivalent = ref == r.output;
  }
}

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
  if (::spillway::Status st = devices::SimLedger::Create(0, o_.sim_capacity_mib << 20).status(); !st.ok()) {
    out.skipped_reason = "cannot create the simulated device: " + st.message();
    out.verdict.failures.push_back(out.skipped_reason);
    return out;
  }
  if (target_ != Target::kLlamaServer) std::ofstream(dir_ + "/config.toml") << ConfigToml();
  if (!StartServer()) {
    out.verdict.failures.push_back(Log("the " + out.target + " did not start; see " + dir_));
    return out;
  }
  const Schedule sched = MakeSchedule(s_, o_.seed, o_.duration_ms, profile_.empty() ? o_.faults : 0);
  for (const auto& r : sched.requests) {
    if (target_ == Target::kLlamaServer && (r.kind == "embedding" || r.kind == "agent")) continue;  // no such service there
    plan_cache_.push_back(r);
  }
  Log(out.target + " / " + out.name + ": " + std::to_string(plan_cache_.size()) + " requests, " +
      std::to_string(sched.faults.size()) + " faults");
  t0_ = Steady::now();
  t0_wall_ = WallMs();
  std::thread monitor([this] { Monitor(); });
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
        records[i] = Send(plan_cache_[i]);
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
      Inject(f.kind, &ev);
      std::lock_guard<std::mutex> lk(mu_);
      faults.push_back(ev);
    }
  });
  injector.join();
  for (auto& t : clients) t.join();
  out.duration_ms = std::max<int64_t>(SinceStart(), o_.duration_ms);
  Settle();
  // An acknowledged request may still be finishing: give it time to reach a terminal state.
  const auto deadline = Steady::now() + std::chrono::seconds(15);
  for (auto& r : records) {
    ReadJournal(r);
    while (target_ != Target::kLlamaServer && r.acknowledged && r.journal_state != "completed" && r.journal_state != "failed" &&
           r.journal_state != "failed_resumable" && r.journal_state != "cancelled" && Steady::now() < deadline) {
      SleepMs(100);
      ReadJournal(r);
    }
  }
  CompareWithReference(records);
  Settle();
  SleepMs(300);  // one more sample of the settled system
  stop_monitor_ = true;
  monitor.join();
  out.requests = std::move(records);
  out.faults = std::move(faults);
  out.samples = samples_;
  Recoveries(out.faults, out.samples);
  VerdictOptions vo;
  vo.primary_placement = PrimaryName();
  vo.journal = target_ != Target::kLlamaServer;
  out.verdict = Judge(out, vo);
  if (s_.name == "routing_before_admission" && target_ == Target::kSpillway) {
    // Routed before admission: nothing tried the accelerator and failed first.
    for (const auto& r : out.requests) {
      if (r.attempts > 1) out.verdict.failures.push_back("routed only after a failed attempt: " + r.id);
    }
    out.verdict.passed = out.verdict.failures.empty();
  }
  server_.Stop();
  for (auto& h : holds_) h->Stop(1000);
  return out;
}

}  // namespace

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
