#include "worker/sim_control.h"

#include <ggml-backend.h>

namespace spillway::worker {

std::unique_ptr<SimControl> SimControl::Find() {
  ggml_backend_reg_t reg = ggml_backend_reg_by_name("SIM");
  if (!reg) return nullptr;
  auto c = std::make_unique<SimControl>();
  c->set_phase_ = reinterpret_cast<spillway_sim_set_phase_t>(ggml_backend_reg_get_proc_address(reg, "spillway_sim_set_phase"));
  c->arm_ = reinterpret_cast<spillway_sim_arm_t>(ggml_backend_reg_get_proc_address(reg, "spillway_sim_arm"));
  c->get_state_ = reinterpret_cast<spillway_sim_get_state_t>(ggml_backend_reg_get_proc_address(reg, "spillway_sim_get_state"));
  if (!c->set_phase_ || !c->arm_ || !c->get_state_) return nullptr;
  return c;
}

spillway_sim_state SimControl::State() const {
  spillway_sim_state s{};
  get_state_(&s);
  return s;
}

}  // namespace spillway::worker
