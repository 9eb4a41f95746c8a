// Invariant 1 of docs/DESIGN.md, checked from the outside: every request the
// gateway's journal accepted ends in exactly one terminal state, and none of
// its attempts is left open.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace spillway::testing {

struct JournalCheck {
  std::map<std::string, std::string> state;       // request id -> state
  std::map<std::string, int> attempts;            // request id -> journaled attempts
  std::vector<std::string> problems;              // empty when the invariant holds
};

// Reads <state_dir>/journal.db (read-only; the gateway may still run). A
// running gateway applies its commit log's records (what it told clients is
// durable) to the database within milliseconds: the check first waits, up to
// 10 s, for that log to be empty, and says so when it never is.
JournalCheck CheckJournal(const std::string& state_dir);

}  // namespace spillway::testing
