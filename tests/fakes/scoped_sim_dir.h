// A private directory for simulated-device ledgers ($SPILLWAY_SIM_DIR) for
// the lifetime of a test; processes started meanwhile inherit it.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace spillway::testing {

class ScopedSimDir {
 public:
  explicit ScopedSimDir(const std::string& name)
      : path_(std::filesystem::temp_directory_path() / ("spillway-" + name + "-" + std::to_string(getpid()))) {
    std::filesystem::create_directories(path_);
    setenv("SPILLWAY_SIM_DIR", path_.c_str(), 1);
  }
  ~ScopedSimDir() {
    unsetenv("SPILLWAY_SIM_DIR");
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScopedSimDir(const ScopedSimDir&) = delete;
  ScopedSimDir& operator=(const ScopedSimDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace spillway::testing
