// The gateway's own bounds on one attempt of a request (request_lifecycle,
// attempt_runner).
#pragma once

#include <chrono>

namespace spillway::gateway {

// The gateway's own bounds on an attempt, apart from the request's deadline
// (X-Request-Timeout). Reaching one says nothing of the worker's health: a
// hung worker is replaced through its health reports. Tests step them down.
struct AttemptBounds {
  // A non-streamed answer's wait when the request has no deadline.
  std::chrono::milliseconds answer{std::chrono::hours(1)};
  // How long a stream's worker may stay silent (no byte), whatever the
  // request's deadline: a huge prompt prefilling on the CPU.
  std::chrono::milliseconds stream_silence{std::chrono::seconds(600)};
};

}  // namespace spillway::gateway
