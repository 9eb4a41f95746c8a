// Prometheus text metrics of the gateway. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace spillway::gateway {

class Metrics {
 public:
  // `placement` names where its last attempt ran, `key` which placement that
  // was (two placements may share a name: two on the CPU); both "" when none ran.
  void RequestFinished(const std::string& service, const std::string& outcome, const std::string& placement,
                       const std::string& key, double seconds);
  void Decision(const std::string& service, const std::string& kind);
  // Renders every series; `gauges` are (name, labels, value) sampled by the caller.
  std::string Render(const std::vector<std::tuple<std::string, std::string, double>>& gauges) const;

 private:
  static constexpr double kBuckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
  struct Histogram {
    std::vector<uint64_t> counts = std::vector<uint64_t>(std::size(kBuckets), 0);
    uint64_t count = 0;
    double sum = 0;
  };
  mutable std::mutex mu_;
  // (std::less<>: a request finds its series by references to its strings; strings are made only for a new one.)
  std::map<std::tuple<std::string, std::string, std::string, std::string>, uint64_t, std::less<>> requests_;
  std::map<std::string, Histogram> latency_;
  std::map<std::pair<std::string, std::string>, uint64_t> decisions_;
};

}  // namespace spillway::gateway
