#include "common/private_files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/secret.h"

namespace spillway {

namespace {

std::string Octal(unsigned mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", mode & 07777);
  return buf;
}

}  // namespace

Status EnsurePrivateDir(const std::string& dir) {
  std::error_code ec;
  const auto parent = std::filesystem::path(dir).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);  // the parents as the umask says
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Status::Unavailable("cannot create state directory " + dir + ": " + std::strerror(errno));
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return Status::Unavailable("cannot read " + dir + ": " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) return Status::InvalidArgument(dir + " is not a directory");
  if (st.st_uid != ::geteuid()) {
    return Status::PermissionDenied("state directory " + dir + " belongs to user " + std::to_string(st.st_uid) +
                                    ", not to this user (" + std::to_string(::geteuid()) +
                                    "): another user could have planted files in it; use a directory of your own");
  }
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    return Status::PermissionDenied("state directory " + dir + " has mode " + Octal(st.st_mode) +
                                    ": others may write to it, so its files cannot be trusted; remove it or "
                                    "`chmod 700 " + dir + "` after checking its contents");
  }
  if ((st.st_mode & 077) != 0 && ::chmod(dir.c_str(), 0700) != 0) {
    return Status::PermissionDenied("state directory " + dir + " has mode " + Octal(st.st_mode) +
                                    " and cannot be made private: " + std::strerror(errno));
  }
  return Status::Ok();
}

Status WriteFileAtomically(const std::string& path, const std::string& content, unsigned mode, bool replace) {
  const std::string tmp = path + ".tmp-" + RandomHex(8);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) return Status::Unavailable("cannot create " + tmp + ": " + std::strerror(errno));
  auto fail = [&](const std::string& what) {
    const int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return Status::Unavailable(what + ": " + std::strerror(e));
  };
  if (::fchmod(fd, mode) != 0) return fail("cannot set the mode of " + tmp);
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail("cannot write " + tmp);
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  // Without `replace`, link() is the atomic "create if absent" for a whole file.
  if ((replace ? ::rename(tmp.c_str(), path.c_str()) : ::link(tmp.c_str(), path.c_str())) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    if (e == EEXIST) return Status::Conflict(path + " exists");
    return Status::Unavailable("cannot " + std::string(replace ? "rename " : "link ") + tmp + " to " + path + ": " +
                               std::strerror(e));
  }
  if (!replace) ::unlink(tmp.c_str());
  return Status::Ok();
}

StatusOr<std::string> ReadPrivateFile(const std::string& path, size_t max_bytes) {
  // Not opened at all unless it is a regular file (a device's open may do
  // something), and checked again once open (it may have been replaced).
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::NotFound(path + " is not there");
    return Status::Unavailable("cannot read " + path + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return Status::Unavailable(path + " is not a regular file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound(path + " is not there");
    return Status::Unavailable("cannot open " + path + ": " + std::strerror(errno));
  }
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const std::string why = S_ISREG(st.st_mode) ? std::string(std::strerror(errno)) : "not a regular file";
    ::close(fd);
    return Status::Unavailable(path + ": " + why);
  }
  std::string out(max_bytes, '\0');
  size_t got = 0;
  while (got < max_bytes) {
    const ssize_t n = ::read(fd, out.data() + got, max_bytes - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      return Status::Unavailable("cannot read " + path + ": " + std::strerror(e));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

Status WritePrivateFileAtomically(const std::string& path, const std::string& content) {
  return WriteFileAtomically(path, content, kPrivateFileMode);
}

}  // namespace spillway
