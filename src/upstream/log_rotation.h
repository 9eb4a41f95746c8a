// Worker logs rotated by size: a worker's stdout and stderr are appended to
// <state_dir>/logs/<key>.log by the worker itself (the file is its
// descriptor, opened O_APPEND), so the file is copied and truncated in place
// (logrotate's copytruncate): the worker's next write lands at the start of
// the emptied file. Lines written between the copy and the truncation are
// lost; one older file is kept (<key>.log.1).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace spillway::upstream {

inline constexpr uint64_t kWorkerLogMaxBytes = 16ull << 20;

// When `path` holds more than `max_bytes`: copies it to `path`.1 (replacing
// it, mode 0600) and truncates it. Ok when nothing needed doing, or the file
// does not exist.
Status RotateIfLarger(const std::string& path, uint64_t max_bytes);

}  // namespace spillway::upstream
