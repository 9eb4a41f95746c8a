#include "common/names.h"

namespace spillway {

std::optional<DeviceName> ParseDeviceName(const std::string& name) {
  if (name == "cpu") return DeviceName{"cpu", -1};
  const auto colon = name.find(':');
  if (colon == std::string::npos || colon == 0) return std::nullopt;
  const std::string digits = name.substr(colon + 1);
  // One spelling per device: "sim:00" beside "sim:0" was a second device
  // name for the same device (two ledgers, admission counted each apart).
  if (digits.empty() || digits.size() > 6 || digits.find_first_not_of("0123456789") != std::string::npos ||
      (digits.size() > 1 && digits[0] == '0')) {
    return std::nullopt;
  }
  return DeviceName{name.substr(0, colon), std::stoi(digits)};
}

bool KnownDeviceName(const std::string& name) {
  const auto d = ParseDeviceName(name);
  // (The host is "cpu" alone: "cpu:0" was taken for an accelerator, every
  // check of the host's own being `device == "cpu"`, and loaded the whole
  // model into RAM past the CPU path's budget, unchecked.)
  return d && ((d->kind == "cpu" && d->index < 0) || d->kind == "cuda" || d->kind == "sim");
}

bool SplitHostPort(const std::string& s, std::string* host, uint16_t* port) {
  const auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  *host = s.substr(0, colon);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  if (*host == "localhost") *host = "127.0.0.1";
  const std::string p = s.substr(colon + 1);
  if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos) return false;
  const int v = std::stoi(p);
  if (v > 65535) return false;
  *port = static_cast<uint16_t>(v);
  return true;
}

}  // namespace spillway
