// A model load's progress, told to the supervisor through a small file that
// the worker rewrites atomically ("LOADED_BYTES TOTAL_BYTES\n") as llama.cpp
// reports it, so that `/v1/status`, the event stream and the dashboard can
// show "loading 42 %" while a large model comes in from disk. The supervisor
// reads it while the worker is starting (upstream::ReadLoadProgress).
#pragma once

#include <cstdint>
#include <string>

namespace spillway::worker {

class LoadProgressFile {
 public:
  // `path` empty: reports nothing. `min_load_ms` > 0 (the slow-load fault)
  // stretches the load to at least that long, in proportion to progress, so
  // that tests can watch it.
  LoadProgressFile(std::string path, uint64_t total_bytes, int64_t min_load_ms);
  // llama.cpp's progress callback: `fraction` in [0, 1].
  void Report(float fraction);

 private:
  std::string path_;
  uint64_t total_;
  int64_t min_load_ms_;
  int last_permille_ = -1;
  float last_fraction_ = 0;
};

}  // namespace spillway::worker
