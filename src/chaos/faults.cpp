// Faults injected by `spillway chaos` (see chaos/schedule.h for their kinds).
#include <signal.h>

#include <nlohmann/json.hpp>

#include <random>
#include <sstream>
#include <string>

#include "chaos/run.h"
#include "devices/sim_ledger.h"
#include "protocol/worker_protocol.h"

namespace spillway::chaos {

bool Run::Hold(uint64_t mib, double seconds) {
  if (mib == 0) return true;  // (nothing free to take)
  auto h = std::make_unique<Child>();
  std::ostringstream secs;
  secs << seconds;
  if (h->Spawn({o_.bin_dir + "/spillway", "sim", "hold", "sim:0", "--mib", std::to_string(mib), "--seconds", secs.str()},
               dir_ + "/holds.log", env_)) {
    holds_.push_back(std::move(h));
  } else {
    return false;
  }
  SleepMs(100);  // the hold is in the ledger
  return true;
}

int64_t Run::WorkerFaultsFired(uint16_t port) const {
  if (port == 0) return -1;
  auto r = http::Fetch("127.0.0.1", port, "GET", std::string(protocol::kInfoPath), "", WorkerAuth(),
                       std::chrono::seconds(1));
  if (!r.ok() || r->status != 200) return -1;
  const json info = json::parse(r->body, nullptr, false);
  try {
    return info.at("faults").at("faults_fired").get<int64_t>();
  } catch (const json::exception&) {
    return -1;  // not a sim device's worker (no fault counters)
  }
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
    ev->back_ms = SinceStart();  // (serving again, or given up on: its down time ends here)
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
  if (!Simulated() && kind == "lose-at-token") {
    // No simulated device to lose: a driver reset looks like this from outside.
    const json p = Placement(0, 0);
    if (p.is_object() && p.value("pid", 0) > 0) kill(p.value("pid", 0), SIGKILL);
    ev->kind = "kill -9 GPU worker (a lost device, on " + o_.device + ")";
    return;
  }
  // A fault armed through the worker's routes needs a ready worker (up to
  // 2 s); a kill takes whatever process is there.
  const bool armed = kind == "compute-error" || kind == "kv-full" || kind == "hang" || kind.rfind("fail-next=", 0) == 0 ||
                     kind.rfind("lose-", 0) == 0;
  json gpu = Placement(0, 0);
  for (int i = 0; armed && i < 100 && !(gpu.is_object() && gpu.value("state", "") == "ready"); ++i) {
    SleepMs(20);
    gpu = Placement(0, 0);
  }
  const uint16_t gpu_port = gpu.is_object() ? gpu.value("port", 0) : 0;
  const int gpu_pid = gpu.is_object() ? gpu.value("pid", 0) : 0;
  auto arm = [&](const std::string& spec) {
    // (Read before the arming: a fault that goes off at once is still seen to fire.)
    const int64_t fired_before = WorkerFaultsFired(gpu_port);
    auto r = http::Fetch("127.0.0.1", gpu_port, "POST", std::string(protocol::kFaultsPath), json{{"faults", {spec}}}.dump(),
                         WorkerAuth(), std::chrono::seconds(2));
    if (!r.ok() || r->status != 200) {
      ev->injected = false;  // the GPU worker was not ready
    } else if (fired_before >= 0) {
      ev->worker_pid = gpu_pid;
      ev->fired_before = fired_before;
    } else {
      // Armed, but whether it goes off cannot be told (its count was not
      // read): not counted as injected. Counted so, as if it acted at once,
      // it let a scenario whose faults never met a request pass.
      ev->injected = false;
      ev->kind += " (its worker's count of fired faults could not be read: not counted)";
    }
  };
  auto kill_gpu = [&] {
    // (Counted only when the signal was sent: a worker gone meanwhile was not killed by it.)
    if (gpu_pid <= 0 || kill(gpu_pid, SIGKILL) != 0) ev->injected = false;
  };
  auto hold = [&](uint64_t mib, double seconds) {
    if (!Hold(mib, seconds)) ev->injected = false;
  };
  if (kind == "compute-error" || kind == "kv-full" || kind.rfind("fail-next=", 0) == 0) {
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
    hold(mib, 2.5);
    kill_gpu();
    ev->kind = "sim hold " + std::to_string(mib) + " MiB for 2.5 s + kill -9 GPU worker";
  } else if (kind == "memory-step") {
    // A quarter of what is free goes, until the end of the fault window.
    const uint64_t mib = free_mib() / 4;
    const double left_s = std::max(1.0, (duration_ms_ * 0.8 - static_cast<double>(SinceStart())) / 1000.0);
    hold(mib, left_s);
    kill_gpu();
    ev->kind = "memory step: hold " + std::to_string(mib) + " MiB + kill -9 GPU worker";
  } else if (kind == "gpu-out") {
    const uint64_t mib = free_mib() > 4 ? free_mib() - 4 : 0;
    hold(mib, 3.0);
    kill_gpu();
    ev->kind = "accelerator out for 3 s (hold " + std::to_string(mib) + " MiB + kill -9 GPU worker)";
  } else {
    ev->kind = kind + " (unknown fault kind)";
    ev->injected = false;
  }
  if (!ev->injected) ev->kind += " (not injected: its target was not ready)";
}


}  // namespace spillway::chaos
