// Which external service a request to a proxied route is for (pure: no I/O).
//
// The model names the service, as for every route: in a JSON body its
// "model", in a multipart form (audio uploads) its "model" field. A route
// served by one external service only may leave the model out. The body is
// only read here, never changed: it goes to the upstream byte for byte.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "api/json_limits.h"
#include "common/status.h"
#include "config/config.h"

namespace spillway::gateway {

// The boundary of a multipart/form-data content type; "" when it is not one.
std::string MultipartBoundary(std::string_view content_type);

// The value of the simple form field `name` (not a file) in a multipart
// body; nullopt when absent. Values over `max_value` bytes are not taken.
std::optional<std::string> MultipartField(std::string_view body, std::string_view boundary, std::string_view name,
                                          size_t max_value = 256);

// What an Idempotency-Key's payload hash covers: the content type and the
// body, a multipart form's without its boundary (a client builds its upload
// again on each retry, with a new random boundary: the same request): the
// pieces between its delimiters, each after its length, so that no content
// passes for a delimiter (with each delimiter written as "--", a part whose
// text held "\r\n--\r\n" hashed as two parts).
std::string PayloadForHash(std::string_view content_type, std::string_view body);

// What routing reads of a proxied request's body.
struct RequestedFields {
  std::string model;    // JSON "model" or the form's "model" field; "" when it names none
  bool stream = false;  // JSON "stream" is true (anything else is the server's to judge)
};

// The fields of a proxied request: InvalidArgument for a body that is
// neither JSON nor a form, a JSON body that does not parse or breaks
// `limits`. A JSON body is walked (limits first, then its top-level fields)
// and never built: every generation request is read here when an external
// service is configured, before the lifecycle parses it.
StatusOr<RequestedFields> ReadRequestedFields(std::string_view content_type, std::string_view body,
                                              const api::JsonLimits& limits = {});

// The external service for `path` and `model` ("" : the only one serving
// `path`). NotFound or InvalidArgument with what the client should do.
StatusOr<const config::ExternalConfig*> ChooseExternal(const config::GatewayConfig& config, const std::string& path,
                                                       const std::string& model);

}  // namespace spillway::gateway
