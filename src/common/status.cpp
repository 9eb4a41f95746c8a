#include "common/status.h"

namespace spillway {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid_argument";
    case StatusCode::kUnauthenticated: return "unauthenticated";
    case StatusCode::kPermissionDenied: return "permission_denied";
    case StatusCode::kNotFound: return "not_found";
    case StatusCode::kConflict: return "conflict";
    case StatusCode::kUnprocessable: return "unprocessable";
    case StatusCode::kPayloadTooLarge: return "payload_too_large";
    case StatusCode::kResourceExhausted: return "resource_exhausted";
    case StatusCode::kRateLimited: return "rate_limited";
    case StatusCode::kUnavailable: return "unavailable";
    case StatusCode::kDeadlineExceeded: return "deadline_exceeded";
    case StatusCode::kBadGateway: return "bad_gateway";
    case StatusCode::kCancelled: return "cancelled";
    case StatusCode::kInternal: return "internal";
  }
  return "unknown";
}

const char* FailurePhaseName(FailurePhase phase) {
  switch (phase) {
    case FailurePhase::kNone: return "none";
    case FailurePhase::kLoad: return "load";
    case FailurePhase::kKv: return "kv";
    case FailurePhase::kCompute: return "compute";
    case FailurePhase::kDevice: return "device";
  }
  return "unknown";
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  std::string s = std::string(StatusCodeName(code_)) + ": " + message_;
  if (phase_ != FailurePhase::kNone) s += " (phase=" + std::string(FailurePhaseName(phase_)) + ")";
  return s;
}

int HttpStatusFor(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return 200;
    case StatusCode::kInvalidArgument: return 400;
    case StatusCode::kUnauthenticated: return 401;
    case StatusCode::kPermissionDenied: return 403;
    case StatusCode::kNotFound: return 404;
    case StatusCode::kConflict: return 409;
    case StatusCode::kUnprocessable: return 422;
    case StatusCode::kPayloadTooLarge: return 413;
    case StatusCode::kResourceExhausted: return 503;
    case StatusCode::kRateLimited: return 429;
    case StatusCode::kUnavailable: return 503;
    case StatusCode::kDeadlineExceeded: return 504;
    case StatusCode::kBadGateway: return 502;
    case StatusCode::kCancelled: return 499;
    case StatusCode::kInternal: return 500;
  }
  return 500;
}

const char* OpenAiErrorType(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kPayloadTooLarge:
    case StatusCode::kUnprocessable:
    case StatusCode::kConflict:
    case StatusCode::kNotFound: return "invalid_request_error";
    case StatusCode::kResourceExhausted:
    case StatusCode::kUnavailable: return "server_overloaded";
    case StatusCode::kRateLimited: return "rate_limit_exceeded";
    case StatusCode::kUnauthenticated: return "authentication_error";
    case StatusCode::kPermissionDenied: return "permission_error";
    case StatusCode::kDeadlineExceeded: return "timeout";
    case StatusCode::kBadGateway: return "upstream_error";
    case StatusCode::kCancelled: return "cancelled";
    default: return "server_error";
  }
}

}  // namespace spillway
