// A request's head (start line and header fields, through the blank line)
// to a worker or an external server, as Beast writes a request built field
// by field (Host, User-Agent, then `headers`, each set: a later one of a name
// replaces an earlier one, Host and User-Agent too), then Content-Type
// application/json for a body without one, prepare_payload (Content-Length
// for a body, or for a POST, PUT or OPTIONS without one) and keep_alive (no
// Connection field on HTTP/1.1). A given Content-Length or Transfer-Encoding
// is dropped: the body that follows is always `body_size` bytes, as they are.
// Written straight into one string: a Beast message costs an allocation per
// field and a walk, about 5,000 instructions a request (callgrind).
// `v6`: the server is on [::1] (its Host says so: a server that checks Host
// refused 127.0.0.1).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "api/http_client.h"

namespace spillway::upstream {

std::string RequestHead(uint16_t port, const std::string& method, const std::string& target, size_t body_size,
                        const http::HeaderList& headers, bool v6 = false);

}  // namespace spillway::upstream
