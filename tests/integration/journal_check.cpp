#include "journal_check.h"

#include <sqlite3.h>

#include <chrono>
#include <thread>

#include "journal/commit_log.h"

namespace spillway::testing {

JournalCheck CheckJournal(const std::string& state_dir) {
  JournalCheck out;
  sqlite3* db = nullptr;
  const std::string path = state_dir + "/journal.db";
  // Records whose rows are not in the database yet (journal.h: the commit log).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!journal::CommitLog::ReadRecords(path + "-log").empty()) {
    if (std::chrono::steady_clock::now() > deadline) {
      out.problems.push_back("the commit log still holds records not applied to " + path);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    out.problems.push_back("cannot open " + path);
    sqlite3_close(db);
    return out;
  }
  sqlite3_busy_timeout(db, 5000);
  auto each = [&](const char* sql, auto&& row) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db, sql, -1, &st, nullptr) != SQLITE_OK) {
      out.problems.push_back(std::string("query failed: ") + sqlite3_errmsg(db));
      return;
    }
    while (sqlite3_step(st) == SQLITE_ROW) row(st);
    sqlite3_finalize(st);
  };
  auto text = [](sqlite3_stmt* st, int i) {
    const unsigned char* t = sqlite3_column_text(st, i);
    return t ? std::string(reinterpret_cast<const char*>(t)) : std::string();
  };
  each("SELECT id, state, attempts FROM requests", [&](sqlite3_stmt* st) {
    const std::string id = text(st, 0), state = text(st, 1);
    out.state[id] = state;
    out.attempts[id] = sqlite3_column_int(st, 2);
    if (state != "completed" && state != "failed" && state != "failed_resumable" && state != "cancelled") {
      out.problems.push_back(id + " is not in a terminal state: " + state);
    }
  });
  each("SELECT request_id, n FROM attempts WHERE ended_ms = 0", [&](sqlite3_stmt* st) {
    out.problems.push_back(text(st, 0) + " attempt " + std::to_string(sqlite3_column_int(st, 1)) + " never ended");
  });
  each("SELECT r.id, r.attempts, COUNT(a.n) FROM requests r LEFT JOIN attempts a ON a.request_id = r.id GROUP BY r.id",
       [&](sqlite3_stmt* st) {
         if (sqlite3_column_int(st, 1) != sqlite3_column_int(st, 2)) {
           out.problems.push_back(text(st, 0) + " counts " + std::to_string(sqlite3_column_int(st, 1)) +
                                  " attempts but journaled " + std::to_string(sqlite3_column_int(st, 2)));
         }
       });
  sqlite3_close(db);
  return out;
}

}  // namespace spillway::testing
