// The commit log: the request path's hot writes are durable once their record
// is in it, their rows follow, and nothing in it is lost to a crash between
// the two, a torn write or a failed apply.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <boost/crc.hpp>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <tuple>
#include <thread>

#include "journal/commit_log.h"
#include "journal/journal_internal.h"
#include "journal/storage_faults.h"
#include "journal_fixture.h"

namespace spillway::journal {
namespace {

namespace fs = std::filesystem;

class CommitLogTest : public JournalFixture {
 protected:
  std::string LogPath() const { return (dir_ / "plain-log").string(); }
  // sync: FULL (a sync thread); faults: the storage faults it goes through.
  std::unique_ptr<CommitLog> OpenLog(std::vector<std::string>* leftover, bool sync = false,
                                     std::shared_ptr<StorageFaults> faults = nullptr) {
    auto log = CommitLog::Open(LogPath(), sync, std::move(faults), leftover);
    EXPECT_TRUE(log.ok()) << log.status().ToString();
    return log.ok() ? std::move(*log) : nullptr;
  }
  // What a replay would find now, read without changing the files.
  std::vector<std::string> OnDisk() const { return CommitLog::ReadRecords(LogPath()); }
  // Writes `bytes` over the file at `offset`.
  void Overwrite(int64_t offset, const std::string& bytes) const {
    std::fstream f(LogPath(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(offset);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  // Changes the byte at `offset` (XOR: a fixed byte written over a random
  // one, a CRC's or a generation's, left it as it was once in 256 runs).
  void Flip(int64_t offset) const {
    std::fstream f(LogPath(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(offset);
    const char c = static_cast<char>(f.get() ^ 0x5a);
    f.seekp(offset);
    f.put(c);
  }
  // The log holding "first" and "second", written by an earlier release, is
  // read, and replaced by one of this version's format that takes records.
  void ExpectReadAndReplaced() {
    EXPECT_EQ(OnDisk(), (std::vector<std::string>{"first", "second"}));
    std::vector<std::string> left;
    {
      auto log = OpenLog(&left);
      EXPECT_EQ(left, (std::vector<std::string>{"first", "second"}));
      ASSERT_GT(Append(*log, "third"), 0);
    }
    std::ifstream f(LogPath(), std::ios::binary);
    std::string magic(8, '\0');
    f.read(magic.data(), 8);
    EXPECT_EQ(magic, "SPWLOG3\n");
    OpenLog(&left);
    EXPECT_EQ(left, (std::vector<std::string>{"first", "second", "third"}));
  }
  static constexpr int64_t kHeader = 32, kRecordHeader = 16;
  static ino_t Inode(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
  }
  // Appends and returns the record's sequence number (0: it failed).
  static int64_t Append(CommitLog& log, const std::string& payload) {
    int64_t seq = 0;
    int rc = -1;
    log.Append(payload, [&](int64_t s) { seq = s; }, [&](int r, const std::string&) { rc = r; });
    return rc == SQLITE_OK ? seq : 0;
  }
  // Appends and waits until the record is durable or failed (at FULL, on the
  // sync thread): its result code, and what failed in `what`.
  static int AwaitAppend(CommitLog& log, const std::string& payload, std::string* what = nullptr) {
    std::promise<int> rc;
    log.Append(payload, [](int64_t) {}, [&](int r, const std::string& w) {
      if (what) *what = w;
      rc.set_value(r);
    });
    return rc.get_future().get();
  }
};

// At FULL a record handed to the journal (its queued callback) is one a
// replay reads. A replay between the two (the journal applying the log again
// after a failed commit) counted it as not yet synced, cut it off, and then
// counted it applied: its rows were never written, its request acknowledged.
TEST_F(CommitLogTest, ARecordHandedToTheJournalIsOneAReplayReads) {
  std::vector<std::string> left;
  auto log = OpenLog(&left, /*sync=*/true);
  ASSERT_NE(log, nullptr);
  int64_t seq = 0, last = 0;
  StatusOr<std::vector<std::string>> read = std::vector<std::string>{};
  std::promise<int> rc;
  log->Append(
      "handed",
      [&](int64_t s) {
        seq = s;
        read = log->ReadAll(&last);  // (as a replay on the journal's thread would, now)
      },
      [&](int r, const std::string&) { rc.set_value(r); });
  ASSERT_EQ(rc.get_future().get(), SQLITE_OK);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(last, seq);
  EXPECT_EQ(*read, std::vector<std::string>{"handed"});
}

TEST_F(CommitLogTest, RecordsNotYetAppliedAreWhatTheNextOpenFinds) {
  std::vector<std::string> left;
  {
    auto log = OpenLog(&left);
    ASSERT_TRUE(left.empty());
    EXPECT_EQ(Append(*log, "one"), 1);
    EXPECT_EQ(Append(*log, std::string("two\0with a zero", 15)), 2);
    EXPECT_EQ(Append(*log, ""), 3);
    log->Applied(2);  // not all: the file keeps every record
  }
  auto log = OpenLog(&left);
  EXPECT_EQ(left, (std::vector<std::string>{"one", std::string("two\0with a zero", 15), ""}));
}

TEST_F(CommitLogTest, OnceEveryRecordIsAppliedTheFileIsEmptied) {
  std::vector<std::string> left;
  auto log = OpenLog(&left);
  ASSERT_EQ(Append(*log, "one"), 1);
  ASSERT_EQ(Append(*log, "two"), 2);
  log->Applied(1);
  log->EmptyIfApplied();
  EXPECT_EQ(OnDisk().size(), 2u) << "emptied with a record not applied";
  log->Applied(2);
  EXPECT_EQ(OnDisk().size(), 2u) << "a small file is emptied only once the journal is idle";
  log->EmptyIfApplied();
  EXPECT_TRUE(OnDisk().empty());
  EXPECT_EQ(log->size(), 0);
  EXPECT_EQ(Append(*log, "three"), 3);  // appends go on after it
  log.reset();
  OpenLog(&left);
  EXPECT_EQ(left, std::vector<std::string>{"three"});
  // 4 KiB and more of applied records: emptied at once, without waiting for idleness.
  log = OpenLog(&left);
  for (int i = 0; i < 5; ++i) ASSERT_GT(Append(*log, std::string(1000, 'x')), 0);
  log->Applied(log->last_seq());
  EXPECT_TRUE(OnDisk().empty());
}

// The file keeps its size: records overwrite zeros written once or records
// already applied, so that a sync has no file size to make durable.
TEST_F(CommitLogTest, TheFileIsPreallocatedAndKeepsItsSize) {
  std::vector<std::string> left;
  auto log = OpenLog(&left);
  const auto size = fs::file_size(LogPath());
  EXPECT_GE(size, 1u << 20);
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 20; ++i) ASSERT_GT(Append(*log, std::string(500, static_cast<char>('a' + round))), 0);
    log->Applied(log->last_seq());
    EXPECT_TRUE(OnDisk().empty()) << round;
  }
  EXPECT_EQ(fs::file_size(LogPath()), size);
}

// A file begun again still holds the records of its earlier generation past
// the new ones: none of them is replayed, even one that starts exactly where
// the last new record ends.
TEST_F(CommitLogTest, ARecordOfAnEarlierGenerationIsNeverReplayed) {
  std::vector<std::string> left;
  {
    auto log = OpenLog(&left);
    for (const char* p : {"old one", "old two", "old three"}) ASSERT_GT(Append(*log, p), 0);
    log->Applied(3);
    log->EmptyIfApplied();
    ASSERT_GT(Append(*log, "new one"), 0);  // as long as "old one": "old two" follows it intact
  }
  OpenLog(&left);
  EXPECT_EQ(left, std::vector<std::string>{"new one"});
  // A record whose CRC checks out under the file's generation but whose
  // generation field names another (CRC-32 alone cannot tell some pairs of
  // generations apart) ends the replay too.
  {
    auto log = OpenLog(&left);
    ASSERT_GT(Append(*log, "second"), 0);
  }
  Overwrite(kHeader + kRecordHeader + 7 + 8, std::string(8, '\x5a'));  // "second"'s generation field
  OpenLog(&left);
  EXPECT_EQ(left, std::vector<std::string>{"new one"});
}

// Logs an earlier release left, written with zlib's CRC-32 (boost's
// crc_32_type computes the same).
std::string Crc32Le(const std::string& bytes) {
  boost::crc_32_type c;
  c.process_bytes(bytes.data(), bytes.size());
  const uint32_t v = c.checksum();
  std::string out;
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  return out;
}

std::string U32Le(uint32_t v) {
  std::string out;
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  return out;
}

// The first version: no header, each CRC-32 over its payload alone.
TEST_F(CommitLogTest, ALogOfTheEarlierFormatIsReadAndReplaced) {
  {
    std::ofstream f(LogPath(), std::ios::binary);
    for (const std::string p : {"first", "second"}) f << U32Le(static_cast<uint32_t>(p.size())) << Crc32Le(p) << p;
  }
  ExpectReadAndReplaced();
}

// The version before this one ("SPWLOG2", CRC-32 where this one has CRC-32C),
// with its header sound or damaged.
TEST_F(CommitLogTest, ALogOfThePreviousVersionIsReadAndReplaced) {
  const uint64_t gen = 0x0123456789abcdefull;
  const std::string gen_le = U32Le(static_cast<uint32_t>(gen)) + U32Le(static_cast<uint32_t>(gen >> 32));
  for (const bool damaged : {false, true}) {
    SCOPED_TRACE(damaged ? "a damaged header" : "a sound header");
    std::string file = "SPWLOG2\n" + gen_le;
    file += Crc32Le(file);
    file.resize(kHeader, '\0');
    for (const std::string p : {"first", "second"}) {
      file += U32Le(static_cast<uint32_t>(p.size())) + Crc32Le(p + gen_le) + gen_le + p;
    }
    if (damaged) file[3] = 'X';
    std::ofstream(LogPath(), std::ios::binary | std::ios::trunc) << file;
    ExpectReadAndReplaced();
    fs::remove(LogPath() + ".damaged");
  }
}

// Under a steady load the file may never be all applied at once: past 256
// KiB it is set aside, and once its records are applied it becomes the spare
// that the next rotation takes, instead of the file growing on.
TEST_F(CommitLogTest, AFileThatIsNeverAllAppliedIsSetAsideAndRecycledOnceItsRecordsAre) {
  std::vector<std::string> left;
  std::vector<std::string> written;
  const auto spare = LogPath() + ".spare", old = LogPath() + ".old";
  {
    auto log = OpenLog(&left);
    for (int i = 0; i < 10; ++i) {
      written.emplace_back();
      written.back().assign(size_t{64} << 10, static_cast<char>('a' + i));
      ASSERT_EQ(Append(*log, written.back()), i + 1);
    }
    ASSERT_TRUE(fs::exists(old)) << "no rotation past 256 KiB";
    EXPECT_EQ(OnDisk(), written);
  }
  // A crash now: both files' records, oldest first.
  auto log = OpenLog(&left);
  EXPECT_EQ(left, written);
  // The next process applied them: both files go.
  log->DropLeftovers();
  EXPECT_FALSE(fs::exists(old));
  EXPECT_TRUE(OnDisk().empty());
  // Its own life: once the records of the file set aside are applied it
  // becomes the spare, while the newer ones stay.
  for (int i = 0; i < 10; ++i) ASSERT_EQ(Append(*log, written[static_cast<size_t>(i)]), i + 1);
  ASSERT_TRUE(fs::exists(old));
  const ino_t set_aside = Inode(old);
  log->Applied(3);
  EXPECT_TRUE(fs::exists(old)) << "recycled with a record in it not applied";
  log->Applied(4);
  EXPECT_FALSE(fs::exists(old));
  ASSERT_TRUE(fs::exists(spare));
  EXPECT_EQ(OnDisk(), std::vector<std::string>(written.begin() + 4, written.end()));
  // The next record past 256 KiB sets the file aside again and goes on in the spare.
  ASSERT_EQ(Append(*log, "next"), 11);
  EXPECT_TRUE(fs::exists(old));
  EXPECT_FALSE(fs::exists(spare));
  EXPECT_EQ(Inode(LogPath()), set_aside) << "a new file instead of the spare";
  std::vector<std::string> expect(written.begin() + 4, written.end());
  expect.push_back("next");
  EXPECT_EQ(OnDisk(), expect) << "a record of the spare's earlier life was read again";
  ASSERT_EQ(Append(*log, "after"), 12);
  expect.push_back("after");
  EXPECT_EQ(OnDisk(), expect);
  log->Applied(12);
  log->EmptyIfApplied();
  EXPECT_TRUE(OnDisk().empty());
  EXPECT_TRUE(fs::exists(spare));
}

// At FULL the spare's new header is synced (by the sync thread) before a
// rotation takes it; a spare whose sync failed is dropped, and the rotation
// makes a new file. Nothing written is lost either way.
TEST_F(CommitLogTest, AtFullTheSpareIsSyncedBeforeARotationTakesIt) {
  auto faults = StorageFaults::Create();
  ASSERT_NE(faults, nullptr);
  const std::string rec(64 << 10, 'r');
  const auto old = LogPath() + ".old", spare = LogPath() + ".spare";
  for (const bool spare_sync_fails : {false, true}) {
    SCOPED_TRACE(spare_sync_fails ? "the spare's sync fails" : "the spare's sync works");
    for (const auto& f : {LogPath(), old, spare}) fs::remove(f);
    std::vector<std::string> left, expect;
    {
      auto log = OpenLog(&left, /*sync=*/true, faults);
      ASSERT_NE(log, nullptr);
      for (int i = 0; i < 4; ++i) ASSERT_EQ(AwaitAppend(*log, rec), SQLITE_OK);
      ASSERT_TRUE(fs::exists(old)) << "no rotation past 256 KiB";
      const ino_t set_aside = Inode(old);
      log->Drain();  // (the sync round that told the callers lets go of the file set aside after)
      if (spare_sync_fails) faults->FailSyncs(1);  // the next sync: the spare's (nothing else waits for one)
      log->Applied(4);  // the spare, whose sync the sync thread starts at once
      if (!spare_sync_fails) {
        ASSERT_TRUE(fs::exists(spare));
      }
      for (int i = 0; i < 4; ++i) {
        expect.push_back(rec + std::to_string(i));
        ASSERT_EQ(AwaitAppend(*log, expect.back()), SQLITE_OK);
        if (i == 0) {
          EXPECT_EQ(fs::exists(spare), !spare_sync_fails) << "(a spare whose sync failed is dropped)";
        }
      }
      ASSERT_TRUE(fs::exists(old)) << "no second rotation";
      // (A new file may get the dropped spare's inode number: compared only when the spare is kept.)
      if (!spare_sync_fails) {
        EXPECT_EQ(Inode(LogPath()), set_aside) << "the rotation did not take the spare";
      }
      expect.push_back("last");
      ASSERT_EQ(AwaitAppend(*log, "last"), SQLITE_OK);
    }
    auto log = OpenLog(&left, /*sync=*/true, faults);
    ASSERT_NE(log, nullptr);
    EXPECT_EQ(left, expect);
  }
}

// A deferred record (a non-streamed request's first attempt) asks for no
// sync of its own: it becomes durable with the next record that does, in
// that record's sync, on SyncNow, on Drain, or once it has waited its bound.
TEST_F(CommitLogTest, ADeferredRecordSharesTheNextSyncAndWaitsNoLongerThanItsBound) {
  auto faults = StorageFaults::Create();
  ASSERT_NE(faults, nullptr);
  std::vector<std::string> left;
  auto log = OpenLog(&left, /*sync=*/true, faults);
  ASSERT_NE(log, nullptr);
  log->set_lazy_wait(std::chrono::hours(1));
  log->Drain();  // (whatever Open synced is behind us)
  struct Unblock {  // a failed check still lets the log's syncs go before it closes
    StorageFaults* f;
    ~Unblock() { f->Unblock(); }
  } unblock{faults.get()};
  std::atomic<int> durable{0};
  const auto append = [&](const std::string& payload, bool deferred) {
    log->Append(payload, [](int64_t) {}, [&](int rc, const std::string&) {
      EXPECT_EQ(rc, SQLITE_OK);
      ++durable;
    }, deferred);
  };
  const auto durable_soon = [&](int n) {
    for (int i = 0; i < 5000 && durable.load() < n; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return durable.load() >= n;
  };
  faults->BlockSyncs();
  const int64_t held = faults->syncs();  // (none held yet: syncs() counts those that went on)
  append("request", /*deferred=*/true);
  EXPECT_FALSE(faults->WaitForHeldSyncs(1, std::chrono::milliseconds(200))) << "a deferred record asked for a sync";
  append("end", /*deferred=*/false);
  ASSERT_TRUE(faults->WaitForHeldSyncs(1, std::chrono::seconds(5)));
  EXPECT_EQ(durable.load(), 0) << "durable before its sync";
  faults->PassSyncs(1);
  ASSERT_TRUE(durable_soon(2));
  EXPECT_EQ(faults->syncs() - held, 1) << "the two records did not share one sync";

  append("asked for", /*deferred=*/true);
  log->SyncNow();
  ASSERT_TRUE(faults->WaitForHeldSyncs(2, std::chrono::seconds(5))) << "SyncNow did not sync it";
  faults->PassSyncs(1);
  ASSERT_TRUE(durable_soon(3));

  faults->Unblock();
  append("drained", /*deferred=*/true);
  log->Drain();
  EXPECT_EQ(durable.load(), 4) << "Drain returned before a deferred record was durable";

  log->set_lazy_wait(std::chrono::milliseconds(20));
  append("alone", /*deferred=*/true);
  EXPECT_TRUE(durable_soon(5)) << "a deferred record alone was never synced";
  log.reset();
  auto reopened = OpenLog(&left, /*sync=*/true, faults);
  EXPECT_EQ(left, (std::vector<std::string>{"request", "end", "asked for", "drained", "alone"}));
}

// A rotation while the spare's header is still on its way to the disk does
// not take the spare: it makes a new file.
TEST_F(CommitLogTest, ARotationNeverTakesASpareWhoseHeaderIsNotYetDurable) {
  auto faults = StorageFaults::Create();
  ASSERT_NE(faults, nullptr);
  std::vector<std::string> left;
  const std::string rec(64 << 10, 'r');
  const auto old = LogPath() + ".old", spare = LogPath() + ".spare";
  std::vector<std::string> expect;
  {
    auto log = OpenLog(&left, /*sync=*/true, faults);
    ASSERT_NE(log, nullptr);
    std::vector<std::future<int>> done;
    auto append = [&](const std::string& payload) {
      auto p = std::make_shared<std::promise<int>>();
      done.push_back(p->get_future());
      log->Append(payload, [](int64_t) {}, [p](int r, const std::string&) { p->set_value(r); });
    };
    for (int i = 0; i < 4; ++i) append(rec);
    for (auto& d : done) ASSERT_EQ(d.get(), SQLITE_OK);
    done.clear();
    ASSERT_TRUE(fs::exists(old));
    log->Drain();  // (the sync round that told the callers lets go of the file set aside after)
    faults->BlockSyncs();
    log->Applied(4);  // the spare: its header's sync now waits
    ASSERT_TRUE(fs::exists(spare));
    for (int i = 0; i < 4; ++i) {
      expect.push_back(rec + std::to_string(i));
      append(expect.back());  // the fourth one rotates
    }
    EXPECT_TRUE(fs::exists(spare)) << "the rotation took a spare whose header may not be durable";
    faults->Unblock();
    for (auto& d : done) EXPECT_EQ(d.get(), SQLITE_OK);
  }
  auto log = OpenLog(&left, /*sync=*/true, faults);
  ASSERT_NE(log, nullptr);
  EXPECT_EQ(left, expect);
}

TEST_F(CommitLogTest, ATornOrDamagedRecordEndsTheReplayAtIt) {
  std::vector<std::string> left;
  {
    auto log = OpenLog(&left);
    for (const char* p : {"first", "second", "third"}) ASSERT_GT(Append(*log, p), 0);
  }
  // A crash in mid-write: the last record lacks its end (zeros where it ends).
  const int64_t third = kHeader + kRecordHeader + 5 + kRecordHeader + 6;
  Overwrite(third + kRecordHeader + 3, std::string(2, '\0'));
  OpenLog(&left);
  EXPECT_EQ(left, (std::vector<std::string>{"first", "second"}));
  // A flipped byte in the second record's payload: its CRC no longer matches.
  Overwrite(kHeader + kRecordHeader + 5 + kRecordHeader + 1, "X");
  left.clear();
  OpenLog(&left);
  EXPECT_EQ(left, std::vector<std::string>{"first"});
}

// Damage in the middle of the log (a bad sector, a stray write) loses the
// records in it, not the acknowledged ones after it: a good record of the
// file's generation further on is never what a crash leaves (the log is
// written in order), so the replay goes on from there, says so, and keeps
// the file as it was. The replay ended at the damage, and the rewrite
// dropped everything after it.
TEST_F(CommitLogTest, DamageInTheMiddleLosesOnlyTheRecordsInIt) {
  std::vector<std::string> left;
  {
    auto log = OpenLog(&left);
    for (const char* p : {"first", "second", "third", "fourth"}) ASSERT_GT(Append(*log, p), 0);
  }
  Overwrite(kHeader + kRecordHeader + 5 + kRecordHeader + 1, "X");  // in "second"'s payload
  OpenLog(&left);
  EXPECT_EQ(left, (std::vector<std::string>{"first", "third", "fourth"}));
  EXPECT_TRUE(fs::exists(LogPath() + ".damaged")) << "the damaged file was not kept";
  // Rewritten without the damage: the next Open finds the same, with nothing to skip.
  fs::remove(LogPath() + ".damaged");
  OpenLog(&left);
  EXPECT_EQ(left, (std::vector<std::string>{"first", "third", "fourth"}));
  EXPECT_FALSE(fs::exists(LogPath() + ".damaged"));
  // Zeros over a record (a cut written in parts, pages a power loss wrote
  // back out of order) are not damage: nothing after them was acknowledged.
  {
    auto log = OpenLog(&left);
    ASSERT_GT(Append(*log, "fifth"), 0);
  }
  Overwrite(kHeader + kRecordHeader + 5, std::string(kRecordHeader + 5, '\0'));  // "third", the second record now
  OpenLog(&left);
  EXPECT_EQ(left, std::vector<std::string>{"first"});
  EXPECT_FALSE(fs::exists(LogPath() + ".damaged"));
}

// A header that no longer checks out (a flipped bit in its CRC, its magic,
// its generation) does not hide the acknowledged records after it: they
// carry their generation themselves. The replay found none before.
TEST_F(CommitLogTest, ADamagedHeaderHidesNoRecord) {
  for (const int64_t at : {int64_t{16}, int64_t{0}, int64_t{9}}) {
    SCOPED_TRACE("damage at byte " + std::to_string(at));
    fs::remove(LogPath());
    fs::remove(LogPath() + ".damaged");
    std::vector<std::string> left;
    {
      auto log = OpenLog(&left);
      for (const char* p : {"first", "second"}) ASSERT_GT(Append(*log, p), 0);
    }
    Flip(at);
    EXPECT_EQ(OnDisk(), (std::vector<std::string>{"first", "second"}));
    {
      auto log = OpenLog(&left);
      EXPECT_EQ(left, (std::vector<std::string>{"first", "second"}));
      EXPECT_TRUE(fs::exists(LogPath() + ".damaged")) << "the damaged file was not kept";
      ASSERT_GT(Append(*log, "third"), 0);
    }
    OpenLog(&left);  // rewritten under a good header
    EXPECT_EQ(left, (std::vector<std::string>{"first", "second", "third"}));
  }
  // Records all applied and the file begun again: a damaged header over
  // them finds none to apply a second time.
  fs::remove(LogPath());
  std::vector<std::string> left;
  {
    auto log = OpenLog(&left);
    for (const char* p : {"done-1", "done-2"}) ASSERT_GT(Append(*log, p), 0);
    log->Applied(log->last_seq());
    log->EmptyIfApplied();
  }
  Flip(16);
  EXPECT_TRUE(OnDisk().empty());
  OpenLog(&left);
  EXPECT_TRUE(left.empty());
}

// The tear is cut off when the log is opened: records written after it are
// not hidden behind it at the next replay.
TEST_F(CommitLogTest, RecordsWrittenAfterATornOneAreFoundAgain) {
  std::vector<std::string> left;
  {
    auto log = OpenLog(&left);
    ASSERT_GT(Append(*log, "before"), 0);
  }
  // A record header promising 64 bytes, and a few of them.
  Overwrite(kHeader + kRecordHeader + 6, std::string("\x40\x00\x00\x00half", 8));
  {
    auto log = OpenLog(&left);
    EXPECT_EQ(left, std::vector<std::string>{"before"});
    ASSERT_GT(Append(*log, "after"), 0);
  }
  OpenLog(&left);
  EXPECT_EQ(left, (std::vector<std::string>{"before", "after"}));
}

// Records whose rows never commit (a journal stuck behind a failing apply)
// must not fill the disk: past the log's bound an append fails as a full disk
// does, and records that fit again (once applied) are taken again.
TEST_F(CommitLogTest, PastItsBoundTheLogRefusesRecordsAsAFullDiskDoes) {
  std::vector<std::string> left;
  auto log = OpenLog(&left);
  const int64_t kRecord = 1000 + kRecordHeader;
  log->set_max_bytes(8 * kRecord);
  const std::string kb(1000, 'x');
  for (int64_t i = 1; i <= 8; ++i) ASSERT_EQ(Append(*log, kb), i);
  int rc = SQLITE_OK;
  std::string what;
  log->Append(kb, [](int64_t) { ADD_FAILURE() << "a refused record reached the journal"; },
              [&](int r, const std::string& w) { rc = r, what = w; });
  EXPECT_EQ(rc, CommitLog::kCapRc);
  EXPECT_EQ(rc & 0xff, SQLITE_FULL);  // a storage failure, to SQLite's way of telling
  EXPECT_EQ(detail::StorageProblem(rc), "commit log full");
  EXPECT_EQ(detail::StorageProblem(SQLITE_FULL), "disk full");
  EXPECT_NE(what.find("have not committed"), std::string::npos) << what;
  // A large record (over a quarter of the cap) that does not fit beside the
  // records there now is refused alone, to be sent again: it made the whole
  // journal refuse every request for a while, as a full log does.
  log->Append(std::string(3 * kRecord, 'x'), [](int64_t) { ADD_FAILURE() << "a refused record was queued"; },
              [&](int r, const std::string& w) { rc = r, what = w; });
  EXPECT_EQ(rc, CommitLog::kNoRoomRc);
  EXPECT_TRUE(detail::StorageProblem(rc).empty()) << "taken for the storage's failure: " << detail::StorageProblem(rc);
  EXPECT_NE(what.find("no room for it now"), std::string::npos) << what;
  log->Applied(8);
  log->EmptyIfApplied();  // emptied: room again
  EXPECT_EQ(Append(*log, kb), 9);
  EXPECT_EQ(Append(*log, std::string(3 * kRecord - kRecordHeader, 'x')), 10) << "taken once there is room";
  // A record the log could not hold even empty is that record's refusal, not
  // a full log's: the journal took it for a storage failure and refused every
  // request for a while (one huge body, sent now and then, kept it refusing).
  log->Append(std::string(9 * kRecord, 'x'), [](int64_t) { ADD_FAILURE() << "a refused record was queued"; },
              [&](int r, const std::string& w) { rc = r, what = w; });
  EXPECT_EQ(rc, CommitLog::kTooLargeRc);
  EXPECT_TRUE(detail::StorageProblem(rc).empty()) << "taken for the storage's failure: " << detail::StorageProblem(rc);
  EXPECT_NE(what.find("larger than"), std::string::npos) << what;
  EXPECT_EQ(Append(*log, kb), 11);
}

// A record whose sync failed was answered "failed": no replay may apply it,
// even when records after it synced fine.
TEST_F(CommitLogTest, ARecordWhoseSyncFailedIsNeverReplayed) {
  auto faults = StorageFaults::Create();
  ASSERT_NE(faults, nullptr);
  std::vector<std::string> left;
  {
    auto log = OpenLog(&left, /*sync=*/true, faults);
    ASSERT_NE(log, nullptr);
    ASSERT_EQ(AwaitAppend(*log, "synced"), SQLITE_OK);
    faults->FailSyncs(1);
    ASSERT_EQ(AwaitAppend(*log, "failed"), SQLITE_IOERR_FSYNC);
    log->Drain();
    EXPECT_EQ(OnDisk(), std::vector<std::string>{"synced"}) << "a crash now would replay it";
    ASSERT_EQ(AwaitAppend(*log, "after"), SQLITE_OK);
    log->Drain();  // (the sync thread books the round after telling its callers)
    int64_t last = 0;
    EXPECT_EQ(log->ReadAll(&last).value(), (std::vector<std::string>{"synced", "after"}));
  }
  auto log = OpenLog(&left, /*sync=*/true, faults);
  ASSERT_NE(log, nullptr);
  EXPECT_EQ(left, (std::vector<std::string>{"synced", "after"}));
}

// A failed record whose cut cannot be synced either: the log takes nothing
// more, and says that a restart is what brings it back.
TEST_F(CommitLogTest, ALogThatCannotCutAFailedRecordSaysARestartIsNeeded) {
  auto faults = StorageFaults::Create();
  ASSERT_NE(faults, nullptr);
  std::vector<std::string> left;
  {
    auto log = OpenLog(&left, /*sync=*/true, faults);
    ASSERT_NE(log, nullptr);
    ASSERT_EQ(AwaitAppend(*log, "synced"), SQLITE_OK);
    faults->FailSyncs(2);  // the record's sync, then the cut's
    ASSERT_EQ(AwaitAppend(*log, "failed"), SQLITE_IOERR_FSYNC);
    log->Drain();
    // What a replay reads now: the acknowledged record, not the failed one
    // (its zeros are written, only not synced). It dropped the acknowledged
    // one too: the failed record was left out twice, once as zeros and once
    // by count.
    int64_t last = 0;
    EXPECT_EQ(log->ReadAll(&last).value(), std::vector<std::string>{"synced"});
    std::string what;
    EXPECT_EQ(AwaitAppend(*log, "refused", &what), SQLITE_IOERR_WRITE);
    EXPECT_NE(what.find("restart spillway"), std::string::npos) << what;
  }
  auto log = OpenLog(&left, /*sync=*/true, faults);
  ASSERT_NE(log, nullptr);
  EXPECT_EQ(left, std::vector<std::string>{"synced"});
  EXPECT_EQ(AwaitAppend(*log, "after the restart"), SQLITE_OK);
}

// An append after the sync thread stopped (teardown) fails at once instead
// of waiting forever for a sync that never comes.
TEST_F(CommitLogTest, AnAppendAfterStopFailsAtOnce) {
  std::vector<std::string> left;
  auto log = OpenLog(&left, /*sync=*/true);
  ASSERT_NE(log, nullptr);
  log->Stop();
  std::promise<int> rc;
  log->Append("late", [](int64_t) {}, [&](int r, const std::string&) { rc.set_value(r); });
  auto f = rc.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(5)), std::future_status::ready) << "the append hung";
  EXPECT_EQ(f.get(), SQLITE_MISUSE);
}

TEST_F(CommitLogTest, AFieldReaderNeverReadsPastItsRecord) {
  RecordWriter w;
  w.U8(7).I64(-5).Str("text");
  const std::string rec = w.out();
  uint8_t u = 0;
  int64_t i = 0;
  std::string s;
  RecordReader r(rec);
  ASSERT_TRUE(r.U8(&u) && r.I64(&i) && r.Str(&s));
  EXPECT_EQ(u, 7);
  EXPECT_EQ(i, -5);
  EXPECT_EQ(s, "text");
  EXPECT_TRUE(r.done());
  EXPECT_FALSE(r.U8(&u));
  for (size_t cut = 0; cut < rec.size(); ++cut) {  // every truncation is refused somewhere
    const std::string part = rec.substr(0, cut);
    RecordReader p(part);
    EXPECT_FALSE(p.U8(&u) && p.I64(&i) && p.Str(&s)) << cut;
  }
  const std::string lying = std::string("\xff\xff\xff\x7f", 4) + "ab";  // a length past the end
  RecordReader l(lying);
  EXPECT_FALSE(l.Str(&s));
}

// The journal's side: logged writes on the fault-injecting VFS.
class LoggedWritesTest : public FaultyJournalFixture {
 protected:
  JournalOptions Slow(bool full) {
    JournalOptions o = Options();
    o.synchronous_full = full;
    o.log_apply_delay_ms = 3'600'000;  // rows wait until something takes them along
    return o;
  }
  // A logged write's result, once it is durable.
  static Status Durable(const std::function<void(Journal::OnCommit)>& start) {
    std::promise<Status> p;
    auto f = p.get_future();
    start([&p](Status st) { p.set_value(st); });
    return f.get();
  }
  Status NewRunning(const std::string& id) {
    return Durable([&](auto done) { j_->AcceptAndStartAsync(Rec(id), "cpu", "", std::move(done)); });
  }
  // Request `id` runs, durable in the log, and its rows failed to commit
  // (the disk filled after its record was written); the disk takes writes
  // again. False when it did not come to that.
  bool RowsFailedToCommit(const std::string& id) {
    Reopen(Slow(false));
    if (!NewRunning(id).ok()) return false;
    faults_->SetDiskFull(true);
    j_->Flush();  // the rows' transaction fails
    const bool failed = !j_->Get(id).ok();
    faults_->SetDiskFull(false);
    return failed;
  }
  Status End(const std::string& id, const std::string& answer) {
    return Durable([&](auto done) {
      j_->FinishAsync(id, State::kCompleted, 200, "application/json", answer, "", std::move(done));
    });
  }
  // The journal's files as they are now, copied aside: what a process
  // killed at this instant would leave (for an Open of its own).
  fs::path CopyAsCrashed() {
    const fs::path crashed = dir_ / "crashed";
    fs::create_directories(crashed);
    for (const char* f : {"journal.db", "journal.db-wal", "journal.db-log"}) {
      if (fs::exists(dir_ / f)) fs::copy_file(dir_ / f, crashed / f);
    }
    return crashed;
  }
  // A process killed after two requests' records were durable ("done"
  // finished, "running" not) and before their rows committed: its files
  // (empty when a write failed).
  fs::path CrashedWithDoneAndRunning() {
    Reopen(Slow(true));
    if (!NewRunning("done").ok() || !End("done", "answer").ok() || !NewRunning("running").ok()) return {};
    return CopyAsCrashed();
  }
  static bool Eventually(const std::function<bool()>& f) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      if (f()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return f();
  }
};

TEST_F(LoggedWritesTest, WhatWasToldDurableIsReadBackAtOnceAndTheObserverHearsOfItOnceCommitted) {
  for (bool full : {true, false}) {
    Reopen(Slow(full));
    // Shared with the observer, which may outlive this scope when an assertion fails.
    struct Told {
      std::mutex m;
      std::vector<Transition::Kind> kinds;
    };
    auto heard = std::make_shared<Told>();
    auto& told = heard->kinds;
    auto& m = heard->m;
    j_->SetObserver([heard](const Transition& t) {
      std::lock_guard<std::mutex> lk(heard->m);
      heard->kinds.push_back(t.kind);
    });
    const std::string id = full ? "full" : "normal";
    const int64_t commits = j_->stats().commits;
    ASSERT_TRUE(NewRunning(id).ok());
    ASSERT_TRUE(End(id, "the answer").ok());
    EXPECT_EQ(j_->stats().commits, commits) << "nothing waited for a transaction";
    {
      std::lock_guard<std::mutex> lk(m);
      EXPECT_TRUE(told.empty()) << "told before the rows were committed";
    }
    auto rec = j_->Get(id);  // waits for the rows
    ASSERT_TRUE(rec.ok()) << rec.status().ToString();
    EXPECT_EQ(rec->state, State::kCompleted);
    EXPECT_EQ(rec->result_body, "the answer");
    ASSERT_EQ(j_->Attempts(id)->size(), 1u);
    EXPECT_EQ((*j_->Attempts(id))[0].outcome, "completed");
    std::lock_guard<std::mutex> lk(m);
    EXPECT_EQ(told, (std::vector<Transition::Kind>{Transition::Kind::kAttempt, Transition::Kind::kFinished}));
  }
}

// A request's start and end in one batch (a short request's rows, waiting
// together) are applied as the rows they come to, one insert each: the
// rows are what the two records applied one after the other leave, and the
// observer hears the same two transitions.
TEST_F(LoggedWritesTest, AStartAndItsEndInOneBatchLeaveTheRowsEachAloneWouldLeave) {
  Reopen(Slow(false));
  using Heard = std::vector<std::tuple<Transition::Kind, std::string, State, int64_t, std::string>>;
  auto heard = std::make_shared<std::pair<std::mutex, Heard>>();
  j_->SetObserver([heard](const Transition& t) {
    std::lock_guard<std::mutex> lk(heard->first);
    heard->second.emplace_back(t.kind, t.id, t.state, t.status, t.placement + "|" + t.error + "|" + t.decision_json);
  });
  auto end = [&](const std::string& id, bool failed) {
    return Durable([&](auto done) {
      if (failed) return j_->FinishAsync(id, State::kFailed, 502, "application/json", "{\"error\":1}", "boom", std::move(done));
      j_->FinishAsync(id, State::kCompleted, 200, "application/json", "the answer", "", std::move(done));
    });
  };
  auto start = [&](const std::string& id) {
    RequestRecord r = Rec(id);
    r.deadline_ms = 1234;
    r.body = "{\"prompt\":\"x\"}";
    return Durable([&](auto done) { j_->AcceptAndStartAsync(r, "chat.0", "{\"d\":1}", std::move(done)); });
  };
  for (bool failed : {false, true}) {
    SCOPED_TRACE(failed ? "failed" : "completed");
    const std::string apart = failed ? "apart-failed" : "apart", paired = failed ? "paired-failed" : "paired";
    const int64_t before = j_->stats().paired;
    ASSERT_TRUE(start(apart).ok());
    j_->Flush();  // its start's rows alone
    clock_.Advance(7);
    ASSERT_TRUE(end(apart, failed).ok());
    j_->Flush();
    clock_.Advance(-7);
    ASSERT_TRUE(start(paired).ok());
    clock_.Advance(7);
    ASSERT_TRUE(end(paired, failed).ok());
    j_->Flush();  // both in one batch
    EXPECT_EQ(j_->stats().paired, before + 1);
    auto a = j_->Get(apart);
    auto p = j_->Get(paired);
    ASSERT_TRUE(a.ok() && p.ok());
    auto fields = [](const RequestRecord& r) {
      return std::make_tuple(r.client, r.idempotency_key, r.payload_hash, r.service, r.endpoint, r.stream, r.body,
                             r.body_type, StateName(r.state), r.placement, r.attempts, r.error, r.result_status,
                             r.result_type, r.result_body, r.decision, r.created_ms, r.updated_ms, r.deadline_ms);
    };
    EXPECT_EQ(fields(*a), fields(*p));
    EXPECT_EQ(p->state, failed ? State::kFailed : State::kCompleted);
    EXPECT_EQ(p->updated_ms - p->created_ms, 7);
    auto aa = j_->Attempts(apart);
    auto pa = j_->Attempts(paired);
    ASSERT_TRUE(aa.ok() && pa.ok());
    ASSERT_EQ(pa->size(), 1u);
    ASSERT_EQ(aa->size(), 1u);
    for (auto* at : {&(*aa)[0], &(*pa)[0]}) {
      EXPECT_EQ(at->outcome, failed ? "failed" : "completed");
    }
    EXPECT_EQ((*aa)[0].error, (*pa)[0].error);
    EXPECT_EQ((*aa)[0].placement, (*pa)[0].placement);
    EXPECT_EQ((*aa)[0].started_ms, (*pa)[0].started_ms);
    EXPECT_EQ((*aa)[0].ended_ms, (*pa)[0].ended_ms);
    clock_.Advance(-7);
  }
  EXPECT_TRUE(j_->Recover()->empty());
  std::lock_guard<std::mutex> lk(heard->first);
  Heard apart, paired;
  for (const auto& h : heard->second) {
    auto x = h;
    const std::string id = std::get<1>(x);
    std::get<1>(x) = "";
    (id.rfind("apart", 0) == 0 ? apart : paired).push_back(x);
  }
  EXPECT_EQ(apart, paired);
  EXPECT_EQ(paired.size(), 4u);
}

// An unlogged write between a start and its end (a second attempt begun)
// keeps them apart: it may be about the same request, and must see the
// start's rows and be seen by the end's.
TEST_F(LoggedWritesTest, AnUnloggedWriteBetweenAStartAndItsEndKeepsThemApart) {
  Reopen(Slow(false));
  for (int i = 0; i < 20; ++i) {
    const std::string id = "r" + std::to_string(i);
    ASSERT_TRUE(NewRunning(id).ok());
    std::promise<Status> second;
    j_->StartAttemptAsync(id, "gpu", "", [&](Status st) { second.set_value(st); });
    ASSERT_TRUE(End(id, "answer").ok());
    ASSERT_TRUE(second.get_future().get().ok());
    auto attempts = j_->Attempts(id);
    ASSERT_TRUE(attempts.ok());
    ASSERT_EQ(attempts->size(), 2u);
    EXPECT_EQ((*attempts)[1].placement, "gpu");
    EXPECT_EQ((*attempts)[1].outcome, "completed");
    EXPECT_NE((*attempts)[1].ended_ms, 0);
    EXPECT_EQ(j_->Get(id)->state, State::kCompleted);
    EXPECT_EQ(j_->Get(id)->attempts, 2);
  }
}

// A record the log cannot write fails its caller (its rows never come), and
// the writes after it go on once the disk takes them.
TEST_F(LoggedWritesTest, ARecordTheLogCannotWriteFailsItsCallerAlone) {
  Reopen(Slow(false));
  faults_->SetDiskFull(true);
  const Status refused = NewRunning("lost");
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable) << refused.ToString();
  faults_->SetDiskFull(false);
  clock_.Advance(JournalOptions{}.unwritable_retry_ms);
  ASSERT_TRUE(NewRunning("kept").ok());
  ASSERT_TRUE(End("kept", "answer").ok());
  j_->Flush();
  EXPECT_EQ(j_->Get("lost").status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(j_->Get("kept").ok());
  EXPECT_EQ(j_->Get("kept")->state, State::kCompleted);
  EXPECT_EQ(j_->stats().logged, 2);
}

// A pair whose rows a replay of the log brought first (the batch after
// rows failed to commit): applied one by one, changing nothing, and not
// told twice.
TEST_F(LoggedWritesTest, APairAReplayBroughtFirstIsToldOnce) {
  ASSERT_TRUE(RowsFailedToCommit("a"));
  clock_.Advance(JournalOptions{}.unwritable_retry_ms);
  auto heard = std::make_shared<std::pair<std::mutex, std::vector<std::string>>>();
  j_->SetObserver([heard](const Transition& t) {
    std::lock_guard<std::mutex> lk(heard->first);
    heard->second.push_back(t.id + (t.kind == Transition::Kind::kAttempt ? " attempt" : " end"));
  });
  ASSERT_TRUE(NewRunning("b").ok());
  ASSERT_TRUE(End("b", "answer").ok());
  j_->Flush();
  ASSERT_TRUE(j_->Get("b").ok());
  EXPECT_EQ(j_->Get("b")->state, State::kCompleted);
  EXPECT_EQ(j_->Get("b")->result_body, "answer");
  EXPECT_EQ(j_->Attempts("b")->size(), 1u);
  EXPECT_EQ(j_->Get("a")->state, State::kRunning);
  std::lock_guard<std::mutex> lk(heard->first);
  EXPECT_EQ(std::count(heard->second.begin(), heard->second.end(), "b attempt"), 1);
  EXPECT_EQ(std::count(heard->second.begin(), heard->second.end(), "b end"), 1);
}

// A process that dies after the records are durable and before their rows
// are committed: the files as it left them, opened by the next one.
TEST_F(LoggedWritesTest, RecordsWhoseRowsNeverCommittedAreAppliedByTheNextOpen) {
  const fs::path crashed = CrashedWithDoneAndRunning();
  ASSERT_FALSE(crashed.empty());
  ASSERT_FALSE(CommitLog::ReadRecords((crashed / "journal.db-log").string()).empty());
  auto j = Journal::Open((crashed / "journal.db").string(), {}, clock_);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  auto done = (*j)->Get("done");
  ASSERT_TRUE(done.ok()) << "a request acknowledged as finished is missing";
  EXPECT_EQ(done->state, State::kCompleted);
  EXPECT_EQ(done->result_body, "answer");
  ASSERT_TRUE((*j)->Get("running").ok()) << "a request acknowledged as running is missing";
  EXPECT_EQ((*j)->Get("running")->state, State::kRunning);
  EXPECT_EQ((*j)->Attempts("running")->size(), 1u);
  EXPECT_TRUE(CommitLog::ReadRecords((crashed / "journal.db-log").string()).empty())
      << "applied records are not kept";
  // And a restart's recovery sees the running one.
  auto recovered = (*j)->Recover();
  ASSERT_TRUE(recovered.ok());
  ASSERT_EQ(recovered->size(), 1u);
  EXPECT_EQ((*recovered)[0].id, "running");
}

// Rows of the log that failed to commit (a write error in their batch) go
// in before any later write: a later write may be about their request. A
// requeue of a request whose row had not committed changed nothing, and the
// replay after it then wrote the request back as running.
TEST_F(LoggedWritesTest, RowsThatFailedToCommitGoInBeforeLaterWrites) {
  Reopen(Slow(true));
  ASSERT_TRUE(NewRunning("r").ok());  // durable in the log; its rows wait in the queue
  faults_->FailWrites(1);
  EXPECT_FALSE(j_->Accept(Rec("other", "k")).ok());  // its batch, with r's rows, fails
  // The observer hears of the replayed rows, and may read the journal as the
  // gateway's does (told once the batch no longer leads: a read that
  // flushed the queue from inside it waited for itself).
  std::atomic<int> read_back{0};
  j_->SetObserver([&](const Transition& t) {
    if (j_->Get(t.id).ok()) ++read_back;
  });
  clock_.Advance(JournalOptions{}.unwritable_retry_ms);  // new requests are taken again
  ASSERT_TRUE(NewRunning("deferred").ok());  // a logged write queued: the observer's read flushes the queue
  ASSERT_TRUE(j_->Requeue("r", "worker busy").ok());
  auto r = j_->Get("r");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->state, State::kQueued) << "the requeue ran before the request's own row";
  EXPECT_TRUE(Eventually([&] { return read_back.load() > 0; }));
}

// An Open that cannot apply what the log holds from before (the disk full,
// the database locked by another program) fails, and keeps those records
// for the next try, as it says. Its journal, dropped by the failed Open,
// emptied the log on its way out: the next Open found nothing to apply.
TEST_F(LoggedWritesTest, AnOpenThatCannotApplyTheLogKeepsItsRecords) {
  const fs::path crashed = CrashedWithDoneAndRunning();
  ASSERT_FALSE(crashed.empty());
  const std::string db = (crashed / "journal.db").string();
  {
    JournalOptions full_disk;
    full_disk.faults = StorageFaults::Create();
    ASSERT_NE(full_disk.faults, nullptr);
    full_disk.faults->SetDiskFull(true);
    auto refused = Journal::Open(db, full_disk, clock_);
    ASSERT_FALSE(refused.ok()) << "the rows could not be written, yet it opened";
    EXPECT_NE(refused.status().message().find("they are kept"), std::string::npos) << refused.status().ToString();
  }
  EXPECT_EQ(CommitLog::ReadRecords((crashed / "journal.db-log").string()).size(), 3u);
  auto j = Journal::Open(db, {}, clock_);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  auto done = (*j)->Get("done");
  ASSERT_TRUE(done.ok()) << "a request acknowledged as finished is missing";
  EXPECT_EQ(done->state, State::kCompleted);
  ASSERT_TRUE((*j)->Get("running").ok()) << "a request acknowledged as running is missing";
}

// A request's deadline (X-Request-Timeout as a time) is journaled with it,
// by both ways a request is first written (a log record, a transaction):
// a restart that recovers the request recovers its deadline too (it ran
// again with none, however old).
TEST_F(LoggedWritesTest, ADeadlineOutlivesARestart) {
  Reopen(Slow(true));
  RequestRecord logged = Rec("logged");
  logged.deadline_ms = 1'700'000'123'456;
  ASSERT_TRUE(Durable([&](auto done) { j_->AcceptAndStartAsync(logged, "cpu", "", std::move(done)); }).ok());
  RequestRecord keyed = Rec("keyed", "key-1");
  keyed.deadline_ms = 1'700'000'654'321;
  ASSERT_TRUE(j_->Accept(keyed).ok());
  const fs::path crashed = CopyAsCrashed();
  auto j = Journal::Open((crashed / "journal.db").string(), {}, clock_);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  auto recovered = (*j)->Recover();
  ASSERT_TRUE(recovered.ok());
  std::map<std::string, int64_t> deadlines;
  for (const auto& r : *recovered) deadlines[r.id] = r.deadline_ms;
  EXPECT_EQ(deadlines["logged"], 1'700'000'123'456);
  EXPECT_EQ(deadlines["keyed"], 1'700'000'654'321);
}

// A journal closed with every row committed leaves an empty log (it used to
// keep records under 4 KiB, applied again by the next Open), in both modes.
TEST_F(LoggedWritesTest, AClosedJournalLeavesNoRecordsInItsLog) {
  for (const bool full : {false, true}) {
    const std::string a = full ? "full-a" : "normal-a", b = full ? "full-b" : "normal-b";
    Reopen(Slow(full));
    ASSERT_TRUE(NewRunning(a).ok());
    ASSERT_TRUE(End(a, "answer").ok());
    ASSERT_TRUE(NewRunning(b).ok());
    const std::string log = (dir_ / "journal.db-log").string();
    ASSERT_FALSE(CommitLog::ReadRecords(log).empty());
    j_.reset();
    EXPECT_TRUE(CommitLog::ReadRecords(log).empty()) << (full ? "FULL" : "NORMAL");
    auto j = Journal::Open((dir_ / "journal.db").string(), {}, clock_);
    ASSERT_TRUE(j.ok()) << j.status().ToString();
    ASSERT_TRUE((*j)->Get(a).ok());
    EXPECT_EQ((*j)->Get(a)->state, State::kCompleted);
    ASSERT_TRUE((*j)->Get(b).ok());
    EXPECT_EQ((*j)->Get(b)->state, State::kRunning);
  }
}

// Rows that fail to commit (the disk filled after the record was written)
// are applied again from the log once the storage takes writes.
TEST_F(LoggedWritesTest, RowsThatFailedToCommitAreAppliedAgainWhenTheStorageRecovers) {
  ASSERT_TRUE(RowsFailedToCommit("r"));
  EXPECT_FALSE(CommitLog::ReadRecords((dir_ / "journal.db-log").string()).empty())
      << "the record was dropped with its failed rows";
  clock_.Advance(JournalOptions{}.unwritable_retry_ms);
  ASSERT_TRUE(j_->Accept(Rec("next")).ok());  // a commit: the storage writes again
  EXPECT_TRUE(Eventually([&] { return j_->Get("r").ok(); })) << "the failed rows were never applied again";
  EXPECT_EQ(j_->Get("r")->state, State::kRunning);
  EXPECT_TRUE(Eventually([&] { return CommitLog::ReadRecords((dir_ / "journal.db-log").string()).empty(); }));
}

// While rows of the log cannot commit, a read of an acknowledged request
// says the journal is behind (503, try again): it said "no request" (404),
// or an ended request's earlier state, though its client had been told the
// request was durable.
TEST_F(LoggedWritesTest, AReadWhileRowsCannotCommitSaysTheJournalIsBehindNotThatTheRequestIsUnknown) {
  Reopen(Slow(false));
  ASSERT_TRUE(NewRunning("r").ok());
  faults_->SetDiskFull(true);
  j_->Flush();  // the rows' transaction fails
  const auto got = j_->Get("r");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable) << got.status().ToString();
  EXPECT_GT(got.status().retry_after_s(), 0);
  EXPECT_EQ(j_->Attempts("r").status().code(), StatusCode::kUnavailable);
  faults_->SetDiskFull(false);
  // Once the storage writes again, the next batch (an end that was on its
  // way) brings every row, and so proves the journal writable: its own write
  // changed nothing (its row came with the replay), and new requests were
  // refused until the next retry time.
  ASSERT_TRUE(End("r", "answer").ok());
  j_->Flush();  // (its rows' batch: the replay, then its own write)
  EXPECT_TRUE(j_->Health().ok()) << j_->Health().ToString();
  ASSERT_TRUE(j_->Get("r").ok());
  EXPECT_EQ(j_->Get("r")->state, State::kCompleted);
}

// A log that cannot be read back when its records are applied again (the
// same failing disk) keeps them for the next try: the replay read nothing,
// committed nothing and counted every record applied, so an acknowledged
// request's rows were never written and its record was erased.
TEST_F(LoggedWritesTest, ALogThatCannotBeReadBackKeepsItsRecordsForTheNextReplay) {
  ASSERT_TRUE(RowsFailedToCommit("r"));
  faults_->FailLogReads(1);
  clock_.Advance(JournalOptions{}.unwritable_retry_ms);
  const auto refused = j_->Accept(Rec("next"));  // its batch applies the log again: the read fails
  EXPECT_FALSE(refused.ok()) << "a write went in while the log's records could not be applied";
  EXPECT_FALSE(CommitLog::ReadRecords((dir_ / "journal.db-log").string()).empty()) << "the records were counted applied";
  clock_.Advance(JournalOptions{}.unwritable_retry_ms);
  ASSERT_TRUE(j_->Accept(Rec("after")).ok());  // the log reads again
  EXPECT_TRUE(Eventually([&] { return j_->Get("r").ok(); })) << "an acknowledged request's rows were never written";
  EXPECT_EQ(j_->Get("r")->state, State::kRunning);
}

}  // namespace
}  // namespace spillway::journal
