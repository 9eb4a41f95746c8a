#include "worker/load_progress.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "common/private_files.h"

namespace spillway::worker {

LoadProgressFile::LoadProgressFile(std::string path, uint64_t total_bytes, int64_t min_load_ms)
    : path_(std::move(path)), total_(total_bytes), min_load_ms_(min_load_ms) {
  Report(0);
}

void LoadProgressFile::Report(float fraction) {
  fraction = std::clamp(fraction, 0.0f, 1.0f);
  if (min_load_ms_ > 0 && fraction > last_fraction_) {
    const auto ms = static_cast<int64_t>(static_cast<double>(min_load_ms_) * (fraction - last_fraction_));
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
  last_fraction_ = std::max(last_fraction_, fraction);
  const int permille = static_cast<int>(fraction * 1000);
  // At most one write per percent (and the last one): a large model calls
  // this once per tensor, thousands of times.
  if (path_.empty() || (permille - last_permille_ < 10 && permille != 1000)) return;
  last_permille_ = permille;
  const auto loaded = static_cast<uint64_t>(static_cast<double>(total_) * fraction);
  (void)WritePrivateFileAtomically(path_, std::to_string(loaded) + " " + std::to_string(total_) + "\n");
}

}  // namespace spillway::worker
