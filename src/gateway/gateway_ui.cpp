// The dashboard's files at / and /ui/ (compiled in, see ui/assets.h). The page
// holds no data of its own: everything it shows comes from /v1/events and the
// API with the caller's key, so the files are served without one (Host and
// Origin are still checked).
#include "gateway/gateway.h"
#include "gateway/gateway_internal.h"
#include "ui/assets.h"

namespace spillway::gateway {

bool IsUiPath(const std::string& path) { return path == "/" || path == "/ui" || path.rfind("/ui/", 0) == 0; }

http::Response UiResponse(const std::string& path, unsigned v) {
  std::string name = path == "/" || path == "/ui" || path == "/ui/" ? "index.html" : path.substr(4);
  const ui::Asset* a = ui::FindAsset(name);
  if (!a) return ErrorResponse(Status::NotFound("no dashboard file " + path), v);
  auto res = http::MakeResponse(200, std::string(reinterpret_cast<const char*>(a->data), a->size), a->content_type, v);
  res.set(bhttp::field::cache_control, "no-cache");
  res.set("X-Content-Type-Options", "nosniff");
  res.set("Referrer-Policy", "no-referrer");
  // Only its own files and its own API; no inline script, no framing.
  res.set("Content-Security-Policy",
          "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
          "base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
  return res;
}

}  // namespace spillway::gateway
