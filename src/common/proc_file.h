// Reading small files whose contents can vanish under the reader: /proc/<pid>/*.
//
// A /proc file opened while its process lived fails its read with ESRCH once
// the process is reaped. std::istreambuf_iterator lets that read error escape
// as std::ios_base::failure, which ended the chaos harness's sampler (and could
// end the gateway's supervisor) with std::terminate. These report it instead.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace spillway {

// Everything from `fd`'s position to its end (read() until 0, EINTR retried);
// nullopt on a read error. Does not close `fd`.
std::optional<std::string> ReadAll(int fd);

// Opens `path` read-only, reads it whole, closes it; nullopt when it cannot be
// opened or read, errno saying why (ENOENT: no such process; ESRCH: reaped
// meanwhile; EACCES, EMFILE: it may well be there).
std::optional<std::string> ReadSmallFile(const std::string& path);

// The fields of /proc/<pid>/stat that Spillway reads (proc(5)).
struct ProcStat {
  char state = '?';  // 'Z': a zombie
  int32_t ppid = 0, pgrp = 0, session = 0;
  uint64_t start_time = 0;  // field 22, clock ticks since boot
};
// nullopt for a text that is not a stat line.
std::optional<ProcStat> ParseProcStat(const std::string& text);
// `<proc_root>/<pid>/stat`; nullopt (errno as ReadSmallFile's) when it cannot be read or parsed.
std::optional<ProcStat> ReadProcStat(int32_t pid, const std::string& proc_root = "/proc");

// Every process of process group `pgid` (zombies left out), with its stat
// fields: one walk of `proc_root`. nullopt when the walk cannot tell (the
// directory cannot be read, or a process's stat cannot for another reason
// than its end: no descriptor left, hidepid).
std::optional<std::vector<std::pair<int32_t, ProcStat>>> ProcessesOfGroup(int32_t pgid,
                                                                          const std::string& proc_root = "/proc");

// The owner of `<proc_root>/<pid>`: its process's effective uid (root's for a
// process that is not dumpable). Readable under hidepid=1 (noaccess), where
// the entry's files are not; nullopt when it cannot be stat'ed (gone, or
// hidden by hidepid=2).
std::optional<uint32_t> ProcOwner(int32_t pid, const std::string& proc_root = "/proc");

// Whether process `pid` alone listens on TCP port `port`: every socket in
// LISTEN state on that local port (IPv4 and IPv6, any address) is one of its
// open files, and there is at least one. Before a secret is sent to a port
// recorded for a process: another program (another user's) bound there
// since would get it. nullopt when /proc cannot tell (the sockets' tables
// or the process's descriptors cannot be read).
std::optional<bool> ListensAlone(int32_t pid, uint16_t port, const std::string& proc_root = "/proc");

// This boot and this pid namespace ("<boot_id>:<pid namespace inode>"): pids
// and start times compare only within one. Empty when either cannot be read.
std::string BootIdentity();

}  // namespace spillway
