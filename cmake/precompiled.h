// The heavy headers most translation units include (Asio, Beast, nlohmann
// json, the standard library), compiled once per build as a precompiled
// header that the library, binary, test and benchmark targets reuse (see
// CMakeLists.txt: spillway_precompiled). It roughly halves the compile time
// of a gateway source on 2 cores. Sources still include what they use: the
// fuzz builds (tests/fuzz/run.sh) compile them without it.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>
