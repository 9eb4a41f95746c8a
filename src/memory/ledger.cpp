#include "memory/ledger.h"

#include <algorithm>

namespace spillway::memory {

uint64_t Headroom::For(uint64_t capacity) const {
  const double pct = std::clamp(percent, 0.0, 100.0) / 100.0 * static_cast<double>(capacity);
  return std::min(capacity, std::max(absolute, static_cast<uint64_t>(pct)));
}

DeviceLedger::DeviceLedger(std::string device, uint64_t capacity, Headroom headroom)
    : device_(std::move(device)), capacity_(capacity), headroom_(headroom) {}

void DeviceLedger::Observe(uint64_t free_bytes, uint64_t reading_seq) {
  observed_free_ = free_bytes;
  observed_seq_ = std::max(observed_seq_, reading_seq);
}

uint64_t DeviceLedger::reserved() const {
  uint64_t total = 0;
  for (const auto& [k, r] : reservations_) total += r.bytes;
  return total;
}

uint64_t DeviceLedger::in_flight() const {
  uint64_t total = 0;
  for (const auto& [k, r] : reservations_) {
    if (r.made_at_seq >= observed_seq_) total += r.bytes;
  }
  return total;
}

uint64_t DeviceLedger::Available() const {
  const uint64_t h = headroom();
  const uint64_t used = reserved();
  const uint64_t by_prediction = capacity_ > h + used ? capacity_ - h - used : 0;
  if (!observed_free_) return by_prediction;
  const uint64_t pending = in_flight() + h;
  const uint64_t by_observation = *observed_free_ > pending ? *observed_free_ - pending : 0;
  return std::min(by_prediction, by_observation);
}

Status DeviceLedger::Reserve(const std::string& key, uint64_t bytes, uint64_t reading_seq) {
  // A new reservation for the same key replaces the old one.
  auto old = reservations_.find(key);
  std::optional<Reservation> saved;
  if (old != reservations_.end()) {
    saved = old->second;
    reservations_.erase(old);
  }
  const uint64_t avail = Available();
  if (bytes > avail) {
    if (saved) reservations_[key] = *saved;
    const uint64_t mib = 1 << 20;
    return Status::ResourceExhausted(
        device_ + ": " + key + " needs " + std::to_string(bytes / mib) + " MiB, " + std::to_string(avail / mib) +
        " MiB available (capacity " + std::to_string(capacity_ / mib) + ", headroom " + std::to_string(headroom() / mib) +
        ", reserved " + std::to_string(reserved() / mib) +
        (observed_free_ ? ", observed free " + std::to_string(*observed_free_ / mib) : std::string()) + ")");
  }
  reservations_[key] = {bytes, reading_seq};
  return Status::Ok();
}

void DeviceLedger::Release(const std::string& key) { reservations_.erase(key); }

bool CellPool::Reserve(const std::string& id, uint32_t cells) {
  if (by_request_.count(id)) return true;  // already holds its cells
  if (cells > request_capacity()) return false;
  if (per_slot_) cells = per_slot_;  // a slot's stream is its own, whole
  if (cells > free()) return false;
  by_request_[id] = cells;
  reserved_ += cells;
  return true;
}

void CellPool::Release(const std::string& id) {
  auto it = by_request_.find(id);
  if (it == by_request_.end()) return;
  reserved_ -= it->second;
  by_request_.erase(it);
}

}  // namespace spillway::memory
