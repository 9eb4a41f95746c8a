// The run of one scenario against one target (chaos/harness.h), shared by
// the harness's files: harness.cpp (processes, monitor, settling, judging),
// client.cpp (the requests), faults.cpp (the injections). Not an interface.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "api/http_client.h"
#include "chaos/harness.h"
#include "chaos/process.h"
#include "devices/telemetry.h"

namespace spillway::chaos {

using nlohmann::json;
using Steady = std::chrono::steady_clock;
namespace fs = std::filesystem;

int64_t WallMs();
void SleepMs(int64_t ms);
uint16_t FreePort();
uint64_t RssOf(int pid);
// The service a planned request of `kind` goes to: chat, embed or search.
std::string ServiceOf(const std::string& kind);

inline constexpr int64_t kCompetingMinMs = 30000;

class Run {
 public:
  Run(const Scenario& s, Target t, const HarnessOptions& o, std::string profile = "")
      : s_(s), target_(t), o_(o), profile_(std::move(profile)),
        // Services competing need enough requests before and during the batch traffic to compare p95s.
        duration_ms_(s.Competing() ? std::max<int64_t>(o.duration_ms, kCompetingMinMs) : o.duration_ms) {
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
    return o_.device + (profile_ == "split" ? "/2" : "/99");
  }
  bool Simulated() const { return o_.device.rfind("sim:", 0) == 0; }
  std::string ConfigToml() const;
  std::string CompetingToml() const;
  // competing_services: chat and embed loaded once, then the simulated device
  // shrunk so that chat and one more fit but not all three.
  bool SizeDeviceForCompetition(std::string* why);
  // What each service's processes hold on the run's device, from a /v1/status.
  std::map<std::string, uint64_t> ServiceDeviceBytes(const json& status) const;
  // A sample's per-service bytes, and the residency events not seen yet (those
  // before the run's start, the sizing's own, left out).
  void PollCompeting(const json& status, Sample& s);
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
  // The count of faults fired by the worker on `port` (its GET /v1/worker/info); -1 when it does not answer.
  int64_t WorkerFaultsFired(uint16_t port) const;
  void Monitor();
  void Inject(const std::string& kind, FaultEvent* ev);
  RequestRecord Send(const PlannedRequest& p);
  json BodyFor(const PlannedRequest& p) const;
  void Settle();
  void ReadJournal(RequestRecord& r);
  // Records when the host stopped running this process (see Stall).
  void MeterStalls();
  void CompareWithReference(std::vector<RequestRecord>& records);
  // False when the holding process could not be started.
  bool Hold(uint64_t mib, double seconds);
  int64_t SinceStart() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Steady::now() - t0_).count();
  }

  const Scenario& s_;
  const Target target_;
  const HarnessOptions& o_;
  const std::string profile_;
  const int64_t duration_ms_;
  std::string dir_;
  std::map<std::string, std::string> env_;
  Child server_;
  std::mutex server_mu_;            // restarts of the server
  std::atomic<uint16_t> port_{0};
  std::atomic<bool> stop_monitor_{false};
  std::vector<std::unique_ptr<Child>> holds_;
  std::mutex mu_;
  std::vector<Sample> samples_;
  std::vector<ResidencyEvent> events_;  // competing_services, in order, each once
  std::vector<Stall> stalls_;
  std::vector<PlannedRequest> plan_cache_;
  std::unique_ptr<devices::DeviceTelemetry> device_telemetry_;  // a real device's memory
  Steady::time_point t0_ = Steady::now();
  int64_t t0_wall_ = WallMs();
};


}  // namespace spillway::chaos
