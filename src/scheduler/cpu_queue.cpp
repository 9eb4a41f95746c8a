#include "scheduler/cpu_queue.h"

#include <algorithm>
#include <cmath>

namespace spillway::scheduler {

uint64_t CpuQueue::Resident() const {
  uint64_t sum = 0;
  for (const auto& [_, b] : resident_) sum += b;
  return sum;
}

uint64_t CpuQueue::RunningBytes() const {
  uint64_t sum = 0;
  for (const auto& [_, b] : running_) sum += b;
  return sum;
}

uint64_t CpuQueue::Resident(const std::string& replica) const {
  auto it = resident_.find(replica);
  return it == resident_.end() ? 0 : it->second;
}

void CpuQueue::SetResident(const std::string& replica, uint64_t bytes) {
  if (bytes == 0) resident_.erase(replica);
  else resident_[replica] = bytes;
  peak_ = std::max(peak_, Resident() + RunningBytes());
}

CpuQueue::JoinResult CpuQueue::Join(const std::string& id, uint64_t bytes, bool past_bound) {
  if (Running(id)) return JoinResult::kQueued;
  if (auto w = std::find_if(waiting_.begin(), waiting_.end(), [&](const Waiter& x) { return x.id == id; });
      w != waiting_.end()) {
    // The replicas grew since it joined (one loaded, its RSS rose): one that
    // no longer fits even with nothing running would never start, and as
    // the head it held the whole line for good. It leaves, refused.
    if (opts_.ram_budget_bytes && Resident() + w->bytes > opts_.ram_budget_bytes) {
      waiting_.erase(w);
      CountRefusal(id, &rejected_budget_);
      return JoinResult::kOverBudget;
    }
    return JoinResult::kQueued;
  }
  if (opts_.ram_budget_bytes && Resident() + bytes > opts_.ram_budget_bytes) {
    CountRefusal(id, &rejected_budget_);
    return JoinResult::kOverBudget;
  }
  // (One that would start at once does not wait: max_queue = 0, "never
  // wait", still lets the path run.)
  const bool starts_now = waiting_.empty() && static_cast<int>(running_.size()) < opts_.concurrency;
  if (waiting_.size() >= opts_.max_waiting && !starts_now && !past_bound) {
    CountRefusal(id, &rejected_full_);
    return JoinResult::kFull;
  }
  waiting_.push_back({id, bytes, clock_->NowMs()});
  return JoinResult::kQueued;
}

bool CpuQueue::MayStart(const std::string& id) const {
  if (Running(id)) return true;
  if (waiting_.empty() || waiting_.front().id != id) return false;
  if (static_cast<int>(running_.size()) >= opts_.concurrency) return false;
  return !opts_.ram_budget_bytes || Resident() + RunningBytes() + waiting_.front().bytes <= opts_.ram_budget_bytes;
}

CpuQueue::StartResult CpuQueue::TryStart(const std::string& id, uint64_t host_available) {
  if (Running(id)) return StartResult::kStart;
  if (!MayStart(id)) return StartResult::kWait;
  const Waiter& w = waiting_.front();
  if (host_available != kUnknown && w.bytes > host_available) {
    CountRefusal(id, &rejected_host_);
    waiting_.pop_front();
    return StartResult::kHostLow;
  }
  running_[w.id] = w.bytes;
  waiting_.pop_front();
  ++started_;
  peak_ = std::max(peak_, Resident() + RunningBytes());
  return StartResult::kStart;
}

void CpuQueue::CountRefusal(const std::string& id, uint64_t* counter) {
  if (refused_.size() >= kMaxRefusedIds) refused_.clear();
  if (refused_.insert(id).second) ++*counter;
}

bool CpuQueue::Leave(const std::string& id) {
  const size_t before = running_.size() + waiting_.size();
  running_.erase(id);
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), [&](const Waiter& w) { return w.id == id; }),
                 waiting_.end());
  return running_.size() + waiting_.size() < before;
}

bool CpuQueue::Waiting(const std::string& id) const {
  return std::any_of(waiting_.begin(), waiting_.end(), [&](const Waiter& w) { return w.id == id; });
}

size_t CpuQueue::Position(const std::string& id) const {
  for (size_t i = 0; i < waiting_.size(); ++i) {
    if (waiting_[i].id == id) return i + 1;
  }
  return 0;
}

double CpuQueue::EstimatedWaitS(const std::string& id, double per_request_s) const {
  return WaitS(running_.size(), Position(id), opts_.concurrency, per_request_s);
}

double CpuQueue::WaitS(size_t running, size_t position, int concurrency, double per_request_s) {
  if (position == 0) return 0;
  // Everyone ahead (running and waiting) finishes `concurrency` at a time.
  const size_t ahead = running + position - 1;
  const size_t lanes = static_cast<size_t>(std::max(1, concurrency));
  if (ahead < lanes) return 0;
  return std::ceil(static_cast<double>(ahead - lanes + 1) / lanes) * per_request_s;
}

CpuQueueStats CpuQueue::stats() const {
  CpuQueueStats s;
  s.waiting = waiting_.size();
  s.running = running_.size();
  s.resident_bytes = Resident();
  s.running_bytes = RunningBytes();
  s.peak_bytes = peak_;
  s.oldest_wait_ms = waiting_.empty() ? 0 : clock_->NowMs() - waiting_.front().since_ms;
  s.rejected_full = rejected_full_;
  s.rejected_budget = rejected_budget_;
  s.rejected_host = rejected_host_;
  s.started = started_;
  return s;
}

}  // namespace spillway::scheduler
