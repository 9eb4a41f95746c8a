// Worker records: what a gateway writes about each worker it starts, so that
// the next gateway on the same state directory can find it after a crash.
//
// One file per placement, <state_dir>/run/<key>.json (mode 0600, written
// atomically): the worker's pid and that process's start time (field 22 of
// /proc/<pid>/stat, so a pid reused by another process is never mistaken for
// the worker), its port (0 while it loads), a hash of its spec arguments and
// the gateway-worker protocol version it speaks.
//
// The adoption decision is a pure function of a record, what the system says
// of its process and what the worker answers: see DecideAdoption().
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "devices/sim_ledger.h"

namespace spillway::upstream {

struct WorkerRecord {
  std::string key;
  pid_t pid = 0;
  uint64_t start_time = 0;  // clock ticks since boot, from /proc/<pid>/stat
  uint16_t port = 0;        // 0: not listening yet when written
  std::string spec_hash;    // SpecHash() of the worker's WorkerSpec::args
  int protocol_version = 0;
  // An external server's (started from the config's `command`): judged by
  // pid and start time alone, never asked anything (false in records
  // written before it was recorded).
  bool external = false;
  // What stops it (an external server's `stop_signal`; 15 in records
  // written before it was recorded).
  int stop_signal = 15;
  // The state directory's run folder it was written in (device and inode;
  // 0: not recorded, in records written before). A copy of the state
  // directory (a backup restored beside it, a test setup) holds the same
  // records: their processes belong to the gateway of the original, which
  // a gateway on the copy must neither adopt nor stop. It stopped the
  // original's external servers (judged by pid and start time alone).
  uint64_t dir_dev = 0, dir_ino = 0;
  // Its session when it was recorded (0: not recorded, in records written
  // before; its own pid since workers lead their own session). Processes an
  // external server left in its group after it ended are stopped only in
  // this session (OrphanedGroup).
  pid_t session = 0;
  // The boot and pid namespace it was recorded in (BootIdentity(); empty in
  // records written before): what its group left is looked for only in the
  // same, where its pid and start time mean the same process.
  std::string boot;
};

std::string RecordToJson(const WorkerRecord& r);
// Refuses anything that is not a complete record (a file of another version,
// a truncated or planted one) with the reason.
StatusOr<WorkerRecord> ParseWorkerRecord(std::string_view text);

// SHA-256 over the arguments, each length-prefixed so that {"a b"} and
// {"a", "b"} differ. Any change of model, device, context, slots... changes it.
std::string SpecHash(const std::vector<std::string>& args);

// <dir>/<key>.json for each key; the records of `dir` (file name = key).
std::string RecordPath(const std::string& run_dir, const std::string& key);
struct RecordFile {
  std::string key, path;
  StatusOr<WorkerRecord> record;
};
std::vector<RecordFile> ReadWorkerRecords(const std::string& run_dir);

// What the worker said to GET /v1/worker/info with the secret; nullopt when it
// did not answer 200 (gone, hung, another secret, not a worker).
struct WorkerInfoFacts {
  int protocol_version = 0;
  pid_t pid = 0;  // the process that answered
};

enum class AdoptAction {
  kAdopt,   // serve on with it: ready at once, nothing reloaded
  kForget,  // its process is gone or the pid is now another process: drop the record, touch nothing
  kStop,    // ours but not what the config wants now (or not talking): stop its group, start anew
  kWait,    // its pid is there but /proc cannot tell whose it is (no descriptor left, hidepid): neither
            // adopted nor signalled; its record is kept, and its placement starts no worker beside it
            // until it is seen ended (Supervisor's Worker::dying)
};
const char* AdoptActionName(AdoptAction a);

struct AdoptDecision {
  AdoptAction action;
  std::string reason;  // why, for the log line
  // kStop of a group whose leader has ended, through what it left in its group (WorkerPid::leader_gone).
  bool leader_gone = false;
};

// `configured_hash`: SpecHash() of the current spec for the record's key,
// nullopt when the key is no longer configured (or not admitted now).
// `process`: kAlive when the record's pid exists with the record's start time
// (not a zombie) and, for a worker, was started as the record key's worker
// (its command line); kGone when it does not; kUnknown when its pid exists
// and its /proc entry cannot be read (ProcessLiveness).
// `info`: the worker's answer on the record's port, asked only when alive.
// `external`: the record is an external server's (started by the gateway
// from its `command`): never asked with the workers' secret, never adopted;
// stopped when alive, so that it does not hold its memory beside the one started anew.
// `orphans`: with `process` kGone, how many processes it started live on in
// its group (OrphanedGroup): they are stopped (its server, which a wrapper
// script started and which outlived it, would run beside the one started
// anew, with its memory), the record forgotten only once none is left;
// nullopt when /proc cannot tell: waited out, as a process it cannot tell about.
AdoptDecision DecideAdoption(const WorkerRecord& record, const std::optional<std::string>& configured_hash,
                             int protocol_version, devices::Liveness process,
                             const std::optional<WorkerInfoFacts>& info, bool external = false,
                             std::optional<size_t> orphans = 0);

}  // namespace spillway::upstream
