// The dashboard's files (src/ui/*.html, *.js, *.css), compiled into the
// binary by the build (cmake/embed_assets.cmake): the page works offline and
// needs nothing beside the gateway's executable.
#pragma once

#include <cstddef>
#include <string_view>

namespace spillway::ui {

struct Asset {
  const char* name;          // "index.html", "app.js", ...
  const char* content_type;
  const unsigned char* data;
  size_t size;
};

// The asset named `name` (no leading slash), or null.
const Asset* FindAsset(std::string_view name);

}  // namespace spillway::ui
