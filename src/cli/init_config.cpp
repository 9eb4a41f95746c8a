#include "cli/init_config.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "cli/plan_fit.h"
#include "common/utf8.h"
#include "memory/estimator.h"

namespace spillway::cli {

namespace {

struct PlacementPlan {
  std::string device, role;
  int gpu_layers = 0;
  uint32_t ctx = 0, slots = 0;
  uint64_t bytes = 0;      // plan's estimate of its part on the device (the host for "cpu")
  uint32_t n_vocab = 0;
  std::vector<std::string> verdict;  // plan's lines and how it was chosen
};

struct ServicePlan {
  std::string name;
  const FoundModel* model = nullptr;
  std::vector<PlacementPlan> placements;
  std::vector<std::string> notes;  // placements left out, and why
};

// Text from outside (a GGUF's keys and metadata, file and directory names)
// for a comment line: UTF-8, on the one line (a newline in a key wrote a
// TOML line of its own into the config).
std::string CommentText(std::string_view text) {
  std::string out = ValidUtf8(text);
  for (auto& ch : out) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f) ch = ' ';
  }
  return out;
}

std::string Joined(const std::vector<std::string>& lines, const char* sep) {
  std::string out;
  for (const auto& l : lines) out += (out.empty() ? "" : sep) + l;
  return out;
}

std::string TomlList(const std::vector<std::string>& items) {
  std::string out = "[";
  for (const auto& i : items) out += (out.size() > 1 ? ", " : "") + TomlString(i);
  return out + "]";
}

std::string MiB(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

uint32_t PerSlot(const FoundModel& m, uint32_t cap) {
  const uint64_t trained = m.summary.context_length;
  return static_cast<uint32_t>(trained > 0 && trained < cap ? trained : cap);
}

FitQuery Query(const FoundModel& m, const std::string& device, uint32_t ctx, uint32_t slots) {
  FitQuery q;
  q.model_file = m.file;
  q.device = device;
  q.ctx = ctx;
  q.slots = slots;
  return q;
}

// One placement with plan's verdict; *fits when it fits (on an accelerator:
// with at least one layer there).
PlacementPlan Place(const FoundModel& m, const std::string& device, const std::string& role, uint32_t ctx,
                    uint32_t slots, bool* fits) {
  PlacementPlan p{device, role, 0, ctx, slots, 0, 0, {}};
  FitQuery q = Query(m, device, ctx, slots);
  auto fit = PlanFit(q);
  if (fit.ok() && device != "cpu" && fit->spec.gpu_layers == 0) {
    q.gpu_layers = "1";  // not even one layer fits: the verdict says so for one
    fit = PlanFit(q);
  }
  *fits = false;
  if (!fit.ok()) {
    p.verdict.push_back("no plan: " + fit.status().message());
    return p;
  }
  p.gpu_layers = device == "cpu" ? 0 : fit->spec.gpu_layers;
  p.bytes = fit->DevicePart().total();
  p.n_vocab = fit->shape.n_vocab;
  *fits = fit->fits;
  const int all = static_cast<int>(fit->shape.n_layer) + 1;
  std::string what = "needs " + MiB(fit->DevicePart().total()) + " there";
  if (device != "cpu") {
    what += p.gpu_layers >= all ? " (all " + std::to_string(all) + " layers offloaded)"
                                : " (" + std::to_string(p.gpu_layers) + " of " + std::to_string(all) +
                                      " layers offloaded" + (*fits ? ": the most that fit)" : ")");
  }
  p.verdict.push_back(what);
  for (const auto& line : FitVerdict(q, *fit)) p.verdict.push_back(line);
  return p;
}

// The biggest model whose primary placement fits, else the smallest; its
// placements: the accelerator and a CPU fallback, or the CPU alone.
ServicePlan Plan(const std::string& name, std::vector<const FoundModel*> candidates, const InitInput& in,
                 uint32_t per_slot_cap, uint32_t slots) {
  ServicePlan s;
  s.name = name;
  std::sort(candidates.begin(), candidates.end(),
            [](const FoundModel* a, const FoundModel* b) { return a->summary.size > b->summary.size; });
  const std::string primary = in.accelerators.empty() ? "cpu" : in.accelerators.front();
  PlacementPlan first;
  bool fits = false;
  for (const FoundModel* m : candidates) {
    const uint32_t per_slot = PerSlot(*m, per_slot_cap);
    first = Place(*m, primary, "primary", per_slot * slots, slots, &fits);
    s.model = m;
    if (fits) break;
  }
  if (!fits) {
    s.model = candidates.back();
    const uint32_t per_slot = PerSlot(*s.model, per_slot_cap);
    first = Place(*s.model, primary, "primary", per_slot * slots, slots, &fits);
    if (!fits) s.notes.push_back("no model found fits " + primary + " now: the smallest was chosen");
  }
  const uint32_t per_slot = PerSlot(*s.model, per_slot_cap);
  if (primary == "cpu" || fits) {
    s.placements.push_back(std::move(first));
  } else {
    // It does not fit the accelerator at all: the CPU serves it.
    s.notes.push_back("not placed on " + primary + ": " + Joined(first.verdict, "; "));
    bool cpu_fits = false;
    s.placements.push_back(Place(*s.model, "cpu", "primary", per_slot * slots, slots, &cpu_fits));
    return s;
  }
  if (primary != "cpu") {
    // The CPU fallback: one slot of the same size, loaded warm (README "Replica readiness").
    bool cpu_fits = false;
    PlacementPlan fb = Place(*s.model, "cpu", "fallback", per_slot, 1, &cpu_fits);
    if (cpu_fits) {
      s.placements.push_back(std::move(fb));
    } else {
      s.notes.push_back("no CPU fallback: " + Joined(fb.verdict, "; "));
    }
  }
  return s;
}

// The host-RAM budget for a service's CPU path (its CPU fallback, loaded warm,
// and one request at a time: [service.cpu_path] concurrency's default), in
// whole MiB: plan's estimate and a tenth more, at least 64 MiB more (the
// worker's runtime and libraries, which a small model's estimate does not
// cover; the budget counts a replica's resident set where it is larger).
// 0 without a CPU fallback.
uint64_t CpuPathBudget(const ServicePlan& s) {
  for (size_t i = 1; i < s.placements.size(); ++i) {
    const PlacementPlan& p = s.placements[i];
    if (p.role != "fallback" || p.device != "cpu") continue;
    const uint64_t need = p.bytes + memory::RequestHostBytes(p.n_vocab, p.ctx);
    return (need + std::max<uint64_t>(need / 10, uint64_t{64} << 20) + (1 << 20) - 1) >> 20 << 20;
  }
  return 0;
}

void Header(std::ostringstream& os, const InitInput& in, const std::vector<ServicePlan>& services) {
  os << "# Spillway configuration written by `spillway init`.\n#\n";
  os << "# Models found: " << in.models.size() << " (searched: ";
  for (size_t i = 0; i < in.searched.size(); ++i) os << (i ? ", " : "") << CommentText(in.searched[i]);
  os << ")\n";
  for (const auto& s : in.skipped) os << "#   skipped " << CommentText(s) << "\n";
  os << "# Devices: ";
  for (const auto& d : in.accelerators) os << CommentText(d) << ", ";
  os << "cpu\n";
  for (const auto& n : in.device_notes) os << "#   not used: " << CommentText(n) << "\n";
  if (services.empty()) return;
  os << "#\n# spillway plan's verdict for each placement, on this machine now:\n";
  for (const auto& s : services) {
    for (const auto& p : s.placements) {
      os << "#   service '" << s.name << "' on " << CommentText(p.device) << " (" << p.role << ", ctx " << p.ctx << ", "
         << p.slots << (p.slots == 1 ? " slot" : " slots") << "):\n";
      for (const auto& line : p.verdict) os << "#     " << CommentText(line) << "\n";
    }
    for (const auto& n : s.notes) os << "#   service '" << s.name << "': " << CommentText(n) << "\n";
  }
  os << "#\n# Check it: spillway serve --check --config FILE (what serve would refuse);\n"
     << "# spillway doctor --config FILE (memory, state directory, port). API keys: api_keys below,\n"
     << "# or SPILLWAY_API_KEYS in /etc/spillway/env for the systemd unit.\n\n";
}

void Service(std::ostringstream& os, const ServicePlan& s) {
  const FoundModel& m = *s.model;
  os << "[[service]]\nname = " << TomlString(s.name) << "\n";
  os << "model = " << TomlString(m.file) << "  # " << MiB(m.summary.size) << ", " << CommentText(m.summary.architecture) << " "
     << CommentText(m.summary.quantization) << ", " << models::HumanCount(m.summary.parameters) << " parameters";
  if (m.label != m.file) os << ", " << CommentText(m.label);
  os << "\n";
  for (const auto& p : s.placements) {
    os << "[[service.placement]]\n";
    if (p.role != "primary") os << "role = " << TomlString(p.role) << "\n";
    os << "device = " << TomlString(p.device) << "\n";
    if (p.device != "cpu") os << "gpu_layers = " << p.gpu_layers << "\n";
    os << "ctx = " << p.ctx << "\nslots = " << p.slots << "\n";
  }
  if (const uint64_t budget = CpuPathBudget(s)) {
    // Without it each service's CPU path may take half of the host's memory,
    // and doctor warns for two services that their budgets pass the host's.
    os << "[service.cpu_path]\nram_budget_mib = " << (budget >> 20)
       << "  # the CPU fallback and one request (plan's estimate), with room to spare\n";
  }
  os << "\n";
}

std::string NoModels(const InitInput& in) {
  std::ostringstream os;
  Header(os, in, {});
  const std::string dir = CommentText(in.models_hint);
  os << "#\n# No GGUF model was found, so no service is declared and this file does\n"
     << "# not load yet. Put GGUF files in " << dir << " (readable by the user\n"
     << "# spillway runs as) and run `spillway init --models " << dir << " --force -o FILE`\n"
     << "# again, or uncomment and edit the service below.\n#\n"
     << "# listen = \"127.0.0.1:8480\"\n"
     << "# model_dirs = " << TomlList({dir}) << "\n#\n"
     << "# [[service]]\n# name = \"chat\"\n# model = " << TomlString(dir + "/MODEL.gguf") << "\n"
     << "# [[service.placement]]\n# device = \"cpu\"    # or cuda:0, with gpu_layers = 99 and a CPU fallback\n"
     << "# ctx = 16384\n# slots = 4\n";
  return os.str();
}

}  // namespace

std::string TomlString(const std::string& text) {
  const std::string s = ValidUtf8(text);  // (TOML is UTF-8)
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string StartingConfig(const InitInput& found) {
  // A file whose path is not UTF-8 cannot be named in TOML: skipped, saying so.
  InitInput in = found;
  in.models.clear();
  for (const auto& m : found.models) {
    if (ValidUtf8(m.file) == m.file) in.models.push_back(m);
    else in.skipped.push_back(m.file + ": its path is not UTF-8, which a TOML config cannot name (rename it)");
  }
  std::vector<const FoundModel*> chat, embed;
  for (const auto& m : in.models) (m.summary.embedding ? embed : chat).push_back(&m);
  if (chat.empty() && embed.empty()) return NoModels(in);
  std::vector<ServicePlan> services;
  if (!chat.empty()) services.push_back(Plan("chat", chat, in, 4096, 4));
  if (!embed.empty()) services.push_back(Plan("embed", embed, in, 2048, 2));
  std::ostringstream os;
  Header(os, in, services);
  os << "listen = \"127.0.0.1:8480\"\n";
  if (!in.model_dirs.empty()) os << "model_dirs = " << TomlList(in.model_dirs) << "  # `spillway models --config` lists them\n";
  os << "\n";
  for (const auto& s : services) Service(os, s);
  return os.str();
}

}  // namespace spillway::cli
