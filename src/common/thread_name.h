// Names the calling thread, as `top -H`, `ps -L`, perf and gdb show it
// (/proc/<pid>/task/<tid>/comm): which of the gateway's threads burns CPU
// or waits. Linux keeps 15 bytes; a longer name is cut. Never called on a
// process's main thread (its name is the process's, which tools match).
#pragma once

#include <pthread.h>

#include <string>

namespace spillway {

inline void NameThisThread(const std::string& name) {
  (void)pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

}  // namespace spillway
