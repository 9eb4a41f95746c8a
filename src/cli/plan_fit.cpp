#include "cli/plan_fit.h"

#include <algorithm>
#include <cstdio>

#include "devices/telemetry.h"
#include "cli/serve_config.h"
#include "gguf/gguf_reader.h"
#include "memory/exact_plan.h"

namespace spillway::cli {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

}  // namespace

namespace {

// llama.cpp's plan of one placement, as an estimate (the layer split as the
// estimator's rule puts it: the dry run reports bytes per device only).
StatusOr<memory::PlacementEstimate> DryRunEstimate(const FitQuery& q, uint32_t n_layer, const memory::PlacementSpec& spec) {
  auto plan = memory::RunDryRun(q.worker_binary.empty() ? DefaultWorkerBinary() : q.worker_binary,
                                memory::DryRunArgsFor(q.model_file, q.device, spec, q.kv_type));
  if (!plan.ok()) return plan.status();
  memory::PlacementEstimate e;
  e.accelerator = plan->accelerator;
  e.host = plan->host;
  const int L = static_cast<int>(n_layer);
  const int n_gpu = !spec.accelerator ? 0 : spec.gpu_layers < 0 ? L + 1 : std::min(spec.gpu_layers, L + 1);
  e.layers_on_accelerator = std::min(n_gpu, L);
  e.output_on_accelerator = n_gpu >= 1;
  return e;
}

}  // namespace

StatusOr<Fit> PlanFit(const FitQuery& q) {
  auto meta = gguf::ReadGgufFile(q.model_file);
  if (!meta.ok()) return Status::InvalidArgument(meta.status().message());
  Fit f;
  f.exact_reason = memory::ExactPlanReason(*meta);
  if (f.exact_reason.empty()) {
    auto shape = memory::ShapeFromMetadata(*meta);
    if (!shape.ok()) return Status::InvalidArgument(q.model_file + ": " + shape.status().message());  // (which file: an ollama: name's blob)
    f.shape = *shape;
  } else {
    // Sized by llama.cpp: what the metadata tells of the shape is for the report only.
    f.shape.architecture = meta->architecture();
    f.shape.n_layer = static_cast<uint32_t>(std::min<uint64_t>(meta->ArchUint("block_count").value_or(0), 4096));
    f.shape.n_ctx_train = static_cast<uint32_t>(std::min<uint64_t>(meta->ArchUint("context_length").value_or(0), 1u << 22));
    f.embedding = meta->PoolsEmbeddings();
  }
  // (After its shape: a header whose shape cannot be is named for that first.)
  if (std::string none = memory::NoWeightsReason(*meta); !none.empty()) {
    return Status::InvalidArgument(q.model_file + ": " + none);
  }
  auto size = [&](const memory::PlacementSpec& spec) -> StatusOr<memory::PlacementEstimate> {
    if (f.exact_reason.empty()) return memory::EstimatePlacement(f.shape, spec);
    return DryRunEstimate(q, f.shape.n_layer, spec);
  };
  memory::PlacementSpec& spec = f.spec;
  spec.accelerator = q.device != "cpu";
  spec.ctx = q.ctx;
  spec.slots = q.slots;
  spec.batch = q.batch;
  spec.kv_unified = q.kv_unified;
  spec.kv_k_x32 = spec.kv_v_x32 = q.kv_type == "q8_0" ? 34 : q.kv_type == "f32" ? 128 : 64;

  // What the accelerator (or the host, for a CPU placement) can hold.
  if (spec.accelerator) {
    auto t = devices::OpenDeviceTelemetry(q.device);
    auto r = t.ok() ? (*t)->Read() : StatusOr<devices::DeviceReading>(t.status());
    if (r.ok()) {
      f.capacity = r->total;
      f.free = r->free;
    } else {
      f.telemetry_note = r.status().message();
    }
  } else if (auto h = devices::HostTelemetry().Read(); h.ok()) {
    f.capacity = h->total;
    f.free = h->effective_available();
  } else {
    f.telemetry_note = h.status().message();
  }
  if (f.capacity) {
    const double headroom = std::max(q.headroom_mib * kMiB, q.headroom_pct / 100.0 * static_cast<double>(*f.capacity));
    const double by_capacity = static_cast<double>(*f.capacity) - headroom;
    const double by_free = static_cast<double>(*f.free) - headroom;
    f.budget = static_cast<uint64_t>(std::max(0.0, std::min(by_capacity, by_free)));
  }
  auto device_part = [&](const memory::PlacementEstimate& e) { return spec.accelerator ? e.accelerator : e.host; };
  // Fits the budget. A dry run that fails is not "does not fit" (nothing is
  // allocated in one): the search stops, and its reason is the answer.
  Status probe_failed;
  auto fits = [&](const memory::PlacementSpec& probe) {
    if (!probe_failed.ok()) return false;
    auto e = size(probe);
    if (!e.ok()) probe_failed = e.status();
    return e.ok() && device_part(*e).total() <= *f.budget;
  };

  const int L = static_cast<int>(f.shape.n_layer);
  int layers = 0;
  if (q.gpu_layers == "auto") {
    layers = spec.accelerator ? L + 1 : 0;
    if (spec.accelerator && f.budget) {
      // The most layers that fit (more layers never need less): a search, a dry run a step for a model llama.cpp plans.
      memory::PlacementSpec probe = spec;
      int lo = 0, hi = L + 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        probe.gpu_layers = mid;
        if (fits(probe)) lo = mid;
        else hi = mid - 1;
      }
      layers = lo;
      if (!probe_failed.ok()) return Status::InvalidArgument(probe_failed.message());
    }
  } else {
    try {
      layers = std::stoi(q.gpu_layers);
    } catch (...) {
      return Status::InvalidArgument("--gpu-layers must be a number or auto");
    }
  }
  spec.gpu_layers = layers;
  auto estimate = size(spec);
  if (!estimate.ok()) return Status::InvalidArgument(estimate.status().message());
  f.estimate = *estimate;
  f.fits = f.budget && device_part(f.estimate).total() <= *f.budget;

  // The largest context (KV pool) that fits with these layers.
  if (f.budget) {
    memory::PlacementSpec probe = spec;
    // (A model llama.cpp plans is searched up to its training context, or the
    // context asked for: each step is a dry run, and one of millions of cells takes seconds.)
    uint32_t lo = 0, hi = 1u << 22;
    if (!f.exact_reason.empty()) {
      hi = static_cast<uint32_t>(std::min<uint64_t>((uint64_t{std::max<uint32_t>({f.shape.n_ctx_train, q.ctx, 256})} + 255) / 256 * 256,
                                                    hi));
    }
    // (An embedding model's context is a whole number of slots: the worker refuses any other.)
    const uint32_t unit = f.shape.embedding || f.embedding ? std::max<uint32_t>(1, q.slots) : 1;
    uint32_t best = 0;
    while (lo < hi) {
      const uint32_t mid = (lo + hi + 256) / 512 * 256;
      probe.ctx = std::max<uint32_t>(std::max<uint32_t>(mid, 256) / unit * unit, unit);
      if (mid > lo && fits(probe)) {
        lo = mid;
        best = probe.ctx;
      } else {
        hi = mid > lo ? mid - 256 : lo;
      }
    }
    if (!probe_failed.ok()) return Status::InvalidArgument(probe_failed.message());
    f.max_ctx = best;
  }
  f.per_slot = std::max<uint32_t>(1, q.ctx / std::max<uint32_t>(1, q.slots));
  f.max_slots = f.max_ctx / f.per_slot;
  return f;
}

std::vector<std::string> FitVerdict(const FitQuery& q, const Fit& f) {
  char buf[512];
  if (!f.capacity) {
    std::snprintf(buf, sizeof buf, "device memory unknown (%s): no fit check", f.telemetry_note.c_str());
    return {buf};
  }
  std::vector<std::string> out;
  std::snprintf(buf, sizeof buf, "%s: %.1f MiB, %.1f MiB free; budget after headroom %.1f MiB -> %s", q.device.c_str(),
                *f.capacity / kMiB, *f.free / kMiB, *f.budget / kMiB, f.fits ? "FITS" : "DOES NOT FIT");
  out.push_back(buf);
  std::snprintf(buf, sizeof buf, "largest context that fits: %u cells (%u slots of %u)", f.max_ctx, f.max_slots,
                f.per_slot);
  out.push_back(buf);
  return out;
}

}  // namespace spillway::cli
