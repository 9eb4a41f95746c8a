#include "upstream/log_rotation.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "common/private_files.h"

namespace spillway::upstream {

namespace fs = std::filesystem;

Status RotateIfLarger(const std::string& path, uint64_t max_bytes) {
  struct stat st{};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return Status::Ok();  // gone, or not ours to touch
  if (static_cast<uint64_t>(st.st_size) <= max_bytes) return Status::Ok();
  const std::string old = path + ".1";
  std::error_code ec;
  fs::remove(old, ec);
  fs::copy_file(path, old, fs::copy_options::overwrite_existing, ec);
  if (ec) return Status::Internal("cannot copy " + path + " to " + old + ": " + ec.message());
  ::chmod(old.c_str(), kPrivateFileMode);
  if (::truncate(path.c_str(), 0) != 0) return Status::Internal("cannot truncate " + path);
  return Status::Ok();
}

}  // namespace spillway::upstream
