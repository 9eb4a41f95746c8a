// libFuzzer target: the gateway's SSE relay, fed a worker's stream in
// arbitrary pieces: events are cut at blank lines (as Gateway::Run does) and
// each is observed by the stream's progress (tokens, text, tool calls,
// errors), which must read each event as the whole parsed document says
// (tests/fakes/stream_progress_reference.h; a difference traps);
// ParseSseData reads whole bodies.
#include <cstddef>
#include <cstdint>
#include <string>

#include "api/http_client.h"
#include "failover/stream_progress.h"
#include "../fakes/stream_progress_reference.h"  // (the fuzz builds search src/ alone)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string all(reinterpret_cast<const char*>(data), size);
  (void)spillway::http::ParseSseData(all);
  spillway::failover::StreamProgress progress;
  std::string pending;
  size_t at = 0;
  while (at < all.size()) {
    const size_t piece = 1 + static_cast<unsigned char>(all[at]) % 61;
    pending.append(all, at, piece);
    at += piece;
    size_t pos;
    while ((pos = pending.find("\n\n")) != std::string::npos) {
      std::string event = pending.substr(0, pos + 2);
      pending.erase(0, pos + 2);
      std::string phase;
      (void)progress.Observe(event, &phase);
      spillway::failover::StreamProgress one;  // (the event alone, against the reference)
      spillway::failover::StreamProgressReference ref;
      const auto got = one.Observe(event, &phase);
      if (got != ref.Observe(event) || one.tokens() != ref.tokens || one.text_bytes() != ref.text_bytes ||
          one.tool_calls_delivered() != ref.tool_calls || one.finished() != ref.finished ||
          one.last_error().has_value() != ref.error) {
        __builtin_trap();
      }
    }
  }
  (void)progress.Continuable();
  return 0;
}
