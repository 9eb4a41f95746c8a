// `--log-format json`: every line the process writes to stdout and stderr
// becomes one JSON object on the same stream, so that a log shipper reads
// them without patterns:
//
//   {"time":"2026-12-01T10:31:02.123Z","stream":"stderr","msg":"spillway: worker chat.0 ..."}
//
// A line that already is a JSON object (the gateway's request lines, see
// JsonLogs()) passes as it is, with "time" added when it has none.
//
// How: both descriptors are replaced by pipes that one thread reads and
// writes on, line by line, to the original descriptors. Text printed by
// other libraries is wrapped the same way. A line still in a pipe when the
// process is killed with -9 is lost (a pipe holds what the thread has not
// read yet, usually nothing).
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace spillway {

// Whether JSON logs are on (StartJsonLogs succeeded and StopJsonLogs not yet called).
bool JsonLogs();

// Before any thread writes; once per process.
Status StartJsonLogs();
// Flushes, gives stdout and stderr their descriptors back and ends the thread.
void StopJsonLogs();

// One event of the process's own (a worker exited, was adopted...): with JSON
// logs, one line {"event": EVENT, ...fields, "msg": TEXT}, so that a log
// shipper can select on fields instead of patterns; otherwise TEXT as it is.
// `fields` is a JSON object (nlohmann::json dumped), e.g. {"worker":"chat.0"}.
void LogEvent(std::string_view event, const std::string& fields_json, const std::string& text);

// The JSON line for one text line (without its newline), stamped `time_ms`
// (unix ms): what the pipes write.
std::string JsonLogLine(std::string_view line, std::string_view stream, int64_t time_ms);

}  // namespace spillway
