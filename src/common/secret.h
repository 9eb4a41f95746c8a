// Secrets: random tokens from the operating system's cryptographic source and
// comparisons whose time does not depend on where two secrets differ.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace spillway {

// `bytes` random bytes from the kernel's CSPRNG (getrandom; OpenSSL's where it is missing), as
// lower-case hex (2 * bytes characters). Aborts rather than return a weak value.
// Draws of up to 32 bytes come from a per-thread store of the kernel's bytes
// (each byte handed out once; refilled after a fork).
std::string RandomHex(size_t bytes);
// RandomHex(bytes) appended to `out` (no string of its own).
void AppendRandomHex(std::string& out, size_t bytes);

// Whether `given` equals `expected`, in time that depends on neither content
// nor where they differ (both are hashed first, so not on `given`'s length either).
bool SecretEquals(std::string_view given, std::string_view expected);

// The environment variable that carries the worker secret from the
// supervisor (or a test, or the chaos harness) to spillway-worker, which
// reads it once at start and removes it from its environment.
inline constexpr char kWorkerSecretEnv[] = "SPILLWAY_WORKER_SECRET";

}  // namespace spillway
