#include "common/proc_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <sstream>

namespace spillway {

std::optional<std::string> ReadAll(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      return out;
    } else if (errno != EINTR) {
      return std::nullopt;
    }
  }
}

std::optional<std::string> ReadSmallFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  auto out = ReadAll(fd);
  const int read_errno = errno;
  ::close(fd);
  errno = read_errno;  // (the caller may ask why: ESRCH, a process reaped meanwhile)
  return out;
}

std::optional<ProcStat> ParseProcStat(const std::string& text) {
  const auto close = text.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return std::nullopt;
  std::istringstream in(text.substr(close + 1));
  ProcStat f;
  long long ppid = 0, pgrp = 0, session = 0;
  if (!(in >> f.state >> ppid >> pgrp >> session)) return std::nullopt;
  std::string skipped;
  for (int field = 7; field <= 21; ++field) in >> skipped;  // tty_nr .. itrealvalue
  if (!(in >> f.start_time)) return std::nullopt;
  f.ppid = static_cast<int32_t>(ppid);
  f.pgrp = static_cast<int32_t>(pgrp);
  f.session = static_cast<int32_t>(session);
  return f;
}

std::optional<ProcStat> ReadProcStat(int32_t pid, const std::string& proc_root) {
  const std::optional<std::string> text = ReadSmallFile(proc_root + "/" + std::to_string(pid) + "/stat");
  if (!text) return std::nullopt;
  auto stat = ParseProcStat(*text);
  if (!stat) errno = EINVAL;  // (read, but not a stat line: not the errno of an earlier call)
  return stat;
}

std::optional<std::vector<std::pair<int32_t, ProcStat>>> ProcessesOfGroup(int32_t pgid,
                                                                          const std::string& proc_root) {
  std::vector<std::pair<int32_t, ProcStat>> out;
  if (pgid <= 0) return out;
  std::error_code ec;
  std::filesystem::directory_iterator it(proc_root, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || name.size() > 9 || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const auto pid = static_cast<int32_t>(std::stol(name));
    const auto f = ReadProcStat(pid, proc_root);
    if (!f) {
      if (errno == ENOENT || errno == ESRCH) continue;  // ended meanwhile
      // Another user's (hidepid=1: its entry is listed, its files are not
      // readable): not one this user started, as under hidepid=2, which
      // leaves it out of the listing. (Left to "cannot tell", no worker's
      // placement started again once one had ended.)
      if (errno == EACCES || errno == EPERM) {
        const auto owner = ProcOwner(pid, proc_root);
        if (!owner) continue;  // (gone meanwhile)
        if (*owner != ::geteuid()) continue;
      }
      return std::nullopt;
    }
    if (f->pgrp == pgid && f->state != 'Z') out.emplace_back(pid, *f);
  }
  if (ec) return std::nullopt;
  return out;
}

std::optional<uint32_t> ProcOwner(int32_t pid, const std::string& proc_root) {
  struct stat st {};
  if (::stat((proc_root + "/" + std::to_string(pid)).c_str(), &st) != 0) return std::nullopt;
  return static_cast<uint32_t>(st.st_uid);
}

namespace {

// The inodes of the sockets listening on local port `port` in one of
// /proc/net/tcp or tcp6 (proc(5): "sl local_address rem_address st ...
// inode", addresses as hex "ADDR:PORT", LISTEN is state 0A); nullopt when
// the table cannot be read or is not in that form.
std::optional<std::vector<uint64_t>> ListeningInodes(const std::string& table, uint16_t port) {
  const auto text = ReadSmallFile(table);
  if (!text) return std::nullopt;
  std::vector<uint64_t> out;
  std::istringstream in(*text);
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string sl, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
    if (!(fields >> sl >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode)) {
      errno = EINVAL;  // (not proc(5)'s form: no errno of the read's to mistake for a missing table)
      return std::nullopt;
    }
    const size_t colon = local.rfind(':');
    if (colon == std::string::npos || state != "0A") continue;
    unsigned long local_port = 0;
    try {
      local_port = std::stoul(local.substr(colon + 1), nullptr, 16);
      if (local_port == port) out.push_back(std::stoull(inode));
    } catch (const std::exception&) {
      errno = EINVAL;
      return std::nullopt;
    }
  }
  return out;
}

}  // namespace

std::optional<bool> ListensAlone(int32_t pid, uint16_t port, const std::string& proc_root) {
  std::vector<uint64_t> listening;
  for (const char* table : {"/net/tcp", "/net/tcp6"}) {
    auto inodes = ListeningInodes(proc_root + table, port);
    if (!inodes) {
      if (std::string(table) == "/net/tcp6" && errno == ENOENT) continue;  // (a kernel without IPv6)
      return std::nullopt;
    }
    listening.insert(listening.end(), inodes->begin(), inodes->end());
  }
  if (listening.empty()) return false;
  std::vector<uint64_t> own;
  std::error_code ec;
  const std::string fds = proc_root + "/" + std::to_string(pid) + "/fd";
  std::filesystem::directory_iterator it(fds, ec), end;
  if (ec) return std::nullopt;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code link_ec;
    const std::string target = std::filesystem::read_symlink(it->path(), link_ec).string();
    // "socket:[INODE]"
    if (link_ec || target.rfind("socket:[", 0) != 0 || target.back() != ']') continue;
    try {
      own.push_back(std::stoull(target.substr(8, target.size() - 9)));
    } catch (const std::exception&) {
    }
  }
  if (ec) return std::nullopt;
  for (const uint64_t inode : listening) {
    if (std::find(own.begin(), own.end(), inode) == own.end()) return false;
  }
  return true;
}

std::string BootIdentity() {
  std::optional<std::string> boot = ReadSmallFile("/proc/sys/kernel/random/boot_id");
  struct stat ns {};
  if (!boot || ::stat("/proc/self/ns/pid", &ns) != 0) return "";
  while (!boot->empty() && (boot->back() == '\n' || boot->back() == ' ')) boot->pop_back();
  if (boot->empty()) return "";
  return *boot + ":" + std::to_string(static_cast<uint64_t>(ns.st_ino));
}

}  // namespace spillway
