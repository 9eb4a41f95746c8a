// The gateway <-> worker protocol: one header used by both binaries.
//
// Versioned: a worker reports kWorkerProtocolVersion in GET /v1/worker/info
// (and its port file); the gateway refuses a worker of another version with
// a clear start-up error rather than misread it.
#pragma once

namespace spillway::protocol {

// Bump on any change a worker of the previous version would misread.
inline constexpr int kWorkerProtocolVersion = 1;

}  // namespace spillway::protocol
