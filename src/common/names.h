// Parsing of the two names every part of Spillway reads from users: device
// names ("cpu", "cuda:N", "sim:N") and listen addresses ("HOST:PORT").
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace spillway {

struct DeviceName {
  std::string kind;  // "cpu", "cuda", "sim", ...
  int index = -1;    // -1 for "cpu"
};

// "cpu" or "<kind>:<1 to 6 digits, no leading zero>"; nullopt otherwise. The kind is not checked.
std::optional<DeviceName> ParseDeviceName(const std::string& name);
// A device a placement may name: cpu, cuda:N or sim:N.
bool KnownDeviceName(const std::string& name);

// "HOST:PORT" (an IPv6 host in brackets); port 0 to 65535. The host
// "localhost" comes back as "127.0.0.1" (what is bound and dialled: the
// servers take numeric addresses only).
bool SplitHostPort(const std::string& s, std::string* host, uint16_t* port);

}  // namespace spillway
