// libFuzzer target: the gateway's TOML configuration parser (errors must be
// statuses naming file, line and key; nothing may crash).
#include <cstddef>
#include <cstdint>
#include <string>

#include "config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto c = spillway::config::ParseConfig(text, "fuzz.toml");
  if (c.ok()) (void)c->FindService("chat");
  return 0;
}
