// `spillway plan --config`'s output: short lines in MiB, or JSON.
#include <nlohmann/json.hpp>

#include <cstdio>

#include "cli/plan_config.h"

namespace spillway::cli {

namespace {

using nlohmann::json;

std::string Mib(uint64_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f MiB", static_cast<double>(b) / (1 << 20));
  return s;
}

std::string Join(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "" : ", ") + k;
  return out.empty() ? "(none)" : out;
}

const char* Verdict(int code) {
  switch (code) {
    case 0: return "all services fit together";
    case 1: return "the services fit only by switching: some are evicted for others";
    case 2: return "the pinned services do not fit: this config can never serve as written";
    default: return "device memory unknown: no verdict";
  }
}

void DeviceLines(const DevicePlan& p, std::vector<std::string>& out) {
  char buf[512];
  if (p.budget) {
    std::snprintf(buf, sizeof buf, "%s: %s, %s free now; headroom %s -> budget %s", p.device.c_str(),
                  Mib(*p.capacity).c_str(), Mib(*p.free).c_str(), Mib(p.headroom).c_str(), Mib(*p.budget).c_str());
  } else {
    std::snprintf(buf, sizeof buf, "%s: memory unknown (%s): no fit check", p.device.c_str(), p.telemetry_note.c_str());
  }
  out.push_back(buf);
  for (const auto& h : p.holders) {
    std::snprintf(buf, sizeof buf, "  %-14s %12s  %-10s  %-11s  %s%s%s", h.key.c_str(), Mib(h.bytes).c_str(),
                  h.mode.c_str(), h.priority.c_str(), h.shape.c_str(), h.note.empty() ? "" : "; ",
                  h.note.c_str());
    out.push_back(buf);
  }
  if (!p.budget) return;
  std::snprintf(buf, sizeof buf, "  all together: %s of %s -> %s", Mib(p.total_bytes).c_str(), Mib(*p.budget).c_str(),
                p.all_fit ? "FIT" : "DO NOT FIT");
  out.push_back(buf);
  if (*p.free < *p.capacity && p.total_bytes + p.headroom > *p.free) {  // fits the device, not what is free now
    std::snprintf(buf, sizeof buf, "  note: other processes hold %s there now (a running gateway's own included)",
                  Mib(*p.capacity - *p.free).c_str());
    out.push_back(buf);
  }
  if (!p.pinned_fit) {  // nothing else matters there
    std::snprintf(buf, sizeof buf, "  pinned alone: %s of %s -> DO NOT FIT: %s can never hold them all",
                  Mib(p.pinned_bytes).c_str(), Mib(*p.budget).c_str(), p.device.c_str());
    out.push_back(buf);
    return;
  }
  std::snprintf(buf, sizeof buf, "  pinned alone: %s -> fit; %s left for the others", Mib(p.pinned_bytes).c_str(),
                Mib(*p.budget - p.pinned_bytes).c_str());
  out.push_back(buf);
  if (p.exclusive) out.push_back("  exclusive: one service at a time here; each load unloads every other one not pinned");
  if (p.all_fit) return;
  if (p.start_bytes > p.pinned_bytes) {
    std::snprintf(buf, sizeof buf, "  at start (pinned + keep_alive): %s -> %s", Mib(p.start_bytes).c_str(),
                  p.start_fit ? "fit" : "DO NOT FIT: some keep_alive services wait for room");
    out.push_back(buf);
  }
  out.push_back("  fit beside the pinned: " + Join(p.beside_pinned));
  if (!p.never_beside_pinned.empty()) {
    out.push_back("  NEVER fit beside the pinned (their requests take a CPU path or wait): " +
                  Join(p.never_beside_pinned));
  }
  out.push_back(p.greedy ? "  a large set that fits (greedy: too many to enumerate):"
                         : "  largest sets that fit (with the pinned):");
  constexpr size_t kShown = 10;
  for (size_t i = 0; i < p.largest.size() && i < kShown; ++i) {
    out.push_back("    " + Join(p.largest[i].keys) + " (" + Mib(p.largest[i].bytes) + ")");
  }
  if (p.largest.size() > kShown) out.push_back("    ... " + std::to_string(p.largest.size() - kShown) + " more (--json)");
  out.push_back("  evicted first, when each loads on a full device:");
  for (const auto& e : p.evictions) {
    out.push_back("    " + e.key + " loads beside " + Join(e.resident) + ":");
    if (!e.plan.fits) out.push_back("      no room it may take (it waits or is refused): " + e.plan.reason);
    else if (e.plan.evict.empty()) out.push_back("      nothing evicted: " + e.plan.reason);
    else out.push_back("      evicts " + Join(e.plan.evict) + ": " + e.plan.reason);
  }
}

}  // namespace

std::vector<std::string> PlanConfigLines(const std::vector<DevicePlan>& plans) {
  std::vector<std::string> out;
  if (plans.empty()) {
    out.push_back("no service holds accelerator memory (every placement is on the cpu): nothing to plan");
  }
  for (const auto& p : plans) DeviceLines(p, out);
  out.push_back(std::string("verdict: ") + Verdict(PlanExitCode(plans)));
  return out;
}

std::string PlanConfigJson(const std::string& config_file, const std::vector<DevicePlan>& plans) {
  const int code = PlanExitCode(plans);
  json devices = json::array();
  for (const auto& p : plans) {
    json d = {{"device", p.device}, {"exclusive", p.exclusive}, {"pinned_bytes", p.pinned_bytes},
              {"total_bytes", p.total_bytes}};
    json services = json::array();
    for (const auto& h : p.holders) {
      json s = {{"key", h.key},           {"service", h.service},   {"kind", h.external ? "external" : "llama"},
                {"residency", h.mode},    {"priority", h.priority}, {"bytes", h.bytes},
                {"expected_reload_s", h.reload_s}, {"shape", h.shape}};
      if (h.evict_cost >= 0) s["evict_cost"] = h.evict_cost;
      if (!h.note.empty()) s["note"] = h.note;
      services.push_back(std::move(s));
    }
    d["services"] = std::move(services);
    if (!p.budget) {
      d["note"] = "device memory unknown: " + p.telemetry_note;
      d["all_fit"] = d["pinned_fit"] = nullptr;
      devices.push_back(std::move(d));
      continue;
    }
    d["capacity"] = *p.capacity;
    d["free"] = *p.free;
    d["headroom"] = p.headroom;
    d["budget"] = *p.budget;
    d["all_fit"] = p.all_fit;
    d["pinned_fit"] = p.pinned_fit;
    d["start_bytes"] = p.start_bytes;
    d["start_fit"] = p.start_fit;
    d["fit_beside_pinned"] = p.beside_pinned;
    d["never_fit_beside_pinned"] = p.never_beside_pinned;
    json largest = json::array();
    for (const auto& c : p.largest) largest.push_back({{"services", c.keys}, {"bytes", c.bytes}});
    d["largest_sets"] = std::move(largest);
    d["largest_sets_greedy"] = p.greedy;
    json evictions = json::array();
    for (const auto& e : p.evictions) {
      evictions.push_back({{"service", e.key},
                           {"resident", e.resident},
                           {"available", e.available},
                           {"fits", e.plan.fits},
                           {"evict", e.plan.evict},
                           {"reason", e.plan.reason}});
    }
    d["evictions"] = std::move(evictions);
    devices.push_back(std::move(d));
  }
  json out = {{"config", config_file}, {"exit_code", code}, {"verdict", Verdict(code)}, {"devices", devices}};
  return out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);  // (paths in any bytes)
}

}  // namespace spillway::cli
