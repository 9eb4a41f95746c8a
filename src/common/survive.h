// Runs a piece of work whose exceptions are surprising but survivable (the
// middle row of Envoy's error table): an exception is logged to stderr as
// "<what> threw: <message>" and swallowed, so no exception escapes a
// thread's loop. Returns whether `fn` finished without one.
#pragma once

#include <cstdio>
#include <exception>

namespace spillway {

template <class F>
bool RunSurviving(const char* what, F&& fn) noexcept {
  try {
    fn();
    return true;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s threw: %s\n", what, e.what());
  } catch (...) {
    std::fprintf(stderr, "%s threw an unknown exception\n", what);
  }
  return false;
}

}  // namespace spillway
