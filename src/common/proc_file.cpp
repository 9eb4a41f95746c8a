#include "common/proc_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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
  return ParseProcStat(*text);
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
      return std::nullopt;
    }
    if (f->pgrp == pgid && f->state != 'Z') out.emplace_back(pid, *f);
  }
  if (ec) return std::nullopt;
  return out;
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
