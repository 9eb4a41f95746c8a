// The worker's handle on the simulated device's control functions (see
// devices/sim_api.h), looked up in the loaded SIM backend. Absent (null) when
// the placement is not on a sim device.
#pragma once

#include <memory>
#include <string>

#include "devices/sim_api.h"

namespace spillway::worker {

class SimControl {
 public:
  // Returns null when no SIM backend is loaded.
  static std::unique_ptr<SimControl> Find();

  void SetPhase(spillway_sim_phase phase) const { set_phase_(phase); }
  void Arm(spillway_sim_fault fault, int64_t arg = 0) const { arm_(fault, arg); }
  spillway_sim_state State() const;
  bool lost() const { return State().lost != 0; }

 private:
  spillway_sim_set_phase_t set_phase_ = nullptr;
  spillway_sim_arm_t arm_ = nullptr;
  spillway_sim_get_state_t get_state_ = nullptr;
};

}  // namespace spillway::worker
