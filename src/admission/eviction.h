// Who gives room on an accelerator (pure: no clock, no I/O).
//
// A service that must load onto a device (an on-demand placement's first
// request, an external server's start) needs `need` bytes there; the device
// has `available` (observed free memory less its headroom). When that is not
// enough, PlanEviction picks what to unload, by these rules in order:
//
//   never    a pinned service, one of higher priority than the requester
//            (interactive > batch > background), the requester itself;
//            for a load no request waits for (Demand::awaited false: an
//            on-demand start asked again after its requests went to the CPU
//            path), one of its own priority too, unless the requester is
//            in use (a request in the last minute) and that one is used
//            less (fewer requests a minute than the requester's): a peer
//            that just served stays (it would load again for its own next
//            request), an idle model does not keep a used one on the CPU;
//   busy     a service with requests running, or still loading, or just
//            loaded with requests waiting for it (InUse), is taken only by
//            a requester of strictly higher priority (interactive over
//            batch), and is drained first: its new requests go to its CPU
//            path, it unloads when its running ones end;
//   turns    except by its own priority's turn: a busy service that has
//            served at least its turn (Resident::turn_ms, the service's
//            fair_turn_s; kFairTurnMs by default) since it loaded gives way to a
//            requester of the same priority (another service) whose
//            requests have waited that long for this load
//            (Demand::waited_ms). Services of one class that do not fit
//            together then take turns of at least that long, the one whose
//            requests waited longest first (the gateway gives the others'
//            demand no wait: Demand::turn_of); without it, one kept busy
//            kept the other's requests waiting until they timed out, for as
//            long as its own traffic lasted. (On an exclusive device busy
//            services are drained at once, below.);
//   prefer   idle over busy, lower priority over higher, then the lowest
//            cost: the declared evict_cost, else measured reload seconds x
//            requests per minute (a big model reloaded often costs most),
//            then the most bytes (fewer unloads);
//   enough   victims are taken in that order until the room suffices; if
//            even all the allowed ones would not make room, none is taken
//            (unloading cannot help: the requester waits or is refused).
//
// An exclusive device (`exclusive = true`, llama-swap's "swap" group: one
// model at a time) has one rule instead: every other service loaded there
// that is not pinned is unloaded, whatever its priority (for a load nobody
// waits for, only those the rule above lets go: else it is refused) and whether or not
// the room would suffice, busy ones after their running requests end. A
// service still loading (for at most kExclusiveStartWaitMs), or loaded less
// than kExclusiveServeFirstMs ago with requests waiting for it and none
// running yet, is left to serve them first: the load waits (otherwise two
// services that both have requests undo each other's loads forever, and
// neither serves one). Both bounds keep a hung load or a backlog that never
// reaches it from holding the device for ever.
//
// Windows (batch work only at night, or once interactive work has gone
// quiet) are InWindow's: the local time's minute of the day against
// "HH:MM-HH:MM" ranges, which may cross midnight.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace spillway::admission {

struct Resident {
  std::string key;       // its supervisor key ("embed.0", "whisper.ext")
  std::string service;
  int priority = 0;      // 0 interactive, 1 batch, 2 background
  bool pinned = false;
  uint64_t bytes = 0;    // what it holds on the device now
  int running = 0;       // requests running on it
  double reload_s = 0;   // its measured (else expected) load time
  double requests_per_min = 0;
  double evict_cost = -1;  // declared (< 0: none)
  // Exclusive devices: its process is loading (for state_ms so far), or it
  // is ready (for state_ms) with `waiting` requests for it; already being
  // unloaded (evicting) it blocks nobody.
  bool starting = false;
  int64_t state_ms = 0;
  int waiting = 0;
  bool evicting = false;
  // Its turn against a requester of its priority while busy (fair_turn_s;
  // 0: it never gives way to one).
  int64_t turn_ms = 30000;
  double Cost() const;
  // Running requests, loading, or just loaded with requests waiting (the bounds below).
  bool InUse() const;
  // Busy, and has had its turn against a requester of its priority whose
  // requests have waited `waited_ms` (see "turns" above).
  bool TurnIsOver(int64_t waited_ms) const;
};

struct EvictionPlan {
  bool fits = false;              // room enough without (or with) the victims below
  bool wait = false;              // not now, but soon (exclusive: another service is loading or about to serve)
  std::vector<std::string> evict;  // keys, in the order chosen
  std::vector<std::string> drain;  // those of them still running requests
  uint64_t freed = 0;
  std::string reason;             // in words, for the journal and /v1/status
};

inline constexpr int64_t kExclusiveStartWaitMs = 120000;
inline constexpr int64_t kExclusiveServeFirstMs = 2000;

// Who a load is for: requests that wait for it, or (awaited false) none any
// more, the requester's recent rate then saying how much it is used.
struct Demand {
  bool awaited = true;
  double requests_per_min = 0;
  // Its last request came within kRecentUseMs: it is in use now. (Rates
  // fall as old requests leave their window: without it, a peer's could
  // fall below the requester's minutes after the requester's last request.)
  bool recently_used = false;
  // How long the oldest of the requests waiting for this load has waited
  // (awaited loads only): a busy peer of its priority gives way to it from
  // the peer's turn on (Resident::turn_ms).
  int64_t waited_ms = 0;
  // Another service waiting for the same device whose requests have waited
  // longer, and that a busy peer's turn would let load: the turn is its
  // (waited_ms is then 0 here). In words, for the refusal.
  std::string turn_of;
};
inline constexpr int64_t kRecentUseMs = 60000;
// A busy service's turn on a device that cannot hold it beside a peer of
// its priority whose requests wait, by default (fair_turn_s): at least this
// long served, and the peer's requests waiting at least this long, before it
// is drained for that peer. Well inside a request's default wait for a
// start (120 s), leaving the rest for the drain (as long as the busy one's
// running requests last: not bounded here) and the load.
inline constexpr int64_t kFairTurnMs = 30000;

EvictionPlan PlanEviction(uint64_t need, uint64_t available, int requester_priority, const std::string& requester_key,
                          const std::vector<Resident>& residents, bool exclusive = false, Demand demand = {});

// Whether `minute_of_day` (0..1439, local time) falls in one of `windows`
// ("HH:MM-HH:MM", end exclusive; a range that ends before it starts crosses
// midnight). No windows: always.
bool InWindow(const std::vector<std::string>& windows, int minute_of_day);

}  // namespace spillway::admission
