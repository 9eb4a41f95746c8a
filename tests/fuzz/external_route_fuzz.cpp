// libFuzzer target: routing a request to an external service reads the
// client's body (a JSON object or a multipart form) and content type, never
// changing either. Input: the content type's parameters, a newline, the body.
#include <cstddef>
#include <cstdint>
#include <string>

#include "gateway/external_route.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string all(reinterpret_cast<const char*>(data), size);
  const size_t nl = all.find('\n');
  const std::string params = nl == std::string::npos ? all : all.substr(0, nl);
  const std::string body = nl == std::string::npos ? "" : all.substr(nl + 1);
  const std::string type = "multipart/form-data; " + params;
  const std::string boundary = spillway::gateway::MultipartBoundary(type);
  (void)spillway::gateway::MultipartField(body, boundary, "model");
  (void)spillway::gateway::MultipartField(body, params.substr(0, 70), "file", 8);
  (void)spillway::gateway::ReadRequestedFields(type, body);
  (void)spillway::gateway::ReadRequestedFields(params, body);
  return 0;
}
