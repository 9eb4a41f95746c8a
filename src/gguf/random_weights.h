// Deterministic random numbers for the generated models (llama GGUF and
// whisper): the same (seed, tensor name) gives the same weights on every
// machine and standard library.
#pragma once

#include <cstdint>
#include <string_view>

namespace spillway {

// splitmix64: a tiny, portable generator, so the same seed gives the same bytes
// with every standard library.
struct SplitMix64 {
  uint64_t state;
  uint64_t Next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  float NextUnit() { return static_cast<float>((Next() >> 40) * (1.0 / 8388608.0) - 1.0); }
};

// FNV-1a of a tensor's name: mixed into the seed so each tensor has its own stream.
inline uint64_t HashName(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

}  // namespace spillway
