/* Control interface of the simulated accelerator backend (libggml-sim.so).
 *
 * The backend is a ggml backend module; these functions are reached through
 * ggml_backend_reg_get_proc_address(reg, "<name>") on the "SIM" registry, the
 * way llama.cpp reaches ggml_backend_set_n_threads. Fault state is per
 * process: each worker arms faults on its own view of the device. */
#ifndef SPILLWAY_SIM_API_H
#define SPILLWAY_SIM_API_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum spillway_sim_phase {
  SPILLWAY_SIM_PHASE_NONE = 0,
  SPILLWAY_SIM_PHASE_LOAD = 1,    /* weights */
  SPILLWAY_SIM_PHASE_KV = 2,      /* context creation: KV cache and compute buffer reservation */
  SPILLWAY_SIM_PHASE_COMPUTE = 3, /* decoding */
};

enum spillway_sim_fault {
  SPILLWAY_SIM_CLEAR = 0,            /* disarm everything (a lost device stays lost) */
  SPILLWAY_SIM_FAIL_NEXT_ALLOC = 1,  /* arg: phase; the next allocation made in that phase fails */
  SPILLWAY_SIM_FAIL_AFTER_BYTES = 2, /* arg: bytes; allocations beyond this process total fail (-1 = off) */
  SPILLWAY_SIM_COMPUTE_ERROR = 3,    /* the next graph compute returns an error */
  SPILLWAY_SIM_COMPUTE_ABORT = 4,    /* the next graph compute aborts the process (as CUDA pool failures do) */
  SPILLWAY_SIM_HANG_MS = 5,          /* arg: ms; the next graph compute stalls that long */
  SPILLWAY_SIM_LOSE_DEVICE = 6,      /* the device is gone: allocations and computes fail from now on */
  SPILLWAY_SIM_GROW_COMPUTE = 7,     /* compute buffers must grow at the next graph: forces an allocation */
};

struct spillway_sim_state {
  int32_t lost;
  int32_t phase;
  int64_t process_bytes;      /* this process's allocations on the device */
  int64_t fail_after_bytes;   /* -1 = off */
  int32_t fail_next_phase;    /* 0 = off */
  int32_t compute_error;
  int32_t compute_abort;
  int32_t grow_compute;
  int64_t hang_ms;
  uint64_t faults_fired;
  uint64_t allocations_failed;
  char last_failure[256];
};

typedef void (*spillway_sim_set_phase_t)(int32_t phase);
typedef void (*spillway_sim_arm_t)(int32_t fault, int64_t arg);
typedef void (*spillway_sim_get_state_t)(struct spillway_sim_state* out);

#ifdef __cplusplus
}
#endif

#endif
