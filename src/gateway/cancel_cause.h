// Who cancelled a request first (Gateway::Live::cancel_cause), set before
// its `cancelled` flag: whoever sees the flag sees why. It says how the
// request ends: as cancelled (its client, an operator, its deadline, one of
// the gateway's bounds asked), or as the gateway's stop found it
// (RequestLifecycle::EndForStop).
#pragma once

namespace spillway::gateway {

enum class CancelCause : int { kNone = 0, kAsked = 1, kStop = 2 };

}  // namespace spillway::gateway
