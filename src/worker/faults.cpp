#include "worker/faults.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace spillway::worker {

using nlohmann::json;

namespace {

bool ParseInt(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno || *end || v < 0) return false;
  *out = v;
  return true;
}

bool ParseSeconds(const std::string& s, int64_t* ms) {
  if (s.empty()) return false;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (*end || !(v >= 0) || v > 86400) return false;
  *ms = static_cast<int64_t>(v * 1000);
  return true;
}

}  // namespace

void FaultInjector::Log(const std::string& what) {
  std::fprintf(stderr, "spillway-worker: fault %s\n", what.c_str());
  std::lock_guard<std::mutex> lk(mu_);
  const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::system_clock::now().time_since_epoch()).count();
  history_.push_back({{"unix_ms", now}, {"event", what}});
  if (history_.size() > 100) history_.erase(history_.begin());
}

StatusOr<FaultSpec> ParseFault(const std::string& spec) {
  const auto eq = spec.find('=');
  const std::string name = spec.substr(0, eq);
  const std::string arg = eq == std::string::npos ? "" : spec.substr(eq + 1);
  const bool has_arg = eq != std::string::npos;
  FaultSpec f{FaultSpec::kClear};
  if (name == "fail-next") {
    f.kind = FaultSpec::kFailNext;
    if (arg == "load") f.arg = SPILLWAY_SIM_PHASE_LOAD;
    else if (arg == "kv") f.arg = SPILLWAY_SIM_PHASE_KV;
    else if (arg == "compute" || arg == "reserve") {
      f.arg = SPILLWAY_SIM_PHASE_COMPUTE;
      f.via_reserve = arg == "reserve";
    } else {
      return Status::InvalidArgument("fail-next needs load, kv, compute or reserve");
    }
  } else if (name == "fail-after-bytes") {
    f.kind = FaultSpec::kFailAfterBytes;
    if (!ParseInt(arg, &f.arg)) return Status::InvalidArgument("fail-after-bytes needs a byte count");
  } else if (name == "hang") {
    f.kind = FaultSpec::kHang;
    if (!ParseSeconds(arg, &f.arg)) return Status::InvalidArgument("hang needs seconds in [0, 86400]");
  } else if (name == "slow-load") {
    f.kind = FaultSpec::kSlowLoad;
    if (!ParseSeconds(arg, &f.arg)) return Status::InvalidArgument("slow-load needs seconds in [0, 86400]");
  } else if (name == "lose-at-token") {
    f.kind = FaultSpec::kLoseAtToken;
    if (!ParseInt(arg, &f.arg) || f.arg < 1) return Status::InvalidArgument("lose-at-token needs a token count >= 1");
  } else if (!has_arg && name == "kv-full") {
    f.kind = FaultSpec::kKvFull;
  } else if (!has_arg && name == "compute-error") {
    f.kind = FaultSpec::kComputeError;
  } else if (!has_arg && name == "compute-abort") {
    f.kind = FaultSpec::kComputeAbort;
  } else if (!has_arg && name == "lose-device") {
    f.kind = FaultSpec::kLoseDevice;
  } else if (!has_arg && name == "clear") {
    f.kind = FaultSpec::kClear;
  } else {
    return Status::InvalidArgument("unknown fault '" + spec +
                                   "' (fail-next=, fail-after-bytes=, kv-full, compute-error, compute-abort, hang=, "
                                   "lose-at-token=, lose-device, slow-load=, clear)");
  }
  return f;
}

Status FaultInjector::Arm(const std::string& spec) {
  auto f = ParseFault(spec);
  if (!f.ok()) return f.status();
  if (f->kind == FaultSpec::kSlowLoad) {  // any device: it only stretches the load
    slow_load_ms_ = f->arg;
    Log("armed " + spec);
    return Status::Ok();
  }
  if (!sim_) return Status::InvalidArgument("fault '" + spec + "' needs a sim device (--device sim:N)");
  switch (f->kind) {
    case FaultSpec::kFailNext:
      if (f->arg == SPILLWAY_SIM_PHASE_COMPUTE) sim_->Arm(SPILLWAY_SIM_GROW_COMPUTE);
      sim_->Arm(SPILLWAY_SIM_FAIL_NEXT_ALLOC, f->arg);
      if (f->via_reserve) force_reserve_ = true;
      break;
    case FaultSpec::kFailAfterBytes: sim_->Arm(SPILLWAY_SIM_FAIL_AFTER_BYTES, f->arg); break;
    case FaultSpec::kKvFull: kv_full_ = true; break;
    case FaultSpec::kComputeError: sim_->Arm(SPILLWAY_SIM_COMPUTE_ERROR); break;
    case FaultSpec::kComputeAbort: sim_->Arm(SPILLWAY_SIM_COMPUTE_ABORT); break;
    case FaultSpec::kHang: sim_->Arm(SPILLWAY_SIM_HANG_MS, f->arg); break;
    case FaultSpec::kLoseAtToken: lose_at_token_ = f->arg; break;
    case FaultSpec::kLoseDevice: sim_->Arm(SPILLWAY_SIM_LOSE_DEVICE); break;
    case FaultSpec::kSlowLoad: break;  // above
    case FaultSpec::kClear:
      sim_->Arm(SPILLWAY_SIM_CLEAR);
      lose_at_token_ = -1;
      kv_full_ = false;
      slow_load_ms_ = 0;
      force_reserve_ = false;
      break;
  }
  Log("armed " + spec);
  return Status::Ok();
}

Status FaultInjector::ArmAll(const std::string& list) {
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t end = list.find_first_of(";,", pos);
    if (end == std::string::npos) end = list.size();
    std::string spec = list.substr(pos, end - pos);
    while (!spec.empty() && spec.front() == ' ') spec.erase(0, 1);
    while (!spec.empty() && spec.back() == ' ') spec.pop_back();
    if (!spec.empty()) SPILLWAY_RETURN_IF_ERROR(Arm(spec));
    pos = end + 1;
  }
  return Status::Ok();
}

bool FaultInjector::TakeKvFull() {
  if (!kv_full_.exchange(false)) return false;
  ++fired_;
  Log("fired kv-full: no room in the KV cache");
  return true;
}

void FaultInjector::OnToken() {
  int64_t left = lose_at_token_.load();
  if (left < 0) return;
  if (left <= 1) {
    lose_at_token_ = -1;
    if (sim_) sim_->Arm(SPILLWAY_SIM_LOSE_DEVICE);
    Log("fired lose-at-token: device lost");
    return;
  }
  lose_at_token_ = left - 1;
}

json FaultInjector::ToJson() const {
  json j = {{"sim", sim_ != nullptr}};
  if (sim_) {
    auto s = sim_->State();
    j["device_lost"] = s.lost != 0;
    j["armed"] = {{"fail_next_phase", s.fail_next_phase},
                  {"fail_after_bytes", s.fail_after_bytes},
                  {"compute_error", s.compute_error != 0},
                  {"compute_abort", s.compute_abort != 0},
                  {"grow_compute", s.grow_compute != 0},
                  {"hang_ms", s.hang_ms},
                  {"lose_at_token", lose_at_token_.load()},
                  {"kv_full", kv_full_.load()}};
    j["faults_fired"] = s.faults_fired + fired_.load();
    j["allocations_failed"] = s.allocations_failed;
    j["last_failure"] = s.last_failure;
    j["device_bytes"] = s.process_bytes;
  }
  std::lock_guard<std::mutex> lk(mu_);
  j["history"] = history_;
  return j;
}

}  // namespace spillway::worker
