// Time as a parameter: pure logic takes a Clock, tests step a FakeClock.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace spillway {

class Clock {
 public:
  virtual ~Clock() = default;
  // Unix milliseconds, for intervals and timestamps (SystemClock: moved by
  // a monotonic clock from one wall reading).
  virtual int64_t NowMs() const = 0;
  // The wall clock as it reads now, for what is a time of day (a service's
  // accelerator window); NowMs where the two are one (FakeClock).
  virtual int64_t WallMs() const { return NowMs(); }
};

// Unix milliseconds read from the wall clock once, then moved by a monotonic
// clock. What the gateway measures with its clock is intervals (health
// checks, start and stop timeouts, backoff, breakers, waits, deadlines), so a
// step of the wall clock (NTP's makestep at boot, a board without a
// real-time clock, a manual change) must not move them: a forward step fired
// every start timeout at once (each loading worker killed as a failed start),
// a backward one held every health check back until the workers' orphan
// timeout ended them. A step after the start shows in the absolute times
// (journal timestamps) until the next start; a time of day is read from the
// wall clock itself (WallMs). `wall_ms` and `mono_ms` are for tests; by
// default the system and steady clocks.
class SystemClock final : public Clock {
 public:
  using Source = int64_t (*)();
  explicit SystemClock(Source wall_ms = &SystemMs, Source mono_ms = &MonoMs)
      : wall_ms_(wall_ms), mono_ms_(mono_ms), offset_(wall_ms() - mono_ms()) {}
  int64_t NowMs() const override { return mono_ms_() + offset_; }
  int64_t WallMs() const override { return wall_ms_(); }

  static int64_t SystemMs() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch()).count();
  }
  static int64_t MonoMs() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch()).count();
  }

 private:
  Source wall_ms_, mono_ms_;
  int64_t offset_;  // unix ms at the monotonic clock's zero, as read at construction
};

class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_ms = 1'700'000'000'000) : now_(start_ms) {}
  int64_t NowMs() const override { return now_.load(); }
  void Advance(int64_t ms) { now_ += ms; }

 private:
  std::atomic<int64_t> now_;
};

}  // namespace spillway
