#include "cli/plan_fit.h"

#include <algorithm>
#include <cstdio>

#include "devices/telemetry.h"
#include "gguf/gguf_reader.h"

namespace spillway::cli {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

}  // namespace

StatusOr<Fit> PlanFit(const FitQuery& q) {
  auto meta = gguf::ReadGgufFile(q.model_file);
  if (!meta.ok()) return Status::InvalidArgument(meta.status().message());
  auto shape = memory::ShapeFromMetadata(*meta);
  if (!shape.ok()) return Status::InvalidArgument(q.model_file + ": " + shape.status().message());  // (which file: an ollama: name's blob)
  Fit f;
  f.shape = *shape;
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

  const int L = static_cast<int>(f.shape.n_layer);
  int layers = 0;
  if (q.gpu_layers == "auto") {
    layers = spec.accelerator ? L + 1 : 0;
    if (spec.accelerator && f.budget) {
      while (layers > 0) {
        spec.gpu_layers = layers;
        if (memory::EstimatePlacement(f.shape, spec).accelerator.total() <= *f.budget) break;
        --layers;
      }
    }
  } else {
    try {
      layers = std::stoi(q.gpu_layers);
    } catch (...) {
      return Status::InvalidArgument("--gpu-layers must be a number or auto");
    }
  }
  spec.gpu_layers = layers;
  f.estimate = memory::EstimatePlacement(f.shape, spec);
  f.fits = f.budget && device_part(f.estimate).total() <= *f.budget;

  // The largest context (KV pool) that fits with these layers.
  if (f.budget) {
    memory::PlacementSpec probe = spec;
    uint32_t lo = 0, hi = 1u << 22;
    while (lo < hi) {
      const uint32_t mid = (lo + hi + 256) / 512 * 256;
      probe.ctx = std::max<uint32_t>(mid, 256);
      if (mid > lo && device_part(memory::EstimatePlacement(f.shape, probe)).total() <= *f.budget) lo = mid;
      else hi = mid > lo ? mid - 256 : lo;
    }
    f.max_ctx = lo;
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
