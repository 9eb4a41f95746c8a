// libggml-sim.so: a ggml backend module for a simulated accelerator.
//
// Each device SIM<N> computes on the CPU (through an inner CPU backend) but
// allocates through its own buffer type, whose capacity is the shared ledger
// of sim:N (devices/sim_ledger.h). llama.cpp therefore offloads layers, KV
// cache and compute buffers to it, and an allocation over capacity fails
// inside llama.cpp where a CUDA allocation would. Buffers report
// is_host=false like device memory, so the scheduler copies across as it
// does for a real GPU. Faults (sim_api.h) are armed per process.
//
// Loaded by spillway-worker with ggml_backend_load(), and by llama.cpp's own
// llama-server / llama-bench with GGML_BACKEND_PATH=.../libggml-sim.so.
// Compiled a second time against whisper.cpp's ggml (0.15, whose backend
// interface differs from llama.cpp's 0.23) as libggml-sim-whisper.so, for
// whisper-server (SPILLWAY_SIM_GGML_0_15); both share the ledger files.
#include <ggml-backend-impl.h>
#include <ggml-backend.h>
#include <ggml.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "devices/sim_api.h"
#include "devices/sim_ledger.h"

namespace {

using spillway::devices::LedgerKind;
using spillway::devices::SimLedger;

constexpr size_t kAlignment = 128;

struct SimFaults {
  std::mutex mu;
  int32_t phase = SPILLWAY_SIM_PHASE_NONE;
  bool lost = false;
  int32_t fail_next_phase = 0;
  int64_t fail_after_bytes = -1;
  bool compute_error = false, compute_abort = false, grow_compute = false;
  int64_t hang_ms = 0;
  uint64_t fired = 0, failed = 0;
  std::string last_failure;
};

SimFaults& Faults() {
  static SimFaults f;
  return f;
}

std::atomic<int64_t> g_process_bytes{0};

struct SimDevice {
  int index;
  std::string name, description;
  std::unique_ptr<SimLedger> ledger;
  ggml_backend_buffer_type buft;
  ggml_backend_device dev;
};

struct SimBuffer {
  void* data;
  size_t size;
  SimDevice* device;
};

struct SimBackend {
  SimDevice* device;
  ggml_backend_t cpu;
};

void RecordFailure(const std::string& what) {
  auto& f = Faults();
  ++f.failed;
  f.last_failure = what;
  std::fprintf(stderr, "spillway-sim: %s\n", what.c_str());
}

// --- buffer ---------------------------------------------------------------

void BufferFree(ggml_backend_buffer_t buf) {
  auto* b = static_cast<SimBuffer*>(buf->context);
  std::free(b->data);
  b->device->ledger->Release(LedgerKind::kAlloc, "alloc", b->size);
  g_process_bytes -= static_cast<int64_t>(b->size);
  delete b;
}
void* BufferBase(ggml_backend_buffer_t buf) { return static_cast<SimBuffer*>(buf->context)->data; }
void BufferMemset(ggml_backend_buffer_t, ggml_tensor* t, uint8_t v, size_t off, size_t n) {
  std::memset(static_cast<char*>(t->data) + off, v, n);
}
void BufferSet(ggml_backend_buffer_t, ggml_tensor* t, const void* data, size_t off, size_t n) {
  std::memcpy(static_cast<char*>(t->data) + off, data, n);
}
void BufferGet(ggml_backend_buffer_t, const ggml_tensor* t, void* data, size_t off, size_t n) {
  std::memcpy(data, static_cast<const char*>(t->data) + off, n);
}
bool BufferCpy(ggml_backend_buffer_t, const ggml_tensor* src, ggml_tensor* dst) {
  if (src->buffer && ggml_backend_buffer_is_host(src->buffer)) {
    std::memcpy(dst->data, src->data, ggml_nbytes(src));
    return true;
  }
  return false;
}
void BufferClear(ggml_backend_buffer_t buf, uint8_t v) {
  auto* b = static_cast<SimBuffer*>(buf->context);
  std::memset(b->data, v, b->size);
}

const ggml_backend_buffer_i kBufferIface = {
    /* free_buffer   */ BufferFree,
    /* get_base      */ BufferBase,
    /* init_tensor   */ nullptr,
    /* memset_tensor */ BufferMemset,
    /* set_tensor    */ BufferSet,
    /* get_tensor    */ BufferGet,
    /* set_tensor_2d */ nullptr,
    /* get_tensor_2d */ nullptr,
    /* cpy_tensor    */ BufferCpy,
    /* clear         */ BufferClear,
    /* reset         */ nullptr,
};

// --- buffer type ----------------------------------------------------------

const char* BuftName(ggml_backend_buffer_type_t buft) { return static_cast<SimDevice*>(buft->context)->name.c_str(); }

ggml_backend_buffer_t BuftAlloc(ggml_backend_buffer_type_t buft, size_t size) {
  auto* d = static_cast<SimDevice*>(buft->context);
  const size_t bytes = std::max<size_t>(size, 1);
  const double mib = static_cast<double>(bytes) / (1 << 20);
  {
    auto& f = Faults();
    std::lock_guard<std::mutex> lk(f.mu);
    char msg[200];
    if (f.lost) {
      std::snprintf(msg, sizeof msg, "%s: allocation of %.2f MiB failed: device lost", d->name.c_str(), mib);
      RecordFailure(msg);
      return nullptr;
    }
    if (f.fail_next_phase != 0 && f.fail_next_phase == f.phase) {
      f.fail_next_phase = 0;
      f.grow_compute = false;
      ++f.fired;
      std::snprintf(msg, sizeof msg, "%s: allocation of %.2f MiB failed: injected fault (phase %d)", d->name.c_str(),
                    mib, f.phase);
      RecordFailure(msg);
      return nullptr;
    }
    if (f.fail_after_bytes >= 0 && g_process_bytes + static_cast<int64_t>(bytes) > f.fail_after_bytes) {
      ++f.fired;
      std::snprintf(msg, sizeof msg, "%s: allocation of %.2f MiB failed: injected limit of %lld bytes",
                    d->name.c_str(), mib, static_cast<long long>(f.fail_after_bytes));
      RecordFailure(msg);
      return nullptr;
    }
  }
  if (!d->ledger->Reserve(LedgerKind::kAlloc, "alloc", bytes)) {
    auto snap = d->ledger->Snapshot();
    char msg[200];
    std::snprintf(msg, sizeof msg, "%s: out of memory: allocation of %.2f MiB failed, %.2f MiB free of %.2f MiB",
                  d->name.c_str(), mib, static_cast<double>(snap.free()) / (1 << 20),
                  static_cast<double>(snap.capacity) / (1 << 20));
    std::lock_guard<std::mutex> lk(Faults().mu);
    RecordFailure(msg);
    return nullptr;
  }
  void* data = std::aligned_alloc(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
  if (!data) {
    d->ledger->Release(LedgerKind::kAlloc, "alloc", bytes);
    return nullptr;
  }
  g_process_bytes += static_cast<int64_t>(bytes);
  return ggml_backend_buffer_init(buft, kBufferIface, new SimBuffer{data, bytes, d}, size);
}

size_t BuftAlignment(ggml_backend_buffer_type_t) { return kAlignment; }

// While a compute-growth fault is armed, the results of the ops whose
// allocation ggml allows to expand (matrix products, flash attention: CUDA
// pads these) claim twice their size, so the graph allocator must allocate
// larger compute buffers at the next graph, as when a batch shape or a
// re-reservation needs more than was reserved.
#ifdef SPILLWAY_SIM_GGML_0_15
// ggml 0.15 has no ggml_op_alloc_size_may_expand: the ops 0.23's names.
bool MayExpand(ggml_op op) {
  return op == GGML_OP_FLASH_ATTN_EXT || op == GGML_OP_MUL_MAT || op == GGML_OP_MUL_MAT_ID || op == GGML_OP_CUMSUM ||
         op == GGML_OP_ARGSORT || op == GGML_OP_TOP_K;
}
#else
bool MayExpand(ggml_op op) { return ggml_op_alloc_size_may_expand(op); }
#endif

size_t BuftAllocSize(ggml_backend_buffer_type_t, const ggml_tensor* t) {
  const size_t n = ggml_nbytes(t);
  if (!MayExpand(t->op)) return n;
  auto& f = Faults();
  std::lock_guard<std::mutex> lk(f.mu);
  return f.grow_compute && f.phase == SPILLWAY_SIM_PHASE_COMPUTE ? n * 2 : n;
}

bool BuftIsHost(ggml_backend_buffer_type_t) { return false; }

// --- backend --------------------------------------------------------------

const char* BackendName(ggml_backend_t b) { return static_cast<SimBackend*>(b->context)->device->name.c_str(); }
void BackendFree(ggml_backend_t b) {
  auto* s = static_cast<SimBackend*>(b->context);
  ggml_backend_free(s->cpu);
  delete s;
  delete b;
}
void BackendSync(ggml_backend_t) {}

ggml_status BackendCompute(ggml_backend_t b, ggml_cgraph* graph) {
  auto* s = static_cast<SimBackend*>(b->context);
  int64_t hang = 0;
  {
    auto& f = Faults();
    std::lock_guard<std::mutex> lk(f.mu);
    if (f.lost) return GGML_STATUS_FAILED;
    if (f.compute_abort) {
      std::fprintf(stderr, "spillway-sim: %s: injected fatal error in the device memory pool; aborting\n",
                   s->device->name.c_str());
      std::fflush(stderr);
      std::abort();
    }
    if (f.fail_next_phase == SPILLWAY_SIM_PHASE_COMPUTE) {
      // The armed compute allocation did not happen while reserving (llama.cpp
      // reuses graphs): fail the scratch allocation a device's memory pool
      // makes while computing, as an allocation error.
      f.fail_next_phase = 0;
      f.grow_compute = false;
      ++f.fired;
      RecordFailure(s->device->name + ": memory pool allocation failed during compute: injected fault");
      return GGML_STATUS_ALLOC_FAILED;
    }
    if (f.compute_error) {
      f.compute_error = false;
      ++f.fired;
      RecordFailure(s->device->name + ": injected compute error");
      return GGML_STATUS_FAILED;
    }
    hang = f.hang_ms;
    f.hang_ms = 0;
    if (hang) ++f.fired;
  }
  if (hang > 0) std::this_thread::sleep_for(std::chrono::milliseconds(hang));
  return ggml_backend_graph_compute(s->cpu, graph);
}

const ggml_backend_i kBackendIface = {
    /* get_name            */ BackendName,
    /* free                */ BackendFree,
    /* set_tensor_async    */ nullptr,
    /* get_tensor_async    */ nullptr,
    /* set_tensor_2d_async */ nullptr,
    /* get_tensor_2d_async */ nullptr,
    /* cpy_tensor_async    */ nullptr,
    /* synchronize         */ BackendSync,
    /* graph_plan_create   */ nullptr,
    /* graph_plan_free     */ nullptr,
    /* graph_plan_update   */ nullptr,
    /* graph_plan_compute  */ nullptr,
    /* graph_compute       */ BackendCompute,
    /* event_record        */ nullptr,
    /* event_wait          */ nullptr,
    /* graph_optimize      */ nullptr,
};

ggml_guid_t SimGuid() {
  static ggml_guid guid = {0x53, 0x70, 0x69, 0x6c, 0x6c, 0x77, 0x61, 0x79, 0x2d, 0x73, 0x69, 0x6d, 0x2d, 0x30, 0x30, 0x31};
  return &guid;
}

// --- device ---------------------------------------------------------------

SimDevice* Dev(ggml_backend_dev_t dev) { return static_cast<SimDevice*>(dev->context); }
const char* DevName(ggml_backend_dev_t dev) { return Dev(dev)->name.c_str(); }
const char* DevDescription(ggml_backend_dev_t dev) { return Dev(dev)->description.c_str(); }
void DevMemory(ggml_backend_dev_t dev, size_t* free, size_t* total) {
  auto snap = Dev(dev)->ledger->Snapshot();
  *total = snap.capacity;
  bool lost;
  {
    std::lock_guard<std::mutex> lk(Faults().mu);
    lost = Faults().lost;
  }
  *free = lost ? 0 : snap.free();
}
enum ggml_backend_dev_type DevType(ggml_backend_dev_t) { return GGML_BACKEND_DEVICE_TYPE_GPU; }
void DevProps(ggml_backend_dev_t dev, ggml_backend_dev_props* p) {
  p->name = DevName(dev);
  p->description = DevDescription(dev);
  DevMemory(dev, &p->memory_free, &p->memory_total);
  p->type = GGML_BACKEND_DEVICE_TYPE_GPU;
  p->device_id = nullptr;
  p->caps = {};  // no async, host buffer, buffer from a host pointer, events (nor mmap, where ggml has it)
}

ggml_backend_dev_t CpuDevice() { return ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU); }

ggml_backend_t DevInit(ggml_backend_dev_t dev, const char*) {
  ggml_backend_dev_t cpu_dev = CpuDevice();
  if (!cpu_dev) {
    std::fprintf(stderr, "spillway-sim: the CPU backend must be loaded first\n");
    return nullptr;
  }
  ggml_backend_t cpu = ggml_backend_dev_init(cpu_dev, nullptr);
  if (!cpu) return nullptr;
  return new ggml_backend{SimGuid(), kBackendIface, dev, new SimBackend{Dev(dev), cpu}};
}
ggml_backend_buffer_type_t DevBuft(ggml_backend_dev_t dev) { return &Dev(dev)->buft; }
bool DevSupportsOp(ggml_backend_dev_t, const ggml_tensor* op) {
  ggml_backend_dev_t cpu = CpuDevice();
  return cpu && ggml_backend_dev_supports_op(cpu, op);
}
bool DevSupportsBuft(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft) { return buft == &Dev(dev)->buft; }
// false: true makes large prompt batches split the graph and reserve an extra
// compute buffer even with no layers on the device (probed).
bool DevOffloadOp(ggml_backend_dev_t, const ggml_tensor*) { return false; }

const ggml_backend_device_i kDeviceIface = {
    /* get_name             */ DevName,
    /* get_description      */ DevDescription,
    /* get_memory           */ DevMemory,
    /* get_type             */ DevType,
    /* get_props            */ DevProps,
    /* init_backend         */ DevInit,
    /* get_buffer_type      */ DevBuft,
    /* get_host_buffer_type */ nullptr,
    /* buffer_from_host_ptr */ nullptr,
    /* supports_op          */ DevSupportsOp,
    /* supports_buft        */ DevSupportsBuft,
    /* offload_op           */ DevOffloadOp,
    /* event_new            */ nullptr,
    /* event_free           */ nullptr,
    /* event_synchronize    */ nullptr,
};

// --- registry and control -------------------------------------------------

struct SimRegistry {
  std::vector<std::unique_ptr<SimDevice>> devices;
  ggml_backend_reg reg;
};

SimRegistry& Registry();

const char* RegName(ggml_backend_reg_t) { return "SIM"; }
size_t RegCount(ggml_backend_reg_t) { return Registry().devices.size(); }
ggml_backend_dev_t RegDevice(ggml_backend_reg_t, size_t i) {
  auto& r = Registry();
  return i < r.devices.size() ? &r.devices[i]->dev : nullptr;
}

void SetNThreads(ggml_backend_t backend, int n) {
  auto* s = static_cast<SimBackend*>(backend->context);
  ggml_backend_reg_t cpu_reg = ggml_backend_dev_backend_reg(CpuDevice());
  auto fn = reinterpret_cast<void (*)(ggml_backend_t, int)>(
      ggml_backend_reg_get_proc_address(cpu_reg, "ggml_backend_set_n_threads"));
  if (fn) fn(s->cpu, n);
}

void SetPhase(int32_t phase) {
  std::lock_guard<std::mutex> lk(Faults().mu);
  Faults().phase = phase;
}

void Arm(int32_t fault, int64_t arg) {
  auto& f = Faults();
  std::lock_guard<std::mutex> lk(f.mu);
  switch (fault) {
    case SPILLWAY_SIM_CLEAR:
      f.fail_next_phase = 0;
      f.fail_after_bytes = -1;
      f.compute_error = f.compute_abort = f.grow_compute = false;
      f.hang_ms = 0;
      break;
    case SPILLWAY_SIM_FAIL_NEXT_ALLOC: f.fail_next_phase = static_cast<int32_t>(arg); break;
    case SPILLWAY_SIM_FAIL_AFTER_BYTES: f.fail_after_bytes = arg; break;
    case SPILLWAY_SIM_COMPUTE_ERROR: f.compute_error = true; break;
    case SPILLWAY_SIM_COMPUTE_ABORT: f.compute_abort = true; break;
    case SPILLWAY_SIM_HANG_MS: f.hang_ms = arg; break;
    case SPILLWAY_SIM_LOSE_DEVICE:
      f.lost = true;
      ++f.fired;
      f.last_failure = "device lost";
      break;
    case SPILLWAY_SIM_GROW_COMPUTE: f.grow_compute = true; break;
    default: break;
  }
}

void GetState(spillway_sim_state* out) {
  auto& f = Faults();
  std::lock_guard<std::mutex> lk(f.mu);
  std::memset(out, 0, sizeof *out);
  out->lost = f.lost;
  out->phase = f.phase;
  out->process_bytes = g_process_bytes.load();
  out->fail_after_bytes = f.fail_after_bytes;
  out->fail_next_phase = f.fail_next_phase;
  out->compute_error = f.compute_error;
  out->compute_abort = f.compute_abort;
  out->grow_compute = f.grow_compute;
  out->hang_ms = f.hang_ms;
  out->faults_fired = f.fired;
  out->allocations_failed = f.failed;
  std::strncpy(out->last_failure, f.last_failure.c_str(), sizeof out->last_failure - 1);
}

void* RegProc(ggml_backend_reg_t, const char* name) {
  const std::string n = name;
  if (n == "ggml_backend_set_n_threads") return reinterpret_cast<void*>(&SetNThreads);
  if (n == "spillway_sim_set_phase") return reinterpret_cast<void*>(&SetPhase);
  if (n == "spillway_sim_arm") return reinterpret_cast<void*>(&Arm);
  if (n == "spillway_sim_get_state") return reinterpret_cast<void*>(&GetState);
  return nullptr;
}

const ggml_backend_reg_i kRegIface = {RegName, RegCount, RegDevice, RegProc};

SimRegistry& Registry() {
  static SimRegistry* r = [] {
    auto* reg = new SimRegistry();
    reg->reg = {GGML_BACKEND_API_VERSION, kRegIface, reg};
    // One device per ledger that exists now ($SPILLWAY_SIM_DIR or /dev/shm/spillway-<uid>).
    for (int index : SimLedger::List()) {
      auto ledger = SimLedger::Open(index);
      if (!ledger.ok()) continue;
      auto d = std::make_unique<SimDevice>();
      d->index = index;
      d->name = "SIM" + std::to_string(index);
      d->description = "Spillway simulated accelerator sim:" + std::to_string(index) + " (" +
                       SimLedger::PathFor(index) + ")";
      d->ledger = std::move(*ledger);
      d->buft = {{BuftName, BuftAlloc, BuftAlignment, nullptr, BuftAllocSize, BuftIsHost}, &d->dev, d.get()};
      d->dev = {kDeviceIface, &reg->reg, d.get()};
      reg->devices.push_back(std::move(d));
    }
    return reg;
  }();
  return *r;
}

ggml_backend_reg_t SimReg() { return &Registry().reg; }

}  // namespace

extern "C" {
__attribute__((visibility("default"))) ggml_backend_reg_t ggml_backend_init(void) { return SimReg(); }
__attribute__((visibility("default"))) int ggml_backend_score(void) { return 1; }
}
