// Benchmarks that call workers directly (next to a gateway, or alone) set
// the worker secret in their own environment first: the workers (or the
// gateway's supervisor) take it from there.
#pragma once

#include <cstdlib>
#include <string>

#include "api/http_client.h"
#include "common/secret.h"

namespace spillway::bench {

inline const std::string& WorkerSecret() {
  static const std::string secret = [] {
    const std::string s = RandomHex(16);
    setenv(kWorkerSecretEnv, s.c_str(), 1);
    return s;
  }();
  return secret;
}

inline http::HeaderList WorkerAuth() { return {{"Authorization", "Bearer " + WorkerSecret()}}; }

}  // namespace spillway::bench
