// The memory ledger of one device: what Spillway has reserved on it (per
// placement: weights + KV pool + compute buffers, as predicted), what the
// device reports free (telemetry, which also sees other processes), and the
// headroom to keep.
//
// A reservation must pass both checks (docs/DESIGN.md invariant 3):
//   predicted:  need <= capacity - headroom - sum(reservations)
//   observed:   need <= observed_free - headroom - in-flight reservations
// where in-flight reservations are those whose allocation has not shown up in
// the observed free memory yet (a worker still starting). The observed check
// is what catches memory taken by others between plan and allocation.
//
// Pure: no I/O; observations are pushed in. Not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "common/status.h"

namespace spillway::memory {

struct Headroom {
  uint64_t absolute = 0;
  double percent = 0;  // of capacity
  uint64_t For(uint64_t capacity) const;
};

class DeviceLedger {
 public:
  DeviceLedger(std::string device, uint64_t capacity, Headroom headroom);

  const std::string& device() const { return device_; }
  uint64_t capacity() const { return capacity_; }
  uint64_t headroom() const { return headroom_.For(capacity_); }

  // A fresh telemetry reading. Reservations marked in-flight before it was
  // taken become settled (their bytes are part of what the device reports).
  void Observe(uint64_t free_bytes, uint64_t reading_seq);
  std::optional<uint64_t> observed_free() const { return observed_free_; }

  // Reserves `bytes` for `key` (replacing its previous reservation) if both
  // checks pass; otherwise kResourceExhausted with the numbers.
  Status Reserve(const std::string& key, uint64_t bytes, uint64_t reading_seq);
  void Release(const std::string& key);
  bool Has(const std::string& key) const { return reservations_.count(key) > 0; }

  uint64_t reserved() const;
  uint64_t in_flight() const;
  // Bytes a new reservation could take now (the smaller of the two checks).
  uint64_t Available() const;

 private:
  struct Reservation {
    uint64_t bytes;
    uint64_t made_at_seq;  // settled once a reading with a larger seq arrives
  };
  std::string device_;
  uint64_t capacity_;
  Headroom headroom_;
  std::optional<uint64_t> observed_free_;
  uint64_t observed_seq_ = 0;
  std::map<std::string, Reservation> reservations_;
};

// KV cells of one placement, reserved per request (the worker enforces the
// same numbers; the gateway keeps its own view to decide before sending).
// Unified: one pool of `cells` shared by the slots, a request reserving
// prompt + max_tokens. Per slot (`slots` > 0): each slot has cells/slots of
// its own and a request takes a whole slot.
class CellPool {
 public:
  explicit CellPool(uint32_t cells, uint32_t slots = 0)
      : total_(cells), per_slot_(slots > 0 ? cells / slots : 0) {}
  bool Reserve(const std::string& request_id, uint32_t cells);  // false: does not fit now
  void Release(const std::string& request_id);                  // idempotent
  uint32_t total() const { return total_; }
  uint32_t reserved() const { return reserved_; }
  uint32_t free() const { return total_ - reserved_; }
  size_t active() const { return by_request_.size(); }
  // The most one request can ever hold, and what one request could take now.
  uint32_t request_capacity() const { return per_slot_ ? per_slot_ : total_; }
  uint32_t free_for_request() const { return per_slot_ ? (free() >= per_slot_ ? per_slot_ : 0) : free(); }

 private:
  uint32_t total_;
  uint32_t per_slot_;  // 0: unified
  uint32_t reserved_ = 0;
  std::map<std::string, uint32_t> by_request_;
};

}  // namespace spillway::memory
