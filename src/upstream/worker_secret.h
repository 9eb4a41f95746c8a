// The worker secret: what every request of the gateway to its workers
// carries (Authorization: Bearer <secret>) and what each worker demands.
//
// It must outlive the gateway process: a gateway restarted after a crash
// talks to the workers it adopts with the secret they were started with. So
// it is kept in <state_dir>/run/worker.secret (mode 0600 in the private state
// directory, created once, reused by every later gateway there). A secret set
// in the gateway's environment ($SPILLWAY_WORKER_SECRET, at least 16
// characters: tests and the chaos harness, which call workers too) wins and
// is not written anywhere.
#pragma once

#include <string>

#include "common/status.h"

namespace spillway::upstream {

// The secret for the workers of `run_dir`. A file there that is not a
// regular file of this user, readable by others or too short is replaced by
// a fresh secret (workers started with the old one are then not adopted).
StatusOr<std::string> WorkerSecretFor(const std::string& run_dir);

}  // namespace spillway::upstream
