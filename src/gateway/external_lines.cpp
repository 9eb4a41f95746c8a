#include "gateway/external_lines.h"

#include <algorithm>

namespace spillway::gateway {

ExternalLines::ExternalLines(const std::vector<config::ExternalConfig>& services, int64_t now_ms) {
  for (const auto& s : services) {
    Line& l = lines_[s.name];
    l.concurrency = s.concurrency;
    l.max_queue = static_cast<size_t>(s.max_queue);
    l.last_used_ms = now_ms;
    l.device = s.device;
  }
}

bool ExternalLines::Join(const std::string& service, const std::string& id, bool past_bound) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = lines_.find(service);
  if (it == lines_.end()) return false;
  Line& l = it->second;
  // A request that can run at once never counts against max_queue, nor do
  // those ahead of it that will take the free places (joined, not started
  // yet: their Accept is being committed). Only who waits beyond them does.
  const size_t free = l.free_places();
  const size_t waits_ahead = l.waiting.size() > free ? l.waiting.size() - free : 0;
  const bool runs_now = l.waiting.size() < free;
  if (!past_bound && !runs_now && waits_ahead >= l.max_queue) return false;
  l.waiting.push_back(id);
  return true;
}

bool ExternalLines::TryStart(const std::string& service, const std::string& id, int64_t now_ms,
                             const std::function<bool()>& up) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = lines_.find(service);
  if (it == lines_.end()) return false;
  Line& l = it->second;
  // Among the first as many as there are free places: one ahead of it that
  // is still being committed does not hold it back.
  const auto end = l.waiting.begin() + static_cast<std::ptrdiff_t>(std::min(l.free_places(), l.waiting.size()));
  const auto place = std::find(l.waiting.begin(), end, id);
  if (place == end) return false;
  if (up && !up()) return false;
  l.waiting.erase(place);
  ++l.running;
  l.last_used_ms = now_ms;
  return true;
}

void ExternalLines::Leave(const std::string& service, const std::string& id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = lines_.find(service);
  if (it == lines_.end()) return;
  auto& w = it->second.waiting;
  auto last = std::find(w.rbegin(), w.rend(), id);
  if (last != w.rend()) w.erase(std::next(last).base());
}

bool ExternalLines::BeginRoomCheck(const std::string& service) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = lines_.find(service);
  if (it == lines_.end()) return true;
  return checking_devices_.emplace(it->second.device, service).second;
}

void ExternalLines::EndRoomCheck(const std::string& service, bool took) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = lines_.find(service);
  if (it == lines_.end()) return;
  // (Only the check this service began: never another service's on the device.)
  if (auto c = checking_devices_.find(it->second.device); c != checking_devices_.end() && c->second == service) {
    checking_devices_.erase(c);
  }
  if (took) ++it->second.room_takers;
}

bool ExternalLines::BeginDeviceCheck(const std::string& device, const std::string& who) {
  std::lock_guard<std::mutex> lk(mu_);
  return checking_devices_.emplace(device, who).second;
}

void ExternalLines::EndDeviceCheck(const std::string& device, const std::string& who) {
  std::lock_guard<std::mutex> lk(mu_);
  if (auto c = checking_devices_.find(device); c != checking_devices_.end() && c->second == who) checking_devices_.erase(c);
}

std::vector<std::pair<std::string, int>> ExternalLines::RoomTakersOn(const std::string& device) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<std::pair<std::string, int>> out;
  for (const auto& [name, l] : lines_) {
    if (l.device == device && l.room_takers > 0) out.emplace_back(name, l.room_takers);
  }
  return out;
}

int ExternalLines::RoomTakers(const std::string& service) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = lines_.find(service);
  return it == lines_.end() ? 0 : it->second.room_takers;
}

void ExternalLines::Finished(const std::string& service, const std::string& outcome, int64_t now_ms, bool took_room) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = lines_.find(service);
  if (it == lines_.end()) return;
  Line& l = it->second;
  l.running = std::max(0, l.running - 1);
  if (took_room) l.room_takers = std::max(0, l.room_takers - 1);
  l.last_used_ms = now_ms;
  ++l.outcomes[outcome];
}

bool ExternalLines::IdleLocked(const std::string& service, int64_t idle_ms, int64_t now_ms, bool evicted) const {
  auto it = lines_.find(service);
  if (it == lines_.end()) return false;
  const Line& l = it->second;
  return l.running == 0 && (evicted || l.waiting.empty()) && now_ms - l.last_used_ms >= idle_ms;
}

bool ExternalLines::Idle(const std::string& service, int64_t idle_ms, int64_t now_ms) const {
  std::lock_guard<std::mutex> lk(mu_);
  return IdleLocked(service, idle_ms, now_ms, /*evicted=*/false);
}

bool ExternalLines::ReleaseIfIdle(const std::string& service, int64_t idle_ms, int64_t now_ms, bool evicted,
                                  const std::function<void()>& release) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!IdleLocked(service, idle_ms, now_ms, evicted)) return false;
  release();
  return true;
}

int ExternalLines::Position(const std::string& service, const std::string& id) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = lines_.find(service);
  if (it == lines_.end()) return 0;
  const auto& w = it->second.waiting;
  auto at = std::find(w.begin(), w.end(), id);
  return at == w.end() ? 0 : static_cast<int>(at - w.begin()) + 1;
}

int ExternalLines::Running(const std::string& service) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = lines_.find(service);
  return it == lines_.end() ? 0 : it->second.running;
}

int ExternalLines::Waiting(const std::string& service) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = lines_.find(service);
  return it == lines_.end() ? 0 : static_cast<int>(it->second.waiting.size());
}

void ExternalLines::Observe(const std::string& service, int64_t pid, uint64_t device_bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = lines_.find(service);
  if (it == lines_.end()) return;
  Line& l = it->second;
  if (pid != l.pid) {  // another process: its resident size is measured again (the peak it had stays)
    l.pid = pid;
    l.resident = 0;
  }
  if (l.running == 0) {
    l.resident = device_bytes;
  } else if (l.resident > 0 && device_bytes > l.resident) {
    // One request's peak: what is above the resident size is the sum of
    // every request sent (those holding a place while they wait for room
    // have allocated nothing). The sum was taken as one request's, and
    // charged again for each one running beside the next.
    const uint64_t sent = static_cast<uint64_t>(std::max(1, l.room_takers > 0 ? l.room_takers : l.running));
    l.peak = std::max(l.peak, (device_bytes - l.resident) / sent);
  }
}

std::pair<uint64_t, uint64_t> ExternalLines::Measured(const std::string& service) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = lines_.find(service);
  if (it == lines_.end()) return {0, 0};
  return {it->second.resident, it->second.peak};
}

void ExternalLines::NoteReach(const std::string& service, bool reached, const std::string& why, int64_t now_ms) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = lines_.find(service);
  if (it == lines_.end()) return;
  Line& l = it->second;
  if (reached) {
    l.unreachable_since = 0;
    l.unreachable_why.clear();
    return;
  }
  if (l.unreachable_since == 0) l.unreachable_since = std::max<int64_t>(1, now_ms);
  l.unreachable_why = why;
}

std::pair<int64_t, std::string> ExternalLines::Unreachable(const std::string& service) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = lines_.find(service);
  if (it == lines_.end()) return {0, ""};
  return {it->second.unreachable_since, it->second.unreachable_why};
}

nlohmann::json ExternalLines::Json(const std::string& service, int64_t now_ms) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = lines_.find(service);
  if (it == lines_.end()) return nlohmann::json::object();
  const Line& l = it->second;
  nlohmann::json j = {{"running", l.running},
                      {"waiting", l.waiting.size()},
                      {"concurrency", l.concurrency},
                      {"max_queue", l.max_queue},
                      {"idle_s", l.running > 0 ? 0.0 : static_cast<double>(now_ms - l.last_used_ms) / 1000}};
  nlohmann::json counts = nlohmann::json::object();
  for (const auto& [k, v] : l.outcomes) counts[k] = v;
  j["finished"] = counts;
  return j;
}

}  // namespace spillway::gateway
