// Status and StatusOr: the one error vocabulary of Spillway (after absl::Status).
//
// Every fallible function in the gateway and the worker returns a Status or a
// StatusOr<T>; exceptions never cross a module boundary. A Status maps to an
// HTTP status in exactly one place (HttpStatusFor) and to an OpenAI-style
// error body in src/api.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace spillway {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // 400: the caller sent something wrong
  kUnauthenticated,    // 401: missing or wrong API key
  kPermissionDenied,   // 403: e.g. Host or Origin not allowed
  kNotFound,           // 404
  kConflict,           // 409: e.g. idempotency key in flight
  kUnprocessable,      // 422: e.g. idempotency key reused with another payload
  kPayloadTooLarge,    // 413: body or prompt that can never fit
  kResourceExhausted,  // 503 + Retry-After: could fit later
  kRateLimited,        // 429 + Retry-After: this caller has too much in flight
  kUnavailable,        // 503: placement or device not usable now
  kDeadlineExceeded,   // 504
  kBadGateway,         // 502: an external service failed and the request is not sent again
  kCancelled,          // 499 (client closed request)
  kInternal,           // 500: an invariant broke
};

const char* StatusCodeName(StatusCode code);

// The phase of a failed accelerator allocation or of a device loss. Carried by
// errors from the worker so the gateway can decide on a retry.
enum class FailurePhase { kNone, kLoad, kKv, kCompute, kDevice };
const char* FailurePhaseName(FailurePhase phase);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status Unauthenticated(std::string m) { return {StatusCode::kUnauthenticated, std::move(m)}; }
  static Status PermissionDenied(std::string m) { return {StatusCode::kPermissionDenied, std::move(m)}; }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status Conflict(std::string m) { return {StatusCode::kConflict, std::move(m)}; }
  static Status Unprocessable(std::string m) { return {StatusCode::kUnprocessable, std::move(m)}; }
  static Status PayloadTooLarge(std::string m) { return {StatusCode::kPayloadTooLarge, std::move(m)}; }
  static Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
  static Status RateLimited(std::string m) { return {StatusCode::kRateLimited, std::move(m)}; }
  static Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status BadGateway(std::string m) { return {StatusCode::kBadGateway, std::move(m)}; }
  static Status DeadlineExceeded(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }
  static Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Optional details: the failing phase and a retry hint in seconds.
  FailurePhase phase() const { return phase_; }
  Status& WithPhase(FailurePhase p) { phase_ = p; return *this; }
  int retry_after_s() const { return retry_after_s_; }
  Status& WithRetryAfter(int s) { retry_after_s_ = s; return *this; }
  // A cause more precise than the code that clients branch on, said as the
  // error body's "code" in place of the code's name (OpenAI's
  // "context_length_exceeded"); empty for none.
  const std::string& reason() const { return reason_; }
  Status& WithReason(std::string r) { reason_ = std::move(r); return *this; }

  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  FailurePhase phase_ = FailurePhase::kNone;
  int retry_after_s_ = 0;
  std::string reason_;
};

// Status::reason of a prompt (with its room for an answer) past the context
// that could ever hold it: OpenAI's code for it, which clients look for to
// shorten a conversation.
inline constexpr const char kContextLengthExceeded[] = "context_length_exceeded";
// Status::reason of an answer withheld because the journal could not record
// the request's attempt or end: the request may still run again after a
// restart, so it is not to be sent again blindly (see Gateway::Unrecorded).
inline constexpr const char kAnswerWithheld[] = "answer_withheld";
// Status::reason of a failure after the request reached a service that is
// not idempotent (or whose answer was cut midway): it may have acted on it,
// so clients are told not to send it again on their own.
inline constexpr const char kMayHaveRun[] = "may_have_run";
// Status::reason of a refusal for a service none of whose placements could be
// started at all (a model file that is missing or not a GGUF, a device that
// is not there or too small, found at start): no retry helps until the
// gateway is restarted with it fixed, so clients are told not to retry.
inline constexpr const char kServiceUnavailable[] = "service_unavailable";
// Status::reason of the start gate's refusal for want of memory on a device
// (Gateway::RoomFor, AdmitPlacement's verdict): not a window's, nor an
// exclusive device's turn.
inline constexpr const char kNoRoom[] = "no_room";

// The single mapping from StatusCode to HTTP status.
int HttpStatusFor(StatusCode code);
// The OpenAI error "type" string for a code.
const char* OpenAiErrorType(StatusCode code);

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : v_(std::move(value)) {}           // NOLINT: implicit by design
  StatusOr(Status status) : v_(std::move(status)) {}    // NOLINT: must not be OK

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace spillway

#define SPILLWAY_RETURN_IF_ERROR(expr)          \
  do {                                          \
    ::spillway::Status _st = (expr);            \
    if (!_st.ok()) return _st;                  \
  } while (0)
