#include "cli/sim_command.h"

#include <signal.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <thread>

#include "common/names.h"
#include "devices/sim_ledger.h"

namespace spillway::cli {

using devices::LedgerKind;
using devices::SimLedger;
using nlohmann::json;

int ParseSimDevice(const std::string& device) {
  const auto name = ParseDeviceName(device);
  return name && name->kind == "sim" ? name->index : -1;
}

namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

constexpr double kMiB = 1024.0 * 1024.0;

json SnapshotJson(int index, const devices::LedgerSnapshot& s) {
  json procs = json::array();
  for (const auto& e : s.entries) {
    procs.push_back({{"pid", e.pid},
                     {"kind", e.kind == static_cast<uint32_t>(LedgerKind::kHold) ? "hold" : "alloc"},
                     {"label", e.label},
                     {"bytes", e.bytes},
                     {"expires_unix_ms", e.expires_ms}});
  }
  return {{"device", "sim:" + std::to_string(index)}, {"ledger", SimLedger::PathFor(index)},
          {"capacity", s.capacity}, {"used", s.used}, {"free", s.free()}, {"processes", procs}};
}

void PrintSnapshot(int index, const devices::LedgerSnapshot& s) {
  std::printf("sim:%d  capacity %.1f MiB  used %.1f MiB  free %.1f MiB  (%s)\n", index, s.capacity / kMiB,
              s.used / kMiB, s.free() / kMiB, SimLedger::PathFor(index).c_str());
  for (const auto& e : s.entries) {
    std::printf("  pid %-8d %-5s %-12s %10.1f MiB\n", e.pid,
                e.kind == static_cast<uint32_t>(LedgerKind::kHold) ? "hold" : "alloc", e.label, e.bytes / kMiB);
  }
}

}  // namespace

void AddSimCommand(CLI::App& app, int* exit_code) {
  CLI::App* sim = app.add_subcommand("sim", "Simulated accelerator: a capacity-limited ggml device shared by processes")
                      ->require_subcommand(1);
  auto fail = [exit_code](const Status& st) {
    std::fprintf(stderr, "spillway sim: %s\n", st.message().c_str());
    *exit_code = 1;
  };
  auto device_index = [exit_code](const std::string& d) {
    int i = ParseSimDevice(d);
    if (i < 0) {
      std::fprintf(stderr, "spillway sim: device must be sim:N, not '%s'\n", d.c_str());
      *exit_code = 2;
    }
    return i;
  };

  static std::string create_dev, show_dev, hold_dev, remove_dev;
  static double capacity_mib = 0, hold_mib = 0, hold_seconds = 0;
  static bool show_json = false;

  CLI::App* create = sim->add_subcommand("create", "Create sim:N with a capacity (or change its capacity)");
  create->add_option("device", create_dev, "sim:N")->required();
  create->add_option("--capacity-mib", capacity_mib, "device memory in MiB")->required()->check(CLI::Number)->check(CLI::Range(1.0, 16.0 * 1024 * 1024));
  create->callback([=] {
    int i = device_index(create_dev);
    if (i < 0) return;
    auto l = SimLedger::Create(i, static_cast<uint64_t>(capacity_mib * kMiB));
    if (!l.ok()) return fail(l.status());
    PrintSnapshot(i, (*l)->Snapshot());
  });

  CLI::App* show = sim->add_subcommand("show", "Show capacity, use and the processes holding memory on sim:N (all if omitted)");
  show->add_option("device", show_dev, "sim:N");
  show->add_flag("--json", show_json, "print JSON");
  show->callback([=] {
    std::vector<int> indices;
    if (!show_dev.empty()) {
      int i = device_index(show_dev);
      if (i < 0) return;
      indices.push_back(i);
    } else {
      indices = SimLedger::List();
    }
    json all = json::array();
    for (int i : indices) {
      auto l = SimLedger::Open(i);
      if (!l.ok()) return fail(l.status());
      auto snap = (*l)->Snapshot();
      if (show_json) all.push_back(SnapshotJson(i, snap));
      else PrintSnapshot(i, snap);
    }
    if (show_json) std::printf("%s\n", all.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    else if (indices.empty()) std::printf("no simulated devices in %s\n", SimLedger::DirPath().c_str());
  });

  CLI::App* hold = sim->add_subcommand(
      "hold", "Hold N MiB of sim:N for T seconds, as another GPU workload would; released on exit, kill or expiry");
  hold->add_option("device", hold_dev, "sim:N")->required();
  hold->add_option("--mib", hold_mib, "MiB to hold")->required()->check(CLI::Number)->check(CLI::Range(0.0, 16.0 * 1024 * 1024));
  hold->add_option("--seconds", hold_seconds, "how long (0 = until interrupted)")->check(CLI::Number)->check(CLI::Range(0.0, 365.0 * 86400));
  hold->callback([=] {
    int i = device_index(hold_dev);
    if (i < 0) return;
    auto l = SimLedger::Open(i);
    if (!l.ok()) return fail(l.status());
    const uint64_t bytes = static_cast<uint64_t>(hold_mib * kMiB);
    const uint64_t expires = hold_seconds > 0 ? devices::UnixMillis() + static_cast<uint64_t>(hold_seconds * 1000) : 0;
    if (!(*l)->Reserve(LedgerKind::kHold, "hold", bytes, expires)) {
      auto s = (*l)->Snapshot();
      return fail(Status::ResourceExhausted("cannot hold " + std::to_string(hold_mib) + " MiB: only " +
                                            std::to_string(s.free() / kMiB) + " MiB free"));
    }
    std::signal(SIGINT, OnSignal);
    std::signal(SIGTERM, OnSignal);
    std::printf("holding %.1f MiB on sim:%d (pid %d)\n", hold_mib, i, getpid());
    std::fflush(stdout);
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(hold_seconds * 1000));
    while (!g_stop && (hold_seconds <= 0 || std::chrono::steady_clock::now() < end)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    (*l)->Release(LedgerKind::kHold, "hold", bytes);
    std::printf("released %.1f MiB on sim:%d\n", hold_mib, i);
  });

  CLI::App* remove = sim->add_subcommand("remove", "Remove sim:N");
  remove->add_option("device", remove_dev, "sim:N")->required();
  remove->callback([=] {
    int i = device_index(remove_dev);
    if (i < 0) return;
    if (Status st = SimLedger::Remove(i); !st.ok()) fail(st);
  });
}

}  // namespace spillway::cli
