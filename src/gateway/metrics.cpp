#include "gateway/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace spillway::gateway {

void Metrics::RequestFinished(const std::string& service, const std::string& outcome, const std::string& placement,
                              const std::string& key, double seconds) {
  std::lock_guard<std::mutex> lk(mu_);
  const auto labels = std::tie(service, outcome, placement, key);
  if (auto it = requests_.find(labels); it != requests_.end()) {
    ++it->second;
  } else {
    requests_.emplace(labels, 1);
  }
  auto& h = latency_[service];
  for (size_t i = 0; i < std::size(kBuckets); ++i) {
    if (seconds <= kBuckets[i]) ++h.counts[i];
  }
  ++h.count;
  h.sum += seconds;
}

void Metrics::Decision(const std::string& service, const std::string& kind) {
  std::lock_guard<std::mutex> lk(mu_);
  ++decisions_[{service, kind}];
}

namespace {

// A sample's value as Prometheus reads it back exactly: an integer as one
// (byte counts of 80 GiB printed "8.58993e+10" at the stream's 6 digits),
// else with every digit a double holds.
std::string Value(double v) {
  char buf[32];
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9.0e15) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.17g", v);
  }
  return buf;
}

}  // namespace

std::string Metrics::Render(const std::vector<std::tuple<std::string, std::string, double>>& gauges) const {
  std::ostringstream os;
  std::lock_guard<std::mutex> lk(mu_);
  os << "# HELP spillway_requests_total Requests that reached a terminal state.\n"
        "# TYPE spillway_requests_total counter\n";
  for (const auto& [k, v] : requests_) {
    const auto& [service, outcome, placement, key] = k;
    os << "spillway_requests_total{service=\"" << service << "\",outcome=\"" << outcome << "\",placement=\""
       << placement << "\",key=\"" << key << "\"} " << v << "\n";
  }
  os << "# HELP spillway_request_duration_seconds Time from acceptance to the last byte.\n"
        "# TYPE spillway_request_duration_seconds histogram\n";
  for (const auto& [service, h] : latency_) {
    for (size_t i = 0; i < std::size(kBuckets); ++i) {
      os << "spillway_request_duration_seconds_bucket{service=\"" << service << "\",le=\"" << kBuckets[i] << "\"} "
         << h.counts[i] << "\n";
    }
    os << "spillway_request_duration_seconds_bucket{service=\"" << service << "\",le=\"+Inf\"} " << h.count << "\n";
    os << "spillway_request_duration_seconds_sum{service=\"" << service << "\"} " << Value(h.sum) << "\n";
    os << "spillway_request_duration_seconds_count{service=\"" << service << "\"} " << h.count << "\n";
  }
  os << "# HELP spillway_admission_decisions_total Admission decisions by kind.\n"
        "# TYPE spillway_admission_decisions_total counter\n";
  for (const auto& [k, v] : decisions_) {
    os << "spillway_admission_decisions_total{service=\"" << k.first << "\",decision=\"" << k.second << "\"} " << v << "\n";
  }
  // Each name's samples together under one TYPE line, as the text format
  // requires (they come per service and per device, names interleaved; a
  // second TYPE line made Prometheus reject the whole scrape).
  auto sorted = gauges;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });
  std::string last;
  for (const auto& [name, labels, value] : sorted) {
    if (name != last) {
      os << "# TYPE " << name << (name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0 ? " counter\n" : " gauge\n");
      last = name;
    }
    os << name << (labels.empty() ? "" : "{" + labels + "}") << " " << Value(value) << "\n";
  }
  return os.str();
}

}  // namespace spillway::gateway
