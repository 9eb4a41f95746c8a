// Mutations: deliberate bugs in Spillway's own logic that tests switch on to
// prove that an equivalence check can fail (a check that passes whatever the
// code does proves nothing). Off unless $SPILLWAY_MUTATIONS names them,
// comma-separated; a process with any active says so on stderr at start.
// Never set one outside a test.
//
//   resume-skip-advance   a continuation skips sampling its first delivered
//                         token (the seeded sampler falls one step behind)
//   fallback-drop-seed    an attempt after the first loses its pinned seed
//   relay-drop-chunk      the gateway drops the third content event of a stream
//   protocol-skew         the worker reports the next protocol version (a worker of another build)
//   admit-unmeasured-prompt  admission takes every prompt for one token (long
//                         prompts go where they cannot fit, not routed first)
//   failover-give-up      a failed attempt that would run again elsewhere ends
//                         the request instead (its 5xx goes to the client)
//
// Thread-safe: the set is read once, at the first call.
#pragma once

#include <string_view>

namespace spillway {

bool MutationActive(std::string_view name);

}  // namespace spillway
